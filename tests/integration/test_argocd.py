"""The Argo CD manifests against a real apiserver: argocd/validate.sh installs the CRDs of
the pinned Argo CD release (from its Go module) and server-side dry-runs every manifest
with strict field validation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster.cluster import Cluster, bin_dirs

REPO = Path(__file__).resolve().parents[2]
ARGOCD = REPO / "argocd"


def env_for(cluster: Cluster) -> dict[str, str]:
    path = os.pathsep.join([str(Path(sys.executable).parent), *map(str, bin_dirs()), os.environ["PATH"]])
    return dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), PATH=path, PYTHON=sys.executable)


@pytest.fixture(scope="module")
def argocd_crds(cluster: Cluster) -> None:
    if not shutil.which("go"):
        pytest.skip("go is needed to fetch the Argo CD CRDs from the module proxy")
    res = subprocess.run(
        [str(ARGOCD / "validate.sh")],
        check=False,
        env=env_for(cluster),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_manifest_passes_server_dry_run(argocd_crds: None, cluster: Cluster) -> None:
    for f in sorted(ARGOCD.glob("*.yaml")):
        res = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", str(f), check=False)
        assert res.returncode == 0, f"{f.name}: {res.stderr}"


def test_rolling_sync_survives_the_crd_schema(argocd_crds: None, cluster: Cluster) -> None:
    """Fields the CRD does not know would be pruned: the strategy must come back intact."""
    out = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        str(ARGOCD / "gpu-scheduler-complete-applicationset.yaml"),
    ).stdout
    spec = json.loads(out)["spec"]
    steps = spec["strategy"]["rollingSync"]["steps"]
    assert [s["matchExpressions"][0]["values"] for s in steps] == [["scheduler"], ["check"]]
    assert spec["strategy"]["type"] == "RollingSync"
    assert spec["goTemplateOptions"] == ["missingkey=error"]
    template = spec["template"]
    assert template["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] == "{{ .syncWave }}"
    assert template["spec"]["syncPolicy"]["retry"]["backoff"] == {
        "duration": "5s",
        "factor": 2,
        "maxDuration": "3m",
    }


def test_a_broken_manifest_is_refused(argocd_crds: None, cluster: Cluster, tmp_path: Path) -> None:
    bad = (ARGOCD / "gpu-scheduler-project.yaml").read_text().replace("sourceRepos:", "sourceRepo:")
    (tmp_path / "bad.yaml").write_text(bad)
    res = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", str(tmp_path / "bad.yaml"), check=False
    )
    assert res.returncode != 0 and "sourceRepo" in res.stderr
