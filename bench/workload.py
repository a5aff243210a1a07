"""What the benchmark places: plans (nodes x pods x replicas per node), maps and pod bodies.

Every arm creates **bare pods**, each as a StatefulSet would make it (the ordinal
label ``apps.kubernetes.io/pod-index``, the workload's whole ``gpu-scheduling-map``
annotation) and already carrying the variables the webhook injects
(``CUDA_VISIBLE_DEVICES=<entry devices>``, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), so
the bind arms need no webhook and the scheduler runs its production path
(``GPU_SCHEDULER_REQUIRE_INJECTION=true``). Bare pods keep the StatefulSet
controller's own pace out of the numbers.

A plan of P pods on N nodes with R replicas per node is cut into workloads of at
most N*R replicas: replica k of workload w runs on ``node{k // R + 1}`` with GPU
``w * R + k % R``. So "1 per node" at 100 nodes x 500 pods is five workloads of
100 replicas (one per node each), "5 per node" is one workload of 500.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL
from kube_gpu_scheduler.domain.schedmap import ANNOTATION

PART_OF = "app.kubernetes.io/part-of"
BENCH = "gpu-scheduler-bench"
WORKLOAD_LABEL = "bench.gpu-scheduler.io/workload"
IMAGE = "registry.k8s.io/pause:3.10"
# A scheduler name nobody serves: pods that stay pending (arm C binds them itself).
NOBODY = "bench-nobody"
GPUS_PER_NODE = 8


def node_name(index: int) -> str:
    return f"node{index + 1}"


@dataclass(frozen=True)
class Plan:
    nodes: int
    pods: int
    per_node: int
    # Replicas per workload (its map's entries); 0: nodes * per_node, one replica per node:GPU of
    # a round of the nodes. ``make bench BENCH_SCALE=huge`` cuts 15,000 replicas into workloads of
    # 300: one workload of 15,000 would carry a 200 KB map on every pod.
    workload: int = 0

    @property
    def size(self) -> int:
        return self.workload or self.nodes * self.per_node

    @property
    def label(self) -> str:
        base = f"{self.nodes} nodes, {self.pods} pods, {self.per_node}/node"
        return f"{base}, workloads of {self.workload}" if self.workload else base

    @property
    def key(self) -> str:
        base = f"n{self.nodes}-p{self.pods}-r{self.per_node}"
        return f"{base}-w{self.workload}" if self.workload else base

    def placements(self) -> list[tuple[str, int, str, int]]:
        """(workload, ordinal, node, gpu) for every pod: pod i on node (i // R) mod N, its GPU i mod
        R in the first round of the nodes, R more in each next round; ordinal i mod the workload's
        size (with the default size, replica k of workload w on node k // R with GPU w * R + k % R)."""
        round_ = self.nodes * self.per_node
        out = []
        for i in range(self.pods):
            w, k = divmod(i, self.size)
            gpu = i % self.per_node + self.per_node * (i // round_)
            out.append((f"w{w}", k, node_name((i // self.per_node) % self.nodes), gpu))
        if max(g for *_, g in out) >= GPUS_PER_NODE:
            raise ValueError(f"plan {self.label} needs more than {GPUS_PER_NODE} GPUs per node")
        return out

    def maps(self) -> dict[str, str]:
        """workload -> its map annotation text."""
        lines: dict[str, list[str]] = {}
        for w, k, node, gpu in self.placements():
            lines.setdefault(w, []).append(f"{k}={node}:{gpu}")
        return {w: "\n".join(ls) + "\n" for w, ls in lines.items()}


@dataclass(frozen=True)
class PodSpec:
    """One pod to create, with the node and GPU its map names."""

    name: str
    node: str
    gpu: int
    body: bytes


def pod_body(
    name: str,
    ordinal: int,
    workload: str,
    map_text: str | None,
    *,
    scheduler_name: str,
    env: dict[str, str] | None,
    pin_node: str | None = None,
) -> bytes:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {PART_OF: BENCH, WORKLOAD_LABEL: workload, POD_INDEX_LABEL: str(ordinal)},
    }
    if map_text is not None:
        meta["annotations"] = {ANNOTATION: map_text}
    container: dict[str, Any] = {"name": "main", "image": IMAGE}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
    }
    if pin_node:
        # What a StatefulSet would carry for kube-scheduler to land replica k on its node.
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pin_node]}]}
                    ]
                }
            }
        }
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}).encode()


