"""DRA mode: a replica's map entry as a ResourceClaim, and the GPUs a node publishes.

Pure functions over plain dicts (ResourceSlices, ResourceClaims as the API
returns them), shared by the scheduler's claim controller (kube_gpu_scheduler/scheduler/dra/controller.py),
the check program and the demo, so all three resolve a map entry the same way.

How an entry's GPU names resolve on its node, against the devices of the DRA
driver (NVIDIA's: driver ``gpu.nvidia.com``) in the node's ResourceSlices:

* an index ``i`` is the node's i-th GPU in PCI bus ID order, the order NVML and
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` use (the driver no longer publishes an index:
  it can change when a GPU falls off the bus);
* a UUID (``GPU-...``) is the device whose ``uuid`` attribute it is;
* a PCI bus ID is the device whose ``resource.kubernetes.io/pciBusID`` it is.

The claim pins each GPU with a CEL selector on an attribute: the UUID for the
UUID form, the PCI bus ID otherwise (the slot, which an index names at the time
the claim is made). A CEL selector cannot see the node; the replica's pod is
pinned to its node by required node affinity, so a PCI bus ID (the same on
every node of a model) only ever matches on that node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kube_gpu_scheduler.domain.devicetaints import Taint, slice_taints
from kube_gpu_scheduler.domain.schedmap import Entry, MapError, gpu_kind, gpu_name, parse

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
PCI_DOMAIN = "resource.kubernetes.io"
PCI_ATTRIBUTE = "pciBusID"
UUID_ATTRIBUTE = "uuid"
# The standard topology attributes (resource.kubernetes.io/...): what a count entry's claim aligns on.
PCIE_ROOT_ATTRIBUTE = "pcieRoot"
NUMA_ATTRIBUTE = "numaNode"
# The name of the claim in the pod's spec.resourceClaims and in each container's resources.claims.
POD_CLAIM = "gpu-scheduler"
# The claim's own name: the pod's name (a StatefulSet pod's name is fixed per ordinal) and this.
CLAIM_SUFFIX = "-gpus"
# What the claim controller writes on the claims it makes.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-scheduler"
ENTRY_ANNOTATION = "gpu-scheduler.io/entry"
DEVICES_ANNOTATION = "gpu-scheduler.io/devices"
# The label the admission policy puts on a replica handed to kube-scheduler in DRA mode.
POD_LABEL = "gpu-scheduler.io/dra"
# The scheduling gate a DRA replica is created behind, removed once its claim asks for its entry.
GATE = "gpu-scheduler.io/claim"


def claim_name(pod_name: str) -> str:
    return pod_name + CLAIM_SUFFIX


def normal_name(text: str) -> str:
    """A slice's ``uuid`` or ``pciBusID`` attribute in the map's normal form (as schedmap writes it)."""
    text = text.strip()
    return gpu_name(text) or text.lower()


@dataclass(frozen=True)
class Device:
    """One GPU a node publishes: the slice's pool and device name, its attributes, and the taints
    its slice gives it (the claim controller adds those of the DeviceTaintRules that select it)."""

    node: str
    pool: str
    name: str
    uuid: str
    pci_bus_id: str
    product: str = ""
    taints: tuple[Taint, ...] = field(default=(), compare=False)
    # Topology, where the driver publishes it (the standard attributes): the PCIe root complex
    # (``pci0000:00``) and the NUMA node (``"0"``); "" where not published.
    pcie_root: str = ""
    numa_node: str = ""

    def describe(self) -> str:
        """``gpu-2 (0000:3b:00.0, GPU-...)``"""
        parts = [p for p in (self.pci_bus_id, self.uuid) if p]
        return f"{self.name} ({', '.join(parts)})" if parts else self.name


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> str:
    """An attribute's string value, by its unqualified name (the driver's domain) or qualified."""
    for key in (name, f"{driver}/{name}"):
        value = attrs.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return ""


def _numa(attrs: Mapping[str, Any]) -> str:
    """``resource.kubernetes.io/numaNode`` as its scalar int form (the device's NUMA node), as a
    string; "" when not published (the list form, behind DRAListTypeAttributes, is not read)."""
    value = attrs.get(f"{PCI_DOMAIN}/{NUMA_ATTRIBUTE}")
    got = value.get("int") if isinstance(value, Mapping) else None
    return str(got) if isinstance(got, int) and not isinstance(got, bool) else ""


def node_devices(slices: Iterable[Mapping[str, Any]], node: str, driver: str = DRIVER) -> list[Device]:
    """The driver's devices on ``node``, in PCI bus ID order (devices without one last, by name).

    Only a pool's newest generation counts (a driver republishing a pool bumps it and
    the older slices are on their way out).
    """
    mine = [
        s
        for s in slices
        if isinstance(s, Mapping)
        and (s.get("spec") or {}).get("driver") == driver
        and (s.get("spec") or {}).get("nodeName") == node
    ]
    newest: dict[str, int] = {}
    for s in mine:
        pool = (s.get("spec") or {}).get("pool") or {}
        name, gen = str(pool.get("name", "")), int(pool.get("generation", 0) or 0)
        newest[name] = max(newest.get(name, gen), gen)
    devices: list[Device] = []
    for s in mine:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        pool_name = str(pool.get("name", ""))
        if int(pool.get("generation", 0) or 0) != newest.get(pool_name):
            continue
        for d in spec.get("devices") or []:
            if not isinstance(d, Mapping) or not isinstance(d.get("name"), str):
                continue
            attrs = d.get("attributes") or {}
            devices.append(
                Device(
                    node=node,
                    pool=pool_name,
                    name=d["name"],
                    uuid=normal_name(_attribute(attrs, driver, UUID_ATTRIBUTE)),
                    pci_bus_id=normal_name(_attribute(attrs, PCI_DOMAIN, PCI_ATTRIBUTE)),
                    product=_attribute(attrs, driver, "productName"),
                    taints=slice_taints(d),
                    pcie_root=_attribute(attrs, PCI_DOMAIN, PCIE_ROOT_ATTRIBUTE),
                    numa_node=_numa(attrs),
                )
            )
    devices.sort(key=lambda d: (d.pci_bus_id == "", d.pci_bus_id, d.name))
    return devices


class Unresolved(Exception):
    """A GPU name of the entry names no device on its node; the message says which and why."""


def _listing(devices: Sequence[Device]) -> str:
    shown = ", ".join(d.describe() for d in devices[:8])
    return shown + (f" and {len(devices) - 8} more" if len(devices) > 8 else "")


def resolve(entry: Entry, devices: Sequence[Device]) -> list[Device]:
    """The devices ``entry`` names, in map order; raises :class:`Unresolved` naming the first miss."""
    if not devices:
        raise Unresolved(
            f"node {entry.node} publishes no {DRIVER} device in any ResourceSlice "
            f"(is NVIDIA's DRA driver running on it?)"
        )
    out: list[Device] = []
    for gpu in entry.gpus:
        kind = gpu_kind(gpu)
        found: Device | None = None
        if kind == "index":
            assert isinstance(gpu, int)
            if gpu < len(devices):
                found = devices[gpu]
            else:
                raise Unresolved(
                    f"GPU index {gpu} does not exist on node {entry.node}: it publishes "
                    f"{len(devices)} GPU{'' if len(devices) == 1 else 's'} (index 0-{len(devices) - 1} "
                    f"in PCI bus ID order: {_listing(devices)})"
                )
        elif kind == "uuid":
            want = str(gpu)
            found = next((d for d in devices if d.uuid == want), None)
            if found is None:
                raise Unresolved(
                    f"no GPU with UUID {want} on node {entry.node} (replaced hardware changes the UUID; "
                    f"it publishes {_listing(devices)})"
                )
        else:
            want = str(gpu)
            found = next((d for d in devices if d.pci_bus_id == want), None)
            if found is None:
                raise Unresolved(
                    f"no GPU at PCI bus ID {want} on node {entry.node} (it publishes {_listing(devices)})"
                )
        out.append(found)
    return out


def selector(gpu: int | str, device: Device, driver: str = DRIVER) -> str:
    """The CEL that matches exactly ``device``: by UUID for the UUID form, by PCI bus ID otherwise."""
    if gpu_kind(gpu) == "uuid" or not device.pci_bus_id:
        return f"device.attributes['{driver}'].{UUID_ATTRIBUTE} == '{device.uuid}'"
    return f"device.attributes['{PCI_DOMAIN}'].{PCI_ATTRIBUTE} == '{device.pci_bus_id}'"


def request_name(position: int) -> str:
    return f"gpu-{position}"


def claim_body(
    name: str,
    namespace: str,
    entry: Entry,
    devices: Sequence[Device],
    *,
    owner: Mapping[str, Any] | None,
    device_class: str = DEVICE_CLASS,
    driver: str = DRIVER,
    made_for: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The ResourceClaim that asks for exactly ``devices`` (resolved from ``entry``), one request each.

    ``made_for``: the annotation that says what it was made for (a shared claim's,
    :attr:`kube_gpu_scheduler.domain.draclaims.Part.made_for`); else :data:`ENTRY_ANNOTATION`."""
    key, value = made_for or (ENTRY_ANNOTATION, str(entry))
    requests = [
        {
            "name": request_name(i),
            "exactly": {
                "deviceClassName": device_class,
                "allocationMode": "ExactCount",
                "count": 1,
                "selectors": [{"cel": {"expression": selector(gpu, dev, driver)}}],
            },
        }
        for i, (gpu, dev) in enumerate(zip(entry.gpus, devices, strict=True))
    ]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        "annotations": {
            key: value,
            DEVICES_ANNOTATION: ", ".join(f"{entry.node}/{d.describe()}" for d in devices),
        },
    }
    return claim_object(meta, {"requests": requests}, owner)


