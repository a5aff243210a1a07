"""DRA mode's count entries (``NODE:auto(N)``) on the real kube-apiserver and kube-scheduler.

test_dra.py's environment (two kwok nodes, the chart's DRA injection policy, the gpu-scheduler
with GPU_SCHEDULER_DRA), with each node's slice republished: node "a" with 8 GPUs in two PCIe
roots of four (``resource.kubernetes.io/pcieRoot`` and ``numaNode`` on every device), node "b"
with 8 GPUs that publish only ``numaNode`` (two NUMA nodes of four). kube-scheduler chooses the
GPUs of every count entry's claim; the gpu-scheduler makes, gates, pins and explains it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_gpu_scheduler.domain import dra, dracount
from kube_gpu_scheduler.domain.schedmap import parse
from localcluster import dra as localdra
from tests.integration.test_dra import Dra, dra_env, no_device_twice  # noqa: F401 (the fixture)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

# Node a: root pci0000:00 (NUMA 0) holds the GPUs on buses 1a, 1b, 3b, 3c (indices 0-3 in PCI bus
# ID order), root pci0000:80 (NUMA 1) those on 86, 87, c1, c2 (indices 4-7). Minors out of order.
ROOTS = {"pci0000:00": ["0x3b", "0x1a", "0x3c", "0x1b"], "pci0000:80": ["0xc1", "0x86", "0xc2", "0x87"]}


def topology_slice(node: str, *, pcie: bool) -> dict[str, Any]:
    """Node ``node``'s slice, generation 2: 8 GPUs, two groups of four; each device carries its
    NUMA node, and its PCIe root when ``pcie``."""
    gpus, where = [], {}
    for numa, (root, buses) in enumerate(ROOTS.items()):
        for bus in buses:
            minor = len(gpus)
            gpus.append(localdra.Gpu(minor, localdra.gpu_uuid(node, minor), f"0000:{int(bus, 16):02x}:00.0"))
            where[f"gpu-{minor}"] = (root, numa)
    body = localdra.resource_slice(node, gpus, generation=2)
    for device in body["spec"]["devices"]:
        root, numa = where[device["name"]]
        device["attributes"][f"{dra.PCI_DOMAIN}/{dra.NUMA_ATTRIBUTE}"] = {"int": numa}
        if pcie:
            device["attributes"][f"{dra.PCI_DOMAIN}/{dra.PCIE_ROOT_ATTRIBUTE}"] = {"string": root}
    return body


def chosen(env: Dra, pod_name: str) -> list[dra.Device] | None:
    """The GPUs of the pod's claim when the pod is bound and its claim allocated, else None."""
    pod = env.pod(pod_name)
    if not pod or not pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
        return None
    claim = env.claim(dra.pod_claim_name(pod) or "")
    if claim is None or not dra.allocation(claim):
        return None
    return dracount.chosen(claim, env.devices_of(pod["spec"]["nodeName"]))


def placed(env: Dra, pod_name: str, count: int) -> list[dra.Device]:
    got: list[dra.Device] = wait_for(lambda: chosen(env, pod_name), 90, what=f"{pod_name} placed")
    assert len(got) == count, got
    return got


