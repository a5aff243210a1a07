"""Tenancy: who may pin which nodes' GPUs, and how many (``GPUPinningPolicy``, pure).

A ``GPUPinningPolicy`` (``gpu-scheduler.io/v1alpha1``, cluster-scoped, written by admins)
grants the namespaces its ``namespaceSelector`` selects the GPUs of the nodes its
``nodeSelector`` selects, up to ``maxGPUs`` GPUs held through it by all those namespaces
together, and, per GPU type (the node label ``nvidia.com/gpu.product`` that GPU feature
discovery sets), up to ``gpuTypes[].maxGPUs``. With tenancy on, a namespace may pin a GPU
only where some policy grants it that node; a GPU a namespace holds on a node counts against
*every* policy that grants that namespace that node (conservative, and derived from the
ledger alone: nothing to remember across restarts), and a replica binds only within every
such policy's limits.

A policy may also forbid shared GPUs (``spec.allowSharedGPUs: false``; default true): then a
map that gives one GPU to several of its replicas is refused in every namespace it selects
(:mod:`kube_gpu_scheduler.domain.sharing`).

This module is the policy's model (:class:`Policy`), the counts of one policy
(:class:`Held`), its ``status`` (:func:`status_of`) and the resolved grants the scheduler
publishes for admission (:class:`Grants`: policy -> nodes, namespace -> policies, the
policies that forbid sharing, as a ConfigMap's ``data`` that the ValidatingAdmissionPolicy and
the webhook read). The rules and their messages are
:mod:`kube_gpu_scheduler.domain.rules.tenancy` and :mod:`kube_gpu_scheduler.domain.rules.sharing`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kube_gpu_scheduler.domain.selectors import Selector, SelectorError, parse_selector

GROUP = "gpu-scheduler.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPUPinningPolicy"
PLURAL = "gpupinningpolicies"
# The GPU type of a node's GPUs (GPU feature discovery's label); DRA's device attribute productName.
PRODUCT_LABEL = "nvidia.com/gpu.product"
# The grants ConfigMap's keys: ``policy.<name>`` -> the node names it selects, comma-separated;
# ``ns.<namespace>`` -> the policies whose namespaceSelector selects it; ``unshared.<name>`` ->
# "true" for each policy whose spec.allowSharedGPUs is false.
POLICY_KEY = "policy."
NAMESPACE_KEY = "ns."
UNSHARED_KEY = "unshared."
# How many holders a message names before it says "and N more".
NAMED_HOLDERS = 5
# Status conditions (types): the scheduler enforces the policy; it is at (or over) a limit.
ENFORCED = "Enforced"
LIMIT_REACHED = "LimitReached"


def labels_of(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    meta = (obj or {}).get("metadata") or {}
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def product_of(node: Mapping[str, Any] | None) -> str:
    """The GPU type of a node's GPUs ('' when the node does not say)."""
    return str(labels_of(node).get(PRODUCT_LABEL) or "")


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SelectorError(f"{where} must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Policy:
    """One GPUPinningPolicy, parsed once. A policy whose spec does not parse (``problem``)
    grants nothing (the CRD's schema refuses most such specs; this is the rest)."""

    name: str
    generation: int = 0
    namespaces: Selector = field(default_factory=Selector)
    nodes: Selector = field(default_factory=Selector)
    max_gpus: int | None = None
    types: tuple[tuple[str, int], ...] = ()  # (product, maxGPUs), sorted
    problem: str = ""
    # spec.allowSharedGPUs: false forbids maps that give one GPU to several replicas.
    allow_sharing: bool = True

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Policy:
        meta = obj.get("metadata") or {}
        name, generation = str(meta.get("name") or ""), int(meta.get("generation") or 0)
        found = obj.get("spec")
        spec: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        try:
            if "namespaceSelector" not in spec or "nodeSelector" not in spec:
                raise SelectorError("spec.namespaceSelector and spec.nodeSelector are required")
            namespaces = parse_selector(spec["namespaceSelector"], "spec.namespaceSelector")
            nodes = parse_selector(spec["nodeSelector"], "spec.nodeSelector")
            most = spec.get("maxGPUs")
            max_gpus = None if most is None else _count(most, "spec.maxGPUs")
            types: dict[str, int] = {}
            for i, item in enumerate(spec.get("gpuTypes") or []):
                product = item.get("product") if isinstance(item, Mapping) else None
                if not isinstance(product, str) or not product or product in types:
                    raise SelectorError(f"spec.gpuTypes[{i}].product must be a product named once")
                types[product] = _count(item.get("maxGPUs"), f"spec.gpuTypes[{i}].maxGPUs")
            sharing = spec.get("allowSharedGPUs", True)
            if not isinstance(sharing, bool):
                raise SelectorError(f"spec.allowSharedGPUs must be true or false, got {sharing!r}")
        except SelectorError as err:
            return cls(name, generation, problem=str(err))
        return cls(name, generation, namespaces, nodes, max_gpus, tuple(sorted(types.items())), "", sharing)

    def selects_namespace(self, labels: Mapping[str, str]) -> bool:
        return not self.problem and self.namespaces.matches(labels)

    def selects_node(self, labels: Mapping[str, str]) -> bool:
        return not self.problem and self.nodes.matches(labels)

    def limits(self, product: str) -> list[tuple[str, int]]:
        """``(what, most)`` of each limit a GPU of ``product`` counts against."""
        out = [] if self.max_gpus is None else [("spec.maxGPUs", self.max_gpus)]
        out += [(f"spec.gpuTypes[{p}]", most) for p, most in self.types if p == product and product]
        return out


@dataclass
class Held:
    """What the namespaces of one policy hold through it: GPUs by (namespace, product)."""

    total: int = 0
    by: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, namespace: str, product: str, gpus: int) -> None:
        self.total += gpus
        key = (namespace, product)
        left = self.by.get(key, 0) + gpus
        if left:
            self.by[key] = left
        else:
            self.by.pop(key, None)

    def of_type(self, product: str) -> int:
        return sum(n for (_, p), n in self.by.items() if p == product)

    def counted(self, what: str, product: str) -> int:
        """What counts against one limit of :meth:`Policy.limits`."""
        return self.total if what == "spec.maxGPUs" else self.of_type(product)


