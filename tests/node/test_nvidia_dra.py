"""DRA mode past the API: NVIDIA's own DRA driver prepares each replica's claim on the real node.

The package's real node runs NVIDIA's DRA driver, installed with its own chart over stand-in GPUs
(localcluster/nvidia_driver.py): its kubelet plugin publishes the node's ResourceSlice, the
kubelet asks it to prepare each claim kube-scheduler allocated, and containerd applies the CDI
spec it writes. Nothing on that path is written by hand.

gpu-scheduler runs here in DRA mode as a second release (its own namespace and scheduler name,
beside the package's webhook-mode release, whose webhook leaves the other scheduler's pods
alone). Each replica's container reports what it really has: its /dev/nvidia<minor> nodes
and what NVML (the stand-in library the CDI spec mounts) sees through them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.cluster import Cluster
from localcluster.image import Image
from localcluster.node import NODE_NAME
from localcluster.release import install_chart, product_values, uninstall
from tests.integration.fixtures_scheduler import statefulset
from tests.node.conftest import NODE_GPUS

RELEASE, NAMESPACE, SCHEDULER = "gs-dra", "gs-dra-system", "gpu-scheduler-dra"
TOLERATE_CONTROL_PLANE = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
# What the container has: its GPU device nodes (name -> minor) and NVML's view through them.
REPORT = r"""
import json, os, re, stat, time
nodes = {}
for name in sorted(os.listdir('/dev')):
    if re.fullmatch(r'nvidia[0-9]+', name):
        nodes[name] = os.minor(os.stat('/dev/' + name).st_rdev)
seen = {'nodes': nodes}
try:
    import pynvml as n
    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    seen['uuids'] = [n.nvmlDeviceGetUUID(h) for h in handles]
    seen['buses'] = [n.nvmlDeviceGetPciInfo(h).busId for h in handles]
except Exception as err:
    seen['nvml'] = repr(err)
print('SEEN ' + json.dumps(seen), flush=True)
time.sleep(86400)
"""


@pytest.fixture(scope="module")
def dra_release(node_cluster: Cluster, product_image: Image) -> Iterator[str]:
    """gpu-scheduler-chart in DRA mode, as a user installs it (the scheduler pod on the real node)."""
    values: dict[str, Any] = {
        **product_values(product_image.ref),
        "scheduler": {"name": SCHEDULER},
        "injection": {"mode": "policy"},
        "dra": {"enabled": True},
    }
    install_chart(node_cluster, RELEASE, NAMESPACE, values, wait=True, timeout="180s")
    try:
        yield SCHEDULER
    finally:
        uninstall(node_cluster, RELEASE, NAMESPACE)


def reporting_replicas(name: str, sched_map: str, replicas: int, image: str) -> dict[str, Any]:
    """A StatefulSet of our image whose containers print what they see, on the real node."""
    sts = statefulset(name, sched_map, replicas, SCHEDULER, tolerations=TOLERATE_CONTROL_PLANE)
    spec = sts["spec"]["template"]["spec"]
    spec["containers"] = [reporter(image)]
    spec["terminationGracePeriodSeconds"] = 1
    return sts


def reporter(image: str) -> dict[str, Any]:
    return {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["python3", "-c", REPORT],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def seen(cluster: Cluster, namespace: str, pod: str, timeout: float = 120) -> dict[str, Any]:
    """What the pod's container reported (waits for it to run and print)."""
    found: dict[str, Any] = {}

    def printed() -> bool:
        res = cluster.kubectl("logs", "-n", namespace, pod, check=False)
        m = re.search(r"^SEEN (.*)$", res.stdout, re.M) if res.returncode == 0 else None
        if m:
            found.update(json.loads(m.group(1)))
        return bool(m)

    cluster.wait_until(printed, timeout, f"pod {namespace}/{pod} to report its devices")
    return found


def apply_in(cluster: Cluster, namespace: str, *objs: dict[str, Any]) -> None:
    cluster.apply([{**o, "metadata": {**o["metadata"], "namespace": namespace}} for o in objs])


