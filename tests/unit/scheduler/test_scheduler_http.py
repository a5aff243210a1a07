"""The HTTP endpoints and the metrics they serve; the pod predicates the watch uses."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kube_gpu_scheduler.scheduler.main import build
from kube_gpu_scheduler.scheduler.placing.core import Scheduler
from kube_gpu_scheduler.scheduler.runtime.leader import LeaseRecord
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from kube_gpu_scheduler.scheduler.runtime.server import HealthServer, Probes
from kube_gpu_scheduler.scheduler.runtime.settings import Settings
from kube_gpu_scheduler.scheduler.state.pods import is_pending, pod_signature


class State:
    def __init__(self) -> None:
        self.alive = {"watch-pods": True, "workers": True}
        self.ready = {"pods-synced": False}


@pytest.fixture
def served() -> Iterator[tuple[str, State, Metrics]]:
    state = State()
    metrics = Metrics()
    metrics.track(lambda: 3, lambda: 1)
    probes = Probes(
        lambda: dict(state.alive), lambda: dict(state.ready), lambda: {"leader": False}, metrics.render
    )
    server = HealthServer("127.0.0.1", 0, probes)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", state, metrics
    finally:
        server.stop()


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_liveness_follows_the_loops(served: tuple[str, State, Metrics]) -> None:
    url, state, _ = served
    assert get(url + "/healthz")[0] == 200
    state.alive["workers"] = False
    code, _, body = get(url + "/healthz")
    assert code == 503
    assert json.loads(body)["checks"]["workers"] is False


def test_readiness_follows_the_caches(served: tuple[str, State, Metrics]) -> None:
    url, state, _ = served
    assert get(url + "/readyz")[0] == 503
    state.ready["pods-synced"] = True
    assert get(url + "/readyz")[0] == 200


def test_health_is_json_with_status_ok(served: tuple[str, State, Metrics]) -> None:
    url, state, _ = served
    code, ctype, body = get(url + "/health")
    assert (code, ctype) == (200, "application/json")
    data: dict[str, Any] = json.loads(body)
    assert data["status"] == "ok"
    assert data["leader"] is False
    state.alive["watch-pods"] = False
    code, _, body = get(url + "/health")
    assert code == 503
    assert json.loads(body)["status"] == "unhealthy"


def test_metrics(served: tuple[str, State, Metrics]) -> None:
    url, _, metrics = served
    metrics.pods_bound.inc()
    metrics.failures.labels("GPUInUse").inc(2)
    metrics.bind_latency.observe(0.02)
    metrics.leader.set(1)
    code, ctype, text = get(url + "/metrics")
    assert code == 200
    assert ctype.startswith("text/plain")
    assert "gpu_scheduler_pods_bound_total 1.0" in text
    assert 'gpu_scheduler_scheduling_failures_total{reason="GPUInUse"} 2.0' in text
    assert 'gpu_scheduler_scheduling_failures_total{reason="NodeNotFound"} 0.0' in text
    assert "gpu_scheduler_bind_latency_seconds_count 1.0" in text
    assert "gpu_scheduler_leader 1.0" in text
    assert "gpu_scheduler_queue_depth 3.0" in text
    assert "gpu_scheduler_unschedulable_pods 1.0" in text


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lease_scheduler() -> Iterator[tuple[str, Scheduler, FakeClock]]:
    """The real Scheduler's probes, caches marked synced, its elector on a fake clock and fed by hand.

    Nothing is started: no request reaches an apiserver (the ApiClient points nowhere).
    """
    settings = Settings(identity="me", lease_duration=3, renew_deadline=2, retry_period=0.5).validate()
    sched = build(settings, client.ApiClient())
    assert sched.elector is not None
    clock = FakeClock()
    sched.elector._clock = clock
    sched.pods.synced.set()
    sched.assigned.synced.set()
    sched.nodes.synced.set()
    server = HealthServer("127.0.0.1", 0, sched.probes())
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", sched, clock
    finally:
        server.stop()


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_readiness_fails_when_nobody_renews_for_twice_the_lease_duration(
    lease_scheduler: tuple[str, Scheduler, FakeClock],
) -> None:
    url, sched, clock = lease_scheduler
    elector = sched.elector
    assert elector is not None
    # Before leader election started: no verdict, ready once the caches synced.
    code, _, body = get(url + "/readyz")
    assert code == 200, body
    assert json.loads(body)["checks"]["leader-renewing"] is True
    assert math.isnan(_sample(get(url + "/metrics")[2], "gpu_scheduler_leader_last_renewal_age_seconds"))
    alive_before = sched.health.alive()

    elector.begin()
    elector.observe(LeaseRecord("replica-b", 3, None, None, 0, "1"))
    clock.now += 5.9  # the other replica's last renewal, 5.9 s ago: a healthy standby
    assert get(url + "/readyz")[0] == 200
    lease = json.loads(get(url + "/health")[2])["lease"]
    assert lease["holder"] == "replica-b"
    assert lease["leading"] is False
    assert lease["renewing"] is True
    assert lease["lease_duration_s"] == 3
    assert lease["last_renewal_age_s"] == pytest.approx(5.9)

    clock.now += 0.2  # 6.1 s > 2 x 3 s: nobody renews
    code, _, body = get(url + "/readyz")
    assert code == 503
    assert json.loads(body)["checks"] == {
        "pods-synced": True,
        "assigned-pods-synced": True,
        "nodes-synced": True,
        "leader-renewing": False,
    }
    _, _, body = get(url + "/health")
    data = json.loads(body)
    assert data["lease"]["renewing"] is False
    assert data["ready"] is False
    metrics = get(url + "/metrics")[2]
    assert _sample(metrics, "gpu_scheduler_leader_healthy") == 0
    assert _sample(metrics, "gpu_scheduler_leader_last_renewal_age_seconds") == pytest.approx(6.1)
    # Liveness does not look at the Lease (a restart cannot make anyone renew).
    assert sched.health.alive() == alive_before
    assert "leader-renewing" not in sched.health.alive()

    # Someone renews again: ready at once.
    elector.observe(LeaseRecord("replica-c", 3, None, None, 1, "2"))
    assert get(url + "/readyz")[0] == 200
    metrics = get(url + "/metrics")[2]
    assert _sample(metrics, "gpu_scheduler_leader_healthy") == 1
    assert _sample(metrics, "gpu_scheduler_leader_last_renewal_age_seconds") == 0


def test_readiness_fails_at_once_while_a_holder_claims_an_absurd_duration(
    lease_scheduler: tuple[str, Scheduler, FakeClock],
) -> None:
    url, sched, _ = lease_scheduler
    assert sched.elector is not None
    sched.elector.begin()
    sched.elector.observe(LeaseRecord("garbage", 2147483647, None, None, 0, "1"))
    code, _, body = get(url + "/readyz")
    assert code == 503
    assert json.loads(body)["checks"]["leader-renewing"] is False
    lease = json.loads(get(url + "/health")[2])["lease"]
    assert lease["absurd_duration"] is True
    assert lease["holder_lease_duration_s"] == 2147483647


def test_without_leader_election_there_is_no_lease_check() -> None:
    sched = build(Settings(identity="me", leader_elect=False).validate(), client.ApiClient())
    assert "leader-renewing" not in sched.health.ready()
    assert sched.health.summary()["lease"] is None
    metrics = sched.metrics.render().decode()
    assert _sample(metrics, "gpu_scheduler_leader_healthy") == 1


def test_unknown_path(served: tuple[str, State, Metrics]) -> None:
    assert get(served[0] + "/nope")[0] == 404


def test_is_pending() -> None:
    assert is_pending({"metadata": {}, "spec": {}, "status": {"phase": "Pending"}})
    assert is_pending({"metadata": {}, "spec": {}, "status": {}})
    assert not is_pending({"metadata": {}, "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}})
    assert not is_pending(
        {"metadata": {"deletionTimestamp": "t"}, "spec": {}, "status": {"phase": "Pending"}}
    )
    assert not is_pending({"metadata": {}, "spec": {}, "status": {"phase": "Failed"}})


def test_pod_signature_ignores_status_and_our_own_writes() -> None:
    base = {
        "metadata": {"uid": "u", "annotations": {"gpu-scheduling-map": "0=n:0"}, "labels": {}},
        "spec": {"tolerations": []},
        "status": {},
    }
    ours = json.loads(json.dumps(base))
    ours["metadata"]["annotations"]["gpu-scheduler/assigned"] = "n:0"
    ours["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    assert pod_signature(base) == pod_signature(ours)
    edited = json.loads(json.dumps(base))
    edited["metadata"]["annotations"]["gpu-scheduling-map"] = "0=n:1"
    assert pod_signature(base) != pod_signature(edited)
    tolerant = json.loads(json.dumps(base))
    tolerant["spec"]["tolerations"] = [{"operator": "Exists"}]
    assert pod_signature(base) != pod_signature(tolerant)


def test_every_metric_is_in_the_docs_metrics_table() -> None:
    """docs/scheduler.md's metrics table lists every metric the scheduler can serve (its own, the
    extender's, DRA mode's claim controller's, tenancy's), and nothing that is not served."""
    from pathlib import Path

    from kube_gpu_scheduler.scheduler.dra.metrics import ClaimMetrics
    from kube_gpu_scheduler.scheduler.placing.extender import ExtenderMetrics
    from kube_gpu_scheduler.scheduler.state.ledger import Ledger
    from kube_gpu_scheduler.scheduler.tenancy.holdings import Lookup, Tenancy
    from kube_gpu_scheduler.scheduler.tenancy.status import TenancyController

    metrics = Metrics()
    ExtenderMetrics(metrics)
    ClaimMetrics(metrics)
    # Tenancy's families (tenancy.enabled): a policy's counts, its refusals.
    one = Lookup(lambda name: None, lambda name: None, lambda: [{"metadata": {"name": "p"}, "spec": {}}])
    TenancyController(
        Tenancy(Ledger(), one, lambda key: None), None, lambda: False, list, None, metrics.registry
    )  # type: ignore[arg-type]
    served = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in metrics.registry.collect()
    }
    text = (Path(__file__).resolve().parents[3] / "docs" / "scheduler.md").read_text()
    table = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = {
        line.split("`")[1].split("{")[0]
        for line in table.splitlines()
        if line.startswith("| `gpu_scheduler_")
    }
    assert served == documented, (sorted(served - documented), sorted(documented - served))


def test_between_the_caches_sync_and_the_workers_start_the_scheduler_is_not_called_dead(
    lease_scheduler: tuple[str, Scheduler, FakeClock],
) -> None:
    """/readyz says ready once the caches synced; the workers and the elector start a few ms
    later. In that window /health and /healthz said 503 (a test saw it right after /readyz)."""
    url, sched, _ = lease_scheduler
    assert not sched.started.is_set() and not sched.workers
    assert get(url + "/readyz")[0] == 200
    # (No thread runs in this fixture: the watches and the event sender say so themselves.)
    assert set(sched.health.alive()) == {"watch-pods", "watch-assigned-pods", "watch-nodes", "events"}
    # Once started, the workers and the elector are judged: none alive here, so dead.
    sched.started.set()
    checks = sched.health.alive()
    assert checks["workers"] is False
    assert checks["leader-election"] is False
