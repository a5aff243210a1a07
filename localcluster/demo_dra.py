"""``make demo DEMO_ARGS=--dra``: DRA mode's half of the demo (localcluster/demo.py runs it).

The real node runs NVIDIA's own DRA driver over stand-in GPUs (localcluster/nvidia_driver.py):
its plugin publishes the node's ResourceSlice, prepares each claim the kubelet hands it, and
containerd applies its CDI spec. The kwok GPU nodes get the slices the driver would publish
(localcluster/dra.py). The check chart's replica on the real node is a real container: the demo
prints what it sees (its device nodes, NVML's GPUs) beside what its claim was allocated.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.injection import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, PCI_BUS_ID
from kube_gpu_scheduler.domain.podinfo import entry_for
from localcluster import dra as dra_slices
from localcluster.cluster import REPO, Cluster
from localcluster.node import NODE_NAME
from localcluster.release import CHECK_CHART, REAL_NODE_PLACEMENT, install_chart

DEMO_NS = "gpu-demo"
CHECK_RELEASE, CHECK_NS = "gpu-scheduler-check", "gpu-scheduler-tests"
# The check chart's replicas take GPUs the example leaves free; replica 3 is on the real node.
CHECK_MAP = ((0, "node1", "2,3"), (1, "node2", "0"), (2, "node3", "3"), (3, NODE_NAME, "1"))
# The real node's stand-in GPUs (NVIDIA's driver over them).
REAL_NODE_GPUS = 4


def say(msg: str) -> None:
    """A step of the demo, on stderr (the tables go to stdout)."""
    print(f"==> {msg}", file=sys.stderr, flush=True)


def columns(lines: list[tuple[str, ...]]) -> str:
    """Rows as left-aligned columns (the demo's tables)."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


DRA_NODES = 3  # node1..node3, the kwok GPU nodes Cluster.start makes here


def _items(cluster: Cluster, *args: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load(cluster.kubectl("get", *args, "-o", "yaml").stdout)["items"])


def devices_table(slices: list[dict[str, Any]], nodes: list[str]) -> str:
    """Each node's GPUs as the map's index names them: PCI bus ID order, not the minor's."""
    lines: list[tuple[str, ...]] = [("NODE", "INDEX", "DEVICE", "PCI BUS ID", "UUID")]
    for node in nodes:
        for i, d in enumerate(dra.node_devices(slices, node)):
            lines.append((node, str(i), d.name, d.pci_bus_id, d.uuid))
    return columns(lines)


def dra_rows(cluster: Cluster, sts: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per replica: its node, its claim, the devices the claim is allocated (with
    their PCI bus IDs and UUIDs from the ResourceSlices) and whether that is what its entry says."""
    selector = ",".join(f"{k}={v}" for k, v in sts["spec"]["selector"]["matchLabels"].items())
    pods = _items(cluster, "pods", "-n", DEMO_NS, "-l", selector)
    claims = {c["metadata"]["name"]: c for c in _items(cluster, "resourceclaims", "-n", DEMO_NS)}
    slices = _items(cluster, "resourceslices")
    rows = []
    for pod in pods:
        meta = pod["metadata"]
        ordinal, entry = entry_for(meta)
        node = pod["spec"].get("nodeName") or "-"
        phase = pod["status"].get("phase", "?")
        claim_name = dra.pod_claim_name(pod)
        claim = claims.get(claim_name or "")
        published = {
            (d.pool, d.name): d
            for n in {node, entry.node if entry else ""}
            for d in dra.node_devices(slices, n)
        }
        got = [
            published.get((a.pool, a.device)) or dra.Device(a.pool, a.pool, a.device, "?", "?")
            for a in sorted(dra.allocation(claim or {}), key=lambda a: a.request)
        ]
        envs = [{e["name"]: e.get("value") for e in c.get("env") or []} for c in pod["spec"]["containers"]]
        env_ok = all(e.get(CUDA_DEVICE_ORDER) == PCI_BUS_ID and CUDA_VISIBLE_DEVICES not in e for e in envs)
        try:
            wanted = dra.resolve(entry, dra.node_devices(slices, entry.node)) if entry else None
        except dra.Unresolved:
            wanted = None
        ok = (
            entry is not None
            and wanted is not None
            and claim is not None
            and node == entry.node
            and phase == "Running"
            and env_ok
            and dra.matches(claim, entry, wanted)
        )
        rows.append(
            {
                "ordinal": ordinal,
                "pod": meta["name"],
                "node": node,
                "claim": claim_name or "-",
                "devices": got,
                "phase": phase,
                "expected": str(entry) if entry else "(no entry)",
                "ok": ok,
            }
        )
    return sorted(rows, key=lambda r: (r["ordinal"] is None, r["ordinal"]))


def dra_table(rows: list[dict[str, Any]]) -> str:
    """A line per allocated device (a replica without one gets a line with ``-``)."""
    head = ("ORDINAL", "POD", "NODE", "CLAIM", "DEVICE", "PCI BUS ID", "UUID", "PHASE", "MAP SAYS", "MATCH")
    lines: list[tuple[str, ...]] = [head]
    for r in rows:
        for d in r["devices"] or [None]:
            lines.append(
                (
                    str(r["ordinal"]),
                    r["pod"],
                    r["node"],
                    r["claim"],
                    d.name if d else "-",
                    d.pci_bus_id if d else "-",
                    d.uuid if d else "-",
                    r["phase"],
                    r["expected"],
                    "yes" if r["ok"] else "NO",
                )
            )
    return columns(lines)


def publish_gpus(cluster: Cluster) -> list[dict[str, Any]]:
    """A ResourceSlice per kwok GPU node (localcluster/dra.py; the DeviceClass is NVIDIA's chart's),
    beside the real node's, which NVIDIA's plugin publishes itself; the slices."""
    nodes = {f"node{i}": 4 for i in range(1, DRA_NODES + 1)}
    api = cluster.api_client()
    try:
        dra_slices.publish(api, nodes)
    finally:
        api.close()
    slices = _items(cluster, "resourceslices")
    print(devices_table(slices, [NODE_NAME, *nodes]))
    return slices


def verify_dra_release(cluster: Cluster, timeout: float) -> bool:
    """``gpu-scheduler-check verify-release --mode dra`` on the example, as the check chart's
    helm test runs it: each claim's allocation against the map, through the API."""
    import os
    import subprocess

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kube_gpu_scheduler.check",
            "verify-release",
            "--namespace",
            DEMO_NS,
            "--selector",
            "app=gpu-workload",
            "--mode",
            "dra",
            "--timeout",
            str(int(timeout)),
        ],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "CHECK_LOG_LEVEL": "WARNING"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=False,
    )
    print(res.stdout.strip())
    if res.returncode != 0:
        say(f"verify-release --mode dra failed:\n{res.stderr.strip()[-3000:]}")
    return res.returncode == 0


