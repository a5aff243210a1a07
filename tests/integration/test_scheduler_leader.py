"""Leader health against the real control plane: a garbage Lease, nobody renewing, a killed leader.

Each test runs its own scheduler replica(s) with the least-privilege
ServiceAccount of ``fixtures_scheduler`` and short lease timings, and its own
kwok GPU node. Waits poll with deadlines; the only timing assertions are lower
bounds (slowness can only make them later, never fail them), except where a
test says why an upper margin is safe.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster.cluster import Cluster, free_port
from localcluster.procs import ManagedProcess
from localcluster.scheduler_host import HOST, scheduler_command
from tests.integration.fixtures_scheduler import health, http_get, metric, statefulset
from tests.support.waiting import wait_for

LEASE = "gpu-scheduler"
INT32_MAX = 2147483647


def timings(duration: float, renew: float, retry: float) -> dict[str, str]:
    return {
        "GPU_SCHEDULER_LEASE_DURATION": str(duration),
        "GPU_SCHEDULER_RENEW_DEADLINE": str(renew),
        "GPU_SCHEDULER_RETRY_PERIOD": str(retry),
    }


@pytest.fixture
def launch(
    namespace: str, scheduler_kubeconfig: Path, tmp_path: Path
) -> Iterator[Callable[..., ManagedProcess]]:
    """``launch(identity, **env)``: a scheduler replica like ``start_scheduler``'s, without waiting for /readyz.

    (``start_scheduler`` waits for /readyz 200, which a replica facing a garbage
    Lease answers only after it took the Lease over.)
    """
    started: list[ManagedProcess] = []

    def start(identity: str, **env: str) -> ManagedProcess:
        proc = ManagedProcess(
            f"gpu-scheduler-{identity}",
            [scheduler_command()],
            env={
                **os.environ,
                "KUBECONFIG": str(scheduler_kubeconfig),
                "GPU_SCHEDULER_HTTP_ADDRESS": HOST,
                "GPU_SCHEDULER_HTTP_PORT": str(free_port()),
                "POD_NAME": identity,
                "POD_NAMESPACE": namespace,
                "GPU_SCHEDULER_LOG_LEVEL": "DEBUG",
                # No webhook in these tests: the scheduler-only install.
                "GPU_SCHEDULER_REQUIRE_INJECTION": "false",
                **env,
            },
            log_path=tmp_path / f"scheduler-{identity}.log",
        )
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        print(f"--- {proc.log_path} (last 60 lines) ---\n{proc.log_text(60)}")


@pytest.fixture
def gpu_node(own_node: Callable[..., str]) -> str:
    """A kwok GPU node for this test only."""
    return own_node("lease")


def readyz(proc: ManagedProcess) -> tuple[int, dict[str, Any]]:
    """/readyz's status and checks; (0, {}) while the process does not listen yet."""
    assert proc.running(), proc.log_text(40)
    try:
        code, body = http_get(proc, "/readyz")
    except (urllib.error.URLError, ConnectionError):
        return 0, {}
    return code, dict(json.loads(body)["checks"])


def not_renewing(proc: ManagedProcess) -> bool:
    code, checks = readyz(proc)
    return code == 503 and checks.get("leader-renewing") is False


def ready(proc: ManagedProcess) -> bool:
    return readyz(proc)[0] == 200


def lease(kube: Any, ns: str) -> dict[str, Any] | None:
    try:
        resp = client.CoordinationV1Api(kube).read_namespaced_lease(LEASE, ns, _preload_content=False)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return dict(json.loads(resp.data))


def holder(kube: Any, ns: str) -> str | None:
    obj = lease(kube, ns)
    return obj["spec"].get("holderIdentity") if obj else None


