# Argo CD + cert-manager on the local control plane. Included by the Makefile
# (-include mk/*.mk), which provides $(PY) and a PATH with the tool bin dirs.

.PHONY: gitops-demo

gitops-demo: venv tools image ## Real Argo CD + cert-manager sync argocd/ from a local bare repo onto the real node; prints the timeline and placement
	$(PY) -m localcluster.gitops_demo
