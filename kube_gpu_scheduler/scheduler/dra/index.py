"""DRA mode's indexes: what the claim controller's informer handlers record, so that each
key's work reads only what concerns it, and each change enqueues only the keys it can affect.

* claims by the devices their allocation gives them (who holds ``(driver, pool, device)``),
  by the StatefulSet that owns them, and the claims gpu-scheduler made;
* the ResourceSlices of our driver by node and by pool, and the claims of ours by the pools
  of their allocation;
* the DeviceTaintRules by the pools they may taint (:data:`ANY`: a rule that names none);
* the DRA replicas by their entry's node and by their StatefulSet's UID;
* the replicas waiting for a device another claim holds (recorded by the worker that
  found it held; the claim's release enqueues them).

Handlers run on the informer threads and workers read from theirs: every relation has its
own lock, and what it answers is a copy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.devicetaints import ANY, rule_pools
from kube_gpu_scheduler.domain.objects import Meta
from kube_gpu_scheduler.domain.podinfo import entry_for
from kube_gpu_scheduler.domain.schedmap import MapError
from kube_gpu_scheduler.kube.informer import object_key

V = TypeVar("V")
# A device as an allocation names it: (driver, pool, device).
DeviceKey = tuple[str, str, str]


class Relation(Generic[V]):
    """Each key's set of values, and back: the keys that have a value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._of: dict[str, frozenset[V]] = {}
        self._by: dict[V, set[str]] = {}

    def put(self, key: str, values: Iterable[V]) -> frozenset[V]:
        """``key`` now has exactly ``values``; returns the values it had."""
        new = frozenset(values)
        with self._lock:
            old = self._of.get(key, frozenset())
            if new == old:
                return old
            for value in old - new:
                keys = self._by[value]
                keys.discard(key)
                if not keys:
                    del self._by[value]
            for value in new - old:
                self._by.setdefault(value, set()).add(key)
            if new:
                self._of[key] = new
            else:
                self._of.pop(key, None)
            return old

    def drop(self, key: str) -> frozenset[V]:
        return self.put(key, ())

    def values(self, key: str) -> frozenset[V]:
        with self._lock:
            return self._of.get(key, frozenset())

    def keys(self, *values: V) -> set[str]:
        """The keys that have any of ``values``."""
        with self._lock:
            return {k for v in values for k in self._by.get(v, ())}

    def every_value(self) -> set[V]:
        with self._lock:
            return set(self._by)

    def every_key(self) -> set[str]:
        with self._lock:
            return set(self._of)

    def __len__(self) -> int:
        with self._lock:
            return len(self._of)


def claim_pod(claim: Mapping[str, Any]) -> str | None:
    """``ns/w-1`` for the claim ``ns/w-1-gpus`` (the replica a claim of ours serves)."""
    meta = Meta(claim)
    name = meta.name or ""
    if not name.endswith(dra.CLAIM_SUFFIX) or not meta.namespace:
        return None
    return f"{meta.namespace}/{name.removesuffix(dra.CLAIM_SUFFIX)}"


def is_ours(claim: Mapping[str, Any]) -> bool:
    return Meta(claim).labels.get(dra.MANAGED_BY_LABEL) == dra.MANAGED_BY


def entry_node(pod: Mapping[str, Any]) -> str | None:
    """The node of the pod's entry in its map (None: no entry, or a map that does not parse)."""
    try:
        _, entry = entry_for(Meta(pod).meta)
    except MapError:
        return None
    return entry.node if entry is not None else None


def statefulset_uid(obj: Mapping[str, Any], *, controller: bool) -> str | None:
    """The UID of the StatefulSet that owns ``obj`` (its controller, when ``controller``)."""
    for ref in Meta(obj).owner_references:
        if ref.get("kind") == "StatefulSet" and ref.get("uid") and (ref.get("controller") or not controller):
            return str(ref["uid"])
    return None


