"""The scheduler chart's monitoring, checked by real tools, not by eye (docs/operate.md).

* the PrometheusRule as the chart renders it: ``promtool check rules`` (Prometheus' own checker,
  built from its Go module by ``tools/provision.sh monitoring``), and ``promtool test rules``:
  each alert fires from input series as documented, not before its ``for``, and clears when they
  heal; every expression selects the release (namespace, job), so another release's series mask
  nothing; every alert's ``runbook_url`` names a section of docs/operate.md;
* the Grafana dashboard: decoded strictly against Grafana's dashboard schema by
  ``tools/dashboard-check`` (the foundation SDK's generated types: unknown or mistyped fields
  fail), every query in it parsed by promtool and selecting the release (``$namespace``,
  ``$job``), "Webhook errors (5m)" reading 0 while healthy;
* the ServiceMonitors cover every component that serves metrics: the scheduler, and the
  webhook in webhook mode, each selecting its Service and naming a port it has.
"""

from __future__ import annotations

import json
import re
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


def rendered_rules(chart_values: dict[str, Any] | None = None, **values: Any) -> dict[str, Any]:
    docs = render(
        SCHEDULER_CHART, values={**(chart_values or {}), "prometheusRule": {"enabled": True, **values}}
    )
    return dict(one(docs, "PrometheusRule")["spec"])


def alerts_of(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"]}


@pytest.mark.parametrize(("values", "count"), [({}, 5), (WEBHOOK_MODE, 8)])
def test_the_rendered_rules_pass_promtool_check(tmp_path: Path, values: dict[str, Any], count: int) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rendered_rules(values)))
    done = promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {count} rules found" in done.stdout, done.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        yaml.safe_dump({"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "max by (reason) ("}]}]})
    )
    assert promtool("check", "rules", str(broken)).returncode != 0  # the checker has teeth


def test_the_rules_render_only_for_what_the_release_runs() -> None:
    assert set(alerts_of(rendered_rules())) == {
        "GPUSchedulerDown",
        "GPUSchedulerNoLeader",
        "GPUSchedulerReplicaWaitingTooLong",
        "GPUSchedulerGangWaitingTooLong",
        "GPUSchedulerPodsNotInjected",
    }
    webhook = {"GPUSchedulerWebhookDown", "GPUSchedulerWebhookErrors", "GPUSchedulerWebhookFailOpen"}
    assert webhook <= set(alerts_of(rendered_rules(WEBHOOK_MODE)))
    # A webhook outside the cluster (webhook.url): not scraped by the chart, the apiserver still calls it.
    outside = {**WEBHOOK_MODE, "webhook": {**WEBHOOK_MODE["webhook"], "url": "https://hook.example:8443"}}
    assert set(alerts_of(rendered_rules(outside))) & webhook == {"GPUSchedulerWebhookFailOpen"}
    # No scheduler in this release (replicaCount 0, webhook only): no scheduler alert to fire forever.
    only_webhook = set(alerts_of(rendered_rules({**WEBHOOK_MODE, "replicaCount": 0})))
    assert only_webhook == webhook


def test_every_expression_is_scoped_to_the_release() -> None:
    """Every selector of the release's metrics names its namespace and job, and every alert keeps
    them (or takes them from absent()): release A's series never hide release B's."""
    by_name = alerts_of(rendered_rules(WEBHOOK_MODE))
    scheduler, webhook = (
        f'namespace="gpu-ns", job="{RELEASE}"',
        f'namespace="gpu-ns", job="{RELEASE}-webhook"',
    )
    for name, rule in by_name.items():
        expr = " ".join(rule["expr"].split())
        selectors = re.findall(r"\b(gpu_scheduler_\w+|up)\b(\{[^}]*\})?", expr)
        if name == "GPUSchedulerWebhookFailOpen":  # the apiserver's metric names no release
            assert not selectors, expr
            continue
        assert selectors, expr
        for metric, matchers in selectors:
            assert scheduler in matchers or webhook in matchers, (name, metric, expr)
        assert "sum(" not in expr and "max(" not in expr, (name, expr)  # always by (namespace, job)
    assert by_name["GPUSchedulerDown"]["expr"].count(scheduler) == 2
    rules = rendered_rules(WEBHOOK_MODE, schedulerJob="gpu-scheduler", webhookJob="hook")
    assert 'job="gpu-scheduler"' in alerts_of(rules)["GPUSchedulerNoLeader"]["expr"]
    assert 'job="hook"' in alerts_of(rules)["GPUSchedulerWebhookDown"]["expr"]


