"""Shared GPUs' rules: where sharing is forbidden, a map that shares is refused; elsewhere it is
admitted with a warning that names each shared GPU.

A GPU that several entries of one map name is shared by those replicas
(:meth:`kube_gpu_scheduler.domain.schedmap.SchedulingMap.shared`). An operator forbids that for a
release (chart value ``sharing.allowed=false``) or for the namespaces a GPUPinningPolicy selects
(``spec.allowSharedGPUs: false``); the words are :mod:`kube_gpu_scheduler.domain.sharing`'s, and the
chart's ``map-policy.yaml`` and ``tenancy-policy.yaml`` say the same in CEL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import pod_map
from kube_gpu_scheduler.domain.rules.filters import Decision
from kube_gpu_scheduler.domain.rules.framework import (
    ON_POD,
    ON_POLICY,
    REFUSE,
    WARN,
    Finding,
    emits,
    rule,
)
from kube_gpu_scheduler.domain.schedmap import GPU, Entry, MapError, Problem, SchedulingMap, sharing_problems
from kube_gpu_scheduler.domain.sharing import RELEASE_FORBIDS, warning

GPU_SHARING_FORBIDDEN = rule(
    "GPUSharingForbidden",
    "SharingAllowed",
    "a map that gives one GPU to several replicas is allowed: by the release (chart value "
    "sharing.allowed) and by every GPUPinningPolicy that selects the namespace (spec.allowSharedGPUs)",
    {ON_POD, ON_POLICY},
    "the CLI knows no policies, nor the release's settings but for --no-sharing (then an error)",
    scheduler=REFUSE,
    mutate=REFUSE,
    validate=REFUSE,
)
GPU_SHARED = rule(
    "GPUShared",
    "SharingSeen",
    "a GPU that several entries of the map name is shared by those replicas (time-sliced, no memory "
    "isolation): said at admission and by the CLI so that a typo is seen at once",
    {ON_POD},
    "the scheduler binds shared GPUs as mapped",
    mutate=WARN,
    validate=WARN,
    lint=WARN,
)


@emits(GPU_SHARING_FORBIDDEN)
def sharing_forbidden(smap: SchedulingMap, why: str) -> list[Finding]:
    """GPUSharingForbidden at admission: every entry that names a GPU an earlier entry names
    (:func:`~kube_gpu_scheduler.domain.schedmap.sharing_problems`), each ending with ``why``
    (:data:`~kube_gpu_scheduler.domain.sharing.RELEASE_FORBIDS`, or
    :func:`~kube_gpu_scheduler.domain.sharing.tenant_forbids`); nothing for a map that shares
    nothing."""
    err = sharing_problems(smap, why)
    return [] if err is None else [Finding(GPU_SHARING_FORBIDDEN, str(err))]


@emits(GPU_SHARING_FORBIDDEN)
def replica_sharing_forbidden(smap: SchedulingMap, entry: Entry, why: str) -> Finding | None:
    """GPUSharingForbidden for the scheduler: ``entry``'s replica shares a GPU (None when it
    does not). The words of :func:`sharing_problems` for its line: the first of its GPUs that an
    earlier entry (line, then ordinal) names and the first entry that names it; for the first
    sharer of its GPUs, the first other entry that names one."""
    mine = (entry.line, entry.ordinal)
    found: tuple[GPU, Entry] | None = None
    for gpu in entry.gpus:
        sharers = [smap[o] for o in smap.shared().get((entry.node, gpu), ()) if o != entry.ordinal]
        if not sharers:
            continue
        first = min(sharers, key=lambda e: (e.line, e.ordinal))
        if (first.line, first.ordinal) < mine:
            found = (gpu, first)
            break
        if found is None:
            found = (gpu, first)
    if found is None:
        return None
    gpu, other = found
    problem = Problem(
        entry.line,
        str(entry),
        f"{entry.node}:{gpu} is also given to ordinal {other.ordinal} on line {other.line}: {why}",
    )
    return Finding(GPU_SHARING_FORBIDDEN, str(problem))


def release_forbids(pod: Mapping[str, Any], decision: Decision) -> Decision:
    """``decision`` with GPUSharingForbidden first when the replica shares a GPU by its map and
    the release forbids sharing (``GPU_SCHEDULER_ALLOW_SHARING=false``): its map slipped past
    admission (written before the chart value changed, or with the policy off)."""
    entry = decision.entry
    if entry is None:
        return decision
    try:
        smap = pod_map(Pod(pod).meta)
    except MapError:
        return decision
    if smap is None or not smap.mates(entry.ordinal):
        return decision
    found = replica_sharing_forbidden(smap, entry, RELEASE_FORBIDS)
    if found is None:
        return decision
    return Decision(decision.ordinal, entry, (found, *decision.refusals), decision.warnings)


@emits(GPU_SHARED)
def gpus_shared(smap: SchedulingMap) -> list[Finding]:
    """GPUShared: the admission (and lint) warning for a map that shares GPUs (each shared GPU, its
    ordinals and their lines; :func:`kube_gpu_scheduler.domain.sharing.warning`)."""
    said = warning(smap)
    return [] if said is None else [Finding(GPU_SHARED, said)]