def acquired_at(obj: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(obj["spec"]["acquireTime"].replace("Z", "+00:00"))


def bound_on(kube: Any, ns: str, name: str) -> str | None:
    try:
        resp = client.CoreV1Api(kube).read_namespaced_pod(name, ns, _preload_content=False)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    node = json.loads(resp.data)["spec"].get("nodeName")
    return str(node) if node else None


def lease_events(kube: Any, ns: str) -> list[dict[str, Any]]:
    resp = client.CoreV1Api(kube).list_namespaced_event(
        ns, field_selector=f"involvedObject.kind=Lease,involvedObject.name={LEASE}", _preload_content=False
    )
    return list(json.loads(resp.data)["items"])


def test_a_garbage_lease_is_reported_then_taken_over_after_our_lease_duration(
    cluster: Cluster, namespace: str, kube: Any, launch: Callable[..., ManagedProcess], gpu_node: str
) -> None:
    duration = 6.0  # the not-ready window this test must catch lasts about this long
    created = client.CoordinationV1Api(kube).create_namespaced_lease(
        namespace,
        {
            "metadata": {"name": LEASE},
            "spec": {
                "holderIdentity": "garbage",
                "leaseDurationSeconds": INT32_MAX,
                "renewTime": "2999-12-31T23:59:59.999999Z",  # far in the future: must not matter
            },
        },
        _preload_content=False,
    )
    created_at = dt.datetime.fromisoformat(json.loads(created.data)["metadata"]["creationTimestamp"])
    a = launch("replica-a", **timings(duration, 4, 0.5))

    # Right away: not ready, because the holder is no sound leader; alive all the same.
    wait_for(lambda: not_renewing(a), 30, interval=0.2, what="replica-a reports leader-renewing false")
    assert http_get(a, "/healthz")[0] == 200
    lease_health = health(a)["lease"]
    assert lease_health["holder"] == "garbage"
    assert lease_health["leading"] is False
    assert lease_health["absurd_duration"] is True
    assert lease_health["holder_lease_duration_s"] == INT32_MAX
    assert lease_health["lease_duration_s"] == duration
    assert metric(a, "gpu_scheduler_leader_healthy") == 0

    # After our own duration without renewal it takes the Lease, and says so.
    wait_for(lambda: holder(kube, namespace) == "replica-a", 60, what="replica-a takes the garbage Lease")
    taken = lease(kube, namespace)
    assert taken is not None
    assert taken["spec"]["leaseDurationSeconds"] == int(duration)
    # Lower bound only: it waited at least our duration after it could first have seen the Lease.
    waited = (acquired_at(taken) - created_at).total_seconds()
    assert waited >= duration - 0.01, f"took the Lease over after {waited:.2f}s, before {duration}s"
    wait_for(lambda: ready(a), 30, interval=0.2, what="replica-a ready once it leads")
    lease_health = health(a)["lease"]
    assert lease_health["holder"] == "replica-a"
    assert lease_health["leading"] is True
    assert lease_health["renewing"] is True
    assert metric(a, "gpu_scheduler_leader_healthy") == 1

    event = wait_for(
        lambda: next(
            (e for e in lease_events(kube, namespace) if e["reason"] == "AbsurdLeaseDuration"), None
        ),
        30,
        what="AbsurdLeaseDuration event on the Lease",
    )
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Lease"
    assert event["involvedObject"]["apiVersion"] == "coordination.k8s.io/v1"
    assert event["reportingComponent"] == "gpu-scheduler"
    assert "'garbage'" in event["message"]
    assert str(INT32_MAX) in event["message"]
    assert "'replica-a'" in event["message"]
    warnings = [
        json.loads(line)
        for line in a.log_text().splitlines()
        if line.startswith("{") and "took over a lease with an absurd duration" in line
    ]
    assert len(warnings) == 1, warnings
    assert warnings[0]["level"] == "warning"
    assert warnings[0]["holder"] == "garbage"
    assert warnings[0]["leaseDurationSeconds"] == INT32_MAX

    # And it schedules.
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("g", f"0={gpu_node}:0", 1))
    )
    assert wait_for(lambda: bound_on(kube, namespace, "g-0"), 60, what="g-0 bound") == gpu_node


