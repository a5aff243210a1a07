"""localcluster/dra.py against the real kube-apiserver and kube-scheduler of the local control plane.

The apiserver validates the DeviceClass and the ResourceSlices (resource.k8s.io/v1), and
kube-scheduler's DynamicResources plugin allocates a hand-made claim from them on a kwok node:
the experiment of issue 20, which the demo and the DRA tests build on.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kube_gpu_scheduler.domain import dra
from localcluster import dra as slices
from localcluster.cluster import Cluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster


def _get(cluster: Cluster, *args: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", *args, "-o", "json").stdout))


def test_the_apiserver_accepts_the_slices_and_their_changes(
    cluster: Cluster, kube: Any, own_node: Any
) -> None:
    node = own_node("dra-a")
    published = slices.publish(kube, {node: 4})
    assert [g.name for g in published[node]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    stored = _get(cluster, "resourceslice", slices.slice_name(node))
    assert stored["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    assert len(dra.node_devices([stored], node)) == 4
    dc = _get(cluster, "deviceclass", dra.DEVICE_CLASS)
    assert "device.attributes['gpu.nvidia.com'].type == 'gpu'" in json.dumps(dc["spec"])

    new_uuid = "GPU-00000000-1111-2222-3333-444444444444"
    slices.change(kube, node, remove=[3], new_uuids={0: new_uuid})
    stored = _get(cluster, "resourceslice", slices.slice_name(node))
    assert stored["spec"]["pool"]["generation"] == 2
    devices = dra.node_devices([stored], node)
    assert sorted(d.name for d in devices) == ["gpu-0", "gpu-1", "gpu-2"]
    assert next(d for d in devices if d.name == "gpu-0").uuid == new_uuid

    # Publishing again replaces the slice (back to generation 1, all four GPUs).
    slices.publish(kube, {node: 4})
    assert len(dra.node_devices([_get(cluster, "resourceslice", slices.slice_name(node))], node)) == 4
    slices.delete(kube, [node])
    assert cluster.kubectl("get", "resourceslice", slices.slice_name(node), check=False).returncode != 0


def test_kube_scheduler_allocates_a_claim_selecting_a_uuid_on_a_kwok_node(
    cluster: Cluster, kube: Any, namespace: str, own_node: Any
) -> None:
    node = own_node("dra-b")
    slices.publish(kube, {node: 4})
    try:
        devices = dra.node_devices([_get(cluster, "resourceslice", slices.slice_name(node))], node)
        third = devices[2]  # the third GPU in PCI bus ID order
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "pinned", "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu-0",
                            "exactly": {
                                "deviceClassName": dra.DEVICE_CLASS,
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": f"device.attributes['gpu.nvidia.com'].uuid in ['{third.uuid}']"
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            },
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "user", "namespace": namespace},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "pinned"}],
                "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            },
        }
        cluster.apply([claim, pod])

        def allocated() -> dict[str, Any] | None:
            got = _get(cluster, "resourceclaim", "pinned", "-n", namespace)
            return got if dra.allocation(got) else None

        got = wait_for(allocated, timeout=90, what="kube-scheduler allocating claim pinned")
        assert [(a.driver, a.pool, a.device) for a in dra.allocation(got)] == [
            ("gpu.nvidia.com", node, third.name)
        ]
        reserved = [(r["resource"], r["name"]) for r in got["status"].get("reservedFor") or []]
        assert reserved == [("pods", "user")]

        def running() -> bool:
            p = _get(cluster, "pod", "user", "-n", namespace)
            return p["spec"].get("nodeName") == node and p["status"].get("phase") == "Running"

        wait_for(running, timeout=90, what=f"pod user Running on {node}")
    finally:
        cluster.kubectl("delete", "pod", "user", "-n", namespace, "--wait=false", check=False)
        slices.delete(kube, [node])
