"""kube_gpu_scheduler/domain/dra.py: a map entry resolved against the GPUs a node publishes, and the claim."""

from __future__ import annotations

from typing import Any

import pytest

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.schedmap import Entry, parse_gpu


def device(minor: int, bus: str, uuid: str | None = None) -> dict[str, Any]:
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid or f"GPU-{minor:08x}-0000-0000-0000-000000000000"},
            "productName": {"string": "NVIDIA A100"},
            "resource.kubernetes.io/pciBusID": {"string": bus},
        },
    }


def slice_(
    node: str, devices: list[dict[str, Any]], generation: int = 1, driver: str = dra.DRIVER
) -> dict[str, Any]:
    return {
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        }
    }


SLICES = [
    slice_("n1", [device(0, "0000:c1:00.0"), device(1, "0000:3B:00.0"), device(2, "00000000:86:00.0")]),
    slice_("n2", [device(0, "0000:1a:00.0")]),
    slice_("n1", [device(9, "0000:01:00.0")], driver="other.example.com"),
]


def test_devices_are_in_pci_bus_id_order_normalised() -> None:
    devs = dra.node_devices(SLICES, "n1")
    assert [d.name for d in devs] == ["gpu-1", "gpu-2", "gpu-0"]
    assert [d.pci_bus_id for d in devs] == ["0000:3b:00.0", "0000:86:00.0", "0000:c1:00.0"]
    assert devs[0].product == "NVIDIA A100"


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    newer = slice_("n2", [device(5, "0000:5e:00.0")], generation=2)
    assert [d.name for d in dra.node_devices([*SLICES, newer], "n2")] == ["gpu-5"]


def test_resolve_each_form() -> None:
    devs = dra.node_devices(SLICES, "n1")
    assert [d.name for d in dra.resolve(Entry(0, "n1", (0, 2)), devs)] == ["gpu-1", "gpu-0"]
    # Entries hold the parser's normal forms (schedmap.parse_gpu): any case, NVML's 8-digit domain.
    by_uuid = parse_gpu(devs[1].uuid.upper().replace("GPU-", "GPU-"))
    assert by_uuid is not None
    assert [d.name for d in dra.resolve(Entry(0, "n1", (by_uuid,)), devs)] == ["gpu-2"]
    by_pci = parse_gpu("00000000:C1:00.0")
    assert by_pci is not None
    assert [d.name for d in dra.resolve(Entry(0, "n1", (by_pci,)), devs)] == ["gpu-0"]


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ((3,), "GPU index 3 does not exist on node n1: it publishes 3 GPUs (index 0-2 in PCI bus ID order"),
        (
            ("GPU-deadbeef-0000-0000-0000-000000000000",),
            "no GPU with UUID GPU-deadbeef-0000-0000-0000-000000000000",
        ),
        (("0000:99:00.0",), "no GPU at PCI bus ID 0000:99:00.0 on node n1"),
    ],
)
def test_an_unresolved_name_says_which_and_what_the_node_has(
    gpus: tuple[int | str, ...], message: str
) -> None:
    with pytest.raises(dra.Unresolved) as err:
        dra.resolve(Entry(0, "n1", gpus), dra.node_devices(SLICES, "n1"))
    assert message in str(err.value)
    assert "gpu-1 (0000:3b:00.0" in str(err.value)


def test_a_node_without_slices() -> None:
    with pytest.raises(dra.Unresolved, match=r"node n9 publishes no gpu\.nvidia\.com device"):
        dra.resolve(Entry(0, "n9", (0,)), dra.node_devices(SLICES, "n9"))


def test_the_claim_pins_by_pci_bus_id_or_by_uuid() -> None:
    devs = dra.node_devices(SLICES, "n1")
    entry = Entry(1, "n1", (2, devs[0].uuid))
    resolved = dra.resolve(entry, devs)
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "w", "uid": "u"}
    body = dra.claim_body("w-1-gpus", "ns", entry, resolved, owner=owner)
    requests = body["spec"]["devices"]["requests"]
    assert [r["name"] for r in requests] == ["gpu-0", "gpu-1"]
    assert requests[0]["exactly"]["selectors"][0]["cel"]["expression"] == (
        "device.attributes['resource.kubernetes.io'].pciBusID == '0000:c1:00.0'"
    )
    assert requests[1]["exactly"]["selectors"][0]["cel"]["expression"] == (
        f"device.attributes['gpu.nvidia.com'].uuid == '{devs[0].uuid}'"
    )
    assert all(
        r["exactly"]["count"] == 1 and r["exactly"]["deviceClassName"] == dra.DEVICE_CLASS for r in requests
    )
    assert body["metadata"]["annotations"][dra.ENTRY_ANNOTATION] == str(entry)
    assert body["metadata"]["ownerReferences"] == [owner]
    assert body["metadata"]["labels"] == {dra.MANAGED_BY_LABEL: dra.MANAGED_BY}


def test_matches_compares_request_by_request() -> None:
    devs = dra.node_devices(SLICES, "n1")
    entry = Entry(0, "n1", (0, 1))
    resolved = dra.resolve(entry, devs)
    results = [
        {"request": "gpu-0", "driver": dra.DRIVER, "pool": "n1", "device": "gpu-1"},
        {"request": "gpu-1", "driver": dra.DRIVER, "pool": "n1", "device": "gpu-2"},
    ]
    claim = {"status": {"allocation": {"devices": {"results": results}}}}
    assert dra.matches(claim, entry, resolved)
    swapped = [dict(results[0], device="gpu-2"), dict(results[1], device="gpu-1")]
    assert not dra.matches({"status": {"allocation": {"devices": {"results": swapped}}}}, entry, resolved)
    assert not dra.matches({}, entry, resolved)
    assert dra.held_devices([claim]) == {
        (dra.DRIVER, "n1", "gpu-1"): claim,
        (dra.DRIVER, "n1", "gpu-2"): claim,
    }


def test_the_pod_side() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "other", "resourceClaimName": "x"},
                {"name": dra.POD_CLAIM, "resourceClaimName": "w-0-gpus"},
            ],
            "schedulingGates": [{"name": "a"}, {"name": dra.GATE}],
        }
    }
    assert dra.pod_claim_name(pod) == "w-0-gpus"
    assert dra.gated(pod)
    assert not dra.gated({"spec": {"schedulingGates": [{"name": "a"}]}})
    assert dra.pod_claim_name({"spec": {}}) is None
    assert dra.claim_name("w-0") == "w-0-gpus"