def pod_json(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "pod", "-n", namespace, name, "-o", "json").stdout))


def test_each_replica_gets_exactly_its_gpus_from_nvidias_driver(
    node_cluster: Cluster, node_namespace: str, product_image: Image, dra_release: str
) -> None:
    """An index (PCI bus order), a UUID and a PCI bus ID, each resolved against what NVIDIA's
    plugin published, and each container gets those GPUs' device nodes and no others; the
    fourth GPU, which nobody pins, then goes to a foreign claim, and a second foreign claim
    gets nothing while every replica's GPUs stay pinned, also across a replica's restart."""
    driver = node_cluster.nvidia
    assert driver is not None and len(driver.machine.gpus) == NODE_GPUS
    by_bus = driver.gpus_in_bus_order()  # index i = by_bus[i]; their minors are not in bus order
    assert [g.minor for g in by_bus] != sorted(g.minor for g in by_bus)
    # A map names a node's GPUs one way: one StatefulSet per way.
    wanted = {"idx": by_bus[1], "uuid": by_bus[3], "pci": by_bus[0]}
    maps = {"idx": "1", "uuid": by_bus[3].uuid, "pci": by_bus[0].pci_bus_id}
    ns = node_namespace
    for name, gpu_text in maps.items():
        apply_in(
            node_cluster, ns, reporting_replicas(name, f"0={NODE_NAME}:{gpu_text}", 1, product_image.ref)
        )
    for name, gpu in wanted.items():
        have = seen(node_cluster, ns, f"{name}-0")
        assert have["nodes"] == {f"nvidia{gpu.minor}": gpu.minor}, (name, have)
        assert have["uuids"] == [gpu.uuid], (name, have)
        assert [b.lower().replace("00000000:", "0000:") for b in have["buses"]] == [gpu.pci_bus_id]
        pod = pod_json(node_cluster, ns, f"{name}-0")
        assert pod["spec"]["nodeName"] == NODE_NAME
        claim = json.loads(
            node_cluster.kubectl("get", "resourceclaim", "-n", ns, f"{name}-0-gpus", "-o", "json").stdout
        )
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"], r["device"]) for r in results] == [
            ("gpu.nvidia.com", NODE_NAME, gpu.name)
        ]

    # A foreign workload asking for any one GPU of the class gets the one nobody pinned.
    free = by_bus[2]
    foreign = foreign_pod("foreign-a", product_image.ref)
    apply_in(node_cluster, ns, foreign_claim("any-a"), foreign)
    have = seen(node_cluster, ns, "foreign-a")
    assert have["nodes"] == {f"nvidia{free.minor}": free.minor} and have["uuids"] == [free.uuid], have

    # A second one gets nothing: every other GPU is pinned (kube-scheduler says why).
    apply_in(node_cluster, ns, foreign_claim("any-b"), foreign_pod("foreign-b", product_image.ref, "any-b"))
    node_cluster.wait_until(
        lambda: any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in pod_json(node_cluster, ns, "foreign-b")["status"].get("conditions") or []
        ),
        60,
        "foreign-b to be refused by kube-scheduler",
    )

    # A replica restarts: between its old pod's end and its new pod's start its claim stays
    # allocated (the StatefulSet pins it), so the waiting foreign claim cannot take the GPU.
    old_uid = pod_json(node_cluster, ns, "idx-0")["metadata"]["uid"]
    node_cluster.kubectl("delete", "pod", "-n", ns, "idx-0", "--wait=true")
    node_cluster.wait_until(
        lambda: (
            node_cluster.kubectl(
                "get", "pod", "-n", ns, "idx-0", "-o", "jsonpath={.metadata.uid}", check=False
            ).stdout
            not in ("", old_uid)
        ),
        60,
        "the StatefulSet to recreate idx-0",
    )
    have = seen(node_cluster, ns, "idx-0")
    assert have["nodes"] == {f"nvidia{wanted['idx'].minor}": wanted["idx"].minor}, have
    foreign_b = pod_json(node_cluster, ns, "foreign-b")
    assert not foreign_b["spec"].get("nodeName"), "a foreign claim got a pinned GPU"