def bind_pods(plan: Plan, *, scheduler_name: str, pin: bool) -> list[PodSpec]:
    """The plan's pods, injected already; ``pin``: with the required node affinity (arm B)."""
    maps = plan.maps()
    out = []
    for w, k, node, gpu in plan.placements():
        name = f"{w}-{k}"
        env = {"CUDA_VISIBLE_DEVICES": str(gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        body = pod_body(
            name, k, w, maps[w], scheduler_name=scheduler_name, env=env, pin_node=node if pin else None
        )
        out.append(PodSpec(name, node, gpu, body))
    return out


# Node names of the webhook arm's maps: a map may not give one node:GPU twice, so a
# 3,000-entry map needs more names than nodes exist; the webhook never looks them up.
WEBHOOK_MAP_NODES = 1000


def _webhook_place(k: int) -> tuple[str, int]:
    return node_name(k % WEBHOOK_MAP_NODES), k // WEBHOOK_MAP_NODES


def webhook_map(entries: int) -> str:
    """The create arms' map of ``entries`` lines (``WEBHOOK_MAP_NODES`` node names, GPU k // n)."""
    return "".join("{}={}:{}\n".format(k, *_webhook_place(k)) for k in range(entries))


def webhook_pods(pods: int, entries: int, scheduler_name: str = NOBODY) -> list[PodSpec]:
    """``pods`` pending pods sharing one map of ``entries`` lines, ordinals cycling over the map.

    They carry no GPU variables (the webhook adds them) and name ``scheduler_name`` (by default
    a scheduler nobody serves).
    """
    text = webhook_map(entries)
    out = []
    for i in range(pods):
        k = i % entries
        node, gpu = _webhook_place(k)
        out.append(
            PodSpec(
                f"p-{i}",
                node,
                gpu,
                pod_body(f"p-{i}", k, "wh", text, scheduler_name=scheduler_name, env=None),
            )
        )
    return out


def sized_map(size: int) -> str:
    """A valid map of at most ``size`` bytes, as close to it as lines allow:
    ``N=gpu-node-K.example.com:0,1,2,3`` lines, 4 GPUs per ordinal, 2 ordinals per node (the
    largest map a StatefulSet can carry: the apiserver's 256 KiB limit on annotations)."""
    lines: list[str] = []
    used = o = 0
    while True:
        line = f"{o}=gpu-node-{o // 2}.example.com:{','.join(str((o % 2) * 4 + i) for i in range(4))}\n"
        if used + len(line) > size:
            return "".join(lines)
        lines.append(line)
        used += len(line)
        o += 1


def statefulset_body(name: str, map_text: str, *, scheduler_name: str) -> bytes:
    """A StatefulSet carrying ``map_text`` on its pod template, one replica per entry (the
    benchmark's control plane runs no StatefulSet controller: no pod is made)."""
    labels = {PART_OF: BENCH, WORKLOAD_LABEL: name}
    doc = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": map_text.count("\n"),
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {ANNOTATION: map_text}},
                "spec": {
                    "schedulerName": scheduler_name,
                    "containers": [{"name": "main", "image": IMAGE}],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }
    return json.dumps(doc).encode()


def foreign_pods(count: int, nodes: int = 0) -> list[bytes]:
    """Cheap pods of another scheduler (no map): what the scheduler's memory must barely grow with.

    With ``nodes``, they are bound to them (``spec.nodeName``, round robin), as pods that
    kube-scheduler or a DaemonSet placed: the fit checks keep a small footprint of each.
    """
    out = []
    for i in range(count):
        spec: dict[str, Any] = {"schedulerName": NOBODY, "containers": [{"name": "main", "image": IMAGE}]}
        if nodes:
            spec["nodeName"] = node_name(i % nodes)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"f-{i}", "labels": {PART_OF: BENCH}},
            "spec": spec,
        }
        out.append(json.dumps(pod).encode())
    return out
