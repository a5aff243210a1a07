# Argo CD (and, with GITOPS_ARGS=--webhook, cert-manager) on the local control plane. Included by the Makefile
# (-include mk/*.mk), which provides $(PY) and a PATH with the tool bin dirs.

.PHONY: gitops-demo

gitops-demo: venv tools image ## Real Argo CD syncs argocd/ (policy mode; GITOPS_ARGS=--webhook: webhook + cert-manager) onto the real node; prints the timeline and placement
	$(PY) -m localcluster.gitops_demo $(GITOPS_ARGS)
