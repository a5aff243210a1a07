"""``gpu-scheduler-map status`` (also ``kubectl gpu-map status``): who holds which GPU, which are free,
and which replicas wait and why.

Per node, each GPU by index (its ``nvidia.com/gpu`` count, or the devices its DRA driver
publishes, in PCI bus ID order) with its holder: namespace, pod, StatefulSet, ordinal and mode
(``env``: the variables injected into its containers; ``map``: bound without them, its entry;
``dra``: its ResourceClaim's allocation). GPUs named by UUID are listed after the indices. The
holders are read as the scheduler reads them (:mod:`kube_gpu_scheduler.mapcli.live`), never
from an annotation. Waiting replicas: our pending pods with the scheduler's ``PodScheduled``
message, and DRA replicas behind their scheduling gate with gpu-scheduler's latest Warning.
Bound replicas whose named GPUs span PCIe roots (else NUMA nodes) of what their node's slices
publish (:mod:`kube_gpu_scheduler.mapcli.topology`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from kubernetes import client

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import entry_for, ordinal_of
from kube_gpu_scheduler.domain.schedmap import GPU, MapError
from kube_gpu_scheduler.kube.jsonio import list_all
from kube_gpu_scheduler.mapcli.live import Cluster, Holder, replica_json, sort_gpus
from kube_gpu_scheduler.mapcli.topology import Spanning

FREE = "free"


@dataclass(frozen=True)
class Waiting:
    namespace: str
    pod: str
    statefulset: str
    ordinal: int | None
    wants: str
    why: str

    def to_json(self) -> dict[str, Any]:
        replica = replica_json(self.namespace, self.pod, self.statefulset, self.ordinal)
        return {**replica, "wants": self.wants or None, "why": self.why}


def gpu_table(cluster: Cluster, scheduler_name: str) -> dict[str, list[tuple[GPU, list[Holder]]]]:
    """``node -> [(gpu, holders)]``: every GPU of every node that has GPUs or holders."""
    held = cluster.holdings(scheduler_name)
    nodes = sorted(set(cluster.nodes) | {n for n, _ in held})
    table: dict[str, list[tuple[GPU, list[Holder]]]] = {}
    for node in nodes:
        gpus = sort_gpus([*cluster.gpu_names(node), *(g for n, g in held if n == node)])
        if gpus:
            table[node] = [(g, held.get((node, g), [])) for g in gpus]
    return table


def waiting(cluster: Cluster, scheduler_name: str, notes: Mapping[str, str]) -> list[Waiting]:
    out = []
    for pod in cluster.pods:
        view = Pod(pod)
        ours = view.scheduler_name == scheduler_name or view.labels.get(dra.POD_LABEL) == "true"
        if not ours or view.node_name is not None or view.deleting:
            continue
        try:
            _, entry = entry_for(view.meta)
        except MapError:
            entry = None
        wants = f"{entry.node}:{entry.devices}" if entry else ""
        why = _condition(pod) or notes.get(view.key, "")
        if not why and dra.gated(pod):
            why = "behind its scheduling gate: its ResourceClaim is not ready yet"
        out.append(
            Waiting(
                view.namespace or "",
                view.name or "",
                view.owner_of_kind("StatefulSet") or "",
                ordinal_of(view.name, view.labels),
                wants,
                why or "not seen by the scheduler yet",
            )
        )
    return sorted(out, key=lambda w: (w.namespace, w.statefulset, w.ordinal or 0, w.pod))


def _condition(pod: Mapping[str, Any]) -> str:
    for cond in Pod(pod).status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") != "SchedulingGated"
        ):
            return str(cond.get("message") or cond.get("reason") or "")
    return ""


def latest_warnings(api: client.ApiClient, scheduler_name: str) -> dict[str, str]:
    """``ns/pod -> note`` of the latest Warning gpu-scheduler wrote on each pod (DRA mode's waits)."""
    try:
        events, _ = list_all(
            client.EventsV1Api(api).list_event_for_all_namespaces,
            field_selector=f"reportingController={scheduler_name},type=Warning",
        )
    except Exception:
        return {}
    notes: dict[str, tuple[str, str]] = {}
    for ev in events:
        regarding = ev.get("regarding") or {}
        if regarding.get("kind") != "Pod":
            continue
        key = f"{regarding.get('namespace')}/{regarding.get('name')}"
        when = str((ev.get("series") or {}).get("lastObservedTime") or ev.get("eventTime") or "")
        if key not in notes or when >= notes[key][0]:
            notes[key] = (when, str(ev.get("note") or ""))
    return {k: v for k, (_, v) in notes.items()}


def to_json(
    table: Mapping[str, list[tuple[GPU, list[Holder]]]], waits: list[Waiting], spans: Sequence[Spanning] = ()
) -> dict[str, Any]:
    nodes = [
        {
            "name": node,
            "gpus": [{"gpu": gpu, "holders": [h.to_json() for h in holders]} for gpu, holders in gpus],
            "free": [gpu for gpu, holders in gpus if not holders],
        }
        for node, gpus in table.items()
    ]
    return {"nodes": nodes, "waiting": [w.to_json() for w in waits], "topology": [s.to_json() for s in spans]}


def print_table(
    table: Mapping[str, list[tuple[GPU, list[Holder]]]],
    waits: list[Waiting],
    out: TextIO,
    spans: Sequence[Spanning] = (),
) -> None:
    rows: list[tuple[str, ...]] = [("NODE", "GPU", "HOLDER", "STATEFULSET", "ORDINAL", "MODE")]
    for node, gpus in table.items():
        for gpu, holders in gpus:
            if not holders:
                rows.append((node, str(gpu), FREE, "", "", ""))
            for h in holders:
                ordinal = "" if h.ordinal is None else str(h.ordinal)
                rows.append((node, str(gpu), h.key, h.statefulset, ordinal, h.mode))
    _print(rows, out)
    if waits:
        print(file=out)
        rows = [("WAITING", "STATEFULSET", "ORDINAL", "WANTS", "WHY")]
        rows += [  # one row per waiting replica
            (
                f"{w.namespace}/{w.pod}",
                w.statefulset,
                "" if w.ordinal is None else str(w.ordinal),
                w.wants,
                w.why,
            )
            for w in waits
        ]
        _print(rows, out)
    if spans:  # named GPUs under more than one PCIe root (else NUMA node), from the slices
        print(file=out)
        rows = [("SPANS TOPOLOGY", "STATEFULSET", "ORDINAL", "NODE", "GPUS", "WARNING")]
        rows += [
            (
                f"{s.namespace}/{s.pod}",
                s.statefulset,
                "" if s.ordinal is None else str(s.ordinal),
                s.node,
                s.gpus,
                s.span,
            )
            for s in spans
        ]
        _print(rows, out)


def _print(rows: list[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        cells = [f"{c:<{widths[i]}}" for i, c in enumerate(r[:-1])]
        print("  ".join([*cells, r[-1]]).rstrip(), file=out)
