"""``gpu-scheduler-map suggest``: a complete, explicit map for R replicas of K GPUs each, from the
live cluster's free GPUs, each replica's GPUs under one PCIe root (else one NUMA node) where the
nodes' DRA driver publishes it; for a GitOps user who keeps an explicit map without working it
out by hand.

The GPUs of a node are its indices (PCI bus ID order): the devices its ResourceSlices publish,
else its ``nvidia.com/gpu`` count (one group: no topology is known). A GPU is free when no pod
or claim holds it (:meth:`kube_gpu_scheduler.mapcli.live.Cluster.holdings`, as ``status`` reads
them) and no StatefulSet's map not yet placed wants it (as ``plan`` reads them). Cordoned nodes
are left out. Replicas are placed one by one, each in the group with the fewest free GPUs that
still has K (best fit: whole roots stay free for larger asks), the group's lowest free indices;
ties by node name, then group. The answer is named entries (``ORDINAL=NODE:GPU,...``), which
every mode reads and ``plan`` checks; it is not held: apply it soon, or plan it again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.domain import dracount
from kube_gpu_scheduler.domain.dra import node_devices
from kube_gpu_scheduler.domain.resources import node_gpus
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, GPU
from kube_gpu_scheduler.mapcli.live import Cluster


@dataclass(frozen=True)
class Group:
    """A node's GPUs under one PCIe root (or NUMA node, or the node: ``what``/``name``)."""

    node: str
    what: str
    name: str
    free: tuple[int, ...]


def groups(cluster: Cluster, taken: Collection[tuple[str, GPU]], nodes: Collection[str] = ()) -> list[Group]:
    """Every schedulable node's (of ``nodes``, when given) GPU groups with their free indices."""
    out: list[Group] = []
    for name, node in sorted(cluster.nodes.items()):
        if (nodes and name not in nodes) or (node.get("spec") or {}).get("unschedulable"):
            continue
        devices = node_devices(cluster.slices, name)
        if devices:
            attribute = dracount.alignment(devices)
            index = {d.name: i for i, d in enumerate(devices)}
            for value, members in sorted(dracount.groups(devices, attribute).items()):
                free = tuple(index[d.name] for d in members if (name, index[d.name]) not in taken)
                out.append(Group(name, dracount.words(attribute) if attribute else "node", value, free))
            continue
        count = node_gpus(node.get("status")) or 0
        free = tuple(i for i in range(count) if (name, i) not in taken)
        if count:
            out.append(Group(name, "node", "", free))
    return out


def suggest(
    cluster: Cluster,
    replicas: int,
    gpus: int,
    taken: Collection[tuple[str, GPU]],
    nodes: Collection[str] = (),
) -> tuple[list[tuple[int, Group, tuple[int, ...]]], str]:
    """``[(ordinal, group, indices)]`` for as many of ``replicas`` as fit, and why the others do not."""
    pool = {(g.node, g.name): list(g.free) for g in groups(cluster, taken, nodes)}
    meta = {(g.node, g.name): g for g in groups(cluster, taken, nodes)}
    out: list[tuple[int, Group, tuple[int, ...]]] = []
    for ordinal in range(replicas):
        fits = sorted((len(free), key) for key, free in pool.items() if len(free) >= gpus)
        if not fits:
            largest = max((len(f) for f in pool.values()), default=0)
            return out, (
                f"only {ordinal} of {replicas} replicas fit: no node has {gpus} free GPUs under one PCIe "
                f"root (or NUMA node) left; the most left in one is {largest}"
            )
        key = fits[0][1]
        chosen, pool[key] = tuple(pool[key][:gpus]), pool[key][gpus:]
        out.append((ordinal, meta[key], chosen))
    return out, ""


def map_text(placed: list[tuple[int, Group, tuple[int, ...]]]) -> str:
    return "".join(f"{o}={g.node}:{','.join(map(str, idx))}\n" for o, g, idx in placed)


def fragment(placed: list[tuple[int, Group, tuple[int, ...]]], name: str) -> str:
    """A manifest fragment to merge into the StatefulSet, each entry's group in a comment."""
    lines = [
        f"{o}={g.node}:{','.join(map(str, idx))}" + (f"  # {g.what} {g.name}" if g.name else "")
        for o, g, idx in placed
    ]
    body = "\n".join(f"          {line}" for line in lines)
    return (
        f"# gpu-scheduler-map suggest: {len(placed)} replicas for StatefulSet {name}\n"
        "spec:\n"
        f"  replicas: {len(placed)}\n"
        "  template:\n"
        "    metadata:\n"
        "      annotations:\n"
        f"        {ANNOTATION}: |\n{body}\n"
    )


def taken_gpus(
    cluster: Cluster, scheduler_name: str, wanted: Mapping[tuple[str, GPU], Any]
) -> set[tuple[str, GPU]]:
    """What is not free: every holder's GPU (pods, DRA claims) and every unplaced map's want."""
    held = set(cluster.holdings(scheduler_name))
    return held | {where for where, who in wanted.items() if who}
