"""The scheduler chart's monitoring, checked by real tools, not by eye (docs/operate.md).

* the PrometheusRule as the chart renders it: ``promtool check rules`` (Prometheus' own checker,
  built from its Go module by ``tools/provision.sh monitoring``), and ``promtool test rules``:
  each alert fires from input series as documented, and not before its ``for``;
* the Grafana dashboard: decoded strictly against Grafana's dashboard schema by
  ``tools/dashboard-check`` (the foundation SDK's generated types: unknown or mistyped fields
  fail), and every query in it parsed by promtool;
* the ServiceMonitors cover every component that serves metrics: the scheduler, and the
  webhook in webhook mode, each selecting its Service and naming a port it has.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.toolcache import tool
from tests.support.charts import SCHEDULER_CHART, find, one, render

DASHBOARD = SCHEDULER_CHART / "files" / "dashboard.json"
WEBHOOK_MODE = {"webhook": {"enabled": True, "caBundle": "eHg="}, "injection": {"mode": "webhook"}}


def _tool(name: str) -> str:
    try:
        return str(tool(name))
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: run `tools/provision.sh monitoring` (make tools does it)")


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def rendered_rules(**values: Any) -> dict[str, Any]:
    docs = render(SCHEDULER_CHART, values={"prometheusRule": {"enabled": True, **values}})
    return dict(one(docs, "PrometheusRule")["spec"])


def test_the_rendered_rules_pass_promtool_check(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rendered_rules()))
    done = promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout, done.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        yaml.safe_dump({"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "max by (reason) ("}]}]})
    )
    assert promtool("check", "rules", str(broken)).returncode != 0  # the checker has teeth


ALERT_TESTS: dict[str, Any] = {
    "rule_files": ["rules.yaml"],
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                {"series": 'gpu_scheduler_waiting_pods{reason="GPUInUse", pod="s-0"}', "values": "0 1x30"},
                {"series": 'gpu_scheduler_waiting_pods{reason="GangWaiting", pod="s-0"}', "values": "0 3x30"},
                {"series": 'gpu_scheduler_gangs_waiting{pod="s-0"}', "values": "0 1x30"},
                {"series": 'gpu_scheduler_leader_healthy{pod="s-0"}', "values": "1x5 0x20"},
                {"series": 'gpu_scheduler_leader{pod="s-0"}', "values": "1x5 0x20"},
                {"series": 'gpu_scheduler_not_injected_pods_total{pod="s-0"}', "values": "0x10 1 2 2x10"},
                {
                    "series": 'gpu_scheduler_webhook_requests_total{path="/mutate", code="500", pod="w-0"}',
                    "values": "0+5x30",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "GPUSchedulerReplicaWaitingTooLong", "exp_alerts": []},
                {
                    "eval_time": "20m",
                    "alertname": "GPUSchedulerReplicaWaitingTooLong",
                    "exp_alerts": [
                        {
                            "exp_labels": {"reason": "GPUInUse", "severity": "warning"},
                            "exp_annotations": {
                                "summary": "GPU replicas have waited for GPUInUse for 15m",
                                "description": "1 replica(s) of gpu-scheduler have been waiting with the reason "
                                "GPUInUse for at least 15m. `gpu-scheduler-map status` lists them with the "
                                "scheduler's message; `kubectl describe pod` shows the same in its events.",
                            },
                        }
                    ],
                },
                {
                    "eval_time": "20m",
                    "alertname": "GPUSchedulerGangWaitingTooLong",
                    "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
                },
                {"eval_time": "6m", "alertname": "GPUSchedulerNoLeader", "exp_alerts": []},
                {
                    "eval_time": "10m",
                    "alertname": "GPUSchedulerNoLeader",
                    "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                },
                {"eval_time": "5m", "alertname": "GPUSchedulerPodsNotInjected", "exp_alerts": []},
                {
                    "eval_time": "13m",
                    "alertname": "GPUSchedulerPodsNotInjected",
                    "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
                },
                {
                    "eval_time": "12m",
                    "alertname": "GPUSchedulerWebhookErrors",
                    "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
                },
            ],
        }
    ],
}


def test_each_alert_fires_from_its_series_and_not_before_its_for(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rendered_rules()))
    cases = json.loads(json.dumps(ALERT_TESTS))
    for case in cases["tests"][0]["alert_rule_test"]:
        for alert in case["exp_alerts"]:
            alert.setdefault("exp_annotations", _annotations(case["alertname"], alert["exp_labels"]))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(cases))
    done = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _annotations(alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The annotations the rendered rule gives (promtool wants them all), with $value filled in."""
    (rule,) = [r for g in rendered_rules()["groups"] for r in g["rules"] if r["alert"] == alert]
    value = {
        "GPUSchedulerGangWaitingTooLong": "1",
        "GPUSchedulerPodsNotInjected": "2",
        "GPUSchedulerNoLeader": "0",
    }
    out = {}
    for key, text in rule["annotations"].items():
        out[key] = text.replace("{{ $value }}", value.get(alert, "10"))
    return out


def test_the_values_reach_the_rules() -> None:
    rules = rendered_rules(waitingFor="1h", gangWaitingFor="5m", severity="page", labels={"release": "kp"})
    by_name = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert by_name["GPUSchedulerReplicaWaitingTooLong"]["for"] == "1h"
    assert by_name["GPUSchedulerGangWaitingTooLong"]["for"] == "5m"
    assert by_name["GPUSchedulerWebhookErrors"]["labels"]["severity"] == "page"
    assert not find(render(SCHEDULER_CHART), "PrometheusRule")  # off by default


def test_the_dashboard_passes_grafanas_schema_and_every_query_parses(tmp_path: Path) -> None:
    done = subprocess.run(
        [_tool("dashboard-check"), str(DASHBOARD)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 14
    recording = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump(recording))
    checked = promtool("check", "rules", str(tmp_path / "queries.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The checker has teeth: a field Grafana's schema does not know fails it.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**board, "panelz": []}))
    refused = subprocess.run(
        [_tool("dashboard-check"), str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode == 1 and "panelz" in refused.stdout, refused.stdout


def test_the_dashboard_configmap_carries_the_file_for_grafanas_sidecar() -> None:
    docs = render(SCHEDULER_CHART, values={"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}})
    cm = one(docs, "ConfigMap", "rel-gpu-scheduler-dashboard")
    assert (
        cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    )
    assert json.loads(cm["data"]["gpu-scheduler.json"]) == json.loads(DASHBOARD.read_text())


@pytest.mark.parametrize(
    ("values", "components"), [({}, ["scheduler"]), (WEBHOOK_MODE, ["scheduler", "webhook"])]
)
def test_a_service_monitor_covers_every_component_that_serves_metrics(
    values: dict[str, Any], components: list[str]
) -> None:
    docs = render(SCHEDULER_CHART, values={**values, "serviceMonitor": {"enabled": True}})
    monitors = find(docs, "ServiceMonitor")
    services = find(docs, "Service")
    covered = []
    for monitor in monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [s for s in services if wanted.items() <= s["metadata"]["labels"].items()]
        ports = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
        covered.append(wanted["app.kubernetes.io/component"])
    assert sorted(covered) == components
    if "webhook" in components:
        (hook,) = [
            m
            for m in monitors
            if m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
        ]
        (endpoint,) = hook["spec"]["endpoints"]
        assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt"
