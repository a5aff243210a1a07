"""The rollout eviction decision, once: may the replica that holds a GPU be evicted for the
replica that waits for it, and if not, why.

Both paths ask it: the standalone scheduler, where the holder of ``node:gpu`` comes from
the ledger (:mod:`kube_gpu_scheduler.scheduler.rollout.standalone`, the ``GPUInUse`` notes), and DRA
mode, where the holder is a pod in ``status.reservedFor`` of the claim allocated the device
(:mod:`kube_gpu_scheduler.scheduler.dra.controller`, the ``GPUAllocatedElsewhere`` notes).

A map edit that swaps or rotates GPUs between the replicas of one StatefulSet jams a
rolling update: the controller replaces the highest ordinal first, the new replica waits
for a GPU an outdated replica still holds, and the controller touches no other replica
until the new one is Ready. kube-scheduler's way out is preemption; ours is narrower. The
holder is evicted (the Eviction API, so PodDisruptionBudgets are honoured: a 429 is named,
and the next retry asks again) only when all of these hold:

* the waiting pod is a StatefulSet's replica, and the holder is a replica of the same
  StatefulSet (the same controller UID and namespace), and the waiting pod is of that
  StatefulSet's ``status.updateRevision``;
* the holder is of an older revision (its ``controller-revision-hash`` is not the update
  revision): the controller would replace it in this rollout anyway;
* it is not being deleted already;
* the update strategy lets it move now: ``RollingUpdate`` (never ``OnDelete``: the operator
  deletes each pod) and its ordinal at or above the partition;
* its own entry in the new map no longer holds that GPU (``keeps``, which the path gives: the
  ledger's ``node:gpu``; in DRA mode the device, against the entry resolved on its node's
  published devices, and through the same claim: a GPU its new map shares with the waiting
  replica is held through their shared claim, not its own, and a shared claim made for an
  earlier map is kept only if its new map wants it as it is): evicted, it comes back at the
  new revision wanting other GPUs (or other claims), so no replica moves twice. Where its new entry is not known (no ordinal, a map that does not
  parse, GPUs its node does not publish), it is never moved;
* it was not evicted already: each holder once (by UID).

A holder of another workload is only named, with both workloads and the way out, unless the
operator allows more (``GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS``): then a replica of
another StatefulSet of the same namespace is evicted under the same conditions, applied to
its own StatefulSet (two StatefulSets trading GPUs jam each other otherwise). Never a pod of
another namespace, never one that is not a StatefulSet's.

The GPU is free only once the holder is gone (a terminating pod holds its GPUs, a pinned
claim its devices), so no two pods ever hold one GPU. An Event on the holder
(``EvictedForRollout``) and the waiting pod's note say what happened, or why the holder stays.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kube_gpu_scheduler.domain.mapcache import parse_cached
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import ordinal_of
from kube_gpu_scheduler.domain.rules import EVICTED_FOR_ROLLOUT
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, Entry, MapError
from kube_gpu_scheduler.kube.errors import ApiError, api_status, error_message

log = logging.getLogger("gpu_scheduler")

REVISION_LABEL = "controller-revision-hash"
OTHER_WORKLOADS_SETTING = "GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS"
# How many evicted pods are remembered (so none is evicted twice).
MAX_REMEMBERED = 10_000

# Whether the holder's entry in its StatefulSet's new map still holds the wanted GPU.
Keeps = Callable[[Entry], bool]
# The StatefulSet an ownerReference names (in the waiting pod's namespace), as it is now:
# {} when it is gone, replaced (another UID) or unreadable.
StatefulSets = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class Evictor(Protocol):
    def evict(self, pod: Mapping[str, Any]) -> None: ...


class Warner(Protocol):
    def warning(self, pod: Mapping[str, Any], reason: str, note: str) -> bool: ...


def workload(pod: Mapping[str, Any]) -> str:
    """``StatefulSet ns/w``: the pod's controller, as a note names it."""
    view = Pod(pod)
    owner = view.owner
    if owner is None:
        return f"no controller (bare pod {view.namespace}/{view.name})"
    return f"{owner.get('kind')} {view.namespace}/{owner.get('name')}"


