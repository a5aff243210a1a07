"""``gpu-scheduler-check wait-ready``, the check chart's first hook, against the local control plane.

The command runs as a host process with a token of the chart's own wait-ready ServiceAccount,
bound by the chart's own Roles (rendered with ``helm template --show-only
templates/wait-ready.yaml``), with the arguments the chart's hook Pod carries. The scheduler is
the real one (host process, the scheduler chart's least-privilege identity, its Lease in the
test's namespace) and the webhook the real one, called by the apiserver over TLS. Nothing here
is a stand-in for the apiserver: the dry-run goes through its real admission chain.

What the tests show: while no scheduler holds the Lease, or while no webhook injects, the
command keeps waiting and says which; it passes within seconds of the scheduler starting;
a timeout, a released Lease and a missing Role each end it with a verdict in its termination
message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.clients import load_manifests
from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from localcluster.rbac import LEASE_NAME
from localcluster.release import CHECK_CHART, chart_path
from tests.integration.fixtures_webhook import WebhookServer, register_webhooks
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

CHECK_CMD = Path(sys.executable).parent / "gpu-scheduler-check"
RELEASE = "wr"
VALUES: dict[str, Any] = {
    "replicaCount": 2,
    "gpuScheduling": {
        "schedulingMap": [
            {"podIndex": 0, "nodeName": "node1", "gpuDevices": "0,1"},
            {"podIndex": 1, "nodeName": "node2", "gpuDevices": "3"},
        ]
    },
}


def cluster_version(cluster: Cluster) -> str:
    return str(json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"])


def render_wait_hook(cluster: Cluster, namespace: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The chart's wait-ready hook objects, the scheduler's Lease in ``namespace`` (where the
    tests' scheduler keeps it: POD_NAMESPACE) under its default name."""
    values = {**VALUES, "waitReady": {"lease": {"namespace": namespace, "name": LEASE_NAME}}}
    values_file = tmp_path / "wait-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
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
        "templates/wait-ready.yaml",
    ).stdout
    return load_manifests(out)


@dataclass
class Hook:
    """The hook Pod's command and the kubeconfig of its ServiceAccount."""

    kubeconfig: Path
    args: list[str]
    service_account: str
    docs: list[dict[str, Any]]

    def argv(self, **overrides: str) -> list[str]:
        args = list(self.args)
        for flag, value in overrides.items():
            option = "--" + flag.replace("_", "-")
            args[args.index(option) + 1] = value
        return [str(CHECK_CMD), *args]


@pytest.fixture
def wait_hook(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Callable[..., Hook]]:
    """``wait_hook(skip=())``: the chart's wait-ready RBAC applied (except the kinds/names in
    ``skip``), and the hook Pod's command (the Pod itself is not created: kwok runs nothing)."""

    def make(skip: tuple[str, ...] = ()) -> Hook:
        docs = render_wait_hook(cluster, namespace, tmp_path)
        pod = next(d for d in docs if d["kind"] == "Pod")
        rbac = [d for d in docs if d["kind"] != "Pod" and f"{d['kind']}/{d['metadata']['name']}" not in skip]
        cluster.apply(rbac)
        sa = pod["spec"]["serviceAccountName"]
        (container,) = pod["spec"]["containers"]
        assert container["command"] == ["gpu-scheduler-check"]
        kubeconfig = cluster.service_account_kubeconfig(namespace, sa, path=tmp_path / f"{sa}.kubeconfig")
        return Hook(kubeconfig, list(container["args"]), sa, docs)

    yield make


def start(hook: Hook, tmp_path: Path, name: str, **overrides: str) -> tuple[ManagedProcess, Path]:
    message = tmp_path / f"{name}-termination-log"
    message.write_text("")  # the file the kubelet creates
    overrides.setdefault("termination_message_path", str(message))
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(hook.kubeconfig)}
    proc = ManagedProcess(name, hook.argv(**overrides), env=env, log_path=tmp_path / f"{name}.log").start()
    return proc, message


def records(proc: ManagedProcess) -> list[dict[str, Any]]:
    """Its JSON log lines."""
    return [json.loads(line) for line in proc.log_text().splitlines() if line.startswith("{")]


def polls(proc: ManagedProcess) -> list[dict[str, Any]]:
    """Its "not ready yet" lines (one per poll)."""
    return [rec for rec in records(proc) if str(rec.get("msg", "")).startswith("not ready yet")]


def exit_code(proc: ManagedProcess, timeout: float) -> int:
    wait_for(lambda: not proc.running(), timeout, interval=0.1, what=f"{proc.name} to exit")
    assert proc.proc is not None
    return int(proc.proc.returncode)


def lease_missing(namespace: str) -> str:
    return f"no scheduler holds Lease {LEASE_NAME} in namespace {namespace}"


INJECTION_MISSING = "came back without CUDA_VISIBLE_DEVICES (the webhook/policy has not injected yet)"


