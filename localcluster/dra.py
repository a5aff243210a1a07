"""What NVIDIA's DRA driver publishes, for the local control plane's kwok GPU nodes.

kwok runs no kubelet plugin, so nothing publishes the GPUs as DRA devices there; this module
does it by hand, as Kubernetes' scheduler_perf DRA cases and kwok's DRA example do: the
DeviceClass ``gpu.nvidia.com`` and one ResourceSlice per node. kube-scheduler's
DynamicResources plugin then allocates claims against them like against the real driver's (it
never calls the driver); only the node-side prepare step (CDI, the container seeing the GPUs)
cannot happen on a kwok node.

The shape follows kubernetes-sigs/dra-driver-nvidia-gpu (formerly NVIDIA/k8s-dra-driver-gpu),
commit 95932046 (August 2026):

* ``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml``: the DeviceClass
  ``gpu.nvidia.com`` and its selector. Its ``extendedResourceName: nvidia.com/gpu`` is left
  out: the kwok nodes report ``nvidia.com/gpu`` capacity for the device-plugin path, and the
  other tests' pods that request it must keep going there;
* ``cmd/gpu-kubelet-plugin/deviceinfo.go``, ``GpuInfo.GetDevice``/``Attributes``: device name
  ``gpu-<minor>``; attributes ``type`` (``gpu``), ``uuid``, ``productName``, ``brand``,
  ``architecture`` (strings), ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion`` (versions), and the standard ``resource.kubernetes.io/pciBusID``
  (k8s.io/dynamic-resource-allocation/deviceattribute); no ``index`` or ``minor`` (removed
  upstream: an index can change);
* ``cmd/gpu-kubelet-plugin/partitions.go``, ``fullGpuCapacity``: capacity ``memory``;
* ``cmd/gpu-kubelet-plugin/driver.go``: one pool per node, named after the node.

The driver's slices have generated names; here a node's slice is ``<node>-gpu.nvidia.com`` so a
test can change it in place. Changing a pool (a GPU gone, a UUID changed) bumps the pool's
generation, as the driver's resourceslice controller does when it republishes.

Deterministic hardware: a GPU's UUID is derived from its node and minor (``GPU-`` + a UUID5), and
its PCI bus ID from a fixed list of buses (an 8-GPU HGX board's). On some nodes the minors are
NOT in bus order (the minor -> bus assignment is rotated by a hash of the node's name: node2 of
the local control plane), so that "index = PCI bus ID order" differs from "index = minor" there.
"""

from __future__ import annotations

import uuid as uuidlib
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kube_gpu_scheduler.domain.dra import DEVICE_CLASS, DRIVER, PCI_ATTRIBUTE, PCI_DOMAIN

GROUP, VERSION = "resource.k8s.io", "v1"
API_VERSION = f"{GROUP}/{VERSION}"
# The PCI buses of an HGX H100 8-GPU board, in bus order.
BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
PRODUCT, BRAND, ARCHITECTURE = "NVIDIA H100 80GB HBM3", "Nvidia", "Hopper"
CUDA_COMPUTE_CAPABILITY, DRIVER_VERSION, CUDA_DRIVER_VERSION = "9.0.0", "580.95.5", "13.0.0"
MEMORY = "81559Mi"
# A fixed namespace for the UUID5s: the same node and minor give the same UUID on every run.
_UUID_NAMESPACE = uuidlib.UUID("6f1c2f4e-6a55-4d6e-9a57-2b0c1f5d7e31")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver sees it: its minor (device name ``gpu-<minor>``), UUID, PCI bus ID."""

    minor: int
    uuid: str
    pci_bus_id: str
    product: str = PRODUCT

    @property
    def name(self) -> str:
        return f"gpu-{self.minor}"


def gpu_uuid(node: str, minor: int) -> str:
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{node}/gpu-{minor}')}"


def bus_shift(node: str, count: int) -> int:
    """How far the node's minor -> bus assignment is rotated (0: minors in bus order)."""
    return zlib.crc32(node.encode()) % count if count else 0


def node_gpus(node: str, count: int) -> list[Gpu]:
    """The ``count`` GPUs of ``node``, by minor (``count`` <= 8)."""
    if not 0 <= count <= len(BUSES):
        raise ValueError(f"a node here has 0 to {len(BUSES)} GPUs, not {count}")
    shift = bus_shift(node, count)
    return [
        Gpu(minor, gpu_uuid(node, minor), f"0000:{BUSES[(minor + shift) % count]}:00.0")
        for minor in range(count)
    ]