def _lease_role(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """The chart's leader-election Role in the test's namespace (the one whose rules name leases)."""
    roles = json.loads(cluster.kubectl("get", "roles", "-n", namespace, "-o", "json").stdout)["items"]
    [role] = [r for r in roles if any("leases" in rule.get("resources", []) for rule in r.get("rules") or [])]
    return dict(role)


def _set_lease_rules(cluster: Cluster, namespace: str, rules: list[dict[str, Any]]) -> None:
    name = _lease_role(cluster, namespace)["metadata"]["name"]
    cluster.kubectl(
        "patch", "role", name, "-n", namespace, "--type=merge", "-p", json.dumps({"rules": rules})
    )


def test_when_nobody_renews_for_twice_the_duration_every_replica_turns_not_ready_but_stays_live(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    start_scheduler: Callable[..., ManagedProcess],
    gpu_node: str,
) -> None:
    duration = 3.0
    a = start_scheduler("replica-a", **timings(duration, 2, 0.5))
    wait_for(lambda: holder(kube, namespace) == "replica-a", 30, what="replica-a leads")
    b = start_scheduler("replica-b", **timings(duration, 2, 0.5))
    # The standby has read the Lease once (its first try may come a moment after it is up).
    wait_for(
        lambda: health(b)["lease"]["holder"] == "replica-a", 30, interval=0.2, what="replica-b sees replica-a"
    )
    assert ready(b)  # a standby is ready while the leader renews

    # Nobody may write the Lease any more (as when RBAC or the apiserver refuses every update).
    chart_rules = _lease_role(cluster, namespace)["rules"]
    _set_lease_rules(
        cluster,
        namespace,
        [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}],
    )
    revoked = time.monotonic()
    # The last renewal was at most a retry period ago: both still ready for now.
    assert ready(a) and ready(b)
    wait_for(lambda: not_renewing(a) and not_renewing(b), 30, interval=0.2, what="both replicas not ready")
    # Lower bound: not before 2x the duration after the last renewal (itself at most a retry period,
    # plus a request, before the revocation).
    elapsed = time.monotonic() - revoked
    assert elapsed >= 2 * duration - 1.5, f"not ready after {elapsed:.2f}s, before 2 x {duration}s"
    for proc in (a, b):
        assert http_get(proc, "/healthz")[0] == 200  # liveness unaffected: a restart would not help
        lease_health = health(proc)["lease"]
        assert lease_health["leading"] is False
        assert lease_health["renewing"] is False
        assert lease_health["last_renewal_age_s"] >= 2 * duration
        assert metric(proc, "gpu_scheduler_leader_healthy") == 0
        assert metric(proc, "gpu_scheduler_leader_last_renewal_age_seconds") >= 2 * duration
    assert "could not renew within the deadline" in a.log_text()

    # Writes allowed again: one of them takes the Lease (it went unrenewed long enough), all ready.
    _set_lease_rules(cluster, namespace, chart_rules)
    wait_for(lambda: ready(a) and ready(b), 30, interval=0.2, what="both replicas ready again")
    leader = holder(kube, namespace)
    assert leader in ("replica-a", "replica-b")
    for proc in (a, b):
        assert metric(proc, "gpu_scheduler_leader_healthy") == 1
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("r", f"0={gpu_node}:1", 1))
    )
    assert wait_for(lambda: bound_on(kube, namespace, "r-0"), 60, what="r-0 bound") == gpu_node


def test_a_standby_stays_ready_when_the_leader_is_killed_and_takes_over(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    start_scheduler: Callable[..., ManagedProcess],
    gpu_node: str,
) -> None:
    duration = 4.0
    a = start_scheduler("replica-a", **timings(duration, 3, 0.5))
    wait_for(lambda: holder(kube, namespace) == "replica-a", 30, what="replica-a leads")
    b = start_scheduler("replica-b", **timings(duration, 3, 0.5))
    assert ready(b)

    killed = dt.datetime.now(dt.UTC)
    os.killpg(a.pid, signal.SIGKILL)  # no release: the Lease stays with replica-a until it expires
    assert holder(kube, namespace) == "replica-a"
    codes: list[int] = []

    def b_leads() -> bool:
        codes.append(readyz(b)[0])
        return holder(kube, namespace) == "replica-b"

    wait_for(b_leads, 60, interval=0.2, what="replica-b takes the Lease")
    # The standby takes over after one duration (about 4.5 s); it would turn not ready only after
    # 2 x 4 s without renewal, so it answers 200 throughout.
    assert set(codes) == {200}, codes
    taken = lease(kube, namespace)
    assert taken is not None
    waited = (acquired_at(taken) - killed).total_seconds()
    # Lower bound: the last renewal replica-b saw was at most a retry period (+ a request) before the kill.
    assert waited >= duration - 1, f"took over {waited:.2f}s after the kill, before {duration}s"
    wait_for(lambda: health(b)["lease"]["leading"], 10, interval=0.2, what="replica-b leads")
    assert ready(b)
    assert metric(b, "gpu_scheduler_leader_healthy") == 1
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("k", f"0={gpu_node}:2", 1))
    )
    assert wait_for(lambda: bound_on(kube, namespace, "k-0"), 60, what="k-0 bound by replica-b") == gpu_node
