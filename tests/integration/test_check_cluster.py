"""The check program fed exactly what real pods got from the local control plane.

The apiserver calls the real webhook (host process, TLS), the real scheduler
(host process, least-privilege token) binds the StatefulSet's pods and kwok runs
them. The check then runs as a host process with the pod's env read back from the
apiserver (container env after the webhook), NODE_NAME = spec.nodeName,
GPU_SCHEDULING_MAP = the pod's annotation and POD_INDEX = its label: what the
check chart's downward API gives it inside the pod.

``verify-release`` runs with a token of the check chart's own ``helm test``
ServiceAccount and RBAC (rendered from the chart), with the arguments the chart's
test pod would run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.clients import load_manifests
from localcluster.cluster import Cluster, free_port
from localcluster.procs import ManagedProcess
from localcluster.release import CHECK_CHART, chart_path, install_chart
from tests.integration.fixtures_scheduler import statefulset
from tests.integration.fixtures_webhook import WebhookServer, register_webhooks
from tests.support.fakenvml import nvml_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

CHECK_CMD = Path(sys.executable).parent / "gpu-scheduler-check"
ANNOTATION = "gpu-scheduling-map"
MAP = "0=node1:0,1\n1=node2:3\n"
# The fake NVML (tests/support/fakenvml.py) plays the node's GPUs for every check process here:
# the local cluster's nodes have 4 GPUs each (tests/conftest.py), so the fake has 4.
NODE_GPUS = 4
NVML_ENV: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _node_gpus(fake_nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.NVML_ENV", nvml_env(fake_nvml, gpus=NODE_GPUS))


# --- helpers -------------------------------------------------------------------------------------


def get_pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return list(json.loads(out)["items"])


def wait_placed(cluster: Cluster, namespace: str, selector: str, count: int) -> list[dict[str, Any]]:
    """``count`` pods Running on a node; sorted by name."""

    def placed() -> list[dict[str, Any]] | None:
        pods = [
            p
            for p in get_pods(cluster, namespace, selector)
            if p["spec"].get("nodeName")
            and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
            and ANNOTATION in (p["metadata"].get("annotations") or {})
        ]
        return sorted(pods, key=lambda p: p["metadata"]["name"]) if len(pods) == count else None

    return list(wait_for(placed, timeout=90, what=f"{count} pods placed and Running ({selector})"))


def read_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout))


def downward_env(pod: dict[str, Any], container: str | None = None) -> dict[str, str]:
    """What the check sees inside ``pod``: its container's literal env and the downward API values."""
    meta, spec = pod["metadata"], pod["spec"]
    c = next(c for c in spec["containers"] if container in (None, c["name"]))
    env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
    env.update(
        {
            "POD_NAME": meta["name"],
            "POD_NAMESPACE": meta["namespace"],
            "NODE_NAME": spec.get("nodeName") or "",
            "POD_INDEX": (meta.get("labels") or {}).get("apps.kubernetes.io/pod-index", ""),
            "GPU_SCHEDULING_MAP": (meta.get("annotations") or {}).get(ANNOTATION, ""),
        }
    )
    env.setdefault("GPU_INJECTION_MODE", "cuda")
    return env


