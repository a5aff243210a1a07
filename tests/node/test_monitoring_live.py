"""The chart's monitoring, proven in a real Prometheus against the running release (``product``).

Prometheus (tests/node/fixtures_monitoring.py) scrapes the scheduler's and the webhook's pods as
the chart's ServiceMonitors say, and evaluates the chart's rendered PrometheusRule. Each alert is
made to fire by its real cause and must clear when the cause is healed; on the healthy release,
every query of the chart's Grafana dashboard returns data. Every cause is healed before its test
ends: the release is the package's, and the next test expects it serving.
"""

from __future__ import annotations

import re
import socket
import ssl
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from tests.node.conftest import Product
from tests.node.fixtures_monitoring import MONITORING_VALUES, Prometheus, admit_mapped_pod, prometheus

__all__ = ["prometheus"]

# The window of GPUSchedulerWebhookErrors and GPUSchedulerWebhookFailOpen in this test.
WINDOW = MONITORING_VALUES["prometheusRule"]["errorWindow"]

# Every alert the chart's rules hold; none may fire while the release is healthy.
ALERTS = {
    "GPUSchedulerDown",
    "GPUSchedulerNoLeader",
    "GPUSchedulerReplicaWaitingTooLong",
    "GPUSchedulerGangWaitingTooLong",
    "GPUSchedulerPodsNotInjected",
    "GPUSchedulerWebhookDown",
    "GPUSchedulerWebhookErrors",
    "GPUSchedulerWebhookFailOpen",
}


def _deployment(product: Product, component: str) -> dict[str, Any]:
    [dep] = product.cluster.get_json(
        "deployments",
        "-n",
        product.namespace,
        "-l",
        f"app.kubernetes.io/instance={product.release},app.kubernetes.io/component={component}",
    )["items"]
    return dict(dep)


def _scale(product: Product, dep: dict[str, Any], replicas: int) -> None:
    product.cluster.kubectl(
        "scale", "deployment", dep["metadata"]["name"], "-n", product.namespace, f"--replicas={replicas}"
    )


def _panel_queries(dashboard: dict[str, Any], namespace: str, job: str) -> list[tuple[str, str]]:
    """(panel title, expression) of every query of every panel, the variables filled in."""
    panels = list(dashboard["panels"])
    for p in list(panels):
        panels += p.get("panels") or []  # rows' panels
    out = []
    for p in panels:
        for t in p.get("targets") or []:
            expr = t["expr"].replace("$namespace", namespace).replace("$job", job)
            assert "$" not in expr, f"{p['title']}: a variable the test does not know: {expr}"
            out.append((p["title"], expr))
    return out


def _names(prom: Prometheus) -> set[str]:
    return {a["labels"]["alertname"] for a in prom.alerts()}


def _healthy(prom: Prometheus) -> bool:
    return not (_names(prom) & ALERTS)


def _wait_firing(prom: Prometheus, alert: str, poke: Any = None, timeout: float = 60) -> dict[str, str]:
    prom.wait(lambda: alert in prom.firing(), f"{alert} does not fire", timeout=timeout, poke=poke)
    return prom.firing()[alert]


def _wait_cleared(prom: Prometheus, *alerts: str, timeout: float = 90) -> None:
    prom.wait(lambda: not (_names(prom) & set(alerts)), f"{', '.join(alerts)} do not clear", timeout=timeout)


def test_every_dashboard_query_returns_data_and_no_alert_fires_on_the_healthy_release(
    product: Product, prometheus: Prometheus
) -> None:
    prom = prometheus
    # The dashboard's variables find the release: its namespace, and its scheduler's job.
    prom.wait(
        lambda: (
            prom.namespace
            in prom.get("/api/v1/label/namespace/values", **{"match[]": "gpu_scheduler_leader"})
        ),
        "the dashboard's namespace variable does not list the release's namespace",
        timeout=60,
    )
    queries = _panel_queries(prom.dashboard, prom.namespace, prom.scheduler_job)
    assert len(queries) >= 15, queries
    empty: list[str] = []

    def all_answer() -> bool:
        empty[:] = [f"{title}: {expr}" for title, expr in queries if not prom.query(expr)]
        return not empty

    # rate() and increase() need two samples in their window: a few scrapes after the start.
    prom.wait(all_answer, lambda: "dashboard queries without data:\n  " + "\n  ".join(empty), timeout=60)
    jobs = {r["metric"]["job"] for r in prom.query(f'up{{namespace="{prom.namespace}"}} == 1')}
    assert jobs == {prom.scheduler_job, prom.webhook_job}, jobs
    prom.wait(lambda: _healthy(prom), "an alert fires on the healthy release", timeout=30)


def test_scheduler_down_fires_when_it_is_scaled_to_zero_and_clears_when_it_is_back(
    product: Product, prometheus: Prometheus
) -> None:
    prom, dep = prometheus, _deployment(product, "scheduler")
    replicas = dep["spec"]["replicas"]
    _scale(product, dep, 0)
    try:
        labels = _wait_firing(prom, "GPUSchedulerDown")
        assert (labels["namespace"], labels["job"]) == (prom.namespace, prom.scheduler_job), labels
        assert labels["severity"] == "critical"
    finally:
        _scale(product, dep, replicas)
    product.wait_serving()
    _wait_cleared(prom, "GPUSchedulerDown", "GPUSchedulerNoLeader")