def test_wait_ready_waits_for_the_scheduler_and_the_webhook_then_passes(
    cluster: Cluster,
    namespace: str,
    wait_hook: Callable[..., Hook],
    webhook_server: WebhookServer,
    start_scheduler: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    hook = wait_hook()
    proc, message = start(hook, tmp_path, "wait-ready", interval="1", timeout="120")
    try:
        # Nothing is there: it says both, and keeps waiting.
        first = wait_for(
            lambda: [
                p
                for p in polls(proc)
                if any(lease_missing(namespace) in m for m in p["missing"])
                and any(INJECTION_MISSING in m for m in p["missing"])
            ],
            30,
            what="a poll naming the missing Lease and the missing injection",
        )[0]
        assert "the Lease does not exist" in first["msg"], first
        time.sleep(3)
        assert proc.running(), proc.log_text(20)
        with register_webhooks(cluster, namespace, webhook_server):
            # The webhook injects now; the scheduler is still missing: it still waits, saying so.
            wait_for(
                lambda: [
                    p
                    for p in polls(proc)
                    if p["missing"] and all(lease_missing(namespace) in m for m in p["missing"])
                ],
                30,
                what="a poll naming only the missing Lease",
            )
            assert proc.running(), proc.log_text(20)
            waited = len(polls(proc))
            started = time.monotonic()
            start_scheduler()  # returns once /readyz answers; the Lease is taken right after
            code = exit_code(proc, 30)
            after_scheduler = time.monotonic() - started
        assert code == 0, proc.log_text(30)
        (verdict,) = [rec["msg"] for rec in records(proc) if rec.get("ready") is True]
        assert verdict.startswith("placement path ready after "), verdict
        # A success leaves the termination message empty (the verification's must be the one shown).
        assert message.read_text() == ""
        assert f"holds Lease {namespace}/{LEASE_NAME}" in verdict, verdict
        assert "came back with CUDA_VISIBLE_DEVICES=0,1, CUDA_DEVICE_ORDER=PCI_BUS_ID" in verdict, verdict
        print(
            f"wait-ready: {waited} polls waited; passed {after_scheduler:.1f} s after the scheduler "
            f"was started ({verdict})"
        )
        # Within seconds of the scheduler starting (it renews every 2 s; the poll interval is 1 s).
        assert after_scheduler < 20, after_scheduler
    finally:
        proc.stop()


def test_wait_ready_times_out_with_what_is_missing(
    namespace: str, wait_hook: Callable[..., Hook], tmp_path: Path
) -> None:
    proc, message = start(wait_hook(), tmp_path, "wait-timeout", interval="1", timeout="3")
    try:
        assert exit_code(proc, 60) == 1, proc.log_text(20)
    finally:
        proc.stop()
    verdict = message.read_text()
    assert verdict.startswith("placement path NOT ready after 3 s (timeout 3 s): "), verdict
    assert lease_missing(namespace) in verdict and INJECTION_MISSING in verdict, verdict
    assert len(polls(proc)) >= 2, proc.log_text(20)


def test_a_released_lease_is_not_a_scheduler(
    cluster: Cluster,
    namespace: str,
    wait_hook: Callable[..., Hook],
    start_scheduler: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    scheduler = start_scheduler()

    def holder() -> str:
        return str(
            cluster.kubectl(
                "get",
                "lease",
                LEASE_NAME,
                "-n",
                namespace,
                "-o",
                "jsonpath={.spec.holderIdentity}",
                check=False,
            ).stdout.strip()
        )

    wait_for(holder, 30, what="the scheduler to take its Lease")
    scheduler.stop()  # SIGTERM: it releases the Lease
    proc, message = start(wait_hook(), tmp_path, "wait-released", interval="1", timeout="3")
    try:
        assert exit_code(proc, 60) == 1
    finally:
        proc.stop()
    assert "its holderIdentity is empty (released by a stopping scheduler)" in message.read_text()


def test_a_missing_lease_role_stops_the_wait_after_the_rbac_grace(
    namespace: str, wait_hook: Callable[..., Hook], tmp_path: Path
) -> None:
    hook = wait_hook(skip=(f"RoleBinding/{RELEASE}-gpu-scheduler-check-wait-ready-lease",))
    started = time.monotonic()
    proc, message = start(hook, tmp_path, "wait-forbidden", interval="1", timeout="120")
    try:
        assert exit_code(proc, 90) == 1
    finally:
        proc.stop()
    took = time.monotonic() - started
    verdict = message.read_text()
    assert "(refused: waiting will not change it)" in verdict, verdict
    assert f"cannot read Lease {LEASE_NAME} in namespace {namespace}: 403" in verdict, verdict
    assert f"the hook's Role in {namespace} must grant get on this Lease" in verdict
    assert 15 <= took < 60, took  # waited out the RBAC grace, not the 120 s timeout


def can_i(cluster: Cluster, namespace: str, sa: str, *args: str) -> bool:
    res = cluster.kubectl(
        "auth", "can-i", *args, "--as", f"system:serviceaccount:{namespace}:{sa}", check=False
    )
    return res.stdout.strip() == "yes"


def test_the_hook_identity_may_do_nothing_else(
    cluster: Cluster, namespace: str, wait_hook: Callable[..., Hook]
) -> None:
    hook = wait_hook()
    sa = hook.service_account
    assert can_i(cluster, namespace, sa, "create", "pods", "-n", namespace)
    assert can_i(cluster, namespace, sa, "get", f"leases.coordination.k8s.io/{LEASE_NAME}", "-n", namespace)
    for denied in (
        ("get", "leases.coordination.k8s.io/other", "-n", namespace),
        ("update", f"leases.coordination.k8s.io/{LEASE_NAME}", "-n", namespace),
        ("list", "leases.coordination.k8s.io", "-n", namespace),
        ("get", "pods", "-n", namespace),
        ("delete", "pods", "-n", namespace),
        ("create", "pods", "--subresource=binding", "-n", namespace),
        ("create", "pods", "-n", "default"),
        ("get", "secrets", "-n", namespace),
    ):
        assert not can_i(cluster, namespace, sa, *denied), denied
    # A dry-run stores nothing: no pod of the probe's was ever created.
    res = subprocess.run(
        [*hook.argv(interval="1", timeout="1"), "--kubeconfig", str(hook.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 1, res.stderr
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.split()
    assert not pods, pods
