# Delivery: lint of the charts, the Dockerfile and the YAML; chart packaging;
# Argo CD validation. Included by the Makefile (-include mk/*.mk), which provides
# $(VENV), $(PY), PYTEST_ARGS and a PATH holding .venv/bin and the tool bin dirs
# (helm, ct, kubectl). Each GitLab CI job runs one of these targets.

CHARTS := gpu-scheduler-chart gpu-scheduler-check-chart
# The charts support Kubernetes >= 1.31 (Chart.yaml kubeVersion); lint at both ends.
CHART_KUBE_VERSIONS ?= v1.31.0 v1.37.0
DIST ?= dist
YAML_FILES = ct.yaml lintconf.yaml chart_schema.yaml .gitlab-ci.yml $(wildcard argocd/*.yaml) \
  $(foreach c,$(CHARTS),$(c)/Chart.yaml $(c)/values.yaml $(wildcard $(c)/ci/*.yaml))
IMAGE ?= registry.gitlab.com/evgenii19/gpu-scheduler/gpu-scheduler
IMAGE_TAG ?= $(or $(CI_COMMIT_SHORT_SHA),latest)

.PHONY: chart-tools yamllint hadolint helm-lint ct-lint chart-lint lint-delivery lint-all \
  package argocd-validate deploy-hint release-check

chart-tools: ## Build only helm and ct (what the lint jobs need)
	tools/provision.sh helm ct

yamllint: venv ## yamllint the charts' values, ci scenarios, Argo CD and CI YAML (lintconf.yaml)
	yamllint --strict -c lintconf.yaml $(YAML_FILES)

hadolint: venv ## Lint the Dockerfile
	hadolint Dockerfile

helm-lint: chart-tools ## helm lint --strict every chart with every ci/*-values.yaml, Kubernetes 1.31 and 1.37
	@for c in $(CHARTS); do for k in $(CHART_KUBE_VERSIONS); do for f in $$c/ci/*-values.yaml; do \
	  echo "helm lint $$c -f $$f --kube-version $$k"; \
	  helm lint --strict --quiet --kube-version $$k $$c -f $$f; \
	done; done; done

ct-lint: venv chart-tools ## chart-testing: helm lint per ci/ scenario, yamllint, yamale on Chart.yaml
	ct lint --config ct.yaml --all

chart-lint: helm-lint ct-lint ## helm lint and ct lint

lint-delivery: yamllint hadolint chart-lint ## Every delivery lint (YAML, Dockerfile, charts)

lint-all: lint lint-delivery ## ruff, mypy and every delivery lint

package: chart-tools ## helm package both charts into dist/charts
	mkdir -p $(DIST)/charts
	helm package $(CHARTS) --destination $(DIST)/charts

argocd-validate: venv tools ## Server-side dry-run of argocd/*.yaml with the pinned Argo CD CRDs (local control plane)
	$(PY) -m pytest tests/integration/test_argocd.py $(PYTEST_ARGS)

release-check: ## One version: pyproject, both appVersions, and RELEASE_TAG=v<version> when given (CI, on tags)
	python3 tools/release_check.py $(RELEASE_TAG)

deploy-hint: ## Print the commands that deploy this build (helm or Argo CD)
	@echo "# Helm (image $(IMAGE):$(IMAGE_TAG)):"
	@echo "helm upgrade --install gpu-scheduler ./gpu-scheduler-chart -n gpu-scheduler-system --create-namespace \\"
	@echo "  --set image.repository=$(IMAGE) --set image.tag=$(IMAGE_TAG) \\"
	@echo "  --set webhook.enabled=true --set webhook.certManager.enabled=true"
	@echo "helm test gpu-scheduler -n gpu-scheduler-system"
	@echo "helm upgrade --install gpu-scheduler-check ./gpu-scheduler-check-chart -n gpu-scheduler-tests --create-namespace \\"
	@echo "  --set image.repository=$(IMAGE) --set image.tag=$(IMAGE_TAG)"
	@echo "helm test gpu-scheduler-check -n gpu-scheduler-tests"
	@echo "# Argo CD (argocd/README.md):"
	@echo "kubectl apply -f argocd/gpu-scheduler-project.yaml -f argocd/local-cluster-secret.yaml"
	@echo "kubectl apply -f argocd/gpu-scheduler-complete-applicationset.yaml"