def check_chart_dra(cluster: Cluster, image_ref: str, timeout: float) -> bool:
    """Install gpu-scheduler-check-chart with gpuScheduling.injectionMode=dra (its pre-install
    wait-ready hook dry-runs a mapped pod through the DRA policy on the real node) and run its
    ``helm test``: verify-release --mode dra with the chart's own account and RBAC."""
    repository, _, tag = image_ref.rpartition(":")
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "gpuScheduling": {
            "schedulingMap": [{"podIndex": o, "nodeName": n, "gpuDevices": g} for o, n, g in CHECK_MAP],
            "injectionMode": "dra",
        },
        "replicaCount": len(CHECK_MAP),
        # Its replica on the real node (the control-plane node) runs for real.
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
        # Its hook pods too (kwok nodes run nothing).
        **REAL_NODE_PLACEMENT[CHECK_CHART],
    }
    install_chart(
        cluster, CHECK_RELEASE, CHECK_NS, values, chart=CHECK_CHART, wait=True, timeout=f"{int(timeout)}s"
    )
    res = cluster.helm("test", CHECK_RELEASE, "-n", CHECK_NS, "--timeout", f"{int(timeout)}s", check=False)
    print(res.stdout.strip())
    logs = cluster.kubectl(
        "logs", "-n", CHECK_NS, f"{CHECK_RELEASE}-test", "-c", "verify-release", check=False
    ).stdout
    print("\n".join(line for line in logs.splitlines() if not line.startswith("{")))
    if res.returncode != 0:
        say(f"helm test {CHECK_RELEASE} failed: {res.stderr.strip()}\n{logs[-3000:]}")
    return res.returncode == 0


def real_node_view(cluster: Cluster) -> bool:
    """What the check chart's replica on the real node sees from inside (its ``devices seen``
    log line: NVML's GPUs through the stand-in library the CDI spec mounted, and its device
    nodes), beside the devices its claim was allocated; True when they are the same GPUs."""
    ordinal = next(o for o, n, _ in CHECK_MAP if n == NODE_NAME)
    pod = f"{CHECK_RELEASE}-{ordinal}"
    logs = cluster.kubectl("logs", "-n", CHECK_NS, pod, check=False).stdout
    records = [
        json.loads(line) for line in logs.splitlines() if line.startswith("{") and "devices seen" in line
    ]
    if not records:
        say(f"{pod} on {NODE_NAME} logged no 'devices seen' line:\n{logs[-2000:]}")
        return False
    seen = records[-1].get("seen") or {}
    claim = json.loads(
        cluster.kubectl("get", "resourceclaim", "-n", CHECK_NS, f"{pod}-gpus", "-o", "json").stdout
    )
    slices = _items(cluster, "resourceslices")
    published = {d.name: d for d in dra.node_devices(slices, NODE_NAME)}
    allocated = [published.get(a.device) for a in dra.allocation(claim)]
    lines: list[tuple[str, ...]] = [("POD", "NODE", "SEES (NVML)", "PCI BUS ID", "DEVICE NODES", "CLAIM HAS")]
    gpus = seen.get("gpus") or []
    # The check's record of its NVIDIA device nodes: /dev/nvidia<minor> per GPU, and nvidiactl.
    devices = seen.get("devices") or {}
    nodes = ",".join(
        [*(devices.get("gpus") or []), *(["/dev/nvidiactl"] if devices.get("nvidiactl") else [])]
    )
    nodes = nodes or "-"
    for i, g in enumerate(gpus or [{}]):
        want = allocated[i] if i < len(allocated) else None
        lines.append(
            (
                pod,
                str(seen.get("node")),
                str(g.get("uuid", "-")),
                str(g.get("pci_bus_id", "-")),
                nodes,
                f"{want.name} ({want.uuid})" if want else "-",
            )
        )
    print(columns(lines))
    same = sorted(str(g.get("uuid")) for g in gpus) == sorted(d.uuid for d in allocated if d)
    if same:
        say(
            f"{pod}, a real container on {NODE_NAME}: NVIDIA's DRA plugin prepared its claim and containerd "
            "applied the CDI spec: it sees exactly the GPUs its claim was allocated, and no others"
        )
    else:
        say(f"{pod} on {NODE_NAME} sees {gpus}, its claim holds {[d.uuid for d in allocated if d]}")
    return same
