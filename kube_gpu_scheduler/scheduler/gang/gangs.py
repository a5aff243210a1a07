"""Gang placement in the scheduler: every replica of a map revision, or none.

A member of a gang (:func:`kube_gpu_scheduler.domain.gang.gang_of`) is bound only once its gang is
*admitted*: every replica of the StatefulSet (its ``spec.replicas`` ordinals) passes the
placement rules, and then the GPUs of every pending member are reserved in the ledger in one
step (:meth:`Ledger.reserve_all`, all or nothing) and every member is queued to bind.

* **No deadlock between gangs.** Two gangs wanting one GPU both see it free, and both ask
  ``reserve_all``: under the ledger's lock one takes all it needs, the other takes nothing and
  waits whole. Nothing of a waiting gang is held.
* **A committed gang keeps its GPUs.** Once one member of a revision is bound (the API says
  so), the gang is *committed*: every pending member's GPUs are held for it in the ledger
  (:meth:`Gangs.observe`, from the informer's thread), whatever else happens (a Binding
  that failed, a node not Ready for a moment, a restart, a new leader). This is derived from
  the pods alone, so a new leader's caches hold it before its first worker decides anything.
* **Rollouts.** A replica of another map revision (an outdated one during a rolling
  update) keeps its GPUs; the gang asks only that this revision's entry for it could be
  placed, its GPUs free or held by the StatefulSet's own replicas, which the rollout moves.
* **Pods not created yet** count when their entry could be placed (the pod their siblings'
  template makes for that ordinal), and their GPUs are then held for them (a *phantom*
  reservation, handed to the pod when the watch brings it): the gang binds while the
  StatefulSet controller still creates it, under ``Parallel`` and ``OrderedReady`` alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.domain.gang import (
    PHANTOM,
    Blocked,
    GangKey,
    gang_finding,
    gang_of,
    replica_ordinals,
    sibling_pod,
)
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import ordinal_of, pod_map
from kube_gpu_scheduler.domain.rules import Decision, gpus_in_use
from kube_gpu_scheduler.domain.schedmap import GPU, Entry, MapError
from kube_gpu_scheduler.domain.sharing import Sharing
from kube_gpu_scheduler.kube.errors import error_message
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from kube_gpu_scheduler.scheduler.state.ledger import Claim, Ledger, pod_key
from kube_gpu_scheduler.scheduler.state.pods import is_pending

log = logging.getLogger("gpu_scheduler")

STS_FRESH_S = 2.0  # a StatefulSet read serves the gang's decisions this long

Owner = tuple[str, str]  # (namespace, StatefulSet UID)


@dataclass(frozen=True)
class Verdict:
    """Whether a member may be placed now (``go``), else the decision to report."""

    go: bool
    decision: Decision | None = None  # the member's refusals, the gang's wait first
    node: str = ""  # a node whose change may unblock the gang


@dataclass(frozen=True)
class _Replicas:
    read_at: float
    ordinals: range | None  # None: the StatefulSet could not be read (the map's ordinals stand)
    policy: str | None


class _OtherWorkloads:
    """The ledger's holders, less the pods of one StatefulSet (its rollout moves them) and the
    GPUs held for its replicas not created yet."""

    def __init__(self, ledger: Ledger, pod_of: Callable[[str], Mapping[str, Any] | None], gang: GangKey):
        self._ledger, self._pod_of, self._gang = ledger, pod_of, gang
        self._stand_in = f"{gang.namespace}/{gang.owner_name}-"  # the key of a replica held for

    def holders(
        self, node: str, gpus: Iterable[GPU], exclude_uid: str | None = None, sharing: Sharing | None = None
    ) -> list[tuple[GPU, str]]:
        out = []
        for gpu, key in self._ledger.holders(node, gpus, exclude_uid, sharing):
            holder = self._pod_of(key)
            if holder is None and key.startswith(self._stand_in):
                continue  # held for a replica of this StatefulSet not created yet
            if holder is None or (Pod(holder).owner or {}).get("uid") != self._gang.owner_uid:
                out.append((gpu, key))
        return out


class Gangs:
    def __init__(
        self,
        ledger: Ledger,
        pod_of: Callable[[str], Mapping[str, Any] | None],
        decide: Callable[..., Decision],
        read_statefulset: Callable[[str, str], Mapping[str, Any] | None],
        enqueue: Callable[[str], None],
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self._pod_of = pod_of  # the pods cache
        self._decide = decide  # decide(pod) or decide(pod, holders): the rules on the caches
        self._read_statefulset = read_statefulset
        self._enqueue = enqueue
        self._metrics = metrics
        self._clock = clock
        # Tenancy: the limits a gang's GPUs are checked against together (None: off).
        self.limit: Callable[[list[tuple[Mapping[str, Any], Entry]]], Callable[[], list[Blocked]]] | None = (
            None
        )
        self._lock = threading.Lock()
        self._members: dict[Owner, dict[int, str]] = {}  # gang pods by StatefulSet: ordinal -> key
        self._committed: set[GangKey] = set()  # a member of the revision is bound
        self._since: dict[GangKey, float] = {}  # gangs waiting: first seen waiting
        self._replicas: dict[tuple[str, str], _Replicas] = {}  # (namespace, name) -> its last read
        self._evaluating: dict[GangKey, threading.Lock] = {}  # one pass over a gang at a time
        # Replicas not created yet whose GPUs are held for their gang: (ns, owner UID, ordinal).
        self._phantoms: dict[tuple[str, str, int], tuple[GangKey, Mapping[str, Any]]] = {}
        metrics.track_gangs(lambda: len(self._since))

    # -- the informer's thread: index the members, hold a committed gang's GPUs --------------

    def observe(self, pod: Mapping[str, Any]) -> None:
        gang = gang_of(pod)
        if gang is None:
            return
        view = Pod(pod)
        ordinal = ordinal_of(view.name, view.labels)
        if ordinal is None:
            return
        owner = (gang.namespace, gang.owner_uid)
        with self._lock:
            self._members.setdefault(owner, {})[ordinal] = view.key
            newly = view.node_name is not None and gang not in self._committed
            if newly:
                self._committed.add(gang)
            committed = gang in self._committed
            # Under the lock, so that a worker's take_held never finds the stand-in gone from
            # here while its GPUs are still the stand-in's in the ledger.
            phantom = self._phantoms.pop((gang.namespace, gang.owner_uid, ordinal), None)
            if phantom is not None:
                held_for, stand_in = phantom
                if held_for == gang and is_pending(pod):
                    self.ledger.hand_over(Pod(stand_in).uid, pod)  # the GPUs held for it are its own now
                else:
                    self.ledger.forget(stand_in)  # another revision came: nothing holds them for it
        if newly:
            for key in self._member_keys(owner):
                member = self._pod_of(key)
                if member is not None and gang_of(member) == gang:
                    self._hold(member)
        elif committed and is_pending(pod):
            self._hold(pod)

    def forget(self, pod: Mapping[str, Any]) -> None:
        gang = gang_of(pod)
        if gang is None:
            return
        view = Pod(pod)
        owner = (gang.namespace, gang.owner_uid)
        ordinal = ordinal_of(view.name, view.labels)
        with self._lock:
            members = self._members.get(owner)
            if members is not None and ordinal is not None and members.get(ordinal) == view.key:
                del members[ordinal]
            if members is not None and not members:
                del self._members[owner]
                gone = {
                    g
                    for g in (*self._committed, *self._since, *self._evaluating)
                    if (g.namespace, g.owner_uid) == owner
                }
                self._committed -= gone
                for g in gone:
                    self._since.pop(g, None)
                    self._evaluating.pop(g, None)
                stale = [k for k in self._phantoms if (k[0], k[1]) == owner]
                dropped = [self._phantoms.pop(k)[1] for k in stale]
            else:
                dropped = []
        for stand_in in dropped:
            self.ledger.forget(stand_in)

    def keeps(self, pod: Mapping[str, Any]) -> bool:
        """The pod's gang is committed: its reservation stays while it waits."""
        gang = gang_of(pod)
        with self._lock:
            return gang is not None and gang in self._committed

    def _hold(self, pod: Mapping[str, Any]) -> None:
        """Reserve a pending member's entry for its committed gang (nothing if another holds it)."""
        if not is_pending(pod) or self.ledger.reserved(Pod(pod).uid) is not None:
            return
        entry = _entry(pod)
        if entry is not None:
            self.ledger.reserve(pod, Claim.of(entry.node, entry.gpus))

    def _member_keys(self, owner: Owner) -> list[str]:
        with self._lock:
            return list((self._members.get(owner) or {}).values())

    # -- a worker: may this member be placed? ---------------------------------------------------

    def check(self, pod: Mapping[str, Any], gang: GangKey, decision: Decision) -> Verdict:
        """GO when the member's GPUs are reserved for its gang (admitted now or before, or held
        for a committed gang); else the gang's wait, naming every blocked replica.

        A replica whose pod does not exist yet counts when its entry could be placed (the pod
        its siblings' template makes for it), and its GPUs are then held for it (a *phantom*
        reservation, handed to the pod when it comes): so the gang binds while the StatefulSet
        controller still creates it, under Parallel and OrderedReady alike."""
        view = Pod(pod)
        if self.ledger.reserved(view.uid) is not None:
            return Verdict(True)
        mine = ordinal_of(view.name, view.labels)
        if self.take_held(pod, gang):
            return Verdict(True)
        with self._lock:
            one_at_a_time = self._evaluating.setdefault(gang, threading.Lock())
        with one_at_a_time:  # members in other workers wait for this pass rather than repeat it
            if self.ledger.reserved(view.uid) is not None or self.take_held(pod, gang):
                return Verdict(True)  # admitted by the pass this one waited for
            return self._evaluate(pod, gang, decision, mine)

    def _evaluate(
        self, pod: Mapping[str, Any], gang: GangKey, decision: Decision, mine: int | None
    ) -> Verdict:
        view = Pod(pod)
        ordinals, _ = self._ordinals(gang, pod)
        with self._lock:
            members = dict(self._members.get((gang.namespace, gang.owner_uid)) or {})
        blocked: list[Blocked] = []
        pending: list[tuple[Mapping[str, Any], Entry]] = []
        others = _OtherWorkloads(self.ledger, self._pod_of, gang)
        for ordinal in ordinals:
            key = members.get(ordinal)
            member = pod if key == view.key or ordinal == mine else (self._pod_of(key) if key else None)
            if member is not None and gang_of(member) == gang:
                if Pod(member).node_name is not None:
                    continue  # bound: it holds its GPUs
                found = decision if member is pod else self._decide(member)
                if found.ok and found.entry is not None:
                    pending.append((member, found.entry))
                else:
                    blocked.append(Blocked(ordinal, found.entry, found.reason, found.message))
                continue
            # Not created yet, or another revision's replica (which keeps its GPUs): this
            # revision's entry for it must fit.
            found = self._decide(sibling_pod(pod, ordinal), others)
            if not found.ok or found.entry is None:
                blocked.append(Blocked(ordinal, found.entry, found.reason, found.message))
            elif member is None and not self.ledger.holders(found.entry.node, found.entry.gpus):
                pending.append((_phantom(gang, ordinal), found.entry))
        if not blocked:
            claims = [(m, Claim.of(e.node, e.gpus)) for m, e in pending]
            limit = self.limit(pending) if self.limit is not None else None
            taken, over = self.ledger.reserve_all_within(claims, self._ours(gang), limit)
            if over:  # tenancy: the gang's GPUs together pass a policy's limit
                return self._wait(pod, gang, decision, list(over), len(ordinals))
            if not taken:
                with self._lock:
                    for m, e in pending:
                        if Pod(m).uid.startswith(PHANTOM):
                            self._phantoms[(gang.namespace, gang.owner_uid, e.ordinal)] = (gang, m)
                real = [pod_key(m) for m, _ in pending if m is not pod and not Pod(m).uid.startswith(PHANTOM)]
                self._admitted(gang, real)
                return Verdict(True)
            blocked = _conflicts(pending, taken)
        return self._wait(pod, gang, decision, blocked, len(ordinals))

    def take_held(self, pod: Mapping[str, Any], gang: GangKey) -> bool:
        """The GPUs held for this replica before it existed become its own (the informer's
        thread does it when the watch brings the pod; a worker that gets there first, too)."""
        view = Pod(pod)
        mine = ordinal_of(view.name, view.labels)
        if mine is None or not is_pending(pod):
            return False
        with self._lock:  # as observe: the stand-in leaves both places at once
            held = self._phantoms.pop((gang.namespace, gang.owner_uid, mine), None)
            if held is None:
                return False
            if held[0] != gang:
                self.ledger.forget(held[1])
                return False
            return self.ledger.hand_over(Pod(held[1]).uid, pod)

    def _ours(self, gang: GangKey) -> Callable[[str, str], bool]:
        """Whether a holder is a member of ``gang`` (or held for one not created yet): another
        worker may have reserved for the gang since this one looked."""
        stand_in = f"{PHANTOM}{gang.namespace}/{gang.owner_uid}/"

        def ours(uid: str, key: str) -> bool:
            if uid.startswith(stand_in):
                return True
            member = self._pod_of(key)
            return member is not None and Pod(member).uid == uid and gang_of(member) == gang

        return ours

    def _admitted(self, gang: GangKey, others: list[str]) -> None:
        with self._lock:
            since = self._since.pop(gang, None)
        waited = self._clock() - since if since is not None else 0.0
        self._metrics.gangs_admitted.inc()
        self._metrics.gang_wait.observe(waited)
        log.info(
            "gang admitted",
            extra={"gang": str(gang), "members": len(others) + 1, "waited_s": round(waited, 3)},
        )
        for key in others:
            self._enqueue(key)

    def _wait(
        self, pod: Mapping[str, Any], gang: GangKey, decision: Decision, blocked: list[Blocked], size: int
    ) -> Verdict:
        with self._lock:
            self._since.setdefault(gang, self._clock())
        own = decision.refusals if not decision.ok else ()
        found = gang_finding(gang, size, blocked)
        waiting = Decision(decision.ordinal, decision.entry, (found, *own), decision.warnings)
        first = next((b.entry.node for b in blocked if b.entry is not None), "")
        node = first or (decision.entry.node if decision.entry else "")
        return Verdict(False, waiting, node)

    def _ordinals(self, gang: GangKey, pod: Mapping[str, Any]) -> tuple[range | list[int], str | None]:
        """The replicas' ordinals (the StatefulSet read at most every STS_FRESH_S; the map's own
        ordinals when it cannot be read) and its podManagementPolicy."""
        where = (gang.namespace, gang.owner_name)
        now = self._clock()
        with self._lock:
            known = self._replicas.get(where)
        if known is None or now - known.read_at > STS_FRESH_S:
            known = self._read(gang, now)
            with self._lock:
                self._replicas[where] = known
        if known.ordinals is not None:
            return known.ordinals, known.policy
        try:
            smap = pod_map(Pod(pod).meta)
        except MapError:
            smap = None
        return sorted(smap or {}), known.policy

    def _read(self, gang: GangKey, now: float) -> _Replicas:
        try:
            sts = self._read_statefulset(gang.namespace, gang.owner_name)
        except Exception as err:
            log.warning(
                "cannot read a StatefulSet", extra={"name": gang.workload, "error": error_message(err)}
            )
            return _Replicas(now, None, None)
        if sts is None or Pod(sts).uid != gang.owner_uid:
            return _Replicas(now, None, None)
        return _Replicas(now, replica_ordinals(sts), Pod(sts).spec.get("podManagementPolicy"))


