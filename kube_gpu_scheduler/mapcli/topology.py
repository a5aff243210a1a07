"""Topology warnings from the live cluster: a named entry whose GPUs span PCIe roots (else NUMA nodes).

The facts are what each node's DRA driver publishes in its ResourceSlices
(``resource.kubernetes.io/pcieRoot``, ``resource.kubernetes.io/numaNode``;
:func:`kube_gpu_scheduler.domain.dracount.spans`). A node that publishes neither, or no slice at
all (the env modes' nodes), gives no warning: nothing is known of its topology.

* ``gpu-scheduler-map validate --live`` (:func:`warn`): each named entry of each map that spans
  is a warning (reason ``GPUsSpanTopology``) on the entry's line;
* ``gpu-scheduler-map status`` (:func:`spanning`): each bound replica of ours whose entry spans.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from kube_gpu_scheduler.domain import dra, dracount
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import entry_for, ordinal_of
from kube_gpu_scheduler.domain.rules.catalogue import GPUS_SPAN_TOPOLOGY
from kube_gpu_scheduler.domain.schedmap import Entry, MapError, SchedulingMap
from kube_gpu_scheduler.kube.errors import ApiError, api_error
from kube_gpu_scheduler.kube.jsonio import list_all
from kube_gpu_scheduler.mapcli.live import replica_json

ADVICE = "GPUs under one root talk faster: name GPUs of one root, or ask for a count (NODE:auto(N), DRA mode)"


def read_slices(api: client.ApiClient) -> list[dict[str, Any]]:
    """Every ResourceSlice; none where the cluster serves no ``resource.k8s.io/v1`` or the user
    may not read them (then nothing is known of any node's topology)."""
    try:
        return list(list_all(client.ResourceV1Api(api).list_resource_slice)[0])
    except Exception as err:
        if api_error(err) in (ApiError.NOT_FOUND, ApiError.FORBIDDEN):
            return []
        raise


def message(entry: Entry, span: str) -> str:
    return f"entry '{entry}' {span}: {ADVICE}"


def entry_warnings(smap: SchedulingMap, slices: Iterable[Mapping[str, Any]]) -> list[tuple[Entry, str]]:
    """``(entry, message)`` for each named entry of ``smap`` whose GPUs span roots on its node."""
    slices = list(slices)
    devices: dict[str, list[dra.Device]] = {}
    out = []
    for entry in smap.values():
        if entry.count:
            continue
        if entry.node not in devices:
            devices[entry.node] = dra.node_devices(slices, entry.node)
        span = dracount.spans(entry, devices[entry.node])
        if span:
            out.append((entry, message(entry, span)))
    return out


def warn(reports: Iterable[Any], slices: Iterable[Mapping[str, Any]]) -> None:
    """Add a ``GPUsSpanTopology`` warning to each ``validate`` map report (``MapReport``) per
    named entry of its map that spans PCIe roots (else NUMA nodes) on the live cluster."""
    slices = list(slices)
    for report in reports:
        if report.smap is None:
            continue
        report.warnings.extend(
            {"file_line": report.file_line(entry.line), "message": text, "reason": GPUS_SPAN_TOPOLOGY}
            for entry, text in entry_warnings(report.smap, slices)
        )


@dataclass(frozen=True)
class Spanning:
    """A bound replica whose named GPUs span PCIe roots (else NUMA nodes) of its node."""

    namespace: str
    pod: str
    statefulset: str
    ordinal: int | None
    node: str
    gpus: str
    span: str

    def to_json(self) -> dict[str, Any]:
        replica = replica_json(self.namespace, self.pod, self.statefulset, self.ordinal)
        return {**replica, "node": self.node, "gpus": self.gpus, "spans": self.span}


def spanning(
    pods: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]], scheduler_name: str
) -> list[Spanning]:
    """Our bound replicas (``scheduler_name``'s pods, DRA mode's replicas) whose named entry's GPUs
    span roots of the node they are bound to, as its slices say."""
    slices = list(slices)
    devices: dict[str, list[dra.Device]] = {}
    out = []
    for pod in pods:
        view = Pod(pod)
        ours = view.scheduler_name == scheduler_name or view.labels.get(dra.POD_LABEL) == "true"
        if not ours or not view.node_name or view.deleting:
            continue
        try:
            _, entry = entry_for(view.meta)
        except MapError:
            continue
        if entry is None or entry.count or entry.node != view.node_name:
            continue
        if entry.node not in devices:
            devices[entry.node] = dra.node_devices(slices, entry.node)
        span = dracount.spans(entry, devices[entry.node])
        if span:
            out.append(
                Spanning(
                    view.namespace or "",
                    view.name or "",
                    view.owner_of_kind("StatefulSet") or "",
                    ordinal_of(view.name, view.labels),
                    entry.node,
                    entry.devices,
                    span,
                )
            )
    return sorted(out, key=lambda s: (s.namespace, s.statefulset, s.ordinal or 0, s.pod))
