"""``gpu-scheduler-map plan``: what the scheduler would do with a StatefulSet, before it is applied.

For each replica of each StatefulSet in the input (a file or stdin, as ``validate`` reads), the
pod its controller would make (:func:`kube_gpu_scheduler.domain.gang.replica_pod`) goes through
the scheduler's own rules (:func:`kube_gpu_scheduler.domain.rules.evaluate`) against the live
cluster: its nodes, who holds each GPU (:meth:`kube_gpu_scheduler.mapcli.live.Cluster.holdings`),
what the pods on each node take. Then the maps not yet placed: a GPU that a replica of another
StatefulSet (in the cluster, or in the same input) wants and does not hold yet is a
``MapConflict``, since whichever the scheduler places first gets it. A gang
(``gpu-scheduler.io/gang``) places all its replicas or none.

The StatefulSet's own running replicas are not counted as holders: a rollout replaces them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from kube_gpu_scheduler.domain import dracount
from kube_gpu_scheduler.domain.dra import node_devices
from kube_gpu_scheduler.domain.fit import NodeTotals, PodFootprint
from kube_gpu_scheduler.domain.gang import (
    Blocked,
    gang_finding,
    gang_of,
    is_gang,
    replica_ordinals,
    replica_pod,
)
from kube_gpu_scheduler.domain.holding import is_active
from kube_gpu_scheduler.domain.objects import Meta, Pod
from kube_gpu_scheduler.domain.podinfo import entry_for, map_text, pod_map
from kube_gpu_scheduler.domain.resources import GPU_RESOURCE
from kube_gpu_scheduler.domain.rules import MAP_CONFLICT, Decision, evaluate
from kube_gpu_scheduler.domain.schedmap import GPU, Entry, MapError
from kube_gpu_scheduler.domain.sharing import Sharing
from kube_gpu_scheduler.mapcli.live import Cluster, Holder

Where = tuple[str, GPU]


@dataclass
class ReplicaPlan:
    ordinal: int
    entry: Entry | None
    placed: bool
    reason: str = ""
    message: str = ""
    # GPU -> the other replicas its map gives it (shared on purpose), ordinals ascending.
    shares: Mapping[GPU, tuple[int, ...]] = field(default_factory=dict)
    # Where the node's ResourceSlices publish topology: "spans PCIe roots ..." ("" when aligned).
    topology: str = ""

    @property
    def sharing(self) -> str:
        """``"shares node4:3 with replica 4"`` (``""`` when it shares nothing)."""
        if not self.shares or self.entry is None:
            return ""
        parts = [
            f"{self.entry.node}:{gpu} with replica{'s' if len(o) > 1 else ''} {', '.join(map(str, o))}"
            for gpu, o in self.shares.items()
        ]
        return "shares " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        e = self.entry
        return {
            "ordinal": self.ordinal,
            "node": e.node if e else None,
            "gpus": list(e.gpus) if e else [],
            **({"count": e.count} if e and e.count else {}),
            "placed": self.placed,
            "reason": self.reason or None,
            "message": self.message or None,
            "sharedWith": {str(g): list(o) for g, o in self.shares.items()},
            **({"topology": self.topology} if self.topology else {}),
        }


@dataclass
class SetPlan:
    namespace: str
    name: str
    gang: bool
    replicas: list[ReplicaPlan] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.placed for r in self.replicas)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "gang": self.gang,
            "ok": self.ok,
            "replicas": [r.to_json() for r in self.replicas],
        }


def statefulsets(text: str, namespace: str) -> list[dict[str, Any]]:
    """The StatefulSets of a YAML input (Lists unfolded) whose pod template carries a map,
    each with a namespace (``namespace`` where it names none)."""
    found: list[dict[str, Any]] = []

    def visit(doc: Any) -> None:
        if not isinstance(doc, dict):
            return
        if doc.get("kind") == "List" or str(doc.get("kind", "")).endswith("List"):
            for item in doc.get("items") or []:
                visit(item)
        elif doc.get("kind") == "StatefulSet":
            template = (doc.get("spec") or {}).get("template") or {}
            if map_text(template.get("metadata")) is not None:
                meta = doc.setdefault("metadata", {})
                meta.setdefault("namespace", namespace)
                found.append(doc)

    for doc in yaml.safe_load_all(text):
        visit(doc)
    return found


class _Holders:
    """The cluster's holders, less the planned StatefulSet's own replicas (its rollout moves them)."""

    def __init__(self, held: Mapping[Where, list[Holder]], namespace: str, name: str) -> None:
        self._held, self._ns, self._name = held, namespace, name

    def holders(
        self, node: str, gpus: Iterable[GPU], exclude_uid: str | None = None, sharing: Sharing | None = None
    ) -> list[tuple[GPU, str]]:
        # The planned StatefulSet's own replicas are left out whole: its sharers among them too.
        return [
            (gpu, h.key)
            for gpu in gpus
            for h in self._held.get((node, gpu), [])
            if not (h.namespace == self._ns and h.statefulset == self._name)
        ]


class _Room:
    """What the bound pods on each node take (the fit checks), less the planned StatefulSet's."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self._by_node: dict[str, list[PodFootprint]] = {}
        for pod in cluster.pods:
            view = Pod(pod)
            if view.node_name is None or not is_active(pod):
                continue
            if view.namespace == namespace and view.owner_of_kind("StatefulSet") == name:
                continue
            fp = PodFootprint.of(view.key, view.node_name, view.spec)
            self._by_node.setdefault(view.node_name, []).append(fp)

    def totals(self, node: str, exclude_uid: str | None = None) -> NodeTotals:
        return NodeTotals.of(self._by_node.get(node, []))