def mapcli(env: Dra, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "gpu-scheduler-map"),
            *args,
            "--kubeconfig",
            str(env.cluster.kubeconfig),
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_count_entries_get_aligned_exclusive_sticky_gpus(dra_env: Dra) -> None:  # noqa: F811
    env = dra_env
    a, b = env.nodes["a"], env.nodes["b"]
    env.cluster.apply(topology_slice(a, pcie=True))
    env.cluster.apply(topology_slice(b, pcie=False))
    wait_for(lambda: len(env.devices("a")) == 8 and len(env.devices("b")) == 8, 30, what="the new slices")
    root_of = {d.name: d.pcie_root for d in env.devices("a")}
    index0 = env.devices("a")[0]
    assert index0.pci_bus_id == "0000:1a:00.0" and index0.pcie_root == "pci0000:00"
    # Replica 2 names index 0 (root pci0000:00): replica 0's auto(4) may not take it, so it fills
    # the other root whole.
    text = f"0={a}:auto(4)\n1={a}:auto(2)\n2={a}:0\n3={a}:auto(5)\n"
    env.cluster.apply(env.statefulset("w", text, 1))
    # Node b publishes no PCIe root: the claim aligns on the NUMA node.
    env.cluster.apply(env.statefulset("v", f"0={b}:auto(3)", 1))

    first = placed(env, "w-0", 4)
    assert {root_of[d.name] for d in first} == {"pci0000:80"}, first
    claim0 = env.claim("w-0-gpus") or {}
    assert claim0["spec"]["devices"]["constraints"] == [
        {"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    ]
    assert claim0["spec"]["devices"]["requests"][0]["exactly"]["count"] == 4
    assert "0000:1a:00.0" in str(claim0["spec"]["devices"]["requests"][0]["exactly"]["selectors"])
    numa = placed(env, "v-0", 3)
    assert len({d.numa_node for d in numa}) == 1, numa
    assert (env.claim("v-0-gpus") or {})["spec"]["devices"]["constraints"][0]["matchAttribute"].endswith(
        "/numaNode"
    )

    env.cluster.kubectl("scale", "statefulset", "w", "--replicas=3", "-n", env.namespace)
    second = placed(env, "w-1", 2)
    assert {root_of[d.name] for d in second} == {"pci0000:00"}, second
    assert not {d.name for d in second} & {d.name for d in first}, "replica 1 got a GPU of replica 0"
    assert index0.name not in {d.name for d in second}, "replica 1 got the GPU replica 2 names"
    wait_for(lambda: env.placed("w-2"), 90, what="w-2 placed on its named GPU")
    assert [x.device for x in dra.allocation(env.claim("w-2-gpus") or {})] == [index0.name]
    # What was chosen is said on the pod, and the claim is pinned by its StatefulSet.
    wait_for(lambda: env.events("w-1", "GPUsChosen"), 60, what="a GPUsChosen event on w-1")
    note = env.events("w-1", "GPUsChosen")[0]
    assert all(d.name in note for d in second) and "PCIe root pci0000:00" in note, note
    wait_for(
        lambda: any(
            dra.is_pin(r) for r in ((env.claim("w-1-gpus") or {}).get("status") or {}).get("reservedFor", [])
        ),
        60,
        what="w-1-gpus pinned by its StatefulSet",
    )

    # gpu-scheduler-map status lists the chosen GPUs as the replica's (its claim's allocation),
    # by index on the node; plan --dra warns about a named entry that spans the two roots.
    index = {d.name: i for i, d in enumerate(env.devices("a"))}
    doc = json.loads(mapcli(env, "status", "--output", "json").stdout)
    held = {
        g["gpu"]
        for n in doc["nodes"]
        if n["name"] == a
        for g in n["gpus"]
        if any(h["pod"] == "w-1" and h["mode"] == "dra" for h in g["holders"])
    }
    assert held == {index[d.name] for d in second}, (held, doc)
    spanning = env.statefulset("s", f"0={a}:0,4\n1={a}:1,2\n2={a}:auto(2)", 3)
    res = mapcli(
        env, "plan", "--dra", "--scheduler-name", env.scheduler_name, "-", stdin=yaml.safe_dump(spanning)
    )
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line[:1].isdigit()}
    assert set(rows) == {"0", "1", "2"}, (res.stdout, res.stderr)
    assert "warning: spans PCIe roots pci0000:00 (gpu-1), pci0000:80 (gpu-5)" in rows["0"], res.stdout
    assert "warning" not in rows["1"] and "auto(2)" in rows["2"], res.stdout

    # Sticky: the replica's next pod gets the same GPUs (the same claim, still allocated).
    uid = (env.claim("w-1-gpus") or {})["metadata"]["uid"]
    old = (env.pod("w-1") or {})["metadata"]["uid"]
    env.cluster.kubectl("delete", "pod", "w-1", "-n", env.namespace, "--wait=true")
    wait_for(
        lambda: (env.pod("w-1") or {}).get("metadata", {}).get("uid") not in (None, old),
        60,
        what="w-1 recreated",
    )
    again = placed(env, "w-1", 2)
    assert [d.name for d in again] == [d.name for d in second]
    assert (env.claim("w-1-gpus") or {})["metadata"]["uid"] == uid, "the claim was made anew"

    # auto(5) fits in no root of four: it stays behind its gate, and says why.
    env.cluster.kubectl("scale", "statefulset", "w", "--replicas=4", "-n", env.namespace)
    wait_for(lambda: env.events("w-3", "GPUCountWaits"), 60, what="a GPUCountWaits event on w-3")
    why = env.events("w-3", "GPUCountWaits")[0]
    assert f"no one PCIe root of node {a} has 5 GPUs" in why and "it can never be allocated there" in why, why
    w3 = env.pod("w-3") or {}
    assert dra.gated(w3) and not w3["spec"].get("nodeName")
    claims = env.get("resourceclaims")["items"]
    held = [(x.pool, x.device) for c in claims for x in dra.allocation(c)]
    assert len(held) == len(set(held)), f"a device allocated twice: {held}"

    # gpu-scheduler-map suggest: two replicas of two GPUs from what is free now. Node a has one
    # free GPU per root at most (w-0, w-1, w-2 hold the rest); node b's NUMA node that v-0 left
    # alone has four: both replicas go there, and the map it prints places.
    res = mapcli(
        env,
        "suggest",
        "--replicas",
        "2",
        "--gpus",
        "2",
        "--nodes",
        f"{a},{b}",
        "--scheduler-name",
        env.scheduler_name,
        "-o",
        "map",
    )
    assert res.returncode == 0, res.stderr
    suggested = parse(res.stdout)
    assert {e.node for e in suggested.values()} == {b} and len(suggested) == 2, res.stdout
    devices_b = env.devices("b")
    numa_of = {i: d.numa_node for i, d in enumerate(devices_b)}
    assert len({numa_of[g] for e in suggested.values() for g in e.indices}) == 1, res.stdout
    assert not {numa_of[g] for e in suggested.values() for g in e.indices} & {d.numa_node for d in numa}
    fragment = mapcli(
        env,
        "suggest",
        "--replicas",
        "2",
        "--gpus",
        "2",
        "--nodes",
        f"{a},{b}",
        "--scheduler-name",
        env.scheduler_name,
    ).stdout
    assert "gpu-scheduling-map: |" in fragment and "# NUMA node" in fragment, fragment
    planned = env.statefulset("u", res.stdout, 2)
    # plan --dra accepts it: the GPUs counted from the node's slices (its nvidia.com/gpu is not
    # what DRA mode gives out).
    checked = mapcli(
        env, "plan", "--dra", "--scheduler-name", env.scheduler_name, "-", stdin=yaml.safe_dump(planned)
    )
    assert checked.returncode == 0, (checked.stdout, checked.stderr)
    assert "GPUIndexOutOfRange" not in checked.stdout and "NoGPUResource" not in checked.stdout, (
        checked.stdout
    )
    env.cluster.apply(planned)
    for i in range(2):
        wait_for(lambda i=i: env.placed(f"u-{i}"), 90, what=f"u-{i} placed on its suggested GPUs")
    # Nothing of four GPUs under one root or NUMA node is left: not all fit, and it says so.
    res = mapcli(
        env,
        "suggest",
        "--replicas",
        "1",
        "--gpus",
        "4",
        "--nodes",
        f"{a},{b}",
        "--scheduler-name",
        env.scheduler_name,
    )
    assert res.returncode == 1 and "only 0 of 1 replicas fit" in res.stderr, res.stderr
    no_device_twice(env)

    # Topology warnings beyond plan: once w is scaled away node a is free; t's replica 0 names a
    # GPU of each root. validate --live says so, the scheduler says so on the pod when it makes
    # the claim (placed all the same), and status lists the bound replica that spans.
    env.cluster.kubectl("scale", "statefulset", "w", "--replicas=0", "-n", env.namespace)
    pools = {d.pool for d in env.devices("a")}
    wait_for(
        lambda: (
            not any(x.pool in pools for c in env.get("resourceclaims")["items"] for x in dra.allocation(c))
        ),
        90,
        what=f"node {a}'s GPUs released",
    )
    devices_a = env.devices("a")
    one, other = devices_a[1], devices_a[5]
    assert (one.pcie_root, other.pcie_root) == ("pci0000:00", "pci0000:80")
    spans = f"spans PCIe roots pci0000:00 ({one.name}), pci0000:80 ({other.name})"
    spread = env.statefulset("t", f"0={a}:1,5\n1={a}:2,3", 2)
    res = mapcli(env, "validate", "--live", "--dra", "--format", "json", "-", stdin=yaml.safe_dump(spread))
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)["inputs"][0]["maps"][0]["warnings"]
    topo = [w for w in found if w["reason"] == "GPUsSpanTopology"]
    assert len(topo) == 1 and f"entry '0={a}:1,5' {spans}" in topo[0]["message"], found
    admission_warns_of_spanning_entries(env, spread, spans)
    env.cluster.apply(spread)
    for i in range(2):
        wait_for(lambda i=i: env.placed(f"t-{i}"), 90, what=f"t-{i} placed on its named GPUs")
    note = env.events("t-0", "GPUsSpanTopology")
    assert len(note) == 1 and f"replica 0 (entry '0={a}:1,5') {spans}" in note[0], note
    assert not env.events("t-1", "GPUsSpanTopology")
    res = mapcli(env, "status", "--output", "json")
    listed = [(s["pod"], s["node"], s["gpus"], s["spans"]) for s in json.loads(res.stdout)["topology"]]
    assert listed == [("t-0", a, "1,5", spans)], listed
    table = mapcli(env, "status").stdout
    assert "SPANS TOPOLOGY" in table and f"{env.namespace}/t-0" in table.split("SPANS TOPOLOGY")[1], table
    no_device_twice(env)