RELEASE = "rel-gpu-scheduler"  # the fullname of tests.support.charts' release "rel", in gpu-ns
S = f'namespace="gpu-ns", job="{RELEASE}"'
W = f'namespace="gpu-ns", job="{RELEASE}-webhook"'
OTHER = 'namespace="team-b", job="b-gpu-scheduler"'  # another release's scheduler
SCHEDULER_LABELS = {"namespace": "gpu-ns", "job": RELEASE}
WEBHOOK_LABELS = {"namespace": "gpu-ns", "job": f"{RELEASE}-webhook"}


def series(metric: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{metric}{{{labels}}}", "values": values}


def expect(at: str, alert: str, *fired: tuple[dict[str, str], str]) -> dict[str, Any]:
    """Alert ``alert`` at ``at``: exactly the alerts ``fired`` (their labels, and $value)."""
    return {
        "eval_time": at,
        "alertname": alert,
        "exp_alerts": [{"exp_labels": labels, "value": value} for labels, value in fired],
    }


def healthy(labels: str, pod: str, minutes: int = 40) -> list[dict[str, str]]:
    """The series of a scheduler replica that is up and leads, for ``minutes``."""
    return [
        series("up", f"{labels}, pod={pod!r}", f"1x{minutes}"),
        series("gpu_scheduler_leader", f"{labels}, pod={pod!r}", f"1x{minutes}"),
        series("gpu_scheduler_leader_healthy", f"{labels}, pod={pod!r}", f"1x{minutes}"),
    ]


CRIT, WARN = {"severity": "critical"}, {"severity": "warning"}

ALERT_TESTS: list[dict[str, Any]] = [
    {  # the waiting, gang, injection alerts, from the release's series
        "input_series": [
            *healthy(S, "s-0"),
            series("gpu_scheduler_waiting_pods", f'{S}, reason="GPUInUse", pod="s-0"', "0 1x30"),
            series("gpu_scheduler_waiting_pods", f'{S}, reason="GangWaiting", pod="s-0"', "0 3x30"),
            series("gpu_scheduler_gangs_waiting", f'{S}, pod="s-0"', "0 1x15 0x15"),
            series("gpu_scheduler_not_injected_pods_total", f'{S}, pod="s-0"', "0x10 1 2 2x20"),
        ],
        "alert_rule_test": [
            expect("10m", "GPUSchedulerReplicaWaitingTooLong"),
            expect(
                "20m",
                "GPUSchedulerReplicaWaitingTooLong",
                ({**SCHEDULER_LABELS, "reason": "GPUInUse", **WARN}, "1"),
            ),
            expect("14m", "GPUSchedulerGangWaitingTooLong"),
            expect("16m", "GPUSchedulerGangWaitingTooLong", ({**SCHEDULER_LABELS, **WARN}, "1")),
            expect("20m", "GPUSchedulerGangWaitingTooLong"),  # healed at 16m
            expect("5m", "GPUSchedulerPodsNotInjected"),
            expect("13m", "GPUSchedulerPodsNotInjected", ({**SCHEDULER_LABELS, **WARN}, "2")),
            expect("25m", "GPUSchedulerPodsNotInjected"),  # 10m without a new one
            expect("30m", "GPUSchedulerDown"),
            expect("30m", "GPUSchedulerNoLeader"),
        ],
    },
    {  # the scheduler's only replica stops answering scrapes, then comes back
        "input_series": [
            series("up", f'{S}, pod="s-0"', "1x5 0x10 1x20"),
        ],
        "alert_rule_test": [
            expect("9m", "GPUSchedulerDown"),  # down since 6m: not yet 5m
            expect("12m", "GPUSchedulerDown", ({**SCHEDULER_LABELS, **CRIT}, "0")),
            expect("17m", "GPUSchedulerDown"),
        ],
    },
    {  # the scheduler is gone (no target at all) while another release's is up; then it is back
        "input_series": [
            *healthy(OTHER, "b-0"),
            series("up", f'{S}, pod="s-1"', "_x20 1x20"),
        ],
        "alert_rule_test": [
            expect("3m", "GPUSchedulerDown"),
            expect("10m", "GPUSchedulerDown", ({**SCHEDULER_LABELS, **CRIT}, "1")),
            expect("22m", "GPUSchedulerDown"),
        ],
    },
    {  # release A has no leader while release B leads: A's alert fires, B's release never does
        "input_series": [
            *healthy(OTHER, "b-0"),
            series("up", f'{S}, pod="s-0"', "1x40"),
            series("up", f'{S}, pod="s-1"', "1x40"),
            series("gpu_scheduler_leader", f'{S}, pod="s-0"', "1x5 0x15 1x20"),
            series("gpu_scheduler_leader", f'{S}, pod="s-1"', "0x40"),
            series("gpu_scheduler_leader_healthy", f'{S}, pod="s-0"', "1x5 0x15 1x20"),
            series("gpu_scheduler_leader_healthy", f'{S}, pod="s-1"', "1x5 0x15 1x20"),
        ],
        "alert_rule_test": [
            expect("7m", "GPUSchedulerNoLeader"),
            expect("10m", "GPUSchedulerNoLeader", ({**SCHEDULER_LABELS, **CRIT}, "0")),
            expect("25m", "GPUSchedulerNoLeader"),
            expect("10m", "GPUSchedulerDown"),
        ],
    },
    {  # the webhook's first-ever 5xx: a series born at 10m with the value 1, never increasing
        "input_series": [
            series("up", f'{W}, pod="w-0"', "1x40"),
            series(
                "gpu_scheduler_webhook_requests_total",
                f'{W}, path="/mutate", code="200", pod="w-0"',
                "0+5x40",
            ),
            series(
                "gpu_scheduler_webhook_requests_total",
                f'{W}, path="/mutate", code="500", pod="w-0"',
                "_x10 1x30",
            ),
        ],
        "alert_rule_test": [
            expect("9m", "GPUSchedulerWebhookErrors"),
            expect("10m", "GPUSchedulerWebhookErrors", ({**WEBHOOK_LABELS, **WARN}, "1")),
            expect("14m", "GPUSchedulerWebhookErrors", ({**WEBHOOK_LABELS, **WARN}, "1")),
            expect("16m", "GPUSchedulerWebhookErrors"),  # 5 minutes without another
            expect("20m", "GPUSchedulerWebhookDown"),
        ],
    },
    {  # errors that go on, then stop: counted by increase() (the series is older than 5m)
        "input_series": [
            series("up", f'{W}, pod="w-0"', "1x40"),
            series(
                "gpu_scheduler_webhook_requests_total",
                f'{W}, path="/validate", code="503", pod="w-0"',
                "0+2x20 40x20",
            ),
        ],
        "alert_rule_test": [
            expect("3m", "GPUSchedulerWebhookErrors", ({**WEBHOOK_LABELS, **WARN}, "6")),
            expect("12m", "GPUSchedulerWebhookErrors", ({**WEBHOOK_LABELS, **WARN}, "10")),
            expect("26m", "GPUSchedulerWebhookErrors"),
        ],
    },
    {  # Prometheus (re)started: a webhook's old 5xx series looks new, but its job was not scraped
        # 5m before, so its old errors do not page
        "input_series": [
            series("up", f'{W}, pod="w-0"', "1x20"),
            series(
                "gpu_scheduler_webhook_requests_total", f'{W}, path="/mutate", code="500", pod="w-0"', "40x20"
            ),
        ],
        "alert_rule_test": [expect(t, "GPUSchedulerWebhookErrors") for t in ("0m", "2m", "5m", "8m")],
    },
    {  # the webhook is down, then back; the apiserver admits without it meanwhile
        "input_series": [
            series("up", f'{W}, pod="w-0"', "1x5 0x10 1x20"),
            series(
                "apiserver_admission_webhook_admission_duration_seconds_count",
                'name="mutate-pods.gpu-scheduler.io", type="admit", operation="CREATE", rejected="false", job="apiserver"',
                "0+3x40",
            ),
            series(
                "apiserver_admission_webhook_fail_open_count",
                'name="mutate-pods.gpu-scheduler.io", type="admit", job="apiserver"',
                "_x7 1 2 3x30",
            ),
        ],
        "alert_rule_test": [
            expect("9m", "GPUSchedulerWebhookDown"),
            expect("12m", "GPUSchedulerWebhookDown", ({**WEBHOOK_LABELS, **CRIT}, "0")),
            expect("17m", "GPUSchedulerWebhookDown"),
            expect("6m", "GPUSchedulerWebhookFailOpen"),
            expect(
                "7m", "GPUSchedulerWebhookFailOpen", ({"name": "mutate-pods.gpu-scheduler.io", **WARN}, "1")
            ),
            expect(
                "11m", "GPUSchedulerWebhookFailOpen", ({"name": "mutate-pods.gpu-scheduler.io", **WARN}, "3")
            ),
            expect("15m", "GPUSchedulerWebhookFailOpen"),
        ],
    },
]


def test_each_alert_fires_from_its_series_and_stops_when_healed(tmp_path: Path) -> None:
    rules = rendered_rules(WEBHOOK_MODE)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    tests = []
    for case in json.loads(json.dumps(ALERT_TESTS)):
        for check in case["alert_rule_test"]:
            for alert in check["exp_alerts"]:
                value = alert.pop("value")
                alert["exp_annotations"] = _annotations(
                    alerts_of(rules)[check["alertname"]], alert["exp_labels"], value
                )
        tests.append({"interval": "1m", **case})
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    assert fired == set(alerts_of(rules)), "every alert has a case that makes it fire"
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    done = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _annotations(rule: dict[str, Any], labels: dict[str, str], value: str) -> dict[str, str]:
    """The annotations the rendered rule gives (promtool wants them all), $value and $labels filled in."""
    out = {}
    for key, text in rule["annotations"].items():
        valued = text.replace("{{ $value }}", value)
        out[key] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], valued)
    return out