def wanted(
    cluster: Cluster, held: Mapping[Where, list[Holder]], scheduler_name: str
) -> dict[Where, list[str]]:
    """GPUs the replicas of the cluster's StatefulSets want and do not hold yet (maps not placed)."""
    out: dict[Where, list[str]] = {}
    for sts in cluster.statefulsets:
        template = Meta(sts).spec.get("template") or {}
        if (template.get("spec") or {}).get("schedulerName") != scheduler_name:
            continue
        for ordinal in replica_ordinals(sts):
            for where, who in _wants(sts, ordinal):
                holders = held.get(where, [])
                if not any(
                    h.pod == who.rsplit("/", 1)[1] and h.namespace == Meta(sts).namespace for h in holders
                ):
                    out.setdefault(where, []).append(
                        f"replica {who} (StatefulSet {Meta(sts).key}, not placed yet)"
                    )
    return out


def _wants(sts: Mapping[str, Any], ordinal: int) -> list[tuple[Where, str]]:
    view = Meta(sts)
    pod = replica_pod(sts, ordinal)
    try:
        _, entry = entry_for(pod["metadata"])
    except MapError:
        return []
    if entry is None:
        return []
    return [((entry.node, gpu), f"{view.namespace}/{view.name}-{ordinal}") for gpu in entry.gpus]


def dra_nodes(
    nodes: Mapping[str, Mapping[str, Any]], slices: Sequence[Mapping[str, Any]]
) -> dict[str, Mapping[str, Any]]:
    """The nodes as DRA mode counts their GPUs: a node whose ResourceSlices publish the driver's
    devices has that many (index i is its i-th device in PCI bus ID order, as the claims resolve
    it), whatever its ``nvidia.com/gpu`` says (DRA nodes need not report one); a node that
    publishes none keeps what it reports."""
    out: dict[str, Mapping[str, Any]] = {}
    for name, node in nodes.items():
        devices = node_devices(slices, name)
        if not devices:
            out[name] = node
            continue
        status = dict(node.get("status") or {})
        status["allocatable"] = {**(status.get("allocatable") or {}), GPU_RESOURCE: str(len(devices))}
        out[name] = {**node, "status": status}
    return out


