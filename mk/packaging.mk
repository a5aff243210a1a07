# Packaging: the image's locked runtime dependencies. Included by the Makefile
# (-include mk/*.mk), which provides $(VENV) and the venv target.

LOCK := requirements/runtime.txt
# Extra uv arguments, e.g. LOCK_ARGS=--upgrade (every package) or --upgrade-package orjson.
LOCK_ARGS ?=

.PHONY: lock

lock: venv ## Regenerate requirements/runtime.txt: pyproject.toml's dependencies and the nvml extra, pinned with hashes
	$(VENV)/bin/uv pip compile pyproject.toml --extra nvml --generate-hashes \
	  --python-version 3.11 --python-platform linux \
	  --custom-compile-command 'make lock' --quiet $(LOCK_ARGS) --output-file $(LOCK)
	@echo "$(LOCK): $$(grep -c '^[a-z0-9]' $(LOCK)) packages, each pinned with its hashes"
