"""The mapped GPUs: named so they can be injected, the node reports them, every index exists,
no other pod holds one.

The GPU part of the map, which kube-scheduler has no plugin for: the node's
``nvidia.com/gpu`` count bounds the indices (and the number of GPUs named by UUID),
and the scheduler's ledger says who holds each node:GPU pair. A GPU named by PCI bus
ID can only be given in DRA mode (a ResourceClaim): CUDA_VISIBLE_DEVICES takes an
index or a UUID, never a PCI bus ID.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from kube_gpu_scheduler.domain.resources import GPU_RESOURCE, node_gpus
from kube_gpu_scheduler.domain.rules.framework import (
    NEVER,
    ON_GPU_HOLDER,
    ON_NODE,
    REFUSE,
    WARN,
    Finding,
    emits,
    rule,
)
from kube_gpu_scheduler.domain.rules.node import NOT_READ
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, GPU, Entry, excerpt
from kube_gpu_scheduler.domain.sharing import Sharing, sharing_of

GPU_NAME_NEEDS_DRA = rule(
    "GPUNameNeedsDRA",
    "GPUNameInjectable",
    "outside DRA mode every mapped GPU is named by index or UUID: CUDA_VISIBLE_DEVICES "
    "cannot take a PCI bus ID",
    NEVER,
    "`gpu-scheduler-map validate` does not know whether the cluster runs DRA mode: it warns",
    scheduler=REFUSE,
    mutate=REFUSE,
    validate=REFUSE,
    lint=WARN,
)
GPU_COUNT_NEEDS_DRA = rule(
    "GPUCountNeedsDRA",
    "GPUCountChosen",
    "outside DRA mode every entry names its GPUs: a count entry (NODE:auto(N)) is given GPUs "
    "only by a ResourceClaim that kube-scheduler allocates",
    NEVER,
    "`gpu-scheduler-map validate` does not know whether the cluster runs DRA mode: it warns",
    scheduler=REFUSE,
    mutate=REFUSE,
    validate=REFUSE,
    lint=WARN,
)
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
    f"every mapped GPU index is below the node's {GPU_RESOURCE} count (GPUs named by UUID: "
    "no more of them than that count)",
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
        self, node: str, gpus: Iterable[GPU], exclude_uid: str | None = None, sharing: Sharing | None = None
    ) -> list[tuple[GPU, str]]:
        """``(gpu, "namespace/name")`` for every mapped GPU held by another active pod, less the
        holders ``sharing`` allows beside the pod (its mates by its map)."""
        ...


def gpu_count(node: Mapping[str, Any]) -> int | None:
    """The node's GPU count (:func:`kube_gpu_scheduler.domain.resources.node_gpus`); None when not reported."""
    return node_gpus(node.get("status"))


PCI_NEEDS_DRA = (
    "PCI bus IDs name GPUs only in DRA mode (chart value dra.enabled=true), because "
    "CUDA_VISIBLE_DEVICES cannot take one; name the GPU by index or UUID"
)


COUNT_NEEDS_DRA = (
    "a count of GPUs (auto(N)) is given only in DRA mode (chart value dra.enabled=true), where "
    "kube-scheduler allocates N GPUs of the node to a ResourceClaim of the replica; in this mode name "
    "the GPUs (indices or UUIDs)"
)


@emits(GPU_NAME_NEEDS_DRA, GPU_COUNT_NEEDS_DRA)
def pci_needs_dra(entries: Iterable[Entry], dra: bool = False) -> list[Finding]:
    """Outside DRA mode: GPUNameNeedsDRA, once, when any of ``entries`` names its GPUs by PCI bus
    ID, then GPUCountNeedsDRA, once, when any is a count entry (``NODE:auto(N)``).

    Each message names the first such entry (its line and ordinal) and counts the others.
    """
    if dra:
        return []
    entries = list(entries)
    out: list[Finding] = []
    for reason, found, verb, why in (
        (
            GPU_NAME_NEEDS_DRA,
            [e for e in entries if e.kind == "pci" and not e.count],
            "is mapped to",
            PCI_NEEDS_DRA,
        ),
        (GPU_COUNT_NEEDS_DRA, [e for e in entries if e.count], "asks for", COUNT_NEEDS_DRA),
    ):
        if not found:
            continue
        first = found[0]
        more = len(found) - 1
        others = f" (and {more} more entr{'y' if more == 1 else 'ies'})" if more else ""
        out.append(
            Finding(
                reason,
                f"{ANNOTATION} line {first.line}: replica {first.ordinal} {verb} "
                f"{excerpt(f'{first.node}:{first.devices}')}{others}: {why}",
            )
        )
    return out


@emits(NO_GPU_RESOURCE, GPU_OUT_OF_RANGE)
def gpu_index_findings(entry: Entry, count: int | None) -> list[Finding]:
    """NoGPUResource / GPUIndexOutOfRange for one replica's entry, given its node's GPU count.

    Indices are checked against the count; for GPUs named by UUID only their number is (which
    UUID is which index only the node knows); PCI bus IDs are GPUNameNeedsDRA's (DRA mode checks
    them against the node's ResourceSlices)."""
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
    if entry.kind == "uuid":
        if len(entry.gpus) <= count:
            return []
        return [
            Finding(
                GPU_OUT_OF_RANGE,
                f"{len(entry.gpus)} GPUs named by UUID on node {entry.node!r}, which reports "
                f"{GPU_RESOURCE} allocatable={count}: a node cannot have that many ({where})",
            )
        ]
    missing = [g for g in entry.indices if g >= count]
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
    """No other active pod holds any of the mapped node:GPU pairs, but for the pod's mates: the
    replicas of its StatefulSet that its map gives the same GPU (:mod:`kube_gpu_scheduler.domain.sharing`)."""
    uid = (pod.get("metadata") or {}).get("uid")
    return gpus_in_use(
        entry, ledger.holders(entry.node, entry.gpus, exclude_uid=uid, sharing=sharing_of(pod))
    )


@emits(GPU_IN_USE)
def gpus_in_use(entry: Entry, held: Iterable[tuple[GPU, str]]) -> list[Finding]:
    """GPUInUse: one refusal per ``(gpu, "namespace/name")`` that holds a GPU of ``entry``."""
    return [
        Finding(GPU_IN_USE, f"GPU {entry.node}:{gpu} is held by pod {holder}") for gpu, holder in sorted(held)
    ]