def plan(
    planned: list[dict[str, Any]], cluster: Cluster, scheduler_name: str, dra: bool = False
) -> list[SetPlan]:
    held = cluster.holdings(scheduler_name)
    others = wanted(cluster, held, scheduler_name)
    nodes = dra_nodes(cluster.nodes, cluster.slices) if dra else cluster.nodes
    out = []
    for given in planned:
        view = Meta(given)
        live = next((s for s in cluster.statefulsets if Meta(s).key == view.key), None)
        uid = Meta(live).uid if live is not None else ""
        sts = {**given, "metadata": {**view.meta, "uid": uid}} if uid else given
        mine = _others_of(others, view.key)
        for other in planned:
            if Meta(other).key != view.key:
                for ordinal in replica_ordinals(other):
                    for where, who in _wants(other, ordinal):
                        mine.setdefault(where, []).append(
                            f"replica {who} (StatefulSet {Meta(other).key} in this input)"
                        )
        holders = _Holders(held, view.namespace or "", view.name or "")
        room = _Room(cluster, view.namespace or "", view.name or "")
        result = SetPlan(view.namespace or "", view.name or "", is_gang(view.spec.get("template") or {}))
        for ordinal in replica_ordinals(sts):
            pod = replica_pod(sts, ordinal, uid=f"plan:{ordinal}")
            decision = evaluate(pod, nodes, holders, False, room, dra)
            verdict = _verdict(ordinal, decision, mine)
            verdict.shares = _shares(pod, ordinal)
            if verdict.entry is not None and cluster.slices:
                devices = node_devices(cluster.slices, verdict.entry.node)
                verdict.topology = dracount.spans(verdict.entry, devices)
            result.replicas.append(verdict)
        if result.gang and not result.ok:
            _gang(result, sts)
        out.append(result)
    return out


def _shares(pod: Mapping[str, Any], ordinal: int) -> dict[GPU, tuple[int, ...]]:
    """GPU -> the other replicas the pod's map gives it too."""
    try:
        smap = pod_map(pod.get("metadata"))
    except MapError:
        return {}
    if smap is None:
        return {}
    return {g: tuple(sorted(o)) for g, o in smap.mates(ordinal).items()}


def _others_of(others: Mapping[Where, list[str]], key: str) -> dict[Where, list[str]]:
    """The unplaced wants of every StatefulSet but ``key`` itself."""
    return {where: [w for w in who if f"StatefulSet {key}," not in w] for where, who in others.items()}


def _verdict(ordinal: int, decision: Decision, wanted_by: Mapping[Where, list[str]]) -> ReplicaPlan:
    entry = decision.entry
    if not decision.ok or entry is None:
        return ReplicaPlan(ordinal, entry, False, decision.reason, decision.message)
    clashes = [
        f"GPU {entry.node}:{gpu} is also wanted by {who}"
        for gpu in entry.gpus
        for who in wanted_by.get((entry.node, gpu), [])
    ]
    if clashes:
        return ReplicaPlan(ordinal, entry, False, MAP_CONFLICT, "; ".join(clashes))
    return ReplicaPlan(ordinal, entry, True)


def _gang(result: SetPlan, sts: Mapping[str, Any]) -> None:
    """All or none: every replica of a gang that cannot be placed whole waits, naming why."""
    blocked = [Blocked(r.ordinal, r.entry, r.reason, r.message) for r in result.replicas if not r.placed]
    pod = replica_pod(sts, result.replicas[0].ordinal)
    key = gang_of(pod)
    if key is None:
        return
    finding = gang_finding(key, len(result.replicas), blocked)
    for r in result.replicas:
        own = f"; {r.reason}: {r.message}" if not r.placed else ""
        r.placed, r.reason, r.message = False, finding.reason, finding.message + own
