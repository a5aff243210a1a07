"""The charts in a platform team's setup (issue 41): a parent chart's `condition`, a mirrored
registry (global.imageRegistry), pull secrets and a Linux nodeSelector on every pod, the
GPUPinningPolicy CRD's lifecycle apart from tenancy. Installed for real as a parent's dependency
and as two releases side by side: tests/integration/test_chart_platform.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.charts import CHARTS, SCHEDULER_CHART, one, render, template
from tests.unit.chart.test_chart_release import pods
from tests.unit.chart.test_chart_scheduler import render_notes

CRD = "gpupinningpolicies.gpu-scheduler.io"
MIRROR = "mirror.example:5000/proxy"
# Every pod the scheduler chart can render: scheduler, webhook and its helm test pod, extender
# mode's kube-scheduler, the health test pod.
EVERY_POD = {
    "webhook": {"enabled": True, "caBundle": "QQ==", "tls": {"crt": "c", "key": "k"}},
    "extender": {"enabled": True, "tls": {"caBundle": "QQ==", "crt": "c", "key": "k"}},
}


def every_pod(chart: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    merged = {**(EVERY_POD if chart == SCHEDULER_CHART else {}), **(values or {})}
    specs = pods(render(chart, values=merged))
    assert len(specs) >= (5 if chart == SCHEDULER_CHART else 3), chart.name
    return specs


def images(spec: dict[str, Any]) -> list[str]:
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    refs = [c["image"] for c in containers]
    # wait-ready's --image: the image of the dry-run pod it sends, the one the check pods pull.
    for c in containers:
        argv = [*c.get("command", []), *c.get("args", [])]
        if "--image" in argv:
            refs.append(argv[argv.index("--image") + 1])
    return refs


@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_global_image_registry_reaches_every_image(chart: Path) -> None:
    specs = every_pod(chart, {"global": {"imageRegistry": MIRROR}})
    refs = {ref for spec in specs for ref in images(spec)}
    assert refs and all(ref.startswith(f"{MIRROR}/") for ref in refs), refs
    # The registry is replaced, the path kept.
    assert f"{MIRROR}/evgenii19/gpu-scheduler/gpu-scheduler:0.2.0".rsplit(":", 1)[0] in {
        r.rsplit(":", 1)[0] for r in refs
    }
    if chart == SCHEDULER_CHART:
        assert any(r.startswith(f"{MIRROR}/kube-scheduler:v") for r in refs), refs


@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_global_image_registry_wins_over_the_charts_own(chart: Path) -> None:
    digest = "sha256:" + "cd" * 32
    own = {"image": {"registry": "own.example", "repository": "localhost/team/gs", "digest": digest}}
    refs = {ref for spec in every_pod(chart, own) for ref in images(spec)}
    assert f"own.example/team/gs@{digest}" in refs, refs
    both = {**own, "global": {"imageRegistry": "mirror.example"}}
    refs = {ref for spec in every_pod(chart, both) for ref in images(spec)}
    assert f"mirror.example/team/gs@{digest}" in refs and not any("own.example" in r for r in refs), refs
    # A repository without a registry (Docker Hub's) gets the mirror in front.
    hub = {"image": {"repository": "team/gs", "tag": "t"}, "global": {"imageRegistry": "mirror.example"}}
    refs = {ref for spec in every_pod(chart, hub) for ref in images(spec)}
    assert "mirror.example/team/gs:t" in refs, refs


@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_pull_secrets_on_every_pod(chart: Path) -> None:
    values = {"global": {"imagePullSecrets": ["mirror-creds"]}, "imagePullSecrets": [{"name": "own"}]}
    for spec in every_pod(chart, values):
        assert spec["imagePullSecrets"] == [{"name": "mirror-creds"}, {"name": "own"}]


@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_every_pod_selects_linux_nodes_and_a_given_selector_merges(chart: Path) -> None:
    assert all(spec["nodeSelector"] == {"kubernetes.io/os": "linux"} for spec in every_pod(chart))
    pool = {"pool": "system"}
    given = (
        {"nodeSelector": pool}
        if chart == SCHEDULER_CHART
        else {"nodeSelector": pool, "hookPods": {"nodeSelector": pool}}
    )
    assert all(
        spec["nodeSelector"] == {"kubernetes.io/os": "linux", **pool} for spec in every_pod(chart, given)
    )
    # null drops the default (Helm's merge), for a cluster whose nodes lack the label.
    dropped = {"kubernetes.io/os": None}
    none = (
        {"nodeSelector": dropped}
        if chart == SCHEDULER_CHART
        else {"nodeSelector": dropped, "hookPods": {"nodeSelector": dropped}}
    )
    assert all("nodeSelector" not in spec for spec in every_pod(chart, none))


def test_the_crd_has_its_own_lifecycle() -> None:
    """crds.install renders the CRD whatever tenancy.enabled says; crds.keep keeps it (Helm's
    annotation and Argo CD's) when the release goes."""
    for tenancy in (False, True):
        crd = one(
            render(SCHEDULER_CHART, values={"tenancy": {"enabled": tenancy}}), "CustomResourceDefinition", CRD
        )
        assert crd["metadata"]["annotations"] == {
            "helm.sh/resource-policy": "keep",
            "argocd.argoproj.io/sync-options": "Delete=false",
        }
    gone = render(SCHEDULER_CHART, values={"crds": {"keep": False}})
    assert "annotations" not in one(gone, "CustomResourceDefinition", CRD)["metadata"]
    # Tenancy on, the CRD left to another release: the grants ConfigMap and the policy stay.
    docs = render(SCHEDULER_CHART, values={"tenancy": {"enabled": True}, "crds": {"install": False}})
    assert not [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert one(docs, "ConfigMap", "rel-gpu-scheduler-grants")
    assert template(SCHEDULER_CHART, values={"crds": {"instal": True}}).returncode != 0


@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_root_enabled_is_in_the_schema_and_ignored_alone(chart: Path, tmp_path: Path) -> None:
    """A parent's `condition: <chart>.enabled` needs the schema to take `enabled`; installed on
    its own the chart renders the same, and NOTES.txt says enabled=false changed nothing."""
    schema = json.loads((chart / "values.schema.json").read_text())
    assert schema["properties"]["enabled"]["type"] == "boolean"
    assert template(chart, set_args=["enabled=false"]).stdout == template(chart).stdout
    assert template(chart, set_args=["enabled=maybe"]).returncode != 0
    name = "gpu-scheduler" if chart == SCHEDULER_CHART else "gpu-scheduler-check"
    off = render_notes(chart, tmp_path, "enabled=false")
    assert f"`condition: {name}.enabled`" in off and "changes nothing" in off
    assert "changes nothing" not in render_notes(chart, tmp_path / "on")


def test_helm_test_pods_stay_for_their_logs() -> None:
    """`helm test --logs` reads the test pods after they ran: no hook-succeeded, in either chart."""
    for chart in CHARTS:
        docs = render(chart, values=EVERY_POD if chart == SCHEDULER_CHART else None)
        tests = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
        assert tests, chart.name
        for d in tests:
            assert d["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
