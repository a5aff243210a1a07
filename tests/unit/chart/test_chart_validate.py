"""Rendered manifests of both charts against the Kubernetes 1.31 and 1.37 OpenAPI schemas
(kubernetes-validate, offline, strict: unknown fields fail), and the charts' lint (helm, ct)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.support.charts import (
    CHARTS,
    CHECK_CHART,
    KUBE_VERSIONS,
    REPO,
    SCHEDULER_CHART,
    ci_values,
    render,
)

# Kinds from CRDs that kubernetes-validate has no schema for: checked structurally.
CRD_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}
# Every optional feature at once (beyond the ci/ scenarios).
ALL_FEATURES: dict[str, Any] = {
    "replicaCount": 3,
    "serviceMonitor": {"enabled": True},
    "networkPolicy": {
        "enabled": True,
        "healthFrom": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}],
    },
    "webhook": {
        "enabled": True,
        "replicaCount": 3,
        "certManager": {"enabled": True},
        "namespaceSelector": {"matchLabels": {"g": "1"}},
        "clientAuth": {
            "enabled": True,
            "caBundle": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=",
        },
        "serviceAccount": {"annotations": {"a": "b"}},
    },
    "admissionPolicy": {"enabled": True},
    "imagePullSecrets": [{"name": "reg"}],
    "scheduler": {"name": "gpu-scheduler", "extraEnv": [{"name": "X", "value": "1"}]},
}

SCENARIOS = [(chart, f) for chart in CHARTS for f in ci_values(chart)]


def validate(docs: list[dict[str, Any]], version: str) -> None:
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            assert doc["metadata"]["name"] and doc["metadata"]["namespace"], doc
            assert isinstance(doc["spec"], dict) and doc["spec"], doc
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for Kubernetes {version}: {exc}")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize(
    ("chart", "values_file"), SCENARIOS, ids=[f"{c.name}/{f.name}" for c, f in SCENARIOS]
)
def test_ci_scenarios_validate_against_kubernetes_schemas(
    chart: Path, values_file: Path, kube_version: str
) -> None:
    docs = render(chart, [values_file], kube_version=kube_version)
    validate(docs, kube_version)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_all_optional_features_validate(kube_version: str) -> None:
    validate(render(SCHEDULER_CHART, values=ALL_FEATURES, kube_version=kube_version), kube_version)


def test_kubernetes_validate_ships_both_versions() -> None:
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, version, strict=True
        )


def test_strict_validation_catches_an_unknown_field() -> None:
    docs = render(SCHEDULER_CHART)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    dep["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, KUBE_VERSIONS[0], strict=True)


def tool_env() -> dict[str, str]:
    from localcluster.cluster import bin_dirs

    path = os.pathsep.join([str(REPO / ".venv" / "bin"), *map(str, bin_dirs()), os.environ["PATH"]])
    return dict(os.environ, PATH=path)


def test_helm_lint_strict_every_scenario() -> None:
    from tests.support.charts import helm_bin

    helm = helm_bin()
    for chart, values_file in SCENARIOS:
        for version in KUBE_VERSIONS:
            res = subprocess.run(
                [helm, "lint", "--strict", "--kube-version", version, str(chart), "-f", str(values_file)],
                check=False,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert res.returncode == 0, (
                f"{chart.name} {values_file.name} {version}:\n{res.stdout}{res.stderr}"
            )


def test_ct_lint_passes() -> None:
    from localcluster.cluster import tool

    try:
        ct = tool("ct")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    res = subprocess.run(
        [str(ct), "lint", "--config", "ct.yaml", "--all"],
        check=False,
        cwd=REPO,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "All charts linted successfully" in res.stdout + res.stderr
    for chart in CHARTS:
        assert f'path: \\"{chart.name}\\"' in res.stdout + res.stderr or chart.name in res.stdout + res.stderr


def test_packaged_charts_hold_no_ci_scenarios(tmp_path: Path) -> None:
    from tests.support.charts import helm_bin

    for chart in (SCHEDULER_CHART, CHECK_CHART):
        res = subprocess.run(
            [helm_bin(), "package", str(chart), "--destination", str(tmp_path)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
    import tarfile

    for tgz in tmp_path.glob("*.tgz"):
        with tarfile.open(tgz) as tar:
            names = tar.getnames()
        assert any(n.endswith("values.schema.json") for n in names)
        assert not [n for n in names if "/ci/" in n]
