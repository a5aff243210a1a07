"""The catalogue holds the rules to their checks, and the scheduler to the catalogue's reasons.

* every rule names the checks that emit it (``@emits``), and a check mentions no reason
  it does not declare: a rule's metadata cannot drift from its check;
* no reason is spelt as a literal in the scheduler (nor the webhook, nor the rest of
  kube_gpu_scheduler/): Events, metrics labels and log reasons take their words from
  :mod:`kube_gpu_scheduler.domain.rules.catalogue`.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kube_gpu_scheduler.domain import rules as R
from kube_gpu_scheduler.domain.rules.catalogue import OTHER_REASONS
from kube_gpu_scheduler.mapcli import manifest

ROOT = Path(__file__).resolve().parents[3]
EVERY_REASON = set(R.RULES) | set(OTHER_REASONS)


def _checks() -> dict[Callable[..., Any], set[str]]:
    declared: dict[Callable[..., Any], set[str]] = {}
    for rule in R.RULES.values():
        for check in rule.filters:
            declared.setdefault(check, set()).add(rule.reason)
    return declared


def _mentioned(check: Callable[..., Any]) -> set[str]:
    """The reasons a check's body names (a global constant whose value is a rule's reason)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(check)))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    found = {check.__globals__[n] for n in names if n in check.__globals__}
    found |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    return {v for v in found if isinstance(v, str) and v in R.RULES}


def test_every_rule_has_a_check() -> None:
    # The YAML-only lints' checks read the document: kube_gpu_scheduler.mapcli.manifest registers them.
    assert manifest.find_maps
    assert [r.reason for r in R.RULES.values() if not r.filters] == []


@pytest.mark.parametrize("check", list(_checks()), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_each_check_emits_only_its_own_rules(check: Callable[..., Any]) -> None:
    assert _mentioned(check) == _checks()[check]


def test_no_other_function_of_the_rules_names_a_reason() -> None:
    checks = set(_checks())
    for module in (*R.catalogue.GROUPS, R.filters):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and fn not in checks:
                assert not _mentioned(fn), f"{module.__name__}.{name} names a reason but is no rule's check"


def test_reasons_are_spelt_once() -> None:
    assert len(set(OTHER_REASONS)) == len(OTHER_REASONS)
    assert not set(OTHER_REASONS) & set(R.RULES)


def _reason_literals(path: Path) -> list[str]:
    """String literals in ``path`` that are a catalogued reason (or open a note with one,
    ``"APIError: ..."``), or that sit where a reason goes: the reason argument of an Event
    or a metrics label, a ``"reason": ...`` entry."""
    tree = ast.parse(path.read_text())
    hits: list[str] = []

    def literal(node: ast.AST | None) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    for node in ast.walk(tree):
        text = literal(node)
        if text is not None and (
            text in EVERY_REASON | R.KUBELET_ADMISSION_REASONS or text.partition(":")[0] in EVERY_REASON
        ):
            hits.append(f"{path.name}:{node.lineno}: {text!r}")  # type: ignore[attr-defined]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in ("warning", "normal", "object_warning") and len(node.args) >= 2:
                text = literal(node.args[1])
            elif method == "labels" and node.args and "failures" in ast.unparse(node.func.value):
                text = literal(node.args[0])
            else:
                text = None
            if text is not None:
                hits.append(f"{path.name}:{node.lineno}: {method}({text!r})")
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if literal(key) == "reason" and literal(value) is not None:
                    hits.append(f"{path.name}:{node.lineno}: reason {literal(value)!r}")
    return hits


def test_the_product_spells_no_reason_outside_the_rules() -> None:
    paths = [
        path
        for path in sorted((ROOT / "kube_gpu_scheduler").rglob("*.py"))
        if (ROOT / "kube_gpu_scheduler" / "domain" / "rules") not in path.parents
    ]
    assert any(path.parent.name == "scheduler" for path in paths)
    assert [hit for path in paths for hit in _reason_literals(path)] == []


def test_the_literal_check_sees_a_reason(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        'metrics.failures.labels("Oops").inc()\n'
        'events.warning(pod, "Scheduled", note)\n'
        'x = {"reason": "Nope"}\n'
        'y = f"APIError: {err}"\n'
    )
    # "Scheduled" twice: a catalogued reason, and at an Event's reason; "APIError:" opens a note.
    assert len(_reason_literals(planted)) == 5
