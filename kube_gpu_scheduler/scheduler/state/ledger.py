"""Who holds which GPU: ``(node, gpu) -> holder pod``, rebuilt from the API.

The truth lives on the pods, in fields their owners cannot change after
creation, so a tenant who may patch pods in their namespace can neither forge
nor erase a record (see ``docs/scheduler.md``, "What a pod holds"):

* a pod holds GPUs while it is bound (``spec.nodeName``, set once, by the
  Binding) and active: not Succeeded or Failed. A terminating pod
  (``deletionTimestamp`` set) still holds them until it is gone, because its
  containers may still be using the devices;
* it holds, on that node, the GPU indices its containers were set up with:
  the variables the webhook injected into the container spec
  (``NVIDIA_VISIBLE_DEVICES``, else ``CUDA_VISIBLE_DEVICES``; the union over
  containers), which are immutable;
* a bound pod whose containers carry no such variable (bound by an older
  scheduler, or with injection not required) holds its map entry when that
  entry names the node it is bound to. The chart's ValidatingAdmissionPolicy
  makes the map immutable on existing pods.

No annotation is read: the old ``gpu-scheduler/assigned`` annotation, which
tenants could rewrite, means nothing to this ledger.

A GPU may have several holders at once only when they share it on purpose: replicas of one
StatefulSet whose map gives each of them that GPU (:mod:`kube_gpu_scheduler.domain.sharing`).
The placing pod's map decides (``sharing``): a holder is waived when it is a replica of the
same StatefulSet whose ordinal that map gives the GPU too; every other holder is a conflict.
What a namespace holds counts each GPU once, however many of its pods share it.

Between the scheduler's decision and the watch showing the pod bound, the
GPUs are kept as a *reservation*, so two workers cannot both take a GPU and an
older copy of the pod arriving late on the watch cannot erase the decision.

With tenancy on, the GPUs each namespace holds on each node are also counted here
(:meth:`Ledger.places`), every change is told to a listener (the policies' counts,
:mod:`kube_gpu_scheduler.scheduler.tenancy.holdings`) under the ledger's lock, and a reservation may
be made subject to a limit checked under that same lock (:meth:`Ledger.reserve`), so two
workers can never both take the last GPUs a policy allows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kube_gpu_scheduler.domain.holding import FINISHED_PHASES, is_active, pod_holds
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.schedmap import GPU, gpu_sort_key
from kube_gpu_scheduler.domain.sharing import Member, Sharing, sharing_of

__all__ = ["FINISHED_PHASES", "Claim", "Ledger", "claim_of", "is_active", "is_bound", "pod_key"]

# The listener: (namespace, node, GPUs added; negative when released), called under the lock.
Listener = Callable[[str, str, int], None]
T = TypeVar("T")


@dataclass(frozen=True)
class Claim:
    """GPUs ``gpus`` on ``node``, held by one pod (sorted by :func:`gpu_sort_key`, no duplicates).

    A GPU is an index or a UUID as the map and the injected variables name it: outside DRA
    mode the scheduler cannot tell which index a UUID is, so a GPU named both ways by two
    StatefulSets is two ledger entries (docs/injection.md).
    """

    node: str
    gpus: tuple[GPU, ...]

    @classmethod
    def of(cls, node: str, gpus: Iterable[GPU]) -> Claim:
        return cls(node, tuple(sorted(set(gpus), key=gpu_sort_key)))

    def __str__(self) -> str:
        return f"{self.node}:{','.join(str(g) for g in self.gpus)}"


def pod_key(pod: Mapping[str, Any]) -> str:
    return Pod(pod).key


def is_bound(pod: Mapping[str, Any]) -> bool:
    return Pod(pod).node_name is not None


def claim_of(pod: Mapping[str, Any]) -> Claim | None:
    """The GPUs this pod holds according to the API object's immutable fields
    (:func:`kube_gpu_scheduler.domain.holding.pod_holds`)."""
    held = pod_holds(pod)
    return Claim(*held) if held else None


class Ledger:
    """Thread-safe index of held GPUs, fed by the pod watch and by the scheduler's own writes."""

    def __init__(self, listener: Listener | None = None) -> None:
        # Re-entrant: a limit checked under it (reserve) may list holders (holdings).
        self._lock = threading.RLock()
        self._gpus: dict[tuple[str, GPU], dict[str, str]] = {}  # (node, gpu) -> {uid: "ns/name"}
        self._pods: dict[str, tuple[str, Claim]] = {}  # uid -> ("ns/name", claim)
        self._members: dict[str, Member] = {}  # uid -> its StatefulSet and ordinal (sharing)
        self._reserved: dict[str, Claim] = {}  # uid -> claim written, not yet seen on the watch
        self._places: dict[tuple[str, str], int] = {}  # (namespace, node) -> GPUs held there
        self._listener = listener

    # -- reads ------------------------------------------------------------------

    def holders(
        self, node: str, gpus: Iterable[GPU], exclude_uid: str | None = None, sharing: Sharing | None = None
    ) -> list[tuple[GPU, str]]:
        """``(gpu, "ns/name")`` for each of ``gpus`` on ``node`` held by a pod other than
        ``exclude_uid`` and not allowed beside it by ``sharing`` (its mates)."""
        with self._lock:
            return [(gpu, key) for gpu in gpus for key in self._others(node, gpu, exclude_uid, sharing)]

    def counted(self, namespace: str, node: str, gpus: Iterable[GPU]) -> int:
        """How many of ``gpus`` on ``node`` the namespace holds already (a shared GPU counts once)."""
        with self._lock:
            return sum(1 for gpu in gpus if self._held_by(namespace, node, gpu))

    def claim(self, uid: str) -> Claim | None:
        with self._lock:
            held = self._pods.get(uid)
            return held[1] if held else None

    def snapshot(self) -> dict[str, list[str]]:
        """``{"node:gpu": ["ns/name", ...]}``, for logs and tests."""
        with self._lock:
            return {
                f"{n}:{g}": sorted(h.values())
                for (n, g), h in sorted(
                    self._gpus.items(), key=lambda item: (item[0][0], gpu_sort_key(item[0][1]))
                )
                if h
            }

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    def listen(self, listener: Listener) -> None:
        """Tell ``listener`` every change of what a namespace holds on a node from now on."""
        with self._lock:
            self._listener = listener

    def atomically(self, fn: Callable[[Mapping[tuple[str, str], int]], T]) -> T:
        """``fn(places)`` under the lock: ``(namespace, node) -> GPUs held`` (reservations included)."""
        with self._lock:
            return fn(self._places)

    def holdings(self, where: Callable[[str, str], bool]) -> list[str]:
        """``"ns/name node:gpus"`` of every holder whose (namespace, node) ``where`` accepts, sorted."""
        with self._lock:
            return sorted(
                f"{key} {claim}" for key, claim in self._pods.values() if where(key.split("/")[0], claim.node)
            )

    # -- updates from the watch ---------------------------------------------------

    def observe(self, pod: Mapping[str, Any]) -> set[str]:
        """Record the pod as the watch shows it; returns the nodes where GPUs were freed."""
        uid = Pod(pod).uid
        claim = claim_of(pod)
        member = Member.of(pod)
        with self._lock:
            self._member(uid, member)
            reserved = self._reserved.get(uid)
            if reserved is not None:
                if is_bound(pod) or not is_active(pod):
                    del self._reserved[uid]  # bound (or finished): the pod's own fields rule again
                else:
                    claim = reserved  # still pending: keep what we decided
            return self._set(uid, pod_key(pod), claim)

    def forget(self, pod: Mapping[str, Any]) -> set[str]:
        """The pod is gone; returns the nodes where GPUs were freed."""
        uid = Pod(pod).uid
        with self._lock:
            self._reserved.pop(uid, None)
            released = self._set(uid, pod_key(pod), None)
            self._members.pop(uid, None)
            return released

    # -- the scheduler's own writes -------------------------------------------------

    def reserve(self, pod: Mapping[str, Any], claim: Claim) -> list[tuple[GPU, str]]:
        """Atomically check that no other pod holds ``claim`` and take it.

        Returns the conflicts (and takes nothing) when another pod holds any of the GPUs.
        """
        return self.reserve_within(pod, claim, None)[0]

    def reserve_within(
        self,
        pod: Mapping[str, Any],
        claim: Claim,
        limit: Callable[[int], Sequence[T]] | None,
    ) -> tuple[list[tuple[GPU, str]], Sequence[T]]:
        """:meth:`reserve`, and with ``limit`` only if taking ``claim`` stays within the limits.

        ``limit(already)`` (``already``: GPUs this pod holds or reserved on that node now) runs
        under the lock and returns its refusals. Returns ``(conflicts, refusals)``: when either is
        non-empty nothing was taken.
        """
        uid = Pod(pod).uid
        sharing, member = sharing_of(pod), Member.of(pod)
        namespace = pod_key(pod).split("/", maxsplit=1)[0]
        with self._lock:
            conflicts = [
                (gpu, key) for gpu in claim.gpus for key in self._others(claim.node, gpu, uid, sharing)
            ]
            if conflicts:
                return conflicts, ()
            if limit is not None:
                # The GPUs of the claim the namespace already counts: this pod's own, its mates'.
                refusals = limit(sum(1 for g in claim.gpus if self._held_by(namespace, claim.node, g)))
                if refusals:
                    return [], refusals
            self._member(uid, member)
            self._reserved[uid] = claim
            self._set(uid, pod_key(pod), claim)
            return [], ()

    def reserve_all(
        self,
        claims: list[tuple[Mapping[str, Any], Claim]],
        ours: Callable[[str, str], bool] = lambda uid, key: False,
    ) -> list[tuple[str, GPU, str]]:
        """Reserve every ``(pod, claim)`` in one step, or none of them: a gang's GPUs.

        Returns the conflicts, ``(pod key, gpu, holder key)``, and takes nothing when any GPU is
        held by a pod outside ``claims`` for which ``ours(uid, key)`` is false (the gang's own
        members). Two gangs wanting one GPU thus never hold half of it each: whichever
        reserves first takes all it needs, the other takes nothing."""
        return self.reserve_all_within(claims, ours, None)[0]

    def reserve_all_within(
        self,
        claims: list[tuple[Mapping[str, Any], Claim]],
        ours: Callable[[str, str], bool],
        limit: Callable[[], Sequence[T]] | None,
    ) -> tuple[list[tuple[str, GPU, str]], Sequence[T]]:
        """:meth:`reserve_all`, and with ``limit`` only if taking every claim stays within the
        limits: ``limit()`` runs under the lock (the gang's members counted together) and
        returns its refusals. Returns ``(conflicts, refusals)``; when either is non-empty
        nothing was taken."""
        uids = {Pod(pod).uid for pod, _ in claims}
        with self._lock:
            conflicts = [
                (pod_key(pod), gpu, key)
                for pod, claim in claims
                for gpu in claim.gpus
                for other, key in self._holding(claim.node, gpu, sharing_of(pod))
                if other not in uids and not ours(other, key)
            ]
            if conflicts:
                return conflicts, ()
            if limit is not None:
                refusals = limit()
                if refusals:
                    return [], refusals
            for pod, claim in claims:
                uid = Pod(pod).uid
                self._member(uid, Member.of(pod))
                self._reserved[uid] = claim
                self._set(uid, pod_key(pod), claim)
            return [], ()

    def hand_over(self, from_uid: str, pod: Mapping[str, Any]) -> bool:
        """Move a reservation held for a pod not created yet (``from_uid``) to ``pod``, at once:
        no other pod can take the GPUs in between. False when nothing was held."""
        uid = Pod(pod).uid
        with self._lock:
            claim = self._reserved.pop(from_uid, None)
            if claim is None:
                return False
            held = self._pods.get(from_uid)
            self._set(from_uid, held[0] if held else "", None)
            self._members.pop(from_uid, None)
            self._member(uid, Member.of(pod))
            self._reserved[uid] = claim
            self._set(uid, pod_key(pod), claim)
            return True

    def reserved(self, uid: str) -> Claim | None:
        """The claim reserved for a pending pod (not yet seen bound), if any."""
        with self._lock:
            return self._reserved.get(uid)

    def cancel(self, pod: Mapping[str, Any]) -> set[str]:
        """Drop a reservation whose write failed; fall back to what the API object says."""
        uid = Pod(pod).uid
        with self._lock:
            self._reserved.pop(uid, None)
            return self._set(uid, pod_key(pod), claim_of(pod))

    # -- internals -------------------------------------------------------------------

    def _member(self, uid: str, member: Member | None) -> None:
        if member is None:
            self._members.pop(uid, None)
        else:
            self._members[uid] = member

    def _holding(self, node: str, gpu: GPU, sharing: Sharing | None) -> list[tuple[str, str]]:
        """``(uid, key)`` of the holders of ``node:gpu`` that ``sharing`` does not allow (lock held)."""
        slot = self._gpus.get((node, gpu)) or {}
        if sharing is None:
            return list(slot.items())
        return [(uid, key) for uid, key in slot.items() if not sharing.allows(gpu, self._members.get(uid))]

    def _others(self, node: str, gpu: GPU, exclude_uid: str | None, sharing: Sharing | None) -> list[str]:
        return [key for uid, key in self._holding(node, gpu, sharing) if uid != exclude_uid]

    def _held_by(self, namespace: str, node: str, gpu: GPU) -> bool:
        """Some pod of ``namespace`` holds ``node:gpu`` (lock held)."""
        return any(_namespace(key) == namespace for key in (self._gpus.get((node, gpu)) or {}).values())

    def _set(self, uid: str, key: str, claim: Claim | None) -> set[str]:
        """Set the pod's claim (lock held); returns nodes whose GPUs were released."""
        released: set[str] = set()
        old = self._pods.get(uid)
        if old is not None and old[1] == claim and old[0] == key:
            return released
        if old is not None:
            old_key, old_claim = old
            freed = 0
            for gpu in old_claim.gpus:
                slot = self._gpus.get((old_claim.node, gpu))
                if slot is not None:
                    slot.pop(uid, None)
                    if not slot:
                        del self._gpus[(old_claim.node, gpu)]
                if claim is None or claim.node != old_claim.node or gpu not in claim.gpus:
                    released.add(old_claim.node)
                if not self._held_by(_namespace(old_key), old_claim.node, gpu):
                    freed += 1  # its last holder in the namespace (a shared GPU counts once)
            self._count(old_key, old_claim.node, -freed)
            del self._pods[uid]
        if claim is not None:
            self._pods[uid] = (key, claim)
            taken = sum(1 for gpu in claim.gpus if not self._held_by(_namespace(key), claim.node, gpu))
            for gpu in claim.gpus:
                self._gpus.setdefault((claim.node, gpu), {})[uid] = key
            self._count(key, claim.node, taken)
        return released

    def _count(self, key: str, node: str, gpus: int) -> None:
        """What the pod ``key``'s namespace holds on ``node`` changed by ``gpus`` (lock held)."""
        if not gpus:
            return
        place = (_namespace(key), node)
        held = self._places.get(place, 0) + gpus
        if held:
            self._places[place] = held
        else:
            del self._places[place]
        if self._listener is not None:
            self._listener(place[0], node, gpus)


def _namespace(key: str) -> str:
    return key.split("/", maxsplit=1)[0]
