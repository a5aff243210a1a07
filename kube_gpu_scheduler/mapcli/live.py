"""What ``plan`` and ``status`` read of a live cluster, and who holds which GPU there.

One list of each: nodes, the pods that are not finished, StatefulSets, and (where the cluster
serves ``resource.k8s.io/v1``) ResourceSlices and gpu-scheduler's ResourceClaims. The holders
are read as the scheduler reads them: a pod of ours holds what its containers were set up with
(:func:`kube_gpu_scheduler.domain.holding.pod_holds`), a DRA replica what its claim is
allocated; never an annotation a tenant can write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.holding import pod_holds
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import ordinal_of
from kube_gpu_scheduler.domain.resources import node_gpus
from kube_gpu_scheduler.domain.schedmap import GPU, gpu_sort_key
from kube_gpu_scheduler.kube.errors import ApiError, api_error
from kube_gpu_scheduler.kube.jsonio import list_all

ENV, MAP, DRA = "env", "map", "dra"


def replica_json(namespace: str, pod: str, statefulset: str, ordinal: int | None) -> dict[str, Any]:
    """A replica as the JSON output names it (a bare pod: statefulset null)."""
    return {"namespace": namespace, "pod": pod, "statefulset": statefulset or None, "ordinal": ordinal}


@dataclass(frozen=True)
class Holder:
    """A pod holding a GPU, and how: ``env`` (its injected variables), ``map`` (its entry on the
    node it is bound to, no variables) or ``dra`` (its ResourceClaim's allocation)."""

    namespace: str
    pod: str
    statefulset: str
    ordinal: int | None
    mode: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    def to_json(self) -> dict[str, Any]:
        return {**replica_json(self.namespace, self.pod, self.statefulset, self.ordinal), "mode": self.mode}


def holder_of(pod: Mapping[str, Any], mode: str) -> Holder:
    view = Pod(pod)
    return Holder(
        view.namespace or "",
        view.name or "",
        view.owner_of_kind("StatefulSet") or "",
        ordinal_of(view.name, view.labels),
        mode,
        view.uid,
    )


@dataclass
class Cluster:
    """One read of the cluster (lists, no watch)."""

    nodes: dict[str, dict[str, Any]]
    pods: list[dict[str, Any]]
    statefulsets: list[dict[str, Any]]
    slices: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, api: client.ApiClient) -> Cluster:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        nodes, _ = list_all(core.list_node)
        pods, _ = list_all(
            core.list_pod_for_all_namespaces, field_selector="status.phase!=Succeeded,status.phase!=Failed"
        )
        sets, _ = list_all(apps.list_stateful_set_for_all_namespaces)
        slices = _optional(lambda: list_all(client.ResourceV1Api(api).list_resource_slice)[0])
        claims = _optional(
            lambda: list_all(
                client.ResourceV1Api(api).list_resource_claim_for_all_namespaces,
                label_selector=f"{dra.MANAGED_BY_LABEL}={dra.MANAGED_BY}",
            )[0]
        )
        return cls({Pod(n).name or "": n for n in nodes}, pods, sets, slices, claims)

    def holdings(self, scheduler_name: str) -> dict[tuple[str, GPU], list[Holder]]:
        """``(node, gpu) -> holders``: our bound pods by their variables, DRA replicas by their
        claims' allocations (the GPU as its index on the node, in PCI bus ID order)."""
        held: dict[tuple[str, GPU], list[Holder]] = {}
        for pod in self.pods:
            if Pod(pod).scheduler_name != scheduler_name:
                continue
            found = pod_holds(pod)
            if found is not None:
                node, gpus = found
                mode = ENV if _has_variables(pod) else MAP
                for gpu in gpus:
                    held.setdefault((node, gpu), []).append(holder_of(pod, mode))
        by_name = {Pod(p).key: p for p in self.pods}
        for claim in self.claims:
            for node, index, user in self._claim_holders(claim, by_name):
                held.setdefault((node, index), []).append(holder_of(user, DRA))
        return held

    def _claim_holders(
        self, claim: Mapping[str, Any], pods: Mapping[str, Mapping[str, Any]]
    ) -> Iterable[tuple[str, int, Mapping[str, Any]]]:
        namespace = Pod(claim).namespace or ""
        users = [pods.get(f"{namespace}/{r.get('name')}") for r in dra.pod_refs(claim)]
        holders: list[Mapping[str, Any]] = [p for p in users if p is not None]
        if not holders:
            # Pinned, no pod now: the replica's GPUs stay allocated to it.
            name = (Pod(claim).name or "").removesuffix(dra.CLAIM_SUFFIX)
            owner = Pod(claim).owner_of_kind("StatefulSet") or ""
            meta = {"name": name, "namespace": namespace, "ownerReferences": _owner(owner)}
            holders = [{"metadata": meta}]
        for got in dra.allocation(claim):
            node = self._pool_node(got.pool)
            devices = dra.node_devices(self.slices, node, got.driver) if node else []
            index = next((i for i, d in enumerate(devices) if d.name == got.device), None)
            if node and index is not None:
                for pod in holders:
                    yield node, index, pod

    def _pool_node(self, pool: str) -> str:
        for s in self.slices:
            spec = s.get("spec") or {}
            if (spec.get("pool") or {}).get("name") == pool and spec.get("nodeName"):
                return str(spec["nodeName"])
        return ""

    def gpu_names(self, node: str) -> list[GPU]:
        """The node's GPUs by index: its ``nvidia.com/gpu`` count, or the devices its DRA driver
        publishes."""
        count = node_gpus((self.nodes.get(node) or {}).get("status"))
        if count is None:
            count = len(dra.node_devices(self.slices, node))
        return list(range(count))


def sort_gpus(gpus: Iterable[GPU]) -> list[GPU]:
    return sorted(set(gpus), key=gpu_sort_key)


def _owner(name: str) -> list[dict[str, Any]]:
    return [{"kind": "StatefulSet", "name": name, "controller": True}] if name else []


def _has_variables(pod: Mapping[str, Any]) -> bool:
    from kube_gpu_scheduler.domain.injection import held_devices

    return bool(held_devices(Pod(pod).spec))


def _optional(read: Any) -> list[dict[str, Any]]:
    """A list the cluster may not serve (no DRA API) or the user may not read: empty then."""
    try:
        return list(read())
    except Exception as err:
        if api_error(err) in (ApiError.NOT_FOUND, ApiError.FORBIDDEN):
            return []
        raise