def test_the_values_reach_the_rules() -> None:
    rules = rendered_rules(
        WEBHOOK_MODE,
        waitingFor="1h",
        gangWaitingFor="5m",
        downFor="3m",
        noLeaderFor="4m",
        errorWindow="90s",
        severity="page",
        runbookUrl="https://wiki.example/gpu",
        labels={"release": "kp"},
    )
    by_name = alerts_of(rules)
    assert by_name["GPUSchedulerReplicaWaitingTooLong"]["for"] == "1h"
    assert by_name["GPUSchedulerGangWaitingTooLong"]["for"] == "5m"
    assert by_name["GPUSchedulerDown"]["for"] == by_name["GPUSchedulerWebhookDown"]["for"] == "3m"
    assert by_name["GPUSchedulerNoLeader"]["for"] == "4m"
    for windowed in ("GPUSchedulerWebhookErrors", "GPUSchedulerWebhookFailOpen"):
        expr = by_name[windowed]["expr"]
        assert "5m" not in expr and expr.count("offset 90s") == 2 and "[90s]" in expr, expr
    assert by_name["GPUSchedulerWebhookErrors"]["labels"]["severity"] == "page"
    assert (
        by_name["GPUSchedulerDown"]["annotations"]["runbook_url"]
        == "https://wiki.example/gpu#gpuschedulerdown"
    )
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