def foreign_claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }


def foreign_pod(name: str, image: str, claim: str = "any-a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "tolerations": TOLERATE_CONTROL_PLANE,
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{**reporter(image), "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def node_devices_held(cluster: Cluster) -> dict[str, list[str]]:
    """device -> the claims (ns/name) allocated it on the real node, across the cluster."""
    held: dict[str, list[str]] = {}
    for c in json.loads(cluster.kubectl("get", "resourceclaims", "-A", "-o", "json").stdout)["items"]:
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []:
            if r.get("pool") == NODE_NAME:
                held.setdefault(r["device"], []).append(
                    f"{c['metadata']['namespace']}/{c['metadata']['name']}"
                )
    return held


def test_two_replicas_that_share_a_gpu_both_see_it_and_no_foreign_claim_gets_it(
    node_cluster: Cluster, node_namespace: str, product_image: Image, dra_release: str
) -> None:
    """The task's sharing under NVIDIA's driver: replicas 0 and 1 both name the node's index 1.
    Their one shared claim (kube_gpu_scheduler/domain/draclaims.py) is allocated that GPU once and
    reserved for both; the driver prepares it for both pods, and both containers have the same
    /dev/nvidia<minor> and NVML sees the same UUID. Foreign claims asking for any GPU get the
    three others, never that one, also while one sharer is recreated."""
    driver = node_cluster.nvidia
    assert driver is not None
    by_bus = driver.gpus_in_bus_order()
    gpu = by_bus[1]
    # The previous test's namespace is going: its claims are released once its StatefulSets are gone.
    node_cluster.wait_until(lambda: not node_devices_held(node_cluster), 120, "the node's GPUs to be free")
    ns = node_namespace
    apply_in(
        node_cluster,
        ns,
        reporting_replicas("share", f"0={NODE_NAME}:1\n1={NODE_NAME}:1", 2, product_image.ref),
    )
    for pod in ("share-0", "share-1"):
        have = seen(node_cluster, ns, pod)
        assert have["nodes"] == {f"nvidia{gpu.minor}": gpu.minor}, (pod, have)
        assert have["uuids"] == [gpu.uuid], (pod, have)
        refs = pod_json(node_cluster, ns, pod)["spec"]["resourceClaims"]
        assert refs == [{"name": "gpu-scheduler-shared-0", "resourceClaimName": "share-0-shared-1"}], refs
    claim = json.loads(
        node_cluster.kubectl("get", "resourceclaim", "-n", ns, "share-0-shared-1", "-o", "json").stdout
    )
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r["device"]) for r in results] == [(NODE_NAME, gpu.name)]
    assert {r["name"] for r in claim["status"]["reservedFor"] if r.get("resource") == "pods"} == {
        "share-0",
        "share-1",
    }
    assert node_devices_held(node_cluster)[gpu.name] == [f"{ns}/share-0-shared-1"]

    # Four foreign pods ask for any GPU: three get the three others, the fourth waits.
    for i in range(4):
        apply_in(
            node_cluster,
            ns,
            foreign_claim(f"any-{i}"),
            foreign_pod(f"foreign-{i}", product_image.ref, f"any-{i}"),
        )

    def scheduled() -> dict[str, bool | None]:
        out: dict[str, bool | None] = {}
        for i in range(4):
            conds = pod_json(node_cluster, ns, f"foreign-{i}")["status"].get("conditions") or []
            state = next((c.get("status") for c in conds if c.get("type") == "PodScheduled"), None)
            out[f"foreign-{i}"] = None if state is None else state == "True"
        return out

    node_cluster.wait_until(
        lambda: sorted(v for v in scheduled().values() if v is not None) == [False, True, True, True],
        120,
        "three foreign pods placed and the fourth refused",
    )
    placed = [p for p, v in scheduled().items() if v]
    minors = {m for p in placed for m in seen(node_cluster, ns, p)["nodes"].values()}
    assert minors == {g.minor for g in by_bus} - {gpu.minor}, minors
    # A sharer is recreated: the other holds the claim, the waiting foreign pod still gets nothing.
    old_uid = pod_json(node_cluster, ns, "share-1")["metadata"]["uid"]
    node_cluster.kubectl("delete", "pod", "-n", ns, "share-1", "--wait=true")
    node_cluster.wait_until(
        lambda: (
            node_cluster.kubectl(
                "get", "pod", "-n", ns, "share-1", "-o", "jsonpath={.metadata.uid}", check=False
            ).stdout
            not in ("", old_uid)
        ),
        60,
        "the StatefulSet to recreate share-1",
    )
    have = seen(node_cluster, ns, "share-1")
    assert have["nodes"] == {f"nvidia{gpu.minor}": gpu.minor}, have
    assert node_devices_held(node_cluster)[gpu.name] == [f"{ns}/share-0-shared-1"]
    assert sum(1 for v in scheduled().values() if v) == 3, scheduled()