def test_no_leader_fires_while_a_foreign_holder_keeps_the_lease_and_clears_when_it_is_freed(
    product: Product, prometheus: Prometheus
) -> None:
    """gpu_scheduler_leader is 1 in the replica that holds the Lease (runtime/leader.py); another
    identity in the Lease's record makes the scheduler stand by, so no replica leads."""
    prom, dep = prometheus, _deployment(product, "scheduler")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    lease, ns = env["GPU_SCHEDULER_LEASE_NAME"], env["GPU_SCHEDULER_LEASE_NAMESPACE"]
    coordination = client.CoordinationV1Api(product.cluster.admin_api())
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # A duration the scheduler trusts (under 10x its own: runtime/leader.py's ABSURD_FACTOR), long
    # enough that it does not take the Lease back during the test.
    coordination.patch_namespaced_lease(
        lease,
        ns,
        {
            "spec": {
                "holderIdentity": "intruder",
                "leaseDurationSeconds": 120,
                "acquireTime": now,
                "renewTime": now,
            }
        },
    )
    try:
        labels = _wait_firing(prom, "GPUSchedulerNoLeader")
        assert (labels["namespace"], labels["job"]) == (prom.namespace, prom.scheduler_job), labels
        assert "GPUSchedulerDown" not in prom.firing(), prom.state()
    finally:
        coordination.delete_namespaced_lease(lease, ns)
    _wait_cleared(prom, "GPUSchedulerNoLeader")
    assert prom.query(
        f'max(gpu_scheduler_leader{{namespace="{prom.namespace}", job="{prom.scheduler_job}"}}) == 1'
    )


def _malformed_chunked_request(product: Product, prom: Prometheus) -> int:
    """POST /mutate to a webhook pod with a chunk size that is not hex; the status it answers.

    The webhook cannot serve it: gunicorn's parser raises while the app reads the body, and the
    app answers 500 (an internal error), as it would for any exception of its own."""
    [pod, *_] = product.pods("webhook")
    port = next(
        p["containerPort"]
        for c in pod["spec"]["containers"]
        for p in c.get("ports") or []
        if p["name"] == "webhook"
    )
    ctx = ssl.create_default_context(cafile=str(prom.webhook_ca))
    host = f"{prom.webhook_job}.{prom.namespace}.svc"
    raw = socket.create_connection((pod["status"]["podIP"], port), timeout=5)
    with ctx.wrap_socket(raw, server_hostname=host) as s:
        s.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
        )
        status = s.recv(64).decode(errors="replace")
    m = re.match(r"HTTP/1\.1 (\d{3})", status)
    assert m, status
    return int(m.group(1))


def test_webhook_errors_fire_when_it_answers_5xx_and_clear_after_the_window(
    product: Product, prometheus: Prometheus
) -> None:
    prom = prometheus
    # The rule counts a new 5xx series whole only where the webhook was scraped a window before.
    window = WINDOW
    prom.wait(
        lambda: bool(
            prom.query(f'up{{namespace="{prom.namespace}", job="{prom.webhook_job}"}} offset {window}')
        ),
        f"the webhook was not scraped {window} ago",
        timeout=60,
    )
    assert _malformed_chunked_request(product, prom) == 500
    labels = _wait_firing(prom, "GPUSchedulerWebhookErrors", timeout=30)
    assert (labels["namespace"], labels["job"]) == (prom.namespace, prom.webhook_job), labels
    _wait_cleared(prom, "GPUSchedulerWebhookErrors")


def test_webhook_down_and_fail_open_fire_while_it_is_scaled_to_zero_and_clear_when_it_is_back(
    product: Product, prometheus: Prometheus, node_namespace: str
) -> None:
    prom, dep = prometheus, _deployment(product, "webhook")
    replicas = dep["spec"]["replicas"]

    def create_mapped_pod() -> None:
        """What the apiserver sends the webhook (a dry run: nothing is stored)."""
        admit_mapped_pod(product, node_namespace)

    # The rule counts a new fail-open series whole only where the apiserver had called the
    # webhook a window before (its admission histogram then existed): the fixture made one call.
    window = WINDOW
    prom.wait(
        lambda: bool(
            prom.query(
                'apiserver_admission_webhook_admission_duration_seconds_count{name=~".*gpu-scheduler.io"}'
                f" offset {window}"
            )
        ),
        f"the apiserver did not report a call to the webhook {window} ago",
        timeout=60,
    )
    _scale(product, dep, 0)
    try:
        labels = _wait_firing(prom, "GPUSchedulerWebhookDown")
        assert (labels["namespace"], labels["job"]) == (prom.namespace, prom.webhook_job), labels
        # Mapped pods keep coming while it is down: admitted without it (failurePolicy Ignore).
        labels = _wait_firing(prom, "GPUSchedulerWebhookFailOpen", poke=create_mapped_pod)
        assert labels["name"].endswith(".gpu-scheduler.io"), labels
    finally:
        _scale(product, dep, replicas)
    product.wait_serving()
    _wait_cleared(prom, "GPUSchedulerWebhookDown", "GPUSchedulerWebhookFailOpen")