OPERATE = SCHEDULER_CHART.parent / "docs" / "operate.md"


def heading_anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings that both GitLab and GitHub give: lower case, punctuation
    dropped, spaces to hyphens (GitLab then squeezes repeated hyphens; GitHub does not, so an
    anchor counts only where the two agree). Duplicates get GitHub's and GitLab's "-1"."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"[^\w\- ]", "", m.group(1).lower())
        github = text.replace(" ", "-")
        if github != re.sub(r"-+", "-", github):
            continue
        n = seen.get(github, 0)
        seen[github] = n + 1
        out.add(github if n == 0 else f"{github}-{n}")
    return out


def test_every_alert_links_its_runbook_section_in_the_docs() -> None:
    anchors = heading_anchors(OPERATE.read_text())
    assert {"alert-runbooks", "metrics-alerts-and-the-dashboard"} <= anchors  # the helper works
    chart = yaml.safe_load((SCHEDULER_CHART / "Chart.yaml").read_text())
    page = f"{chart['home']}/-/blob/main/docs/operate.md"
    for name, rule in alerts_of(rendered_rules(WEBHOOK_MODE)).items():
        url = rule["annotations"].get("runbook_url", "")
        base, _, anchor = url.partition("#")
        assert base == page, (name, url)
        assert anchor == name.lower() and anchor in anchors, (name, url, "no such section in docs/operate.md")