def device_class(name: str = DEVICE_CLASS, driver: str = DRIVER) -> dict[str, Any]:
    """The driver's DeviceClass for whole GPUs."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.driver == '{driver}' && "
                        f"device.attributes['{driver}'].type == 'gpu'"
                    }
                }
            ]
        },
    }


def device(gpu: Gpu) -> dict[str, Any]:
    """One ``spec.devices`` item, as ``GpuInfo.GetDevice`` makes it."""
    return {
        "name": gpu.name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
            "productName": {"string": gpu.product},
            "brand": {"string": BRAND},
            "architecture": {"string": ARCHITECTURE},
            "cudaComputeCapability": {"version": CUDA_COMPUTE_CAPABILITY},
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            f"{PCI_DOMAIN}/{PCI_ATTRIBUTE}": {"string": gpu.pci_bus_id},
        },
        "capacity": {"memory": {"value": MEMORY}},
    }


def slice_name(node: str, driver: str = DRIVER) -> str:
    return f"{node}-{driver}"


def resource_slice(
    node: str, gpus: Sequence[Gpu], generation: int = 1, driver: str = DRIVER
) -> dict[str, Any]:
    """The node's one ResourceSlice: its pool (named after the node) holds every GPU, by minor."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device(g) for g in sorted(gpus, key=lambda g: g.minor)],
        },
    }


def gpus_of(slice_: Mapping[str, Any]) -> list[Gpu]:
    """The GPUs a slice made by :func:`resource_slice` holds (read back from the API)."""
    out = []
    for d in (slice_.get("spec") or {}).get("devices") or []:
        attrs = d.get("attributes") or {}
        out.append(
            Gpu(
                int(str(d["name"]).rsplit("-", 1)[1]),
                attrs["uuid"]["string"],
                attrs[f"{PCI_DOMAIN}/{PCI_ATTRIBUTE}"]["string"],
                attrs.get("productName", {}).get("string", PRODUCT),
            )
        )
    return out


def changed(
    slice_: Mapping[str, Any],
    *,
    remove: Iterable[int] = (),
    new_uuids: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """``slice_`` (as read from the API) after a change on its node: the GPUs of minors ``remove``
    gone (fell off the bus), the UUIDs of ``new_uuids`` (minor -> UUID) replaced (new hardware in
    the slot); the pool's generation bumped, as a driver republishing its pool does."""
    spec = slice_["spec"]
    gone = set(remove)
    gpus = [
        replace(g, uuid=(new_uuids or {}).get(g.minor, g.uuid))
        for g in gpus_of(slice_)
        if g.minor not in gone
    ]
    body = resource_slice(spec["nodeName"], gpus, int(spec["pool"]["generation"]) + 1, spec["driver"])
    body["metadata"]["resourceVersion"] = slice_["metadata"]["resourceVersion"]
    return body


# ---------------------------------------------------------------- through the API


def _custom(api: Any) -> Any:
    from kubernetes.client import CustomObjectsApi

    return CustomObjectsApi(api)


def _create_or_replace(api: Any, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    objs = _custom(api)
    try:
        return dict(objs.create_cluster_custom_object(GROUP, VERSION, plural, body))
    except ApiException as err:
        if err.status != 409:
            raise
    current = objs.get_cluster_custom_object(GROUP, VERSION, plural, body["metadata"]["name"])
    fresh = {
        **body,
        "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
    }
    return dict(objs.replace_cluster_custom_object(GROUP, VERSION, plural, body["metadata"]["name"], fresh))


def _create_if_absent(api: Any, plural: str, body: Mapping[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        _custom(api).create_cluster_custom_object(GROUP, VERSION, plural, body)
    except ApiException as err:
        if err.status != 409:
            raise


def publish(api: Any, nodes: Mapping[str, int], driver: str = DRIVER) -> dict[str, list[Gpu]]:
    """Create the DeviceClass unless it exists (NVIDIA's chart makes it where its driver runs: it
    stays as the chart wrote it) and create (or replace) one ResourceSlice per node (``node -> GPU
    count``); returns each node's GPUs. ``api``: a ``kubernetes.client.ApiClient``."""
    _create_if_absent(api, "deviceclasses", device_class(driver=driver))
    out = {}
    for node, count in nodes.items():
        gpus = node_gpus(node, count)
        _create_or_replace(api, "resourceslices", resource_slice(node, gpus, driver=driver))
        out[node] = gpus
    return out


def read_slice(api: Any, node: str, driver: str = DRIVER) -> dict[str, Any]:
    return dict(
        _custom(api).get_cluster_custom_object(GROUP, VERSION, "resourceslices", slice_name(node, driver))
    )


def change(
    api: Any,
    node: str,
    *,
    remove: Iterable[int] = (),
    new_uuids: Mapping[int, str] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """Republish ``node``'s slice with :func:`changed`; returns the stored slice."""
    body = changed(read_slice(api, node, driver), remove=remove, new_uuids=new_uuids)
    return dict(
        _custom(api).replace_cluster_custom_object(
            GROUP, VERSION, "resourceslices", slice_name(node, driver), body
        )
    )


def delete(api: Any, nodes: Iterable[str], driver: str = DRIVER, device_class_too: bool = False) -> None:
    """Delete the nodes' slices (a driver going away); with ``device_class_too`` the DeviceClass too."""
    from kubernetes.client.exceptions import ApiException

    objs = _custom(api)
    targets = [("resourceslices", slice_name(n, driver)) for n in nodes]
    if device_class_too:
        targets.append(("deviceclasses", DEVICE_CLASS))
    for plural, name in targets:
        try:
            objs.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        except ApiException as err:
            if err.status != 404:
                raise