class ClaimIndex:
    def __init__(self, driver: str = dra.DRIVER) -> None:
        self.driver = driver
        self._held: Relation[DeviceKey] = Relation()  # claim key -> its allocated devices
        self._owned: Relation[str] = Relation()  # claim key -> the UID of its owner StatefulSet
        self._ours: Relation[bool] = Relation()  # claim key -> {True}: made by gpu-scheduler
        self._slices: Relation[str] = Relation()  # slice key -> {its node} (our driver's slices)
        self._slice_pools: Relation[str] = Relation()  # slice key -> {its pool} (our driver's slices)
        self._claim_pools: Relation[str] = Relation()  # claim of ours -> the pools of its allocation
        self._rules: Relation[str] = Relation()  # DeviceTaintRule -> the pools it may taint, or ANY
        self._pod_nodes: Relation[str] = Relation()  # DRA pod key -> {its entry's node}
        self._pod_sets: Relation[str] = Relation()  # DRA pod key -> {its StatefulSet's UID}
        self._pod_claims: Relation[str] = Relation()  # DRA pod key -> the keys of the claims it references
        self._waits: Relation[DeviceKey] = Relation()  # DRA pod key -> devices held by others

    # -- claims ------------------------------------------------------------------------------

    def claim(self, claim: Mapping[str, Any]) -> frozenset[DeviceKey]:
        """Record ``claim``; returns the devices it held and holds no more (freed)."""
        key = object_key(claim)
        held = {(a.driver, a.pool, a.device) for a in dra.allocation(claim)}
        owner = statefulset_uid(claim, controller=False)
        self._owned.put(key, [owner] if owner else [])
        self._ours.put(key, [True] if is_ours(claim) else [])
        self._claim_pools.put(
            key, {pool for driver, pool, _ in held if driver == self.driver} if is_ours(claim) else []
        )
        return self._held.put(key, held) - held

    def forget_claim(self, claim: Mapping[str, Any]) -> frozenset[DeviceKey]:
        """``claim`` is gone; returns the devices it held."""
        key = object_key(claim)
        self._owned.drop(key)
        self._ours.drop(key)
        self._claim_pools.drop(key)
        return self._held.drop(key)

    def holders(self, device: DeviceKey) -> list[str]:
        """The keys of the claims allocated ``device`` (one, unless something went wrong)."""
        return sorted(self._held.keys(device))

    def claims_of(self, statefulset_uid: str) -> set[str]:
        return self._owned.keys(statefulset_uid)

    def ours(self) -> set[str]:
        return self._ours.keys(True)

    def ours_in(self, pools: Iterable[str]) -> set[str]:
        """The claims of ours allocated a device of one of ``pools`` (every one for :data:`ANY`)."""
        pools = set(pools)
        return self.ours() if ANY in pools else self._claim_pools.keys(*pools)

    # -- slices ------------------------------------------------------------------------------

    def slice(self, obj: Mapping[str, Any]) -> tuple[set[str], set[str]]:
        """Record a ResourceSlice; returns the nodes and the pools whose devices it may change."""
        spec = Meta(obj).spec
        node, pool = spec.get("nodeName"), (spec.get("pool") or {}).get("name")
        ours = spec.get("driver") == self.driver
        now = {node} if ours and isinstance(node, str) and node else set()
        pools = {pool} if ours and isinstance(pool, str) and pool else set()
        key = object_key(obj)
        return set(self._slices.put(key, now)) | now, set(self._slice_pools.put(key, pools)) | pools

    def forget_slice(self, obj: Mapping[str, Any]) -> tuple[set[str], set[str]]:
        key = object_key(obj)
        return set(self._slices.drop(key)), set(self._slice_pools.drop(key))

    def slices_on(self, node: str) -> set[str]:
        return self._slices.keys(node)

    def nodes_of(self, pools: Iterable[str]) -> set[str]:
        """The nodes whose slices of our driver hold one of ``pools`` (every one for :data:`ANY`)."""
        pools = set(pools)
        if ANY in pools:
            return self._slices.every_value()
        return {n for k in self._slice_pools.keys(*pools) for n in self._slices.values(k)}

    # -- DeviceTaintRules --------------------------------------------------------------------

    def rule(self, obj: Mapping[str, Any]) -> set[str]:
        """Record a DeviceTaintRule; returns the pools it may have tainted or may taint now."""
        now = rule_pools(obj, self.driver)
        return set(self._rules.put(object_key(obj), now)) | now

    def forget_rule(self, obj: Mapping[str, Any]) -> set[str]:
        return set(self._rules.drop(object_key(obj)))

    def rules_for(self, pool: str) -> list[str]:
        """The DeviceTaintRules that may taint a device of our driver in ``pool``."""
        return sorted(self._rules.keys(pool, ANY))

    # -- DRA replicas ------------------------------------------------------------------------

    def pod(self, pod: Mapping[str, Any]) -> None:
        key = object_key(pod)
        node, owner = entry_node(pod), statefulset_uid(pod, controller=True)
        self._pod_nodes.put(key, [node] if node else [])
        self._pod_sets.put(key, [owner] if owner else [])
        namespace = Meta(pod).namespace
        self._pod_claims.put(key, {f"{namespace}/{name}" for name in dra.pod_claims(pod).values()})

    def forget_pod(self, key: str) -> None:
        self._pod_claims.drop(key)
        self._pod_nodes.drop(key)
        self._pod_sets.drop(key)
        self._waits.drop(key)

    def pods_on(self, *nodes: str) -> set[str]:
        """The DRA replicas whose entry is on one of ``nodes``."""
        return self._pod_nodes.keys(*nodes)

    def pods_using(self, claim: str) -> set[str]:
        """The DRA replicas whose pod references claim ``claim`` (``ns/name``): a shared claim's sharers."""
        return self._pod_claims.keys(claim)

    def pods_of(self, statefulset_uid: str) -> set[str]:
        return self._pod_sets.keys(statefulset_uid)

    def wait(self, key: str, devices: Iterable[DeviceKey]) -> None:
        """Replica ``key`` waits for ``devices`` (and for no other device any more)."""
        self._waits.put(key, devices)

    def waiting_for(self, devices: Iterable[DeviceKey]) -> set[str]:
        return self._waits.keys(*devices)

    def waiting(self) -> int:
        return len(self._waits)
