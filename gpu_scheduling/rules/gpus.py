"""The mapped GPUs: the node reports them, every index exists, no other pod holds one.

The GPU part of the map, which kube-scheduler has no plugin for: the node's
``nvidia.com/gpu`` count bounds the indices, and the scheduler's ledger says who
holds each node:GPU pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from gpu_scheduling.resources import GPU_RESOURCE, node_gpus
from gpu_scheduling.rules.framework import ON_GPU_HOLDER, ON_NODE, REFUSE, WARN, Finding, emits, rule
from gpu_scheduling.rules.node import NOT_READ
from gpu_scheduling.schedmap import Entry

NO_GPU_RESOURCE = rule(
    "NoGPUResource",
    "NodeReportsGPUs",
    f"the mapped node reports {GPU_RESOURCE} (allocatable, else capacity)",
    {ON_NODE},
    NOT_READ,
    scheduler=REFUSE,
    validate=WARN,
)
GPU_OUT_OF_RANGE = rule(
    "GPUIndexOutOfRange",
    "GPUIndexExists",
    f"every mapped GPU index is below the node's {GPU_RESOURCE} count",
    {ON_NODE},
    NOT_READ,
    scheduler=REFUSE,
    validate=WARN,
)
GPU_IN_USE = rule(
    "GPUInUse",
    "GPUsFree",
    "no other active pod holds a mapped GPU (the ledger)",
    {ON_GPU_HOLDER},
    "only the scheduler keeps the ledger",
    scheduler=REFUSE,
)


class Holders(Protocol):
    """What the checks need from the ledger."""

    def holders(
        self, node: str, gpus: Iterable[int], exclude_uid: str | None = None
    ) -> list[tuple[int, str]]:
        """``(gpu, "namespace/name")`` for every mapped GPU held by another active pod."""
        ...


def gpu_count(node: Mapping[str, Any]) -> int | None:
    """The node's GPU count (:func:`gpu_scheduling.resources.node_gpus`); None when not reported."""
    return node_gpus(node.get("status"))


@emits(NO_GPU_RESOURCE, GPU_OUT_OF_RANGE)
def gpu_index_findings(entry: Entry, count: int | None) -> list[Finding]:
    """NoGPUResource / GPUIndexOutOfRange for one replica's entry, given its node's GPU count."""
    where = f"replica {entry.ordinal} is mapped to {entry.node}:{entry.devices}"
    if count is None:
        return [
            Finding(
                NO_GPU_RESOURCE,
                f"node {entry.node!r} reports no {GPU_RESOURCE} in allocatable or capacity, so GPU "
                f"{entry.devices} cannot be checked: it has no GPUs, or its device plugin is not "
                f"running ({where})",
            )
        ]
    missing = [g for g in entry.gpus if g >= count]
    if not missing:
        return []
    indices = ", ".join(str(g) for g in missing)
    valid = f"valid indices 0-{count - 1}" if count else "it has none"
    return [
        Finding(
            GPU_OUT_OF_RANGE,
            f"GPU {indices} on node {entry.node!r} does not exist: the node reports "
            f"{GPU_RESOURCE} allocatable={count} ({valid}; {where})",
        )
    ]


def check_gpus(pod: Mapping[str, Any], entry: Entry, ledger: Holders) -> list[Finding]:
    """No other active pod holds any of the mapped node:GPU pairs."""
    uid = (pod.get("metadata") or {}).get("uid")
    return gpus_in_use(entry, ledger.holders(entry.node, entry.gpus, exclude_uid=uid))


@emits(GPU_IN_USE)
def gpus_in_use(entry: Entry, held: Iterable[tuple[int, str]]) -> list[Finding]:
    """GPUInUse: one refusal per ``(gpu, "namespace/name")`` that holds a GPU of ``entry``."""
    return [
        Finding(GPU_IN_USE, f"GPU {entry.node}:{gpu} is held by pod {holder}") for gpu, holder in sorted(held)
    ]
