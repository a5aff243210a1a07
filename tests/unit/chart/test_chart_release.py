"""The charts as a registry serves them: READMEs whose values tables are generated and in step,
Artifact Hub metadata, and what fits a managed cluster or an umbrella chart (no required
control-plane node, ``global``, pull secrets, ``image.digest``, topology spread). Installed for
real, from a registry, on the real node: tests/node/test_release_registry.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.charts import CHARTS, SCHEDULER_CHART, helm_bin, is_hook, render, template
from tests.support.tools import load_tool

REPO = Path(__file__).resolve().parents[3]
DIGEST = "sha256:" + "ab" * 32
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
LINUX = "kubernetes.io/os"


def pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod spec of a render (Deployments, StatefulSets, hook and test pods)."""
    out = []
    for d in docs:
        if d["kind"] == "Pod":
            out.append(d["spec"])
        elif d["kind"] in ("Deployment", "StatefulSet"):
            out.append(d["spec"]["template"]["spec"])
    return out


# ---------------------------------------------------------------- README values tables
@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_the_readme_values_table_is_generated_and_in_step(chart: Path) -> None:
    tool = load_tool("chart_readme")
    readme = (chart / "README.md").read_text()
    assert tool.readme_with_table(readme, tool.table(chart)) == readme, "run `make chart-docs`"
    res = subprocess.run(
        ["python3", str(REPO / "tools" / "chart_readme.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_every_value_has_a_row(chart: Path) -> None:
    """Each leaf of values.yaml is a documented key or lies under one, and each documented key
    is one the schema knows: the table says what the chart takes."""
    tool = load_tool("chart_readme")
    rows = {path for path, _ in tool.documented((chart / "values.yaml").read_text())}
    schema = json.loads((chart / "values.schema.json").read_text())

    def leaves(node: Any, path: str = "") -> list[str]:
        if isinstance(node, dict) and node:
            return [leaf for k, v in node.items() for leaf in leaves(v, f"{path}.{k}" if path else k)]
        return [path]

    values = yaml.safe_load((chart / "values.yaml").read_text())
    missing = [
        leaf for leaf in leaves(values) if not any(leaf == row or leaf.startswith(row + ".") for row in rows)
    ]
    assert missing == [], f"values without a `# --` comment: {missing}"
    for row in rows:
        node = schema
        for part in row.split("."):
            node = node["properties"][part]


def test_the_table_shows_type_default_and_text() -> None:
    text = (SCHEDULER_CHART / "README.md").read_text()
    assert '| `image.digest` | string | `""` | Image digest (sha256:<64 hex>)' in text
    assert "| `preferControlPlane` | boolean | `true` |" in text
    assert '| `nodeSelector` | object | `{"kubernetes.io/os":"linux"}` |' in text


# ---------------------------------------------------------------- Chart.yaml for Artifact Hub
@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_chart_metadata_for_artifact_hub(chart: Path) -> None:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    icon = meta["icon"]
    assert icon.startswith("https://gitlab.com/evgenii19/gpu-scheduler/-/raw/main/")
    local = REPO / icon.split("/-/raw/main/", 1)[1]
    assert local.is_file() and local.read_text().lstrip().startswith("<svg")
    assert meta["maintainers"] and all(m["name"] for m in meta["maintainers"])
    annotations = meta["annotations"]
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    links = yaml.safe_load(annotations["artifacthub.io/links"])
    assert {link["name"] for link in links} == {"Documentation", "Changelog"}
    assert all(isinstance(v, str) for v in annotations.values())  # ct's schema: map(str, str)
    res = subprocess.run(
        [helm_bin(), "lint", "--strict", str(chart)], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0 and "icon is recommended" not in res.stdout, res.stdout


# ---------------------------------------------------------------- managed clusters
@pytest.mark.parametrize("chart", CHARTS, ids=lambda c: c.name)
def test_no_pod_requires_a_control_plane_node(chart: Path) -> None:
    """EKS, GKE, AKS: no node is a control-plane node. By default nothing requires one; the
    pods that do not go where the map says prefer one."""
    values = {"webhook": {"enabled": True, "caBundle": "QQ==", "tls": {"crt": "c", "key": "k"}}}
    docs = render(chart, values=values if chart == SCHEDULER_CHART else None)
    placed = [d for d in docs if d["kind"] == "Pod" or d["kind"] == "Deployment"]
    assert placed
    for spec in pods(placed):
        assert CONTROL_PLANE not in (spec.get("nodeSelector") or {}), spec.get("nodeSelector")
        node_affinity = spec["affinity"]["nodeAffinity"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in node_affinity
        (term,) = node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["preference"]["matchExpressions"] == [{"key": CONTROL_PLANE, "operator": "Exists"}]


def test_requiring_the_control_plane_as_before() -> None:
    """A nodeSelector given is merged with the default (Helm merges maps)."""
    docs = render(SCHEDULER_CHART, values={"nodeSelector": {CONTROL_PLANE: ""}})
    assert all(spec["nodeSelector"] == {LINUX: "linux", CONTROL_PLANE: ""} for spec in pods(docs))


def test_image_digest_pins_every_container() -> None:
    for chart in CHARTS:
        docs = render(chart, values={"image": {"repository": "reg.example/gs", "tag": "x", "digest": DIGEST}})
        images = {
            c["image"] for spec in pods(docs) for c in [*spec.get("initContainers", []), *spec["containers"]]
        }
        assert images == {f"reg.example/gs@{DIGEST}"}, chart.name
    bad = template(SCHEDULER_CHART, values={"image": {"repository": "r", "digest": "sha256:abc"}})
    assert bad.returncode != 0 and "digest" in bad.stderr


def test_global_and_own_pull_secrets_on_every_pod() -> None:
    values = {
        "global": {"imagePullSecrets": ["from-parent", {"name": "shared"}]},
        "imagePullSecrets": [{"name": "shared"}, {"name": "own"}],
    }
    for chart in CHARTS:
        for spec in pods(render(chart, values=values)):
            assert spec["imagePullSecrets"] == [{"name": "from-parent"}, {"name": "shared"}, {"name": "own"}]
    # The kube-scheduler of extender mode too.
    extender = render(
        SCHEDULER_CHART,
        values={**values, "extender": {"enabled": True, "tls": {"caBundle": "QQ==", "crt": "c", "key": "k"}}},
    )
    assert all(spec["imagePullSecrets"] for spec in pods(extender))


def test_topology_spread_constraints_default_to_the_pods_selector() -> None:
    spread = {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
    }
    own = {**spread, "labelSelector": {"matchLabels": {"team": "gpu"}}}
    docs = render(
        SCHEDULER_CHART,
        values={
            "topologySpreadConstraints": [spread, own],
            "webhook": {
                "enabled": True,
                "caBundle": "QQ==",
                "tls": {"crt": "c", "key": "k"},
                "topologySpreadConstraints": [spread],
            },
        },
    )
    by_name = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Deployment"}
    sched, webhook = by_name["rel-gpu-scheduler"], by_name["rel-gpu-scheduler-webhook"]
    assert sched["template"]["spec"]["topologySpreadConstraints"] == [
        {**spread, "labelSelector": sched["selector"]},
        own,
    ]
    assert webhook["template"]["spec"]["topologySpreadConstraints"] == [
        {**spread, "labelSelector": webhook["selector"]}
    ]
    assert "topologySpreadConstraints" not in pods(render(SCHEDULER_CHART))[0]


# ---------------------------------------------------------------- as a subchart
def test_both_charts_render_as_subcharts_of_an_umbrella_chart(tmp_path: Path) -> None:
    """A parent chart depending on both, with a `global` of its own (keys our schemas do not
    know, and the pull secrets they do): both schemas accept it, every pod gets the secrets."""
    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    for chart in CHARTS:
        shutil.copytree(chart, parent / "charts" / chart.name)
    (parent / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [
                    {"name": yaml.safe_load((c / "Chart.yaml").read_text())["name"], "version": "*"}
                    for c in CHARTS
                ],
            }
        )
    )
    (parent / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "global": {
                    "imagePullSecrets": ["registry-credentials"],
                    "environment": "prod",
                    "imageRegistry": "x",
                },
                "gpu-scheduler": {
                    "injection": {"mode": "webhook"},
                    "webhook": {"enabled": True, "certManager": {"enabled": True}},
                },
                "gpu-scheduler-check": {"check": {"expectNoGPU": True}},
            }
        )
    )
    docs = render(parent, release="platform")
    names = {d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    assert names == {
        "platform-gpu-scheduler",
        "platform-gpu-scheduler-webhook",
        "platform-gpu-scheduler-check",
    }
    hooks = [d for d in docs if is_hook(d) and d["kind"] == "Pod"]
    assert hooks
    for spec in pods(docs):
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    # Without `global` in their schemas both charts refused this (additional property 'global').
    for chart in CHARTS:
        schema = json.loads((chart / "values.schema.json").read_text())
        assert schema["properties"]["global"]["type"] == "object"
        assert "additionalProperties" not in schema["properties"]["global"]