@dataclass(frozen=True)
class Verdict:
    """``evict``: the holder may be evicted now, as a replica of ``statefulset``, for ``note``
    (whom: ``a replica of the update revision ...``). Otherwise ``note`` says why it stays and
    the way out ("": nothing to say)."""

    evict: bool
    note: str
    statefulset: Mapping[str, Any] = field(default_factory=dict)


def _stay(note: str) -> Verdict:
    return Verdict(False, note)


def decide(
    waiting: Mapping[str, Any],
    holder: Mapping[str, Any] | None,
    key: str,
    statefulset: StatefulSets,
    keeps: Keeps,
    *,
    other_workloads: bool = False,
) -> Verdict:
    """May ``holder`` (pod ``key``, None when it is not one of ours) be evicted for ``waiting``?

    Pure but for ``statefulset`` (a lookup) and ``keeps`` (see the module doc)."""
    mine = Pod(waiting).owner or {}
    if mine.get("kind") != "StatefulSet":
        return _stay("")
    if holder is None:
        return _stay("the holder is not one of this scheduler's pods; it must end or move first")
    view, theirs = Pod(holder), Pod(holder).owner or {}
    # An ownerReference is its writer's claim: a pod elsewhere naming this StatefulSet's
    # UID is not one of its replicas, and no pod of another namespace is ever evicted.
    here = view.namespace == Pod(waiting).namespace
    if here and theirs.get("uid") == mine.get("uid"):
        sts = statefulset(mine)
        return _own(waiting, sts, holder, key, keeps) if sts else _stay("")
    who, mine_is = workload(holder), workload(waiting)
    if who == mine_is:  # the same name, another UID: deleted and created again
        who = f"an earlier {who} (deleted and created again since)"
    if view.deleting:
        return _stay(
            f"it belongs to {who}, not to the waiting pod's {mine_is}, and is terminating: the GPU is free once it is gone"
        )
    other_sts = here and theirs.get("kind") == "StatefulSet"
    if other_workloads and other_sts:
        sts = statefulset(theirs)
        stays = _stays(sts, holder, key, keeps) if sts else f"{who} is gone"
        if stays is None:
            return Verdict(True, f"a replica of {mine_is}, another workload ({OTHER_WORKLOADS_SETTING})", sts)
        return _stay(f"it belongs to another workload, {who}, not to the waiting pod's {mine_is}: {stays}")
    allow = (
        f", or set {OTHER_WORKLOADS_SETTING}=true to let it evict an outdated replica of another StatefulSet of the namespace"
        if other_sts
        else ""
    )
    return _stay(
        f"it belongs to another workload, {who}, not to the waiting pod's {mine_is}: gpu-scheduler "
        f"evicts only an outdated replica of the waiting pod's own StatefulSet{allow}; change one of "
        f"the two maps, or delete pod {key}"
    )


def _own(
    waiting: Mapping[str, Any], sts: Mapping[str, Any], holder: Mapping[str, Any], key: str, keeps: Keeps
) -> Verdict:
    """``holder`` is a replica of the waiting pod's own StatefulSet ``sts``."""
    name = str((sts.get("metadata") or {}).get("name"))
    update = (sts.get("status") or {}).get("updateRevision")
    if not update or Pod(waiting).labels.get(REVISION_LABEL) != update:
        return _stay(
            f"the waiting pod is not of StatefulSet {name}'s update revision ({update}): nothing is evicted for it"
        )
    stays = _stays(sts, holder, key, keeps)
    return (
        _stay(stays)
        if stays is not None
        else Verdict(True, f"a replica of the update revision {update}", sts)
    )


def _stays(sts: Mapping[str, Any], holder: Mapping[str, Any], key: str, keeps: Keeps) -> str | None:
    """Why ``holder``, a replica of ``sts``, may not be evicted now (None: it may)."""
    name = str((sts.get("metadata") or {}).get("name"))
    view, update = Pod(holder), (sts.get("status") or {}).get("updateRevision")
    have = view.labels.get(REVISION_LABEL)
    if not update or have == update:
        return f"it is a replica of StatefulSet {name} at its update revision ({have}): the maps give that GPU twice"
    if view.deleting:
        return f"it is an outdated replica of StatefulSet {name} (revision {have}) and is terminating"
    ordinal = ordinal_of(view.name, view.labels)
    strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return (
            f"it is an outdated replica of StatefulSet {name}, which updates {strategy.get('type')}: "
            f"delete pod {key} to let it move"
        )
    partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
    if ordinal is not None and ordinal < partition:
        return (
            f"it is an outdated replica of StatefulSet {name} below its partition ({partition}): "
            f"it stays at revision {have} until the partition is lowered"
        )
    if new_entry_keeps(sts, ordinal, keeps):
        return (
            f"it is an outdated replica of StatefulSet {name}, but the new map gives it the same GPU: "
            "evicting it would only move it back; the rollout goes on once it is replaced"
        )
    return None


