"""The local control plane is real: pinned apiserver, controllers, scheduler, kwok, RBAC, clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from localcluster.cluster import REPO, Cluster, versions
from localcluster.procs import pid_alive
from tests.support.waiting import wait_for


def test_apiserver_reports_pinned_version(kube) -> None:
    info = client.VersionApi(kube).get_code()
    pinned = versions()["KUBERNETES_VERSION"]
    assert info.git_version == pinned
    major, minor = int(info.major), int(info.minor.rstrip("+"))
    assert (major, minor) >= (1, 36), f"harness must run Kubernetes 1.36 or newer, got {info.git_version}"


def test_gpu_nodes_are_ready_with_gpu_capacity(kube) -> None:
    nodes = {n.metadata.name: n for n in client.CoreV1Api(kube).list_node().items}
    for name in ("node1", "node2", "node3"):
        node = nodes[name]
        assert node.status.allocatable["nvidia.com/gpu"] == "4"
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True"
    cp = nodes["control-plane"]
    assert "node-role.kubernetes.io/control-plane" in cp.metadata.labels
    assert [(t.key, t.effect) for t in cp.spec.taints] == [
        ("node-role.kubernetes.io/control-plane", "NoSchedule")
    ]


def test_statefulset_controller_creates_pods(cluster: Cluster, kube, namespace: str) -> None:
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {
                "replicas": 3,
                "serviceName": "web",
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"nodeName": "node1", "containers": [{"name": "c", "image": "busybox"}]},
                },
            },
        }
    )
    core = client.CoreV1Api(kube)

    def pods():
        items = core.list_namespaced_pod(namespace, label_selector="app=web").items
        return items if len(items) == 3 else None

    items = wait_for(pods, what="3 StatefulSet pods")
    assert sorted(p.metadata.name for p in items) == ["web-0", "web-1", "web-2"]
    for p in items:
        assert p.metadata.owner_references[0].kind == "StatefulSet"
        assert p.metadata.labels["apps.kubernetes.io/pod-index"] == p.metadata.name.rsplit("-", 1)[1]


def test_pod_bound_to_fake_node_becomes_running(cluster: Cluster, kube, namespace: str) -> None:
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pinned", "namespace": namespace},
            "spec": {"nodeName": "node2", "containers": [{"name": "c", "image": "busybox"}]},
        }
    )
    core = client.CoreV1Api(kube)
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("pinned", namespace)).status.phase == "Running" and p,
        what="pod Running",
    )
    assert pod.spec.node_name == "node2"


def test_kube_scheduler_places_plain_deployment(cluster: Cluster, kube, namespace: str) -> None:
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "plain", "namespace": namespace},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "plain"}},
                "template": {
                    "metadata": {"labels": {"app": "plain"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            },
        }
    )
    core = client.CoreV1Api(kube)

    def running():
        items = core.list_namespaced_pod(namespace, label_selector="app=plain").items
        return items[0] if items and items[0].status.phase == "Running" else None

    pod = wait_for(running, what="Deployment pod Running")
    assert pod.spec.scheduler_name == "default-scheduler"
    assert pod.spec.node_name in {"node1", "node2", "node3"}  # the control plane is tainted
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod.metadata.name}")
    scheduled = [e for e in events.items if e.reason == "Scheduled"]
    assert (
        scheduled
        and (scheduled[0].reporting_component or scheduled[0].source.component) == "default-scheduler"
    )


def test_rbac_denies_service_account_without_role(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    cfg = cluster.service_account_kubeconfig(namespace, "nobody")  # token from the TokenRequest API
    token = yaml.safe_load(cfg.read_text())["users"][0]["user"]["token"]
    assert token.count(".") == 2  # a signed JWT, not a static token

    denied = cluster.kubectl("get", "pods", "-n", namespace, kubeconfig=cfg, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr and f"system:serviceaccount:{namespace}:nobody" in denied.stderr

    # The same token is accepted once a Role grants it: the refusal above was RBAC, not authentication.
    cluster.kubectl("create", "role", "pod-reader", "--verb=list", "--resource=pods", "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        "nobody-reads",
        "--role=pod-reader",
        f"--serviceaccount={namespace}:nobody",
        "-n",
        namespace,
    )
    wait_for(
        lambda: cluster.kubectl("get", "pods", "-n", namespace, kubeconfig=cfg, check=False).returncode == 0,
        timeout=30,
        what="RoleBinding to take effect",
    )
    still_denied = cluster.kubectl("get", "nodes", kubeconfig=cfg, check=False)
    assert still_denied.returncode != 0 and "Forbidden" in still_denied.stderr


CHILD_TEST = textwrap.dedent(
    """
    import json, os, signal, time

    # Ctrl-C reaches this run as it reaches a run in a terminal. A run started as a background job
    # of a non-interactive shell (`make test &`, a CI wrapper) inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler: the signal would be dropped and this test would
    # sleep on (test_fixture_leaves_no_process_behind[sigint] timing out after 120 s).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def test_child(cluster):
        tmp = os.environ["PIDS_FILE"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cluster.pids(), f)
        os.replace(tmp, os.environ["PIDS_FILE"])  # the parent never reads half a file
        deadline = time.monotonic() + 60
        while not os.path.exists(os.environ["GO_FILE"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if os.environ["MODE"] == "fail":
            assert False, "deliberate failure"
        time.sleep(120)
    """
)


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["fail", "sigint", "sigterm"])
def test_fixture_leaves_no_process_behind(tmp_path: Path, mode: str) -> None:
    """A failing or interrupted test run still stops every component (checked by pid)."""
    test_file = REPO / "tests" / "integration" / f"_child_{os.getpid()}_{mode}_test.py"
    test_file.write_text(CHILD_TEST)
    pids_file = tmp_path / "pids.json"
    go_file = tmp_path / "go"
    env = dict(os.environ, PIDS_FILE=str(pids_file), GO_FILE=str(go_file), MODE=mode)
    pids: dict[str, int] = {}
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        pids = wait_for(
            lambda: pids_file.exists() and json.loads(pids_file.read_text()),
            timeout=120,
            what="child cluster to start",
        )
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
        assert all(pid_alive(p) for p in pids.values())
        go_file.touch()
        if mode != "fail":
            time.sleep(0.5)
            child.send_signal(signal.SIGINT if mode == "sigint" else signal.SIGTERM)
        out, _ = child.communicate(timeout=120)
        assert child.returncode != 0, out
        # The run ended the way this test means: the failure, or the signal as Ctrl-C.
        assert ("deliberate failure" if mode == "fail" else "KeyboardInterrupt") in out, out
    finally:
        test_file.unlink()
        # After a failure above, leave nothing running for the tests that follow.
        _stop_child(child)
        left = {name: pid for name, pid in pids.items() if pid_alive(pid)}
        for pid in left.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    assert not left, f"processes left behind after {mode}: {left}\n{out}"


def _stop_child(child: subprocess.Popen[str]) -> None:
    """Stop the child run if it still runs: SIGTERM unwinds it like Ctrl-C (tests/conftest.py),
    so it stops its own control plane; SIGKILL if it does not exit within a minute."""
    if child.poll() is None:
        child.terminate()
        try:
            child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()


@pytest.mark.cluster
def test_cluster_up_and_down_commands(tmp_path: Path) -> None:
    """`make cluster-up` / `make cluster-down` (python -m localcluster up|down), as a person uses them."""
    env = dict(os.environ, GPU_SCHEDULER_CLUSTER_DIR=str(tmp_path / "state"))
    up = subprocess.run(
        [sys.executable, "-m", "localcluster", "up", "--nodes", "2"],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert up.returncode == 0, up.stderr
    export = up.stdout.strip().splitlines()[-1]
    assert export.startswith("export KUBECONFIG=")
    kubeconfig = export.split("=", 1)[1]
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    try:
        from localcluster.cluster import tool

        nodes = subprocess.run(
            [str(tool("kubectl")), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
        )
        items = {n["metadata"]["name"]: n for n in json.loads(nodes.stdout)["items"]}
        assert {"node1", "node2"} <= set(items)
        for name in ("node1", "node2"):
            assert items[name]["status"]["allocatable"]["nvidia.com/gpu"] == "4"
            ready = [c for c in items[name]["status"]["conditions"] if c["type"] == "Ready"]
            assert ready[0]["status"] == "True"
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "localcluster", "down"],
            check=False,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert down.returncode == 0, down.stderr
    left = {n: p for n, p in state["pids"].items() if pid_alive(p)}
    assert not left, f"left behind by cluster-down: {left}"
