"""The scheduler chart in a platform team's setup, installed for real on the local control plane
(issue 41): as a dependency of a parent chart with `condition: gpu-scheduler.enabled`, and as two
releases side by side (two namespaces, two scheduler names) sharing the GPUPinningPolicy CRD.
What rendering alone proves (every image, every pod): tests/unit/chart/test_chart_platform.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from localcluster.cluster import Cluster
from localcluster.release import install_chart, uninstall
from tests.integration.fixtures_chart import SCHEDULER_CHART
from tests.integration.test_chart_install import isolate_webhooks, manifest_objects
from tests.support.kubeapi import create_namespace, delete_namespace

CRD = "gpupinningpolicies.gpu-scheduler.io"
MIRROR = "mirror.example:5000"


def parent_chart(tmp_path: Path, cluster: Cluster) -> Path:
    """A parent chart that lists gpu-scheduler-chart (by file:// path) under a condition, with
    its dependency built into charts/ as `helm dependency build` does for a user."""
    parent = tmp_path / "platform"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "0.1.0",
                "dependencies": [
                    {
                        "name": "gpu-scheduler",
                        "version": ">=0.0.0-0",
                        "repository": f"file://{SCHEDULER_CHART}",
                        "condition": "gpu-scheduler.enabled",
                    }
                ],
            }
        )
    )
    (parent / "values.yaml").write_text(yaml.safe_dump({"global": {"imageRegistry": MIRROR}}))
    cluster.helm("dependency", "build", str(parent))
    assert list((parent / "charts").glob("gpu-scheduler-*.tgz"))
    return parent


def test_installed_as_a_parents_dependency_under_its_condition(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    parent = parent_chart(tmp_path, cluster)
    release = f"pp-{namespace}"
    ours = isolate_webhooks({"scheduler": {"name": f"gs-{namespace}"}}, namespace)
    try:
        # The condition false: the release installs, with nothing of ours in it or in the namespace.
        install_chart(cluster, release, namespace, {"gpu-scheduler": {**ours, "enabled": False}}, parent)
        assert manifest_objects(cluster, release, namespace) == []
        assert cluster.get_json("deployments", "-n", namespace)["items"] == []
        # The condition true: the scheduler, Ready, its image from the parent's global.imageRegistry.
        install_chart(
            cluster, release, namespace, {"gpu-scheduler": {**ours, "enabled": True}}, parent, wait=True
        )
        docs = manifest_objects(cluster, release, namespace)
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        assert deployment["metadata"]["name"] == f"{release}-gpu-scheduler"
        live = cluster.get_json("deployment", deployment["metadata"]["name"], "-n", namespace)
        assert live["status"].get("readyReplicas") == 1, live["status"]
        (container,) = live["spec"]["template"]["spec"]["containers"]
        assert container["image"].startswith(f"{MIRROR}/evgenii19/gpu-scheduler/gpu-scheduler:"), container
        assert live["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    finally:
        uninstall(cluster, release, namespace)


def _crd_owner(cluster: Cluster) -> tuple[str, str] | None:
    """(release, namespace) whose Helm release made the CRD; ("", "") when made otherwise; None
    when there is no CRD."""
    res = cluster.kubectl("get", "crd", CRD, "-o", "json", check=False)
    if res.returncode != 0:
        return None
    annotations = yaml.safe_load(res.stdout)["metadata"].get("annotations") or {}
    return annotations.get("meta.helm.sh/release-name", ""), annotations.get(
        "meta.helm.sh/release-namespace", ""
    )


def test_two_releases_side_by_side_share_the_crd(
    cluster: Cluster, namespace: str, helm_release: Callable[..., str], kube: Any
) -> None:
    """Two teams' releases, each in its namespace with its scheduler name, both install with the
    defaults (crds.install true) and become Ready: the CRD is rendered by at most one of them,
    the one that finds it missing, and the other leaves it to that one (Helm would refuse to
    take over an object another release owns)."""
    other = f"t-{uuid.uuid4().hex[:8]}"
    create_namespace(kube, other)
    try:
        before = _crd_owner(cluster)
        releases = []
        for ns, team in ((namespace, "a"), (other, "b")):
            values = isolate_webhooks({"scheduler": {"name": f"gs-{team}-{namespace}"}}, ns)
            releases.append((helm_release(f"gs-{team}-{ns}", ns, values, SCHEDULER_CHART, wait=True), ns))
        with_crd = []
        for release, ns in releases:
            docs = manifest_objects(cluster, release, ns)
            (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
            live = cluster.get_json("deployment", deployment["metadata"]["name"], "-n", ns)
            assert live["status"].get("readyReplicas") == 1, (release, live["status"])
            env = {
                e["name"]: e.get("value") for e in live["spec"]["template"]["spec"]["containers"][0]["env"]
            }
            assert env["GPU_SCHEDULER_NAME"] == f"gs-{'a' if ns == namespace else 'b'}-{namespace}"
            if any(d["kind"] == "CustomResourceDefinition" for d in docs):
                with_crd.append((release, ns))
        after = _crd_owner(cluster)
        assert after is not None, "no GPUPinningPolicy CRD after two installs"
        if before is None:
            # This test made it: the first release owns it, the second shares it.
            assert with_crd == [releases[0]] and after == releases[0], (with_crd, after)
            # The owner keeps rendering it on upgrade; the other still installs beside it.
            first, first_ns = releases[0]
            values = isolate_webhooks({"scheduler": {"name": f"gs-a-{namespace}"}}, first_ns)
            helm_release(first, first_ns, values, SCHEDULER_CHART)
            assert any(
                d["kind"] == "CustomResourceDefinition" for d in manifest_objects(cluster, first, first_ns)
            )
        else:
            # Another release (or kubectl) made it earlier in the session: both leave it alone.
            assert with_crd == [] and after == before, (with_crd, before, after)
        cluster.kubectl("get", "gpupinningpolicies")  # served: the CRD is established
    finally:
        for release, ns in [(f"gs-b-{other}", other)]:
            uninstall(cluster, release, ns)
        delete_namespace(kube, other)
