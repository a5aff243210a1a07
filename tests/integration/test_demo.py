"""`make demo` (python -m localcluster demo): the README's first command, end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from localcluster import dra, nvidia
from localcluster.cluster import REPO
from localcluster.procs import pid_alive

# It starts a control plane (in the demo's process).
pytestmark = pytest.mark.cluster


def dra_expected_rows() -> list[tuple[str, ...]]:
    """The example's replicas in DRA mode, a line per device: an index is the node's i-th GPU
    in PCI bus ID order, so node2's index 2 is its gpu-0 (node2's minors are not in bus order)."""
    rows = []
    for ordinal, node, indices in ((0, "node1", (0, 1)), (1, "node2", (2,)), (2, "node3", (0, 1, 2))):
        by_bus = sorted(dra.node_gpus(node, 4), key=lambda g: g.pci_bus_id)
        entry = f"{ordinal}={node}:{','.join(map(str, indices))}"
        for i in indices:
            g = by_bus[i]
            pod = f"gpu-workload-{ordinal}"
            rows.append(
                (
                    str(ordinal),
                    pod,
                    node,
                    f"{pod}-gpus",
                    g.name,
                    g.pci_bus_id,
                    g.uuid,
                    "Running",
                    entry,
                    "yes",
                )
            )
    return rows


def run_demo(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m localcluster demo ARGS``; past ``timeout`` it gets SIGTERM and the time to stop
    what it started (its real node holds a host-wide lock: killed, it would keep it)."""
    argv = [sys.executable, "-m", "localcluster", "demo", *args]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"`make demo {' '.join(args)}` took over {timeout:.0f}s (stopped):\n{out}\n{err}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def assert_real_replicas(stdout: str) -> None:
    """`kubectl get pod -o wide -A` and the logs: replicas 3 and 4 on node4, the real node, each
    logging node4 and CUDA_VISIBLE_DEVICES=3 run after run; node3's replica (kwok) has no logs."""
    lines = stdout.splitlines()
    head = next(
        i for i, line in enumerate(lines) if line.startswith("NAMESPACE ") and " NOMINATED NODE " in line
    )
    at = lines[head].index(" NODE ") + 1  # kubectl aligns its columns: the node's starts here
    listed: dict[tuple[str, str], str] = {}
    for line in lines[head + 1 :]:
        if not line.strip():
            break
        namespace, name = line.split()[:2]
        listed[(namespace, name)] = line[at:].split()[0]
    assert {name: node for (ns, name), node in listed.items() if ns == "gpu-demo"} == {
        f"gpu-workload-{i}": f"node{min(i + 1, 4)}" for i in range(5)
    }, stdout
    # The product's pods run on the real node too (node4 is also the control-plane node).
    assert {node for (ns, _), node in listed.items() if ns == "gpu-scheduler-system"} == {"node4"}, stdout
    logs: dict[str, list[dict[str, object]]] = {}
    current = ""
    for line in stdout.splitlines():
        m = re.match(r"^\$ kubectl logs -n gpu-demo (gpu-workload-\d) ", line)
        if m:
            current = m.group(1)
            logs[current] = []
        elif current and line.startswith("{"):
            logs[current].append(json.loads(line))
        elif current and line.startswith("(none: node3 is a kwok node"):
            logs[current] = []
            current = ""
        elif not line.strip():
            current = ""
    assert set(logs) == {"gpu-workload-2", "gpu-workload-3", "gpu-workload-4"}, stdout
    assert logs["gpu-workload-2"] == []
    for pod in ("gpu-workload-3", "gpu-workload-4"):
        assert len(logs[pod]) >= 3, stdout
        assert {(d["msg"], d["pod"], d["node"], d["CUDA_VISIBLE_DEVICES"], d["ok"]) for d in logs[pod]} == {
            ("visible devices", f"gpu-demo/{pod}", "node4", "3", True)
        }, stdout