def new_entry_keeps(sts: Mapping[str, Any], ordinal: int | None, keeps: Keeps) -> bool:
    """Whether replica ``ordinal``'s entry in ``sts``'s new map still holds the GPU (``keeps``);
    True where that entry is not known: not knowing where it goes, never move it."""
    text = (
        (((sts.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}
    ).get(ANNOTATION)
    if ordinal is None or not isinstance(text, str):
        return True
    try:
        entry = parse_cached(text).get(ordinal)
    except MapError:
        return True
    return entry is not None and keeps(entry)


class Evictions:
    """Acts on :func:`decide`: evicts (once per holder), sends ``EvictedForRollout`` on the holder,
    and returns the note for the waiting pod."""

    def __init__(self, writer: Evictor, events: Warner, other_workloads: bool = False) -> None:
        self._writer = writer
        self._events = events
        self.other_workloads = other_workloads
        self._lock = threading.Lock()
        self._evicted: dict[str, None] = {}  # holder UIDs already evicted (insertion order)
        self._evicting: set[str] = set()  # holder UIDs a worker is evicting now

    def note(
        self,
        waiting: Mapping[str, Any],
        holder: Mapping[str, Any] | None,
        key: str,
        statefulset: StatefulSets,
        keeps: Keeps,
    ) -> str:
        """What happens to ``holder`` (pod ``key``) of a GPU ``waiting`` wants, or why it stays."""
        verdict = decide(waiting, holder, key, statefulset, keeps, other_workloads=self.other_workloads)
        if not verdict.evict or holder is None:
            return verdict.note
        return self._evict(holder, key, verdict.statefulset, verdict.note)

    def _evict(self, holder: Mapping[str, Any], key: str, sts: Mapping[str, Any], wanted_by: str) -> str:
        """Evict ``holder``, an outdated replica of ``sts``, for ``wanted_by`` (the waiting pod)."""
        uid = Pod(holder).uid or ""
        name = str((sts.get("metadata") or {}).get("name"))
        have = Pod(holder).labels.get(REVISION_LABEL)
        what = f"an outdated replica of StatefulSet {name}, revision {have}"
        with self._lock:
            if uid in self._evicted or uid in self._evicting:  # another waiting replica's worker
                return f"evicted it ({what}); waiting for it to go"
            self._evicting.add(uid)
        try:
            self._writer.evict(holder)
        except Exception as err:
            with self._lock:
                self._evicting.discard(uid)
            status = api_status(err)
            if status.code == 429:
                return (
                    f"it is an outdated replica of StatefulSet {name}; its eviction waits for a "
                    f"PodDisruptionBudget ({status.message or status.reason})"
                )
            if status.kind is ApiError.NOT_FOUND:
                return "it is gone"
            if status.kind is ApiError.CONFLICT:  # the UID precondition: deleted (its rollout), recreated
                return "it is gone (replaced by a new pod of that name)"
            log.warning("eviction failed", extra={"pod": key, "error": error_message(err)})
            return f"evicting it failed: {error_message(err)}"
        with self._lock:
            self._evicting.discard(uid)
            self._evicted[uid] = None
            while len(self._evicted) > MAX_REMEMBERED:
                del self._evicted[next(iter(self._evicted))]
        update = (sts.get("status") or {}).get("updateRevision")
        note = (
            f"{EVICTED_FOR_ROLLOUT}: an outdated replica (revision {have}) of StatefulSet {name} held a GPU "
            f"that {wanted_by} is mapped to, and its own new entry (revision {update}) moves it elsewhere; "
            "evicted so that the rollout goes on"
        )
        log.info("evicted an outdated replica for a rollout", extra={"pod": key, "statefulset": name})
        self._events.warning(holder, EVICTED_FOR_ROLLOUT, note)
        return f"evicted it ({what}, for {wanted_by})"
