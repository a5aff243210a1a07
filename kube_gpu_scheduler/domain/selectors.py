"""Label selectors (``metav1.LabelSelector``), as the apiserver reads them.

``matchLabels`` (each key equal to its value) ANDed with ``matchExpressions`` (``In``,
``NotIn``, ``Exists``, ``DoesNotExist``); an empty selector (``{}``) selects everything. A
GPUPinningPolicy's ``namespaceSelector`` and ``nodeSelector`` and the namespaces injection
serves (the chart's ``injection.namespaceSelector`` with its exclusions) are such selectors.
Pure: a selector is parsed once into a :class:`Selector`, then matched against label dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

IN, NOT_IN, EXISTS, DOES_NOT_EXIST = "In", "NotIn", "Exists", "DoesNotExist"
OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST)
# How many values a description lists before it says "..." (messages stay short).
DESCRIBED_VALUES = 4


class SelectorError(ValueError):
    """A selector the apiserver would refuse; the message says which field and why."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == EXISTS:
            return self.key in labels
        if self.operator == DOES_NOT_EXIST:
            return self.key not in labels
        if self.operator == IN:
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values  # NotIn

    def __str__(self) -> str:
        if self.operator == EXISTS:
            return self.key
        if self.operator == DOES_NOT_EXIST:
            return f"!{self.key}"
        values = sorted(self.values)
        shown = ",".join(values[:DESCRIBED_VALUES]) + (",..." if len(values) > DESCRIBED_VALUES else "")
        if self.operator == IN and len(values) == 1:
            return f"{self.key}={values[0]}"
        return f"{self.key} {'in' if self.operator == IN else 'notin'} ({shown})"


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        have = labels or {}
        return all(r.matches(have) for r in self.requirements)

    def failing(self, labels: Mapping[str, str] | None) -> list[Requirement]:
        """The requirements ``labels`` do not meet (for a message)."""
        have = labels or {}
        return [r for r in self.requirements if not r.matches(have)]

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements) or "(every one)"


def parse_selector(obj: Any, where: str = "selector") -> Selector:
    """A ``metav1.LabelSelector`` as JSON; :class:`SelectorError` names the bad field."""
    if obj is None:
        obj = {}
    if not isinstance(obj, Mapping):
        raise SelectorError(f"{where} must be an object, got {type(obj).__name__}")
    reqs: list[Requirement] = []
    labels = obj.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise SelectorError(f"{where}.matchLabels must be an object")
    for key, value in sorted(labels.items()):
        if not isinstance(key, str) or not isinstance(value, str):
            raise SelectorError(f"{where}.matchLabels must map strings to strings")
        reqs.append(Requirement(key, IN, frozenset({value})))
    exprs = obj.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise SelectorError(f"{where}.matchExpressions must be a list")
    for i, expr in enumerate(exprs):
        at = f"{where}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping) or not isinstance(expr.get("key"), str) or not expr.get("key"):
            raise SelectorError(f"{at} needs a key")
        op, values = expr.get("operator"), expr.get("values") or []
        if op not in OPERATORS:
            raise SelectorError(f"{at}.operator must be one of {', '.join(OPERATORS)}, got {op!r}")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"{at}.values must be a list of strings")
        if op in (IN, NOT_IN) and not values:
            raise SelectorError(f"{at}: operator {op} needs values")
        if op in (EXISTS, DOES_NOT_EXIST) and values:
            raise SelectorError(f"{at}: operator {op} takes no values")
        reqs.append(Requirement(expr["key"], op, frozenset(values)))
    return Selector(tuple(reqs))
