"""``gpu-scheduler-map plan`` and ``status`` (and ``kubectl gpu-map``) against the real apiserver,
with a scheduler placing pods on kwok nodes; and the commands docs/operate.md documents, taken from
the doc and run as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kube_gpu_scheduler.domain.rules import GPU_IN_USE, MAP_CONFLICT, NODE_AFFINITY
from localcluster.cluster import REPO, Cluster, tool
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import statefulset
from tests.support.kubeapi import read_pod
from tests.support.waiting import wait_for

DOC = REPO / "docs" / "operate.md"
BIN = Path(sys.executable).parent


def cli(cluster: Cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gpu-scheduler-map"), *args, "--kubeconfig", str(cluster.kubeconfig)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def in_ns(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj["metadata"]["namespace"] = namespace
    return obj


def test_plan_names_each_replicas_fate_and_status_shows_holders_and_waits(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    own_node: Callable[..., str],
    start_scheduler: Callable[..., ManagedProcess],
) -> None:
    a, b = own_node("a", gpus=2), own_node("b", gpus=2)
    start_scheduler()
    cluster.apply([in_ns(statefulset("held", f"0={a}:0", 1), namespace)])
    later = in_ns(statefulset("later", f"0={b}:1", 1, nodeSelector={"example.com/none": "x"}), namespace)
    cluster.apply([later])
    wait_for(lambda: (read_pod(kube, namespace, "held-0") or {}).get("spec", {}).get("nodeName"), 30)

    conflicting = in_ns(statefulset("w", f"0={a}:0\n1={b}:1\n2={b}:0", 3), namespace)
    done = cli(cluster, "plan", "-", stdin=yaml.safe_dump(conflicting))
    assert done.returncode == 1, done.stderr
    assert f"{GPU_IN_USE}: GPU {a}:0 is held by pod {namespace}/held-0" in done.stdout, done.stdout
    assert f"{MAP_CONFLICT}: GPU {b}:1 is also wanted by replica {namespace}/later-0" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("2 "))
    assert row.split()[1:4] == [b, "0", "placed"], done.stdout

    fine = in_ns(statefulset("ok", f"0={a}:1\n1={b}:0", 2), namespace)
    path = Path(cluster.kubeconfig).parent / f"{namespace}-ok.yaml"
    path.write_text(yaml.safe_dump(fine))
    done = cli(cluster, "plan", str(path), "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["ok"] is True

    cluster.apply([fine])
    wait_for(
        lambda: all(
            (read_pod(kube, namespace, f"ok-{i}") or {}).get("spec", {}).get("nodeName") for i in (0, 1)
        ),
        30,
    )
    wait_for(lambda: "NodeAffinityMismatch" in json.dumps(_condition(kube, namespace, "later-0")), 30)
    done = cli(cluster, "status", "-o", "json")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    nodes = {n["name"]: n for n in view["nodes"]}
    holders = {
        (node, g["gpu"]): [(h["namespace"], h["pod"], h["statefulset"], h["ordinal"]) for h in g["holders"]]
        for node in (a, b)
        for g in nodes[node]["gpus"]
    }
    assert holders == {
        (a, 0): [(namespace, "held-0", "held", 0)],
        (a, 1): [(namespace, "ok-0", "ok", 0)],
        (b, 0): [(namespace, "ok-1", "ok", 1)],
        (b, 1): [],
    }
    assert nodes[b]["free"] == [1]
    (wait,) = [w for w in view["waiting"] if w["namespace"] == namespace]
    assert wait["pod"] == "later-0" and wait["why"].startswith(NODE_AFFINITY) and wait["wants"] == f"{b}:1"

    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PATH": f"{BIN}:{tool('kubectl').parent}:{os.environ['PATH']}",
    }
    plugin = subprocess.run(
        ["kubectl", "gpu-map", "status"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert plugin.returncode == 0, plugin.stderr
    assert any(line.split()[:3] == [b, "1", "free"] for line in plugin.stdout.splitlines()), plugin.stdout


def _condition(kube: Any, ns: str, name: str) -> dict[str, Any]:
    pod = read_pod(kube, ns, name) or {}
    return next((c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"), {})


def doc_blocks(heading: str, doc: Path = DOC) -> list[str]:
    """The ```sh blocks of ``doc``'s section ``heading`` (up to the next heading of its level)."""
    text = doc.read_text()
    level = heading.split(" ", 1)[0]
    section = text.split(f"\n{heading}\n", 1)[1]
    section = section.split(f"\n{level} ", 1)[0]
    return [part.split("```", 1)[0] for part in section.split("```sh\n")[1:]]


def test_the_documented_status_and_plan_commands_run_as_written(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess]
) -> None:
    """Every command of docs/operate.md's "Who holds which GPU" and "A plan before apply", and of
    docs/scheduler.md's "Who holds what, and who waits" (which replaced the stale custom-columns
    recipe), from the doc, on the session's node1..node3 (the example's nodes); a plan may say a replica would
    wait (another test's pods may hold the example's GPUs), but it must decide (exit 0 or 1). Each
    command prints something: a replica of this test's own waits, so the waiting replicas' commands
    have one to show whatever other tests left behind on this worker's control plane."""
    start_scheduler()
    cluster.apply(
        [in_ns(statefulset("waits", "0=node1:0", 1, nodeSelector={"example.com/none": "x"}), namespace)]
    )

    def failed_scheduling() -> list[Any]:
        events = client.CoreV1Api(kube).list_namespaced_event(
            namespace, field_selector="reason=FailedScheduling"
        )
        return list(events.items)

    wait_for(failed_scheduling, 60, what="a FailedScheduling event on waits-0")
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PATH": f"{BIN}:{tool('kubectl').parent}:{os.environ['PATH']}",
    }
    scripts = [
        *doc_blocks("## Who holds which GPU: `status`"),
        *doc_blocks("## A plan before apply: `plan`"),
        *doc_blocks("### Who holds what, and who waits", REPO / "docs" / "scheduler.md"),
    ]
    assert len(scripts) >= 3, scripts
    for script in scripts:
        for command in [c for c in script.splitlines() if c.strip() and not c.startswith("#")]:
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", command],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            allowed = (0, 1) if " plan " in f" {command} " else (0,)
            assert done.returncode in allowed, f"{command}: {done.returncode}: {done.stdout}{done.stderr}"
            assert done.stdout.strip(), command


def test_the_argocd_presync_hook_plans_with_its_own_account(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """examples/argocd-presync-plan.yaml: its Job's command, with its ServiceAccount's token bound
    to its ClusterRole only, plans the ConfigMap's StatefulSet (RBAC enough: exit 0 or 1, never 2)."""
    docs = list(yaml.safe_load_all((REPO / "examples" / "argocd-presync-plan.yaml").read_text()))
    by_kind = {d["kind"]: d for d in docs}
    assert all(d["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "PreSync" for d in docs)
    suffix = f"-{namespace}"
    account = [by_kind["ServiceAccount"], by_kind["ClusterRole"], by_kind["ClusterRoleBinding"]]
    by_kind["ServiceAccount"]["metadata"]["namespace"] = namespace
    by_kind["ClusterRole"]["metadata"]["name"] += suffix
    binding = by_kind["ClusterRoleBinding"]
    binding["metadata"]["name"] += suffix
    binding["roleRef"]["name"] += suffix
    binding["subjects"][0]["namespace"] = namespace
    cluster.apply(account)
    try:
        kubeconfig = cluster.service_account_kubeconfig(namespace, "gpu-map-plan")
        job = by_kind["Job"]["spec"]["template"]["spec"]
        (container,) = job["containers"]
        assert container["command"][:2] == ["gpu-scheduler-map", "plan"]
        chart = yaml.safe_load((REPO / "gpu-scheduler-chart" / "Chart.yaml").read_text())
        assert container["image"].endswith(f":{chart['appVersion']}"), container["image"]
        (mount,) = container["volumeMounts"]
        planned = tmp_path / Path(container["command"][2]).relative_to(mount["mountPath"])
        planned.write_text(
            by_kind["ConfigMap"]["data"]["statefulset.yaml"].replace(
                "namespace: ml", f"namespace: {namespace}"
            )
        )
        done = subprocess.run(
            [str(BIN / "gpu-scheduler-map"), "plan", str(planned), "--kubeconfig", str(kubeconfig)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode in (0, 1), done.stdout + done.stderr
        assert f"StatefulSet {namespace}/gpu-workload (3 replicas, gang: all or none)" in done.stdout
    finally:
        for doc in account[1:]:
            cluster.kubectl(
                "delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found", check=False
            )
