"""kube-score, a third-party checker of Kubernetes manifests (built from its Go module by
tools/provision.sh, version in tools/versions.env), over the charts as users install
them: `helm template` of each scenario, hooks (the helm test pods) included.

Every CRITICAL finding fails the test unless it is in IGNORED, where each entry says
why the chart keeps it; docs/charts.md ("kube-score") lists the same entries, and the
tests below check both directions (every ignore documented, every ignore still needed).
kube-score's own opt-out annotations (kube-score/ignore) are disabled: an ignore lives
here, in the open, not in an object's metadata.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.charts import (
    CHECK_CHART,
    KUBE_VERSIONS,
    REPO,
    SCHEDULER_CHART,
    ci_values,
    template,
)

CRITICAL = 1  # kube-score's scorecard.GradeCritical (WARNING is 5, OK 7 and 10)
DOC = REPO / "docs" / "charts.md"
KUBE_SCORE_VERSION = "v" + ".".join(KUBE_VERSIONS[-1].split(".")[:2])  # vN.NN, its flag's format


@dataclass(frozen=True)
class Ignored:
    """A CRITICAL finding the charts keep on purpose: kube-score check id, object kind, reason."""

    check: str
    kind: str
    reason: str


IGNORED: tuple[Ignored, ...] = (
    Ignored(
        "container-image-pull-policy",
        "*",
        "The image tag is pinned (the chart's appVersion; kube-scheduler: the cluster's "
        "version), and with IfNotPresent a webhook or scheduler pod restarts from the node's "
        "copy while the registry is unreachable. Always would make every restart depend on "
        "the registry: a webhook that cannot restart means pods admitted without their GPU "
        "variables. image.pullPolicy=Always (or the AlwaysPullImages admission plugin) is "
        "one value away where nodes are shared with tenants who must not reuse a private image.",
    ),
    Ignored(
        "statefulset-has-poddisruptionbudget",
        "StatefulSet",
        "The check StatefulSet is a validation workload whose replicas are pinned to their "
        "mapped nodes: an evicted replica cannot run anywhere else, so a PodDisruptionBudget "
        "would only hold up node drains, for no availability anyone needs.",
    ),
)


@dataclass(frozen=True)
class Finding:
    check: str
    kind: str
    name: str
    comment: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}: [{self.check}] {self.comment}"


@dataclass(frozen=True)
class Scenario:
    chart: Path
    values_files: tuple[Path, ...] = ()
    values: Mapping[str, Any] | None = None


# What users install: the chart's defaults, a webhook user's install (webhook with
# cert-manager, 2 replicas), the extender, the check chart; then every ci/ scenario, and
# the NetworkPolicies with egress restricted.
SCENARIOS: dict[str, Scenario] = {
    "defaults": Scenario(SCHEDULER_CHART),
    "webhook-user": Scenario(
        SCHEDULER_CHART,
        (SCHEDULER_CHART / "ci" / "webhook-cert-manager-values.yaml",),
        {"webhook": {"replicaCount": 2}},
    ),
    "extender": Scenario(SCHEDULER_CHART, (SCHEDULER_CHART / "ci" / "extender-values.yaml",)),
    "check": Scenario(CHECK_CHART),
    "egress": Scenario(
        SCHEDULER_CHART,
        (SCHEDULER_CHART / "ci" / "ha-values.yaml",),
        {
            "networkPolicy": {
                "egress": {"enabled": True},
                "apiserver": {"peers": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]},
            }
        },
    ),
    **{
        f"{chart.name}/{f.name}": Scenario(chart, (f,))
        for chart in (SCHEDULER_CHART, CHECK_CHART)
        for f in ci_values(chart)
    },
}


def kube_score_bin() -> str:
    from localcluster.cluster import tool

    try:
        return str(tool("kube-score"))
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: run `tools/provision.sh kube-score` (make tools does it)")


def rendered(scenario: Scenario, tmp_path: Path, set_args: Sequence[str] = ()) -> Path:
    res = template(scenario.chart, scenario.values_files, scenario.values, set_args=set_args)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "manifests.yaml"
    out.write_text(res.stdout)
    return out


def score(manifests: Path) -> list[dict[str, Any]]:
    """kube-score's JSON report: one entry per object it scores, with every check's grade."""
    res = subprocess.run(
        [
            kube_score_bin(),
            "score",
            "--kubernetes-version",
            KUBE_SCORE_VERSION,
            "--disable-ignore-checks-annotations",
            "--output-format",
            "json",
            str(manifests),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # 1 when something is CRITICAL; anything else is kube-score failing to run.
    assert res.returncode in (0, 1), res.stderr
    report = json.loads(res.stdout)
    assert isinstance(report, list) and report, res.stdout[:500]
    return report


def criticals(report: list[dict[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    for obj in report:
        for c in obj["checks"]:
            if c["skipped"] or c["grade"] > CRITICAL:
                continue
            comments = "; ".join(
                f"({x['path']}) {x['summary']}" if x.get("path") else x["summary"]
                for x in c.get("comments") or []
            )
            out.append(
                Finding(c["check"]["id"], obj["type_meta"]["kind"], obj["object_meta"]["name"], comments)
            )
    return out


def ignored(f: Finding) -> bool:
    return any(i.check == f.check and i.kind in ("*", f.kind) for i in IGNORED)


def grades(report: list[dict[str, Any]], check: str) -> dict[str, int]:
    return {
        f"{o['type_meta']['kind']}/{o['object_meta']['name']}": c["grade"]
        for o in report
        for c in o["checks"]
        if c["check"]["id"] == check and not c["skipped"]
    }


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_no_critical_finding_beyond_the_documented_ones(name: str, tmp_path: Path) -> None:
    found = criticals(score(rendered(SCENARIOS[name], tmp_path)))
    left = [str(f) for f in found if not ignored(f)]
    assert not left, (
        "kube-score CRITICAL findings (fix them, or add them to IGNORED and docs):\n" + "\n".join(left)
    )


def test_every_ignore_is_still_needed(tmp_path: Path) -> None:
    seen: set[str] = set()
    for i, scenario in enumerate(SCENARIOS.values()):
        d = tmp_path / str(i)
        d.mkdir()
        seen |= {f.check for f in criticals(score(rendered(scenario, d))) if ignored(f)}
    assert {i.check for i in IGNORED} == seen


def test_every_ignore_is_documented() -> None:
    text = DOC.read_text()
    section = text[text.index("## kube-score") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    for i in IGNORED:
        assert f"`{i.check}`" in section, f"{i.check} is ignored but not in docs/charts.md, kube-score"


def test_the_checker_catches_what_the_charts_fixed(tmp_path: Path) -> None:
    """The same run fails when a fix is undone: no NetworkPolicy, no ephemeral-storage."""
    manifests = rendered(
        SCENARIOS["webhook-user"],
        tmp_path,
        set_args=[
            "networkPolicy.enabled=false",
            "webhook.resources.limits.ephemeral-storage=null",
        ],
    )
    left = {(f.check, f.name) for f in criticals(score(manifests)) if not ignored(f)}
    assert ("pod-networkpolicy", "rel-gpu-scheduler") in left
    assert ("pod-networkpolicy", "rel-gpu-scheduler-webhook") in left
    assert ("container-ephemeral-storage-request-and-limit", "rel-gpu-scheduler-webhook") in left
    assert ("container-ephemeral-storage-request-and-limit", "rel-gpu-scheduler") not in left


def test_with_egress_every_pod_has_both_policies(tmp_path: Path) -> None:
    """networkPolicy.egress.enabled: every pod (helm test pods included) has an ingress and
    an egress NetworkPolicy, which kube-score grades OK (10), not a warning."""
    report = score(rendered(SCENARIOS["egress"], tmp_path))
    pods = grades(report, "pod-networkpolicy")
    assert {"Deployment/rel-gpu-scheduler", "Deployment/rel-gpu-scheduler-webhook"} <= set(pods)
    assert {k for k in pods if k.startswith("Pod/")}, pods
    assert set(pods.values()) == {10}, pods
    assert set(grades(report, "networkpolicy-targets-pod").values()) == {10}
