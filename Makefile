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

.PHONY: help venv tools image test test-unit lint demo cluster-up cluster-down clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# The virtualenv is rebuilt when pyproject.toml changes.
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.stamp ## Create the virtualenv with the package and its dev tools

tools: ## Build the pinned control-plane binaries into $(GPU_SCHEDULER_CACHE)
	tools/provision.sh all

image: venv tools ## Build the image from the Dockerfile without Docker (mmdebstrap + buildah) into build/image/
	$(PY) -m localcluster.image

test: venv tools image ## Run the whole test suite (unit + local control plane + the real node)
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv tools ## Run only the tests that need no control plane (the charts still need helm)
	$(PY) -m pytest -m 'not cluster' $(PYTEST_ARGS)

lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

demo: venv tools image ## Local control plane + real node: helm install the image, place the example StatefulSet, print the table
	$(PY) -m localcluster demo $(DEMO_ARGS)

cluster-up: venv tools ## Start the local control plane in the background; prints the KUBECONFIG line
	$(PY) -m localcluster up

cluster-down: venv ## Stop the control plane started by cluster-up
	$(PY) -m localcluster down

clean: ## Remove the virtualenv and local state (the tool cache stays)
	rm -rf $(VENV) .cluster .pytest_cache .mypy_cache .ruff_cache

# Delivery targets (charts, image, Argo CD, GitLab CI): mk/*.mk
-include mk/*.mk