def host_env(env: dict[str, str]) -> dict[str, str]:
    """A clean process environment: nothing GPU-related leaks in from the test runner; NVML is the fake."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    return {**base, **NVML_ENV, **env}


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def checks_of(stderr: str) -> dict[str, dict[str, Any]]:
    return {d["check"]: d for d in json_lines(stderr) if "check" in d}


def run_once(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_CMD), "once"], env=host_env(env), capture_output=True, text=True, timeout=60, check=False
    )


def assert_placement_matches(res: subprocess.CompletedProcess[str]) -> None:
    """Every check passed, the NVML ones included (the fake NVML has the node's 4 GPUs)."""
    checks = checks_of(res.stderr)
    for name in (
        "map",
        "ordinal",
        "node",
        "env:CUDA_VISIBLE_DEVICES",
        "env:CUDA_DEVICE_ORDER",
        "nvml:indices",
    ):
        assert checks[name]["ok"] is True, (name, checks[name])
    failed = {name: d for name, d in checks.items() if d["ok"] is not True and name != "dev"}
    assert not failed, failed
    # A host process has no /dev/nvidia*: the stand-in NVML counts GPUs without device nodes,
    # which the dev check says and skips (never passes, never fails).
    assert checks["dev"]["ok"] is None, checks["dev"]
    assert "without any NVIDIA device node" in checks["dev"]["skipped"], checks["dev"]
    assert res.returncode == 0, res.stderr


def readyz(env: dict[str, str], log_dir: Path) -> tuple[int, dict[str, Any]]:
    """Run ``serve`` with ``env``; return its first /readyz answer; stop it with SIGTERM (exit 0)."""
    port = free_port()
    full = host_env({**env, "CHECK_PORT": str(port), "CHECK_INTERVAL_SECONDS": "1"})
    with ManagedProcess(
        f"check-{port}", [CHECK_CMD, "serve"], env=full, log_path=log_dir / f"check-{port}.log"
    ) as proc:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                status, body = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            status, body = err.code, json.loads(err.read())
        os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while proc.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not proc.running(), "serve did not stop on SIGTERM"
        assert proc.proc is not None and proc.proc.returncode == 0, proc.log_text(20)
    return status, body


@pytest.fixture
def placed_statefulset(
    cluster: Cluster, namespace: str, webhook_configs: str, scheduler: ManagedProcess
) -> list[dict[str, Any]]:
    """StatefulSet ``w`` (MAP, 2 replicas) admitted by the webhook, bound by the scheduler, Running."""
    manifest = statefulset("w", MAP, 2)
    manifest["metadata"]["namespace"] = namespace
    cluster.apply(manifest)
    return wait_placed(cluster, namespace, "app=w", 2)


# --- once / serve against real pods ---------------------------------------------------------------


def test_once_matches_what_the_pods_got(placed_statefulset: list[dict[str, Any]]) -> None:
    w0, w1 = placed_statefulset
    # What the webhook and the scheduler did (the check must see exactly this).
    assert w0["spec"]["nodeName"] == "node1" and w1["spec"]["nodeName"] == "node2"
    assert downward_env(w0)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert downward_env(w1)["CUDA_VISIBLE_DEVICES"] == "3"
    for pod in placed_statefulset:
        env = downward_env(pod)
        res = run_once(env)
        assert_placement_matches(res)
        node = checks_of(res.stderr)["node"]
        assert node["pod"] == f"{env['POD_NAMESPACE']}/{env['POD_NAME']}"
        assert node["expected"] == node["actual"] == pod["spec"]["nodeName"]


def test_serve_not_ready_when_the_map_changed_after_binding(
    cluster: Cluster, namespace: str, placed_statefulset: list[dict[str, Any]], tmp_path: Path
) -> None:
    w0 = placed_statefulset[0]
    name = w0["metadata"]["name"]
    # Ready while the pod's annotation still names where it runs.
    status, body = readyz(downward_env(read_pod(cluster, namespace, name)), tmp_path)
    assert status == 200, body
    # Someone edits the pod's map: replica 0 now belongs on node3, but the pod stays on node1.
    moved = MAP.replace("0=node1:0,1", "0=node3:0,1")
    cluster.kubectl("annotate", "pod", name, "-n", namespace, f"{ANNOTATION}={moved}", "--overwrite")
    pod = read_pod(cluster, namespace, name)
    assert pod["metadata"]["annotations"][ANNOTATION] == moved
    assert pod["spec"]["nodeName"] == "node1"
    status, body = readyz(downward_env(pod), tmp_path)
    assert status == 503
    failed = {c["check"]: c for c in body["failed"]}
    assert set(failed) == {"node"}
    assert (failed["node"]["expected"], failed["node"]["actual"]) == ("node3", "node1")
    assert run_once(downward_env(pod)).returncode == 1


def test_serve_not_ready_when_env_differs(
    cluster: Cluster, namespace: str, placed_statefulset: list[dict[str, Any]], tmp_path: Path
) -> None:
    w1 = read_pod(cluster, namespace, placed_statefulset[1]["metadata"]["name"])
    env = downward_env(w1)
    assert readyz(env, tmp_path)[0] == 200
    tampered = {**env, "CUDA_VISIBLE_DEVICES": "2"}
    status, body = readyz(tampered, tmp_path)
    assert status == 503
    (failed,) = body["failed"]
    assert (failed["check"], failed["expected"], failed["actual"]) == ("env:CUDA_VISIBLE_DEVICES", "3", "2")
    no_order = {k: v for k, v in env.items() if k != "CUDA_DEVICE_ORDER"}
    status, body = readyz(no_order, tmp_path)
    assert status == 503 and [c["check"] for c in body["failed"]] == ["env:CUDA_DEVICE_ORDER"]


# --- verify-release with the check chart's helm-test identity -------------------------------------


RELEASE = "chk"
CHART_VALUES: dict[str, Any] = {
    "replicaCount": 2,
    "gpuScheduling": {
        "schedulingMap": [
            {"podIndex": 0, "nodeName": "node1", "gpuDevices": "0,1"},
            {"podIndex": 1, "nodeName": "node2", "gpuDevices": "3"},
        ],
        "injectionMode": "cuda",
    },
    "tests": {"enabled": True},
}


def render_chart_test(cluster: Cluster, namespace: str, values_file: Path) -> list[dict[str, Any]]:
    out = cluster.helm(
        "template",
        RELEASE,
        str(chart_path(CHECK_CHART)),
        "--namespace",
        namespace,
        "--kube-version",
        cluster_version(cluster),
        "--values",
        str(values_file),
        "--show-only",
        "templates/tests/verify-release.yaml",
    ).stdout
    return load_manifests(out)


def cluster_version(cluster: Cluster) -> str:
    info = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    return str(info["serverVersion"]["gitVersion"])


@pytest.fixture
def chart_test_identity(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> Iterator[tuple[Path, list[str], list[str]]]:
    """The helm test's ServiceAccount, Roles and RoleBindings from the chart (its Pod is not created:
    kwok would never run it) -> (kubeconfig with that account's token, the test pod's args, its
    init container's args).
    The scheduler's Lease is the tests' scheduler's: in ``namespace`` (POD_NAMESPACE)."""
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump({**CHART_VALUES, "waitReady": {"lease": {"namespace": namespace}}}))
    docs = render_chart_test(cluster, namespace, values_file)
    test_pod = next(d for d in docs if d["kind"] == "Pod")
    cluster.apply([d for d in docs if d["kind"] != "Pod"])
    sa = test_pod["spec"]["serviceAccountName"]
    (container,) = test_pod["spec"]["containers"]
    assert container["command"] == ["gpu-scheduler-check"]
    (init,) = test_pod["spec"]["initContainers"]
    assert init["command"] == ["gpu-scheduler-check"] and init["args"][0] == "wait-ready"
    yield cluster.service_account_kubeconfig(namespace, sa), list(container["args"]), list(init["args"])


def verify_release(kubeconfig: Path, args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_CMD), *args, "--timeout", str(timeout), "--interval", "1"],
        env=host_env({"KUBECONFIG": str(kubeconfig)}),
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=False,
    )


