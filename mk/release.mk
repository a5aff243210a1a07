# Releases: the image and both charts, one version, pushed to an OCI registry
# (localcluster/publish.py). Included by the Makefile (-include mk/*.mk), which provides
# $(VENV), $(PY) and a PATH holding .venv/bin and the tool bin dirs (helm).
#
#   make release VERSION=0.2.0 REGISTRY=registry.example.com/team/gpu-scheduler
#   make registry                                  # a local registry on 127.0.0.1:5000, then
#   make release VERSION=0.2.0 REGISTRY=127.0.0.1:5000
#
# VERSION must be what pyproject.toml and both Chart.yaml say (version, appVersion).
# A loopback REGISTRY is plain HTTP (PLAIN_HTTP=false to refuse that); credentials, where the
# registry wants them: RELEASE_REGISTRY_USER and RELEASE_REGISTRY_PASSWORD in the environment.
# The image is linux/amd64 (make image's, the one make test ran) and linux/arm64, signed and its
# SBOMs attested with cosign, both verified back: COSIGN_KEY, COSIGN_PASSWORD and
# COSIGN_PUBLIC_KEY name your key; without them a local key pair is made in build/release-keys/.

VERSION ?=
REGISTRY ?=
PLAIN_HTTP ?=
# PYTHON_IMAGE of the image build: local (the mmdebstrap base, as `make image`), dockerfile
# (the Dockerfile's own default, pulled from its registry: CI), or an image reference.
IMAGE_BASE ?= local
# `make image-push`: the tags to push this tree's image under (CI's branch pipelines).
IMAGE_TAGS ?=
REGISTRY_PORT ?= 5000

.PHONY: release image-push registry

release: venv chart-tools ## Build the image, package both charts with its digest, push all three: make release VERSION=x.y.z REGISTRY=host[:port][/path]
	@if [ -z "$(VERSION)" ] || [ -z "$(REGISTRY)" ]; then \
	  echo "usage: make release VERSION=x.y.z REGISTRY=host[:port][/path]" >&2; exit 2; fi
	tools/provision.sh cosign
	$(PY) -m localcluster.publish --version "$(VERSION)" --registry "$(REGISTRY)" --base "$(IMAGE_BASE)" \
	  $(if $(PLAIN_HTTP),--plain-http "$(PLAIN_HTTP)")

image-push: venv ## Build this tree's image and push it under each of IMAGE_TAGS: make image-push REGISTRY=... IMAGE_TAGS="abc123 latest"
	@if [ -z "$(REGISTRY)" ] || [ -z "$(IMAGE_TAGS)" ]; then \
	  echo "usage: make image-push REGISTRY=host[:port][/path] IMAGE_TAGS='tag ...'" >&2; exit 2; fi
	$(PY) -m localcluster.publish --registry "$(REGISTRY)" --base "$(IMAGE_BASE)" \
	  $(foreach t,$(IMAGE_TAGS),--tag "$(t)") $(if $(PLAIN_HTTP),--plain-http "$(PLAIN_HTTP)")

registry: venv ## Run a local OCI registry (CNCF distribution) on 127.0.0.1:$(REGISTRY_PORT) in the foreground
	tools/provision.sh registry
	$(PY) -m localcluster.registry --port $(REGISTRY_PORT)

.PHONY: chart-docs
chart-docs: venv ## Regenerate the values tables of both charts' README.md from values.yaml and the schema
	$(PY) tools/chart_readme.py
