"""Room on the mapped node: node affinity, resources, host ports, and the kubelet's own verdict.

kube-scheduler's NodeAffinity, NodeResourcesFit and NodePorts filters (the
arithmetic is :mod:`kube_gpu_scheduler.domain.fit`), against every non-terminated pod
bound to the node whoever placed it, so the kubelet does not refuse what we
bind; and KubeletRefused, the scheduler's memory of a kubelet that did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kube_gpu_scheduler.domain.fit import (
    PODS,
    NodeTotals,
    affinity_mismatch,
    allocatable,
    host_ports,
    pod_requests,
    port_conflicts,
    shortfalls,
    show,
)
from kube_gpu_scheduler.domain.rules.framework import (
    ON_NODE,
    ON_NODE_PODS,
    ON_POD,
    REFUSE,
    Finding,
    emits,
    rule,
)
from kube_gpu_scheduler.domain.schedmap import Entry

NODE_AFFINITY = rule(
    "NodeAffinityMismatch",
    "NodeAffinity",
    "the mapped node matches the pod's nodeSelector and required node affinity (every "
    "operator, matchFields too)",
    {ON_NODE},
    "node labels change by the minute: checked when binding only",
    scheduler=REFUSE,
)
INSUFFICIENT_RESOURCES = rule(
    "InsufficientResources",
    "NodeResourcesFit",
    "the pod's requests (cpu, memory, ephemeral-storage, hugepages, extended resources, a pod "
    "slot) fit the node's allocatable minus the requests of every non-terminated pod bound there",
    {ON_NODE, ON_NODE_PODS},
    "what a node has free changes by the second: checked when binding only",
    scheduler=REFUSE,
)
HOST_PORT_CONFLICT = rule(
    "HostPortConflict",
    "NodePorts",
    "no other pod on the mapped node takes one of the pod's host ports",
    {ON_NODE_PODS},
    "checked when binding only",
    scheduler=REFUSE,
)
KUBELET_REFUSED = rule(
    "KubeletRefused",
    "NotRefusedByKubelet",
    "the node's kubelet has not refused this replica at admission (OutOfcpu, NodeAffinity, ...) "
    "since the node, the pods on it or the pod last changed",
    {ON_NODE, ON_NODE_PODS, ON_POD},
    "only the scheduler sees pods fail",
    scheduler=REFUSE,
)


class NodeUse(Protocol):
    """What the fit checks need from the scheduler's index of the pods on each node."""

    def totals(self, node: str, exclude_uid: str | None = None) -> NodeTotals:
        """The summed footprint of the non-terminated pods bound to ``node`` (and reserved for it)."""
        ...


@emits(NODE_AFFINITY)
def check_fit(pod: Mapping[str, Any], entry: Entry, node: Mapping[str, Any], usage: NodeUse) -> list[Finding]:
    """NodeAffinityMismatch, InsufficientResources and HostPortConflict on the mapped node."""
    spec = pod.get("spec") or {}
    where = f"replica {entry.ordinal} is mapped to it"
    refusals: list[Finding] = []
    mismatch = affinity_mismatch(spec, node)
    if mismatch is not None:
        refusals.append(
            Finding(NODE_AFFINITY, f"node {entry.node!r} does not match the pod's {mismatch} ({where})")
        )
    totals = usage.totals(entry.node, exclude_uid=(pod.get("metadata") or {}).get("uid"))
    return refusals + room_refusals(pod, entry, node, totals)


@emits(INSUFFICIENT_RESOURCES, HOST_PORT_CONFLICT)
def room_refusals(
    pod: Mapping[str, Any], entry: Entry, node: Mapping[str, Any], totals: NodeTotals
) -> list[Finding]:
    """InsufficientResources and HostPortConflict, given what the node's other pods take."""
    spec = pod.get("spec") or {}
    where = f"replica {entry.ordinal} is mapped to it"
    refusals: list[Finding] = []
    for short in shortfalls(pod_requests(spec), allocatable(node), totals):
        if short.resource == PODS:
            text = (
                f"Too many pods: node {entry.node!r} has {short.used} of {short.allocatable} pod slots "
                f"taken ({where})"
            )
        else:
            name = short.resource
            text = (
                f"Insufficient {name}: the pod requests {show(name, short.requested)}, node "
                f"{entry.node!r} has {show(name, short.free)} of {show(name, short.allocatable)} free "
                f"({show(name, short.used)} requested by {totals.pods} pods there; {where})"
            )
        refusals.append(Finding(INSUFFICIENT_RESOURCES, text))
    for port, holder in port_conflicts(host_ports(spec), totals):
        refusals.append(
            Finding(HOST_PORT_CONFLICT, f"host port {port} on node {entry.node!r} is taken by pod {holder}")
        )
    return refusals


@emits(KUBELET_REFUSED)
def kubelet_refused(entry: Entry, reason: str, message: str, ago_s: float) -> Finding:
    """KubeletRefused: the node refused this replica at admission and nothing has changed since."""
    said = f"{reason}: {message}" if message else reason
    return Finding(
        KUBELET_REFUSED,
        f"node {entry.node!r} refused replica {entry.ordinal} at admission {ago_s:.0f}s ago ({said[:300]}); "
        "not binding it there again until the node, the pods on it or this pod change",
    )
