"""Fixtures for the scheduler's integration tests (registered by tests/conftest.py).

The scheduler runs as a host process with a ServiceAccount token, bound to the
ClusterRole and Role that gpu-scheduler-chart renders (localcluster/rbac.py reads
them from ``helm template``; docs/scheduler.md "RBAC"), never as admin: a missing
permission fails these tests.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from localcluster.rbac import ChartIdentity, chart_identity, scheduler_chart_values
from localcluster.scheduler_host import http_url, run_scheduler


@pytest.fixture
def scheduler_identity(cluster: Cluster, namespace: str) -> Iterator[ChartIdentity]:
    """The chart's scheduler ServiceAccount and RBAC in ``namespace`` (release ``gs-<namespace>``)."""
    with chart_identity(
        cluster, namespace, "scheduler", f"gs-{namespace}", scheduler_chart_values()
    ) as ident:
        yield ident


@pytest.fixture
def scheduler_kubeconfig(scheduler_identity: ChartIdentity) -> Path:
    """A kubeconfig with the token of the chart's (least-privilege) scheduler ServiceAccount."""
    return scheduler_identity.kubeconfig


@pytest.fixture
def start_scheduler(
    namespace: str, scheduler_kubeconfig: Path, tmp_path: Path
) -> Iterator[Callable[..., ManagedProcess]]:
    """``start_scheduler(identity="a", **env)``: a scheduler replica whose Lease lives in ``namespace``."""
    started: list[ManagedProcess] = []

    def start(identity: str = "replica-a", **env: str) -> ManagedProcess:
        proc = run_scheduler(
            scheduler_kubeconfig,
            env={
                "POD_NAME": identity,
                "POD_NAMESPACE": namespace,
                "GPU_SCHEDULER_LOG_LEVEL": "DEBUG",
                # These tests place pods without a webhook (the scheduler-only install);
                # the tests of the webhook and scheduler together turn it on.
                "GPU_SCHEDULER_REQUIRE_INJECTION": "false",
                **env,
            },
            log_path=tmp_path / f"scheduler-{identity}.log",
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        # Shown by pytest when the test failed.
        print(f"--- {proc.log_path} (last 60 lines) ---\n{proc.log_text(60)}")


@pytest.fixture
def scheduler(start_scheduler: Callable[..., ManagedProcess]) -> ManagedProcess:
    """One scheduler replica (leader election on), ready."""
    return start_scheduler()


# -- helpers for the tests ------------------------------------------------------------


def http_get(proc: ManagedProcess, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(http_url(proc, path), timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def metric(proc: ManagedProcess, name: str, labels: str = "") -> float:
    """The value of one sample on /metrics (0 when absent)."""
    _, text = http_get(proc, "/metrics")
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    return 0.0


def health(proc: ManagedProcess) -> dict[str, Any]:
    _, body = http_get(proc, "/health")
    return dict(json.loads(body))


def statefulset(
    name: str, sched_map: str, replicas: int, scheduler_name: str = "gpu-scheduler", **pod_spec: Any
) -> dict[str, Any]:
    """A StatefulSet whose pods kwok runs; Parallel so replicas do not wait for each other."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {"gpu-scheduling-map": sched_map}},
                "spec": {
                    "schedulerName": scheduler_name,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                    **pod_spec,
                },
            },
        },
    }