def claim_object(
    meta: dict[str, Any], devices: Mapping[str, Any], owner: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A ResourceClaim of ``meta`` (its owner added, when there is one) asking for ``devices``."""
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": dict(devices)},
    }


@dataclass(frozen=True)
class Allocated:
    """One allocated device of a claim: the request it answers and the device (driver/pool/name)."""

    request: str
    driver: str
    pool: str
    device: str


def allocation(claim: Mapping[str, Any]) -> list[Allocated]:
    """The devices ``status.allocation`` gives the claim ([] when it is not allocated)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    results = (alloc.get("devices") or {}).get("results") or []
    return [
        Allocated(
            str(r.get("request", "")),
            str(r.get("driver", "")),
            str(r.get("pool", "")),
            str(r.get("device", "")),
        )
        for r in results
        if isinstance(r, Mapping)
    ]


def held_devices(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """``(driver, pool, device) -> claim`` for every allocated device of ``claims``."""
    out: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for claim in claims:
        for a in allocation(claim):
            out.setdefault((a.driver, a.pool, a.device), claim)
    return out


def matches(claim: Mapping[str, Any], entry: Entry, devices: Sequence[Device], driver: str = DRIVER) -> bool:
    """Whether ``claim`` is allocated exactly ``devices`` (resolved from ``entry``), request by request."""
    got = {a.request: (a.driver, a.pool, a.device) for a in allocation(claim)}
    want = {request_name(i): (driver, d.pool, d.name) for i, d in enumerate(devices)}
    return bool(want) and got == want


def pod_claim_name(pod: Mapping[str, Any]) -> str | None:
    """The claim the admission policy gave the pod (spec.resourceClaims[name=gpu-scheduler])."""
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if isinstance(ref, Mapping) and ref.get("name") == POD_CLAIM:
            value = ref.get("resourceClaimName")
            return value if isinstance(value, str) else None
    return None


def pod_claims(pod: Mapping[str, Any]) -> dict[str, str]:
    """The claims the admission policy gave the pod: reference name -> claim name, for its own
    claim (:data:`POD_CLAIM`) and its shared ones (``gpu-scheduler-shared-<i>``)."""
    out: dict[str, str] = {}
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if not isinstance(ref, Mapping) or not isinstance(ref.get("resourceClaimName"), str):
            continue
        name = str(ref.get("name", ""))
        if name == POD_CLAIM or name.startswith(POD_CLAIM + "-shared-"):
            out[name] = ref["resourceClaimName"]
    return out


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still waits behind :data:`GATE`."""
    return any(
        g.get("name") == GATE
        for g in (pod.get("spec") or {}).get("schedulingGates") or []
        if isinstance(g, Mapping)
    )


# -- what the claim controller reads of its claims and replicas ------------------------------------


def pin(sts_name: str, sts_uid: str) -> dict[str, str]:
    """The StatefulSet's entry in a claim's ``status.reservedFor`` (the pin)."""
    return {"apiGroup": "apps", "resource": "statefulsets", "name": sts_name, "uid": sts_uid}


def is_pin(ref: Mapping[str, Any]) -> bool:
    return ref.get("apiGroup") == "apps" and ref.get("resource") == "statefulsets"


def pod_refs(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pods a claim is reserved for."""
    return [
        r
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if isinstance(r, Mapping) and r.get("resource") == "pods" and not r.get("apiGroup")
    ]


def statefulset_ref(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's controller owner reference, when a StatefulSet (apps/*) is its controller."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("kind") == "StatefulSet"
            and str(ref.get("apiVersion", "")).startswith("apps/")
            and ref.get("controller")
        ):
            return ref
    return None


def entry_ordinal(text: str) -> int | None:
    """The ordinal of an entry's text (``1=node2:0``), without parsing the rest."""
    head = text.split("=", 1)[0].strip()
    return int(head) if head.isdigit() and len(head) < 10 else None


def made_for(claim: Mapping[str, Any]) -> Entry | None:
    """The entry a claim of gpu-scheduler's was made for (its :data:`ENTRY_ANNOTATION`)."""
    text = ((claim.get("metadata") or {}).get("annotations") or {}).get(ENTRY_ANNOTATION)
    if not isinstance(text, str):
        return None
    try:
        return next(iter(parse(text).values()), None)
    except MapError:
        return None
