"""docs/dev-interfaces.md names every module of the product packages, and names no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("kube_gpu_scheduler",)
DOC = ROOT / "docs" / "dev-interfaces.md"
# A module path in backquotes: `kube_gpu_scheduler/check/cli.py`, `kube_gpu_scheduler/scheduler/placing/core.py`.
NAMED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")/[\w/]+\.py)`")


def test_every_product_module_is_in_the_module_map() -> None:
    doc = DOC.read_text()
    modules = [
        p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if p.parent.name != pkg or p.name != "__init__.py"
    ]
    assert modules, "no modules found"
    missing = [m for m in modules if f"`{m}`" not in doc]
    assert not missing, f"add these modules to docs/dev-interfaces.md: {missing}"


def test_every_module_the_doc_names_exists() -> None:
    named = sorted(set(NAMED.findall(DOC.read_text())))
    assert "kube_gpu_scheduler/domain/schedmap.py" in named, "the pattern finds no module"
    gone = [m for m in named if not (ROOT / m).is_file()]
    assert not gone, f"docs/dev-interfaces.md names modules that do not exist: {gone}"
