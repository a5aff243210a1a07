"""What the pods on each node take: the index behind the fit checks.

Fed by a watch of every non-terminated, bound pod in the cluster placed by
someone else (kube-scheduler, a DaemonSet, a static pod's mirror), and by the
scheduler's own pod watch for its own pods (each pod decoded once), kept as a
small :class:`~kube_gpu_scheduler.domain.fit.PodFootprint` per pod rather than the pod,
so thousands of pods that are not ours cost little memory. A decision sums
the footprints on one node (at most its pod slots): no LIST per pod.

Between the scheduler's decision and the watch showing its pod bound, the
footprint is kept as a *reservation* (as the ledger does for GPUs), so two
workers cannot both take the last free cores of a node.

Every time something leaves a node (a pod ends, is deleted, or shrinks) the
node's *generation* goes up: the scheduler retries the pods waiting for that
node at once, and a replica the kubelet refused is tried again only once
something changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from kube_gpu_scheduler.domain.fit import NodeTotals, PodFootprint
from kube_gpu_scheduler.domain.objects import Pod

FINISHED_PHASES = ("Succeeded", "Failed")
# The field selector of the watch: bound and not terminated (the apiserver filters).
ASSIGNED_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def footprint(pod: Mapping[str, Any]) -> PodFootprint | None:
    """The pod's footprint on its node; None when it is not bound or has finished."""
    view = Pod(pod)
    node = view.node_name
    if node is None or view.phase in FINISHED_PHASES:
        return None
    return PodFootprint.of(view.key, node, view.spec)


def compact(pod: dict[str, Any]) -> dict[str, Any]:
    """What the informer keeps of a pod that may not be ours: identity, node, phase, footprint."""
    view = Pod(pod)
    meta = view.meta
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": {"nodeName": view.node_name},
        "status": {"phase": view.phase},
        "footprint": footprint(pod),
    }


class NodeUsage:
    """Thread-safe index ``node -> {uid: footprint}``, with reservations and per-node generations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodFootprint] = {}  # uid -> footprint
        self._by_node: dict[str, dict[str, PodFootprint]] = {}
        self._reserved: set[str] = set()  # uids placed by us, not yet seen bound on the watch
        self._generation: dict[str, int] = {}

    # -- reads ---------------------------------------------------------------------------

    def totals(self, node: str, exclude_uid: str | None = None) -> NodeTotals:
        with self._lock:
            pods = [fp for uid, fp in (self._by_node.get(node) or {}).items() if uid != exclude_uid]
        return NodeTotals.of(pods)

    def generation(self, node: str) -> int:
        """Goes up each time a pod leaves ``node`` or takes less there."""
        with self._lock:
            return self._generation.get(node, 0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    # -- the watch --------------------------------------------------------------------------

    def observe(self, uid: str, fp: PodFootprint | None) -> set[str]:
        """Record what the watch shows; returns the nodes where something was freed."""
        with self._lock:
            if fp is not None:
                self._reserved.discard(uid)  # bound: the pod's own fields rule
            elif uid in self._reserved:
                return set()  # still our reservation
            return self._set(uid, fp)

    def forget(self, uid: str) -> set[str]:
        """The pod is gone (deleted, or finished and filtered out of the watch)."""
        with self._lock:
            self._reserved.discard(uid)
            return self._set(uid, None)

    # -- the scheduler's own placements -------------------------------------------------------

    def reserve(self, uid: str, fp: PodFootprint, check: Callable[[NodeTotals], list[Any]]) -> list[Any]:
        """Atomically run ``check`` on the node's totals (without this pod) and, if it finds
        nothing, take the footprint. Returns what ``check`` found."""
        with self._lock:
            others = [f for u, f in (self._by_node.get(fp.node) or {}).items() if u != uid]
            found = check(NodeTotals.of(others))
            if not found:
                self._reserved.add(uid)
                self._set(uid, fp)
            return found

    def cancel(self, uid: str) -> set[str]:
        """Drop a reservation whose Binding failed."""
        with self._lock:
            if uid not in self._reserved:
                return set()
            self._reserved.discard(uid)
            return self._set(uid, None)

    # -- internals ---------------------------------------------------------------------------

    def _set(self, uid: str, fp: PodFootprint | None) -> set[str]:
        old = self._pods.get(uid)
        if old == fp:
            return set()
        released: set[str] = set()
        if old is not None:
            on_node = self._by_node.get(old.node)
            if on_node is not None:
                on_node.pop(uid, None)
                if not on_node:
                    del self._by_node[old.node]
            del self._pods[uid]
            if fp is None or fp.node != old.node or _shrinks(old, fp):
                released.add(old.node)
                self._generation[old.node] = self._generation.get(old.node, 0) + 1
        if fp is not None:
            self._pods[uid] = fp
            self._by_node.setdefault(fp.node, {})[uid] = fp
        return released


def _shrinks(old: PodFootprint, new: PodFootprint) -> bool:
    """The pod takes less of something (or fewer ports) than before."""
    now = dict(new.requests)
    return any(now.get(name, 0) < value for name, value in old.requests) or not set(old.ports) <= set(
        new.ports
    )
