"""Shared GPUs: the words every surface uses, and who may share a held GPU.

A GPU that several entries of one map name is shared by those replicas, on purpose
(:meth:`kube_gpu_scheduler.domain.schedmap.SchedulingMap.shared`). Across workloads GPUs
stay exclusive: a pod may use a GPU another pod holds only when both are replicas of the
same StatefulSet (same namespace, same controller) and the placing pod's map gives the
holder's ordinal that GPU on that node too (:class:`Sharing`). A GPU is free for anyone
else only when its last sharer is gone.

An operator forbids sharing for a whole release (chart value ``sharing.allowed=false``,
``GPU_SCHEDULER_ALLOW_SHARING=false``) or for a tenant (``GPUPinningPolicy``
``spec.allowSharedGPUs: false``); then a map that shares is refused with
:func:`kube_gpu_scheduler.domain.schedmap.sharing_problems` and one of the reasons below.
The admission policies (CEL) say the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.base import config
from kube_gpu_scheduler.base.config import Setting
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import ordinal_of, pod_map
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, GPU, MapError, SchedulingMap

# The chart value and the variable that forbid sharing for a release.
CHART_VALUE = "sharing.allowed"
ENV = "GPU_SCHEDULER_ALLOW_SHARING"

# The GPUPinningPolicy field that forbids it for a tenant.
POLICY_FIELD = "allowSharedGPUs"

RELEASE_FORBIDS = (
    f"this release forbids GPU sharing (chart value {CHART_VALUE}=false): give each replica "
    f"its own GPUs, or ask the operator to set {CHART_VALUE}=true"
)

ADVICE = (
    "a shared GPU is time-sliced by the driver, with no memory isolation between its sharers "
    f"(MIG or MPS give that); {CHART_VALUE}=false forbids sharing"
)


def setting(help: str, flag: str | None = None) -> Setting:
    """The ``allow_sharing`` row of a program's settings (:data:`ENV`, a boolean)."""
    return Setting("allow_sharing", ENV, config.boolean, help, flag)


def tenant_forbids(policy: str, namespace: str) -> str:
    """Why a tenant's map may not share: its GPUPinningPolicy says so."""
    return (
        f"GPUPinningPolicy {policy!r} forbids GPU sharing in namespace {namespace} "
        f"(spec.{POLICY_FIELD}: false): give each replica its own GPUs, or ask the operator "
        f"to set {POLICY_FIELD}: true"
    )


def warning(smap: SchedulingMap) -> str | None:
    """The admission warning for a map that shares GPUs (``None`` when it shares none): each
    shared GPU with its ordinals and lines, so a typo is seen at once."""
    lines = smap.sharing_lines()
    if not lines:
        return None
    return f"{ANNOTATION} shares GPUs between replicas: {'; '.join(lines)}; {ADVICE}"


@dataclass(frozen=True)
class Member:
    """A holder as sharing sees it: its namespace, its controller's uid, its ordinal."""

    namespace: str
    owner_uid: str
    ordinal: int

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> Member | None:
        """``None`` for a pod no StatefulSet controls or without an ordinal: it shares nothing."""
        view = Pod(pod)
        owner = view.owner
        if not owner or owner.get("kind") != "StatefulSet" or not owner.get("uid"):
            return None
        ordinal = ordinal_of(view.name, view.labels)
        if ordinal is None:
            return None
        return cls(view.namespace or "", str(owner["uid"]), ordinal)


@dataclass(frozen=True)
class Sharing:
    """Who may hold a GPU the placing pod wants at the same time: its mates by its map."""

    namespace: str
    owner_uid: str
    mates: Mapping[GPU, frozenset[int]]

    @classmethod
    def of(cls, pod: Mapping[str, Any], smap: SchedulingMap | None, ordinal: int | None) -> Sharing | None:
        """``None`` when the pod shares nothing (its map gives its GPUs to no other ordinal)."""
        if smap is None or ordinal is None:
            return None
        mates = smap.mates(ordinal)
        if not mates:
            return None
        me = Member.of(pod)
        if me is None or me.ordinal != ordinal:
            return None
        return cls(me.namespace, me.owner_uid, mates)

    def allows(self, gpu: GPU, holder: Member | None) -> bool:
        """True when ``holder`` holding ``gpu`` is this pod's mate on it, not a conflict."""
        return (
            holder is not None
            and holder.namespace == self.namespace
            and holder.owner_uid == self.owner_uid
            and holder.ordinal in self.mates.get(gpu, ())
        )


def sharing_of(pod: Mapping[str, Any]) -> Sharing | None:
    """The pod's :class:`Sharing` by its own map and ordinal (``None``: it shares nothing, or its
    map is malformed, which other rules refuse)."""
    view = Pod(pod)
    try:
        smap = pod_map(view.meta)
    except MapError:
        return None
    return Sharing.of(pod, smap, ordinal_of(view.name, view.labels))
