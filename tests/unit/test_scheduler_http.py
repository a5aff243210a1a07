"""The HTTP endpoints and the metrics they serve; the pod predicates the watch uses."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.core import is_pending, pod_signature
from scheduler.metrics import Metrics
from scheduler.server import HealthServer, Probes


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