def admission_warns_of_spanning_entries(env: Dra, spread: dict[str, Any], spans: str) -> None:
    """The admission warning: the leader publishes each node's GPUs' topology into the ConfigMap
    the chart's map-topology binding names, and the policy warns of a named entry that spans
    roots (in validate's words, on its line) and of nothing else."""
    a, b = env.nodes["a"], env.nodes["b"]
    namespace, name = env.topology_configmap

    def published() -> dict[str, str] | None:
        data = ((env.cluster.get_json("configmap", name, "-n", namespace) or {}).get("data")) or {}
        return data if a in data and b in data else None

    data = wait_for(published, 30, what="the topology ConfigMap")
    devices_a, devices_b = env.devices("a"), env.devices("b")
    assert data[a].split(",") == [f"{d.pcie_root}/{d.numa_node}/{d.name}" for d in devices_a], data
    assert data[a].split(",")[0] == f"pci0000:00/0/{devices_a[0].name}", data
    assert data[a].split(",")[7] == f"pci0000:80/1/{devices_a[7].name}", data
    # Node b publishes NUMA nodes only.
    assert data[b].split(",") == [f"/{d.numa_node}/{d.name}" for d in devices_b], data
    assert [v.split("/")[1] for v in data[b].split(",")] == ["0"] * 4 + ["1"] * 4, data
    # The chart's release lives in this test's namespace (the scheduler's RBAC is that release's),
    # and a release's bindings skip their own namespace: select it for this test.
    docs = [dict(d) for d in env.topology]
    for d in docs:
        if d["kind"].endswith("Binding"):
            d["spec"] = {
                **d["spec"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.namespace}}
                },
            }
    env.cluster.apply(docs)
    try:
        # Entry 0 spans the roots; entry 1 does not. A StatefulSet whose entries stay within a
        # root gets no warning.
        within = env.statefulset("r", f"0={a}:1,2\n1={a}:5,6", 2)

        def warnings(obj: dict[str, Any]) -> str:
            out = env.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj))
            return out.stderr

        def warned() -> str | None:
            text = warnings(spread)
            return text if "spans PCIe roots" in text else None

        # The apiserver loads a new policy within about a second.
        text = wait_for(warned, 30, what="the topology warning")
        assert f"line 1: entry '0={a}:1,5' {spans}: " in text and "line 2" not in text, text
        assert "ask for a count (NODE:auto(N), DRA mode)" in text, text
        assert "spans" not in warnings(within)
    finally:
        for d in docs:
            env.cluster.kubectl(
                "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found", check=False
            )