@pytest.mark.slow(
    reason="the whole make demo on the real node; DRA mode installs NVIDIA's driver chart too", budget=300
)
@pytest.mark.parametrize("mode", ["policy", "webhook", "dra"])
def test_demo_places_every_replica_and_cleans_up(tmp_path, mode: str) -> None:
    """`make demo` (policy mode, the chart's default), `make demo DEMO_ARGS=--webhook` and
    `make demo DEMO_ARGS=--dra`."""
    res = run_demo(
        ["--workdir", str(tmp_path / "demo"), *([f"--{mode}"] if mode in ("webhook", "dra") else [])],
        timeout=420 if mode == "dra" else 300,  # dra: also the check chart and its helm test
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # gpu-scheduler-map status: every replica's GPUs, and the free ones, as the scheduler trusts them
    # (a row per holder: node4's GPU 3 has two).
    held: dict[tuple[str, str], list[list[str]]] = {}
    out = [line.split() for line in res.stdout.splitlines()]
    start = next(i for i, cols in enumerate(out) if cols[:3] == ["NODE", "GPU", "HOLDER"])
    for cols in out[start + 1 :]:
        if len(cols) < 3 or not cols[1].isdigit():
            break
        held.setdefault((cols[0], cols[1]), []).append(cols[2:])
    mode_word = "dra" if mode == "dra" else "env"
    placed = [("0", "node1", "01"), ("1", "node2", "2"), ("2", "node3", "012")]
    if mode != "dra":  # DRA mode does not place shared GPUs yet: the demo cuts the map before them
        placed += [("3", "node4", "3"), ("4", "node4", "3")]
    for ordinal, node, gpus in placed:
        for gpu in gpus:
            assert [f"gpu-demo/gpu-workload-{ordinal}", "gpu-workload", ordinal, mode_word] in held[
                (node, gpu)
            ], held
    assert held[("node1", "3")] == held[("node2", "0")] == [["free"]], held
    if mode != "dra":
        # Replicas 3 and 4 share node4's GPU 3, and no one else holds it.
        assert len(held[("node4", "3")]) == 2 and held[("node4", "0")] == [["free"]], held
    rows = [line.split() for line in res.stdout.splitlines() if re.match(r"^\d+\s+gpu-workload-", line)]
    if mode == "dra":
        assert [tuple(r) for r in rows] == dra_expected_rows(), res.stdout
        assert re.search(r"^node2\s+2\s+gpu-0\s+0000:3a:00.0\s", res.stdout, re.M), res.stdout
        assert "claim is allocated exactly its mapped GPUs" in res.stderr
        # verify-release --mode dra passed on the same replicas (its table: POD ... OK).
        verified = [line.split() for line in res.stdout.splitlines() if re.match(r"^gpu-workload-\d\s", line)]
        assert [(v[0], v[-1]) for v in verified] == [(f"gpu-workload-{i}", "yes") for i in range(3)], (
            res.stdout
        )
        # The check chart in DRA mode: its helm test (verify-release --mode dra, the chart's RBAC)
        # on the real node; node2's index 0 is its gpu-2.
        checked = {
            v[0]: (v[3], v[5], v[-1])
            for v in (line.split() for line in res.stdout.splitlines())
            # verify-release's table (its last column says yes or NO), not the view of the real node
            if re.match(r"^gpu-scheduler-check-\d$", v[0] if v else "") and v[-1] in ("yes", "NO")
        }
        assert checked == {
            "gpu-scheduler-check-0": ("node1", "gpu-2,gpu-3", "yes"),
            "gpu-scheduler-check-1": ("node2", "gpu-2", "yes"),
            "gpu-scheduler-check-2": ("node3", "gpu-3", "yes"),
            # On the real node, under NVIDIA's own DRA driver: index 1 is its gpu-0 (bus order).
            "gpu-scheduler-check-3": ("control-plane", "gpu-0", "yes"),
        }, res.stdout
        # That replica is a real container: what it sees from inside is its claim's GPU.
        real = nvidia.Machine.for_node("control-plane", 4, shift=1).in_bus_order()[1]
        sees = re.search(
            r"^gpu-scheduler-check-3\s+control-plane\s+(GPU-\S+)\s+(\S+)\s.*\((GPU-\S+)\)$", res.stdout, re.M
        )
        assert sees and sees.group(1) == sees.group(3) == real.uuid, res.stdout
        assert sees.group(2).lower() == "0000" + real.pci_bus_id, res.stdout
        assert "it sees exactly the GPUs its claim was allocated, and no others" in res.stderr
    else:
        kwok, runs = ["none", "(kwok", "node)"], ["runs,", "Ready"]
        assert rows == [
            ["0", "gpu-workload-0", "node1", "0,1", "0,1", "Running", *kwok, "-", "0=node1:0,1", "yes"],
            ["1", "gpu-workload-1", "node2", "2", "2", "Running", *kwok, "-", "1=node2:2", "yes"],
            ["2", "gpu-workload-2", "node3", "0,1,2", "0,1,2", "Running", *kwok, "-", "2=node3:0,1,2", "yes"],
            ["3", "gpu-workload-3", "node4", "3", "3", "Running", *runs, "4", "3=node4:3", "yes"],
            ["4", "gpu-workload-4", "node4", "3", "3", "Running", *runs, "3", "4=node4:3", "yes"],
        ], res.stdout
        assert_real_replicas(res.stdout)
        assert "shared, as the map says: node4:3 by ordinals 3, 4 (lines 4, 5)" in res.stderr
    assert "every replica is Running on its mapped node" in res.stderr
    policies = re.search(r"^admission policies: (.*)$", res.stdout, re.M)
    webhooks = re.search(r"^webhook configurations: (.*)$", res.stdout, re.M)
    secrets = re.search(r"^TLS Secrets: (.*)$", res.stdout, re.M)
    assert policies and webhooks and secrets, res.stdout
    if mode in ("policy", "dra"):
        # No certificate anywhere: no webhook, no TLS Secret; the apiserver injected.
        assert "mutatingadmissionpolicy" in policies.group(1) and "-inject" in policies.group(1)
        assert (webhooks.group(1), secrets.group(1)) == ("none", "none")
        assert "gpu-scheduler-webhook" not in res.stdout
    else:
        assert "mutatingadmissionpolicy" not in policies.group(1)
        assert "mutatingwebhookconfiguration" in webhooks.group(1)
        assert "gpu-scheduler-webhook-tls" in secrets.group(1)
    # Without --keep, nothing the demo started survives it.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "demo")], capture_output=True, text=True, check=False
    )
    pids = [int(p) for p in leftovers.stdout.split()]
    assert not [p for p in pids if pid_alive(p)], f"demo left processes: {pids}"