def table(stdout: str) -> dict[str, dict[str, str]]:
    lines = stdout.splitlines()
    head = lines[0].split()
    return {row.split()[0]: dict(zip(head, row.split(), strict=True)) for row in lines[1:]}


def test_verify_release_with_the_chart_test_account(
    cluster: Cluster,
    namespace: str,
    webhook_server: WebhookServer,
    scheduler: ManagedProcess,
    chart_test_identity: tuple[Path, list[str], list[str]],
) -> None:
    kubeconfig, args, wait_args = chart_test_identity
    assert args[:2] == ["verify-release", "--namespace"]
    with register_webhooks(cluster, namespace, webhook_server):
        # The pod's first (init) container, with the same identity: the placement path works.
        wait = subprocess.run(
            [str(CHECK_CMD), *wait_args, "--interval", "1"],
            env=host_env({"KUBECONFIG": str(kubeconfig)}),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert wait.returncode == 0, wait.stderr[-3000:]
        assert "placement path ready after" in wait.stderr
        # --no-hooks: kwok would never run the pre-install wait-ready Pod (test_check_wait_ready.py runs it).
        # tests.enabled=false: the helm test's RBAC (objects of the release) are already here, applied above.
        install_chart(
            cluster,
            RELEASE,
            namespace,
            {**CHART_VALUES, "tests": {"enabled": False}},
            chart=CHECK_CHART,
            hooks=False,
        )
        res = verify_release(kubeconfig, args, timeout=90)
        assert res.returncode == 0, res.stdout + res.stderr
        rows = table(res.stdout)
        assert sorted(rows) == [f"{RELEASE}-gpu-scheduler-check-0", f"{RELEASE}-gpu-scheduler-check-1"]
        r0 = rows[f"{RELEASE}-gpu-scheduler-check-0"]
        assert (r0["NODE"], r0["GPUS"], r0["PHASE"], r0["OK"]) == ("node1", "0,1", "Running", "yes")
        replicas = checks_of(res.stderr)["replicas"]
        assert replicas["expected"] == replicas["actual"] == [0, 1]
    # The webhook is gone: a replica re-created now gets no GPU env, and verify-release says so.
    name = f"{RELEASE}-gpu-scheduler-check-1"
    old_uid = read_pod(cluster, namespace, name)["metadata"]["uid"]
    cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=true")

    def recreated() -> bool:
        # Between the delete and the StatefulSet controller's re-create the pod is absent: NotFound is "not yet".
        got = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
        if got.returncode != 0:
            assert "NotFound" in got.stderr, got.stderr
            return False
        pod = json.loads(got.stdout)
        return pod["metadata"]["uid"] != old_uid and bool(pod["spec"].get("nodeName"))

    wait_for(recreated, timeout=90, what=f"{name} re-created and bound")
    res = verify_release(kubeconfig, args, timeout=10)
    assert res.returncode == 1, res.stdout + res.stderr
    assert table(res.stdout)[name]["OK"] == "NO"
    failed = {(d["pod"], d["check"]) for d in json_lines(res.stderr) if "check" in d and d["ok"] is False}
    assert (f"{namespace}/{name}", "env:CUDA_VISIBLE_DEVICES") in failed
    assert (f"{namespace}/{name}", "env:CUDA_DEVICE_ORDER") in failed