def _condition(
    kind: str, true: bool, reason: str, message: str, old: Sequence[Any], now: str
) -> dict[str, Any]:
    status = "True" if true else "False"
    since = now
    for cond in old:
        if isinstance(cond, Mapping) and cond.get("type") == kind and cond.get("status") == status:
            since = str(cond.get("lastTransitionTime") or now)
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}


def status_of(
    policy: Policy,
    held: Held,
    nodes: int,
    old: Mapping[str, Any] | None,
    now: str,
    reasons: Mapping[str, str],
) -> dict[str, Any]:
    """The policy's ``status``: GPUs held now (in all, per namespace and type), the typed limits'
    counts, the nodes it selects, and its conditions (``reasons``: condition type -> reason
    for True, and ``<type>/False`` for False; the catalogue's words)."""
    old_conditions = list((old or {}).get("conditions") or [])
    per_ns: dict[str, dict[str, int]] = {}
    for (ns, product), gpus in sorted(held.by.items()):
        per_ns.setdefault(ns, {})[product] = gpus
    namespaces = [
        {
            "namespace": ns,
            "gpus": sum(types.values()),
            "types": [{"product": p, "gpus": n} for p, n in sorted(types.items()) if p],
        }
        for ns, types in sorted(per_ns.items())
    ]
    at_limit = [f"{what} {most}" for what, most in policy.limits("") if held.total >= most] + [
        f"gpuTypes[{p}] {most}" for p, most in policy.types if held.of_type(p) >= most
    ]
    enforced = not policy.problem
    return {
        "observedGeneration": policy.generation,
        "held": held.total,
        "nodes": nodes,
        "namespaces": namespaces,
        "types": [{"product": p, "maxGPUs": most, "held": held.of_type(p)} for p, most in policy.types],
        "conditions": [
            _condition(
                ENFORCED,
                enforced,
                reasons[ENFORCED if enforced else f"{ENFORCED}/False"],
                f"grants {nodes} nodes; every binding is counted" if enforced else policy.problem,
                old_conditions,
                now,
            ),
            _condition(
                LIMIT_REACHED,
                bool(at_limit),
                reasons[LIMIT_REACHED if at_limit else f"{LIMIT_REACHED}/False"],
                ("at " + ", ".join(at_limit)) if at_limit else "below every limit",
                old_conditions,
                now,
            ),
        ],
    }


