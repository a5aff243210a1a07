"""DRA mode: the ResourceClaim of a count entry (``NODE:auto(N)``), and why it cannot be allocated.

A count entry names no GPU: its replica's claim ``<pod>-gpus`` asks for N devices of the
DeviceClass (one request ``gpus``, ``allocationMode: ExactCount``, ``count: N``) and
kube-scheduler chooses them, on the node the pod is pinned to. Never a device index in the claim.

* **Topology-aligned.** When every device the node publishes carries the standard attribute
  ``resource.kubernetes.io/pcieRoot``, the claim has the constraint
  ``matchAttribute: resource.kubernetes.io/pcieRoot``: the N GPUs share one PCIe root complex.
  Else, when every device carries ``resource.kubernetes.io/numaNode``, the constraint is on
  that: one NUMA node. Else there is none (the node publishes no topology; any N GPUs). The
  choice is made when the claim is made, from the node's slices then, and written on the claim
  (:data:`TOPOLOGY_ANNOTATION`).
* **Exclusive.** kube-scheduler allocates a device to one claim only, so no other claim (another
  replica's, another workload's) is given the chosen GPUs. A selector also keeps the claim off
  the GPUs that the map's *named* entries on that node name (by PCI bus ID, else UUID), so a count
  entry never takes a GPU another entry of its own map is waiting for.
* **Sticky.** The claim is pinned to the StatefulSet as every replica's claim is
  (docs/dra.md): its allocation outlives the pod, and the next pod of the replica reuses it.

:func:`unfit` says why no allocation can be found on the node now (capacity of the largest
group, or GPUs other claims hold): the controller keeps the gate closed and says it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.schedmap import Entry, SchedulingMap

REQUEST = "gpus"
# On a count entry's claim: the attribute its devices must share ("" none), and what it chose.
TOPOLOGY_ANNOTATION = "gpu-scheduler.io/topology"
# The attribute a claim aligns on, by preference, and how a message names it.
ALIGNMENTS = (
    (dra.PCIE_ROOT_ATTRIBUTE, "PCIe root"),
    (dra.NUMA_ATTRIBUTE, "NUMA node"),
)


def value(device: dra.Device, attribute: str) -> str:
    return device.pcie_root if attribute == dra.PCIE_ROOT_ATTRIBUTE else device.numa_node


def alignment(devices: Sequence[dra.Device]) -> str:
    """The standard attribute the claim's devices must share: ``pcieRoot`` when every device
    publishes it, else ``numaNode`` when every device does, else "" (no constraint)."""
    for attribute, _ in ALIGNMENTS:
        if devices and all(value(d, attribute) for d in devices):
            return attribute
    return ""


def words(attribute: str) -> str:
    """How a message names a group of ``attribute``: ``PCIe root``, ``NUMA node``."""
    return next((w for a, w in ALIGNMENTS if a == attribute), "node")


def groups(devices: Sequence[dra.Device], attribute: str) -> dict[str, list[dra.Device]]:
    """The node's devices by their value of ``attribute`` (one group of all without one)."""
    out: dict[str, list[dra.Device]] = {}
    for d in devices:
        out.setdefault(value(d, attribute) if attribute else "", []).append(d)
    return out


def named_on_node(smap: SchedulingMap, entry: Entry, devices: Sequence[dra.Device]) -> list[dra.Device]:
    """The devices the map's named entries on ``entry``'s node name (those that resolve)."""
    out: list[dra.Device] = []
    for other in smap.values():
        if other.node != entry.node or other.count:
            continue
        try:
            out += [d for d in dra.resolve(other, devices) if d not in out]
        except dra.Unresolved:
            continue
    return out


def _excluding(devices: Sequence[dra.Device], driver: str) -> str:
    """CEL that is false for each of ``devices``: by PCI bus ID, else by UUID."""
    pci = sorted({d.pci_bus_id for d in devices if d.pci_bus_id})
    uuids = sorted({d.uuid for d in devices if not d.pci_bus_id and d.uuid})
    parts = []
    if pci:
        listed = ", ".join(f"'{p}'" for p in pci)
        parts.append(f"!(device.attributes['{dra.PCI_DOMAIN}'].{dra.PCI_ATTRIBUTE} in [{listed}])")
    if uuids:
        listed = ", ".join(f"'{u}'" for u in uuids)
        parts.append(f"!(device.attributes['{driver}'].{dra.UUID_ATTRIBUTE} in [{listed}])")
    return " && ".join(parts)