def _phantom(gang: GangKey, ordinal: int) -> dict[str, Any]:
    """The ledger's stand-in for a replica not created yet (keyed as the pod will be)."""
    name = f"{gang.owner_name}-{ordinal}"
    uid = f"{PHANTOM}{gang.namespace}/{gang.owner_uid}/{ordinal}"
    return {"metadata": {"name": name, "namespace": gang.namespace, "uid": uid}}


def _entry(pod: Mapping[str, Any]) -> Entry | None:
    view = Pod(pod)
    try:
        smap = pod_map(view.meta)
    except MapError:
        return None
    ordinal = ordinal_of(view.name, view.labels)
    return smap.get(ordinal) if smap is not None and ordinal is not None else None


def _conflicts(
    pending: list[tuple[Mapping[str, Any], Entry]], taken: list[tuple[str, GPU, str]]
) -> list[Blocked]:
    """What ``reserve_all`` found taken since the rules passed, as blocked replicas."""
    entries = {pod_key(m): e for m, e in pending}
    held: dict[str, list[tuple[GPU, str]]] = {}
    for key, gpu, holder in taken:
        held.setdefault(key, []).append((gpu, holder))
    out = []
    for key, pairs in held.items():
        found = gpus_in_use(entries[key], pairs)
        out.append(
            Blocked(entries[key].ordinal, entries[key], found[0].reason, "; ".join(f.message for f in found))
        )
    return out
