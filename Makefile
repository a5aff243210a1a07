# gpu-scheduler: every task a person or CI runs goes through here.
# `make demo` and `make test` do all set-up on a fresh machine.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Where the control-plane binaries are built (outside the checkout, keyed by version).
export GPU_SCHEDULER_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gpu-scheduler
TOOL_PATH := $(shell tools/provision.sh --print-bin-dirs | paste -sd: -)
export PATH := $(CURDIR)/$(VENV)/bin:$(TOOL_PATH):$(PATH)
PYTEST_ARGS ?=
# `make test` runs the suite on this many pytest-xdist workers (1: one process, in file order).
# tests/conftest.py keeps a module, and every test of the real node, on one worker. Three took
# 25 minutes where two took 32 (its tests wait on the control plane, the kubelet and Argo CD
# much of the time; docs/testing.md, "The test suite"). `make test-unit` (all CPU) runs on
# UNIT_WORKERS.
TEST_WORKERS ?= 3
UNIT_WORKERS ?= 2
XDIST_ARGS := $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope)
UNIT_XDIST_ARGS := $(if $(filter-out 0 1,$(UNIT_WORKERS)),-n $(UNIT_WORKERS) --dist loadscope)

.PHONY: help venv tools unit-tools image test test-unit lint demo cluster-up cluster-down clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# The virtualenv is rebuilt when pyproject.toml changes.
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.stamp ## Create the virtualenv with the package and its dev tools

tools: ## Build the pinned control-plane binaries into $(GPU_SCHEDULER_CACHE)
	tools/provision.sh all

unit-tools: ## Build only what the unit tests run: helm, ct, kube-score, NVIDIA's container toolkit
	tools/provision.sh unit

image: venv tools ## Build the image from the Dockerfile without Docker (mmdebstrap + buildah) into build/image/, amd64 and arm64
	$(PY) -m localcluster.image
	$(PY) -m localcluster.image --arch arm64

test: venv tools image ## Before a commit (and CI): the whole suite (unit + local control plane + the real node)
	$(PY) -m pytest $(XDIST_ARGS) $(PYTEST_ARGS)

# The unit tests: no control plane, no real node, no fresh install of the wheel (those run in
# `make test`); they need helm, ct, kube-score and NVIDIA's container toolkit, nothing else.
test-unit: venv unit-tools ## While developing: the tests that need no control plane (tests/unit, tests/gpu), a few minutes
	$(PY) -m pytest $(UNIT_XDIST_ARGS) -m 'not cluster and not install' tests/unit tests/gpu $(PYTEST_ARGS)

lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

demo: venv tools image ## Local control plane + real node (node4): helm install the image, place the task's map, print the table, pods and node3/node4 logs
	$(PY) -m localcluster demo $(DEMO_ARGS)

cluster-up: venv tools ## Start the local control plane in the background; prints the KUBECONFIG line
	$(PY) -m localcluster up

cluster-down: venv ## Stop the control plane started by cluster-up
	$(PY) -m localcluster down

clean: ## Remove the virtualenv and local state (the tool cache stays)
	rm -rf $(VENV) .cluster .pytest_cache .mypy_cache .ruff_cache

# Delivery targets (charts, image, Argo CD, GitLab CI): mk/*.mk
-include mk/*.mk
