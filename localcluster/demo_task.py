"""The task's layout in ``make demo`` (localcluster/demo.py): GPU nodes node1 to node4, the
task's map (examples/gpu-workload.yaml: replicas 3 and 4 share node4's GPU 3), and what the
replicas that really run log.

node1 to node3 are kwok nodes: the API has them and their pods, but no container runs there,
so their replicas have no logs. node4 is the local control plane's one real node (a kubelet
with containerd and runc, localcluster/node.py) registered under the map's name: replicas 3
and 4 run there side by side as real containers of the image, each running the check program
(``gpu-scheduler-check serve``), which logs its node and CUDA_VISIBLE_DEVICES every interval.
The node has no GPU hardware: its pods get the variables the apiserver injected, not devices.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from kube_gpu_scheduler.domain.injection import CUDA_VISIBLE_DEVICES
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, parse
from localcluster.cluster import Cluster
from localcluster.demo_dra import DEMO_NS, say

# node1..node3 are kwok nodes (Cluster.start's gpu_nodes); the real node is the map's node4.
KWOK_GPU_NODES = 3
REAL_GPU_NODE = "node4"
GPUS_PER_NODE = 4
# The replicas whose logs the demo prints: node3's (a kwok node: none) and node4's sharers.
LOGGED_NODES = ("node3", REAL_GPU_NODE)
# The check program's line of every run (kube_gpu_scheduler/check/once_serve.py log_visible).
VISIBLE = "visible devices"
# How many of those lines each real replica must have logged (it logs them in a loop).
RUNS_SHOWN = 3
CONTROL_PLANE_TAINT = "node-role.kubernetes.io/control-plane:NoSchedule"


def prepare_gpu_node(cluster: Cluster) -> None:
    """Make the real node a GPU node a workload may use, as a user of a one-node kubeadm cluster
    does: lift its control-plane taint and advertise its GPUs as ``nvidia.com/gpu`` (the device
    plugin's count, written into the node's status as Kubernetes documents for an extended
    resource; the scheduler places only on a node that reports it)."""
    assert cluster.node is not None and cluster.node.name == REAL_GPU_NODE, (
        "Cluster.start(real_node_name=node4)"
    )
    say(
        f"the real node registered as {REAL_GPU_NODE}, the map's fourth GPU node: its control-plane taint "
        f"lifted (kubectl taint node {REAL_GPU_NODE} {CONTROL_PLANE_TAINT}-) and nvidia.com/gpu={GPUS_PER_NODE} "
        "in its status; it has no GPU hardware: its containers get the injected variables, not devices"
    )
    cluster.kubectl("taint", "node", REAL_GPU_NODE, f"{CONTROL_PLANE_TAINT}-")
    cluster.kubectl(
        "patch", "node", REAL_GPU_NODE, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"capacity": {"nvidia.com/gpu": str(GPUS_PER_NODE)}}}),
    )  # fmt: skip

    def advertised() -> bool:
        node = json.loads(cluster.kubectl("get", "node", REAL_GPU_NODE, "-o", "json").stdout)
        return (node["status"].get("allocatable") or {}).get("nvidia.com/gpu") == str(GPUS_PER_NODE)

    cluster.wait_until(advertised, 60, f"{REAL_GPU_NODE} to report {GPUS_PER_NODE} allocatable GPUs")


def demo_example(
    example: Path, image_ref: str, workdir: Path, shared: bool = True
) -> tuple[dict[str, Any], Path]:
    """The example as the demo applies it (written to ``workdir``): the image built here, never
    pulled, and CHECK_EXPECT_NO_GPU=true (no GPU hardware on any node here: the check program
    skips NVML and checks the map, the ordinal, the node and the variables). ``shared=False``
    (DRA mode, where shared GPUs are not placed yet): only the replicas before the first that
    shares a GPU, the map cut to their entries."""
    sts = yaml.safe_load(example.read_text())
    spec = sts["spec"]["template"]["spec"]
    for c in spec["containers"]:
        c["image"], c["imagePullPolicy"] = image_ref, "Never"
        c["env"] = [*(c.get("env") or []), {"name": "CHECK_EXPECT_NO_GPU", "value": "true"}]
    if not shared:
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        smap = parse(annotations[ANNOTATION])
        first = min((o for ords in smap.shared().values() for o in ords), default=len(smap))
        annotations[ANNOTATION] = "".join(f"{smap[o]}\n" for o in smap if o < first)
        sts["spec"]["replicas"] = min(int(sts["spec"]["replicas"]), first)
    path = workdir / example.name
    path.write_text(yaml.safe_dump(sts, sort_keys=False))
    return sts, path


def all_pods(cluster: Cluster) -> str:
    """``kubectl get pod -o wide -A``."""
    return cluster.kubectl("get", "pod", "-o", "wide", "-A").stdout.rstrip()


def visible_lines(logs: str) -> list[dict[str, Any]]:
    """The check program's ``visible devices`` lines in a container's logs."""
    out = []
    for line in logs.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("msg") == VISIBLE:
            out.append(record)
    return out


def logged_enough(cluster: Cluster, rows: list[dict[str, Any]]) -> bool:
    """Each replica on the real node has logged at least RUNS_SHOWN ``visible devices`` lines."""
    return all(
        len(visible_lines(cluster.kubectl("logs", "-n", DEMO_NS, r["pod"], check=False).stdout)) >= RUNS_SHOWN
        for r in rows
        if r["node"] == REAL_GPU_NODE
    )


def replica_logs(cluster: Cluster, rows: list[dict[str, Any]]) -> tuple[str, bool]:
    """The logs of the replicas on LOGGED_NODES, as their containers wrote them (the check's
    ``visible devices`` lines, the last RUNS_SHOWN), or for a kwok node why there are none; True
    when every real replica logged at least RUNS_SHOWN runs, each on its mapped node with its
    mapped CUDA_VISIBLE_DEVICES and a passing verdict."""
    out: list[str] = []
    good = True
    for r in rows:
        if r["node"] not in LOGGED_NODES:
            continue
        out.append(f"$ kubectl logs -n {DEMO_NS} {r['pod']} | grep '\"{VISIBLE}\"' | tail -{RUNS_SHOWN}")
        if r["node"] != REAL_GPU_NODE:
            out.append(
                f"(none: {r['node']} is a kwok node, which runs no container; the pod is Running in the API only)"
            )
            continue
        logs = cluster.kubectl("logs", "-n", DEMO_NS, r["pod"], check=False).stdout
        lines = [line for line in logs.splitlines() if f'"msg":"{VISIBLE}"' in line]
        out.extend(lines[-RUNS_SHOWN:] or ["(no such line)"])
        records = visible_lines(logs)
        node, cuda = r["expected_node"], r["expected_cuda"]
        good = (
            good
            and len(records) >= RUNS_SHOWN
            and all(
                rec.get("node") == node and rec.get(CUDA_VISIBLE_DEVICES) == cuda and rec.get("ok") is True
                for rec in records
            )
        )
    return "\n".join(out), good