# Dashboard queries that cannot name the release, and why.
CLUSTER_WIDE = {
    (
        "Webhook errors (5m)",
        "B",
    ): "the apiserver's fail-open count names the webhook, the same in every release",
}


def _targets() -> list[tuple[str, dict[str, Any]]]:
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t) for p in board["panels"] for t in p.get("targets", [])]


def test_every_panel_query_selects_the_release_by_namespace_and_job() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["namespace"]["type"] == variables["job"]["type"] == "query"
    assert '$namespace"' in variables["job"]["definition"]  # the jobs of the chosen namespace
    for title, target in _targets():
        expr = target["expr"]
        if (title, target["refId"]) in CLUSTER_WIDE:
            assert "$" not in expr and "gpu_scheduler_" not in expr, expr
            continue
        selectors = re.findall(r"\b(gpu_scheduler_\w+|up)\b(\{[^}]*\})?", expr)
        assert selectors, (title, expr)
        for metric, matchers in selectors:
            assert 'namespace="$namespace"' in matchers, (title, metric, expr)
            assert re.search(r'job="\$job(-webhook)?"', matchers), (title, metric, expr)


def test_the_webhook_errors_panel_reads_0_while_healthy_and_counts_a_first_5xx(tmp_path: Path) -> None:
    """Only code="200" series exist while healthy: the panel reads 0, not No data; a 5xx series
    born with the value 1 counts at once (rate() would need a second sample)."""
    (errors,) = [t["expr"] for title, t in _targets() if title == "Webhook errors (5m)" and t["refId"] == "A"]
    expr = errors.replace("$namespace", "gpu-ns").replace("$job", RELEASE)
    tests = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("up", f'{W}, pod="w-0"', "1x20"),
                    series(
                        "gpu_scheduler_webhook_requests_total",
                        f'{W}, path="/mutate", code="200", pod="w-0"',
                        "0+5x20",
                    ),
                    series(
                        "gpu_scheduler_webhook_requests_total",
                        f'{W}, path="/mutate", code="500", pod="w-0"',
                        "_x10 1x10",
                    ),
                ],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "8m", "exp_samples": [{"labels": "{}", "value": 0}]},
                    {"expr": expr, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 1}]},
                    {"expr": expr, "eval_time": "16m", "exp_samples": [{"labels": "{}", "value": 0}]},
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


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