def test_a_count_entry_gets_two_gpus_from_nvidias_driver_and_keeps_them(
    node_cluster: Cluster, node_namespace: str, product_image: Image, dra_release: str
) -> None:
    """``0=<node>:auto(2)``: the replica's claim asks NVIDIA's class for two devices and
    kube-scheduler chooses them; the kubelet has NVIDIA's plugin prepare them, and the container
    has exactly those two (device nodes, NVML's UUIDs). After the pod is deleted the replica's
    next pod has the same two (its claim, pinned by the StatefulSet). The stand-in publishes
    neither ``resource.kubernetes.io/pcieRoot`` (the driver reads it from sysfs, which the stand-in
    cannot provide) nor ``numaNode``, so the claim carries no ``matchAttribute``: any two GPUs."""
    driver = node_cluster.nvidia
    assert driver is not None
    by_name = {g.name: g for g in driver.gpus_in_bus_order()}
    # The previous test's namespace is going: its claims are released once its StatefulSets are gone.
    node_cluster.wait_until(lambda: not node_devices_held(node_cluster), 120, "the node's GPUs to be free")
    ns = node_namespace
    apply_in(node_cluster, ns, reporting_replicas("cnt", f"0={NODE_NAME}:auto(2)", 1, product_image.ref))
    have = seen(node_cluster, ns, "cnt-0")
    claim = json.loads(
        node_cluster.kubectl("get", "resourceclaim", "-n", ns, "cnt-0-gpus", "-o", "json").stdout
    )
    assert "constraints" not in claim["spec"]["devices"], claim["spec"]
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2, claim["spec"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {NODE_NAME}, results
    got = [by_name[r["device"]] for r in results]
    assert len({g.name for g in got}) == 2, results
    assert have["nodes"] == {f"nvidia{g.minor}": g.minor for g in got}, have
    assert sorted(have["uuids"]) == sorted(g.uuid for g in got), have
    # Sticky: the next pod of the replica gets the same two GPUs through the same claim.
    old_uid = pod_json(node_cluster, ns, "cnt-0")["metadata"]["uid"]
    node_cluster.kubectl("delete", "pod", "-n", ns, "cnt-0", "--wait=true")
    node_cluster.wait_until(
        lambda: (
            node_cluster.kubectl(
                "get", "pod", "-n", ns, "cnt-0", "-o", "jsonpath={.metadata.uid}", check=False
            ).stdout
            not in ("", old_uid)
        ),
        60,
        "the StatefulSet to recreate cnt-0",
    )
    again = seen(node_cluster, ns, "cnt-0")
    assert again["nodes"] == have["nodes"], (again, have)
    after = json.loads(
        node_cluster.kubectl("get", "resourceclaim", "-n", ns, "cnt-0-gpus", "-o", "json").stdout
    )
    assert after["metadata"]["uid"] == claim["metadata"]["uid"], "the claim was made anew"
