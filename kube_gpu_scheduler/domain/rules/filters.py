"""The scheduler's filter pipeline: every rule it evaluates, in order, into one :class:`Decision`.

kube-scheduler's framework runner, for one candidate node (the mapped one): the
pod's own rules (:mod:`.pod`), then the node's (:mod:`.node`), its GPUs'
(:mod:`.gpus`) and the room on it (:mod:`.fit`). The extender and the webhook
call :func:`evaluate` and :func:`resolve` too; nothing here talks to the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.domain.fit import allocatable
from kube_gpu_scheduler.domain.resources import gpu_requesting_containers
from kube_gpu_scheduler.domain.rules.findings import gpu_resource_requested
from kube_gpu_scheduler.domain.rules.fit import NodeUse, check_fit
from kube_gpu_scheduler.domain.rules.framework import Finding
from kube_gpu_scheduler.domain.rules.gpus import (
    Holders,
    check_gpus,
    gpu_count,
    gpu_index_findings,
    pci_needs_dra,
)
from kube_gpu_scheduler.domain.rules.node import BLOCKING_EFFECTS, node_state_findings, ready_condition
from kube_gpu_scheduler.domain.rules.pod import check_injected, pod_entry
from kube_gpu_scheduler.domain.schedmap import Entry


@dataclass(frozen=True)
class Decision:
    """The outcome of the checks: ``entry`` to bind to, or the refusals.

    ``entry`` is set whenever the map resolved (also when refused), so the
    caller knows which node a waiting pod waits for.
    """

    ordinal: int | None
    entry: Entry | None
    refusals: tuple[Finding, ...] = ()
    # Findings that do not block binding (the scheduler's warning Events).
    warnings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        return self.entry is not None and not self.refusals

    @property
    def reason(self) -> str:
        return self.refusals[0].reason if self.refusals else ""

    @property
    def message(self) -> str:
        return "; ".join(r.message for r in self.refusals)


def node_signature(node: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """Everything the checks read from a node: when it changes, waiting pods are retried."""
    if node is None:
        return ()
    spec = node.get("spec") or {}
    ready = ready_condition(node) or {}
    taints = tuple(
        sorted(
            (t.get("key") or "", t.get("value") or "", t.get("effect") or "")
            for t in spec.get("taints") or []
            if t.get("effect") in BLOCKING_EFFECTS
        )
    )
    labels = tuple(sorted(((node.get("metadata") or {}).get("labels") or {}).items()))
    offered = tuple(sorted(allocatable(node).items()))
    return (bool(spec.get("unschedulable")), ready.get("status"), taints, gpu_count(node), labels, offered)


def check_node(pod: Mapping[str, Any], entry: Entry, node: Mapping[str, Any] | None) -> list[Finding]:
    """Node exists, is not cordoned, is Ready, its taints are tolerated, the GPU indices exist."""
    refusals = node_state_findings(pod, entry, node)
    if node is not None:
        refusals.extend(gpu_index_findings(entry, gpu_count(node)))
    return refusals


def resolve(pod: Mapping[str, Any]) -> Decision:
    """The pod's ordinal and map entry, or why there is none."""
    ordinal, entry, why_not = pod_entry(pod)
    return Decision(ordinal, entry, (why_not,) if why_not is not None else ())


def evaluate(
    pod: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
    ledger: Holders,
    require_injection: bool = True,
    usage: NodeUse | None = None,
    dra: bool = False,
) -> Decision:
    """All the checks, in order; the first refusal names the reason, the message lists them all.

    The fit checks (:func:`~kube_gpu_scheduler.domain.rules.fit.check_fit`) run when ``usage``, the index
    of what the pods on each node take, is given: the scheduler passes it.

    A pod that lacks its injection is refused with that reason alone: nothing
    about the node can make it bindable, since its containers cannot change. So is
    a pod whose entry names its GPUs by PCI bus ID outside DRA mode (``dra``): no
    variable can give it those GPUs.
    """
    decision = resolve(pod)
    if decision.entry is None:
        return decision
    entry = decision.entry
    needs_dra = pci_needs_dra([entry], dra)
    if needs_dra:
        return Decision(decision.ordinal, entry, tuple(needs_dra))
    if require_injection:
        not_injected = check_injected(pod, entry)
        if not_injected:
            return Decision(decision.ordinal, entry, tuple(not_injected))
    node = nodes.get(entry.node)
    refusals = check_node(pod, entry, node)
    if node is not None and usage is not None:
        refusals += check_fit(pod, entry, node, usage)
    refusals += check_gpus(pod, entry, ledger)
    requesters = gpu_requesting_containers(pod.get("spec"))
    warnings = (gpu_resource_requested(requesters),) if requesters else ()
    return Decision(decision.ordinal, entry, tuple(refusals), warnings)