def same_status(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Equal but for the conditions' transition times (no write for those alone)."""

    def bare(s: Mapping[str, Any] | None) -> Any:
        s = dict(s or {})
        s["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in s.get("conditions") or []
            if isinstance(c, Mapping)
        ]
        return s

    return bool(bare(a) == bare(b))


@dataclass(frozen=True)
class Grants:
    """The resolved grants: which nodes each policy selects, which policies select each namespace,
    which policies forbid shared GPUs."""

    nodes_of: Mapping[str, frozenset[str]] = field(default_factory=dict)
    policies_of: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unshared: frozenset[str] = frozenset()

    @classmethod
    def resolve(
        cls,
        policies: Iterable[Policy],
        namespaces: Mapping[str, Mapping[str, str]],
        nodes: Mapping[str, Mapping[str, str]],
    ) -> Grants:
        """From the policies and the labels of every namespace and node."""
        valid = sorted((p for p in policies if not p.problem), key=lambda p: p.name)
        nodes_of = {
            p.name: frozenset(n for n, labels in nodes.items() if p.selects_node(labels)) for p in valid
        }
        policies_of: dict[str, tuple[str, ...]] = {}
        for ns, labels in namespaces.items():
            granting = tuple(p.name for p in valid if p.selects_namespace(labels))
            if granting:
                policies_of[ns] = granting
        return cls(nodes_of, policies_of, frozenset(p.name for p in valid if not p.allow_sharing))

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> Grants:
        """From the ConfigMap's ``data`` (what :meth:`to_data` wrote)."""

        def split(value: Any) -> list[str]:
            return [v for v in str(value or "").split(",") if v]

        nodes_of, policies_of, unshared = {}, {}, set()
        for key, value in (data or {}).items():
            if key.startswith(POLICY_KEY):
                nodes_of[key[len(POLICY_KEY) :]] = frozenset(split(value))
            elif key.startswith(NAMESPACE_KEY):
                policies_of[key[len(NAMESPACE_KEY) :]] = tuple(split(value))
            elif key.startswith(UNSHARED_KEY) and str(value) == "true":
                unshared.add(key[len(UNSHARED_KEY) :])
        return cls(nodes_of, policies_of, frozenset(unshared))

    def to_data(self) -> dict[str, str]:
        data = {f"{POLICY_KEY}{p}": ",".join(sorted(nodes)) for p, nodes in self.nodes_of.items()}
        data.update({f"{NAMESPACE_KEY}{ns}": ",".join(ps) for ns, ps in self.policies_of.items()})
        data.update({f"{UNSHARED_KEY}{p}": "true" for p in self.unshared})
        return dict(sorted(data.items()))

    def considered(self, namespace: str) -> tuple[str, ...]:
        """The policies whose namespaceSelector selects ``namespace``."""
        return tuple(self.policies_of.get(namespace, ()))

    def granted(self, namespace: str, node: str) -> bool:
        return any(node in self.nodes_of.get(p, ()) for p in self.considered(namespace))

    def forbids_sharing(self, namespace: str) -> str | None:
        """The first policy (by name) that selects ``namespace`` and forbids shared GPUs, or None."""
        return next((p for p in self.considered(namespace) if p in self.unshared), None)


def holders_text(holders: Sequence[str]) -> str:
    """``"a/w-0 node1:0,1; b/x-0 node2:3"``, at most NAMED_HOLDERS of them, then how many more."""
    shown = "; ".join(holders[:NAMED_HOLDERS])
    more = len(holders) - NAMED_HOLDERS
    return shown + (f"; and {more} more" if more > 0 else "") if holders else "none"
