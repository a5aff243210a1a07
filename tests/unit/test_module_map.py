"""docs/dev-interfaces.md names every module of the product packages."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpu_scheduling", "scheduler", "webhook")


def test_every_product_module_is_in_the_module_map() -> None:
    doc = (ROOT / "docs" / "dev-interfaces.md").read_text()
    modules = [
        p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if p.name != "__init__.py" or p.parent.name != pkg
    ]
    assert modules, "no modules found"
    missing = [m for m in modules if f"`{m}`" not in doc]
    assert not missing, f"add these modules to docs/dev-interfaces.md: {missing}"