def claim_body(
    name: str,
    namespace: str,
    entry: Entry,
    devices: Sequence[dra.Device],
    excluded: Sequence[dra.Device],
    *,
    owner: Mapping[str, Any] | None,
    device_class: str = dra.DEVICE_CLASS,
    driver: str = dra.DRIVER,
) -> dict[str, Any]:
    """The claim for count entry ``entry``: ``entry.count`` devices, aligned on the node's topology
    (:func:`alignment` of ``devices``, its published GPUs), none of ``excluded``."""
    attribute = alignment(devices)
    request: dict[str, Any] = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": entry.count,
    }
    if excluded:
        request["selectors"] = [{"cel": {"expression": _excluding(excluded, driver)}}]
    devices_spec: dict[str, Any] = {"requests": [{"name": REQUEST, "exactly": request}]}
    if attribute:
        devices_spec["constraints"] = [
            {"requests": [REQUEST], "matchAttribute": f"{dra.PCI_DOMAIN}/{attribute}"}
        ]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {dra.MANAGED_BY_LABEL: dra.MANAGED_BY},
        "annotations": {
            dra.ENTRY_ANNOTATION: str(entry),
            TOPOLOGY_ANNOTATION: f"{dra.PCI_DOMAIN}/{attribute}" if attribute else "",
            dra.DEVICES_ANNOTATION: f"{entry.count} of {entry.node}, chosen by kube-scheduler"
            + (f" within one {words(attribute)}" if attribute else ""),
        },
    }
    return dra.claim_object(meta, devices_spec, owner)


def unfit(
    entry: Entry,
    devices: Sequence[dra.Device],
    excluded: Collection[dra.Device],
    held: Collection[dra.Device],
    attribute: str,
) -> tuple[bool, str]:
    """Why no ``entry.count`` devices of one group (of ``attribute``) are free now: ``(never,
    why)``; ``(False, "")`` when some group has them. ``never``: no group has that many GPUs at
    all, whoever holds them (the map must change, or the node); else other claims hold them."""
    n, what = entry.count, words(attribute)
    usable = [d for d in devices if d not in excluded]
    by_group = groups(usable, attribute)
    free = {g: [d for d in ds if d not in held] for g, ds in by_group.items()}
    if any(len(ds) >= n for ds in free.values()):
        return False, ""
    shown = "; ".join(
        f"{what} {g}: {len(by_group[g])} GPU{'' if len(by_group[g]) == 1 else 's'}, {len(free[g])} free"
        if attribute
        else f"{len(by_group[g])} GPUs, {len(free[g])} free"
        for g in sorted(by_group)[:8]
    )
    never = not any(len(ds) >= n for ds in by_group.values())
    where = f"one {what} of node {entry.node}" if attribute else f"node {entry.node}"
    left = f" ({len(excluded)} named by other entries of the map)" if excluded else ""
    if never:
        return True, (
            f"no {where} has {n} GPUs it may use{left} ({shown or 'none published'}): it can never be "
            f"allocated there; ask for fewer (auto(N) with N at most the largest {what}), or name the GPUs"
        )
    return False, f"{where} with {n} free GPUs is needed{left}, and other claims hold the others ({shown})"


def chosen(
    claim: Mapping[str, Any], devices: Iterable[dra.Device], driver: str = dra.DRIVER
) -> list[dra.Device]:
    """The published devices kube-scheduler allocated the claim, in PCI bus ID order."""
    got = {(a.pool, a.device) for a in dra.allocation(claim) if a.driver == driver}
    return [d for d in devices if (d.pool, d.name) in got]


def spans(entry: Entry, devices: Sequence[dra.Device]) -> str:
    """For a named entry whose GPUs resolve on ``devices`` (its node's): ``"spans PCIe roots
    pci0000:00 (gpu-0), pci0000:80 (gpu-4)"`` when they lie under more than one PCIe root (else
    more than one NUMA node), from the attributes the node publishes; "" when they do not, or
    when the node publishes neither for them (a count entry: "")."""
    if entry.count or len(entry.gpus) < 2:
        return ""
    try:
        got = dra.resolve(entry, devices)
    except dra.Unresolved:
        return ""
    for attribute, what in ALIGNMENTS:
        if not all(value(d, attribute) for d in got):
            continue
        by = groups(got, attribute)
        if len(by) < 2:
            return ""
        listed = ", ".join(f"{g} ({', '.join(d.name for d in ds)})" for g, ds in sorted(by.items()))
        return f"spans {what}s {listed}"
    return ""


def topology_value(devices: Sequence[dra.Device]) -> str:
    """A node's GPUs as the admission warning reads them (the DRA scheduler's ConfigMap
    ``<fullname>-topology``, one key per node): ``ROOT/NUMA/NAME`` per GPU, comma-separated, in
    index order (PCI bus ID order, :func:`kube_gpu_scheduler.domain.dra.node_devices`), an
    attribute the GPU does not publish left empty; "" when no GPU publishes either."""
    if not any(d.pcie_root or d.numa_node for d in devices):
        return ""
    return ",".join(f"{d.pcie_root}/{d.numa_node}/{d.name}" for d in devices)
