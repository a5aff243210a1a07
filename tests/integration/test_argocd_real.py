"""argocd/ synced by a REAL Argo CD (v3.5, host processes) with a REAL cert-manager.

One control plane with its Service network, cert-manager and Argo CD for the whole
module (the cost is paid once); the scheduler and the webhook run as host processes
with the identities Argo CD and cert-manager created (see localcluster/gitops_demo.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import REPO, Cluster
from localcluster.gitops import argocd_manifest, bare_repository, start_argocd, start_cert_manager
from localcluster.gitops_demo import APPS, HostComponents, Timeline, get, observe

pytestmark = pytest.mark.cluster

SCHED_APP, CHECK_APP = APPS


class GitOps:
    def __init__(self, cluster: Cluster, repo_url: str) -> None:
        self.cluster = cluster
        self.repo_url = repo_url
        self.hosts = HostComponents(cluster)

    def apply(self, name: str) -> None:
        self.cluster.apply(argocd_manifest(name, self.repo_url))

    def app(self, name: str) -> dict[str, Any]:
        return get(self.cluster, "applications.argoproj.io", name, "-n", "argocd")

    def wait(self, cond: Any, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.hosts.poll()
            if cond():
                return
            time.sleep(0.5)
        apps = self.cluster.kubectl(
            "get", "applications.argoproj.io", "-n", "argocd", "-o", "yaml", check=False
        ).stdout
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}\n{apps[-4000:]}")

    def synced_healthy(self, *names: str) -> bool:
        for n in names:
            st = self.app(n).get("status", {})
            if (
                st.get("sync", {}).get("status") != "Synced"
                or st.get("health", {}).get("status") != "Healthy"
            ):
                return False
        return True


@pytest.fixture(scope="module")
def gitops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitOps]:
    workdir = tmp_path_factory.mktemp("gitops")
    cluster = Cluster.start(workdir, gpu_nodes=3, gpus_per_node=4, service_network=True)
    try:
        start_cert_manager(cluster)
        start_argocd(cluster)
        repo_url = bare_repository(Path(workdir) / "git" / "gpu-scheduler.git", REPO)
        g = GitOps(cluster, repo_url)
        g.apply("gpu-scheduler-project.yaml")
        g.apply("local-cluster-secret.yaml")
        yield g
    finally:
        cluster.stop()


def _ts(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def complete(gitops: GitOps) -> GitOps:
    """The recommended path: the complete ApplicationSet, both steps Synced and Healthy."""
    gitops.apply("gpu-scheduler-complete-applicationset.yaml")
    tl = Timeline()
    gitops.wait(
        lambda: observe(gitops.cluster, tl, APPS) and gitops.hosts.webhook is not None,
        "both Applications Synced and Healthy",
    )
    return gitops


def test_step_two_syncs_only_after_step_one_is_healthy(complete: GitOps) -> None:
    sched = complete.app(SCHED_APP)["status"]
    check = complete.app(CHECK_APP)["status"]
    sched_op, check_op = sched["operationState"], check["operationState"]
    assert sched_op["phase"] == "Succeeded" and check_op["phase"] == "Succeeded"
    # Step 2's sync began after step 1's sync finished (and the ApplicationSet saw it Healthy).
    assert _ts(check_op["startedAt"]) >= _ts(sched_op["finishedAt"]), (sched_op, check_op)
    appset = get(complete.cluster, "applicationsets.argoproj.io", "gpu-scheduler-complete", "-n", "argocd")
    steps = {s["application"]: s for s in appset["status"]["applicationStatus"]}
    assert steps[SCHED_APP]["step"] == "1" and steps[CHECK_APP]["step"] == "2", steps
    assert all(s["status"] == "Healthy" for s in steps.values()), steps


def test_both_end_synced_and_healthy_with_the_replicas_placed(complete: GitOps) -> None:
    from localcluster.gitops_demo import placement_table

    assert complete.synced_healthy(SCHED_APP, CHECK_APP)
    table, good = placement_table(complete.cluster)
    assert good, table


def test_cainjector_cabundle_causes_no_out_of_sync(complete: GitOps) -> None:
    hooks = get(
        complete.cluster, "mutatingwebhookconfigurations", "-l", "app.kubernetes.io/instance=gpu-scheduler"
    )
    bundles = [h["clientConfig"].get("caBundle") for w in hooks["items"] for h in w["webhooks"]]
    assert bundles and all(bundles), "cainjector did not fill caBundle"
    # The chart renders no caBundle: Argo CD would see a diff if it did not ignore the field.
    app = complete.app(SCHED_APP)
    assert app["status"]["sync"]["status"] == "Synced"
    webhook_resources = [r for r in app["status"]["resources"] if r["kind"].endswith("WebhookConfiguration")]
    assert webhook_resources and all(r.get("status") == "Synced" for r in webhook_resources), (
        webhook_resources
    )


@pytest.mark.xfail(
    strict=True,
    reason="measured 2026-11-22: a kubectl patch of the check StatefulSet's replicas stays for 180s "
    "and the Application still reports Synced (RollingSync turns automated sync off; "
    "ServerSideApply diff); open question for issue 11, see the helper's report",
)
def test_a_kubectl_edit_of_a_chart_resource_is_reverted(complete: GitOps) -> None:
    c = complete.cluster
    cm = get(
        c, "configmaps", "-n", "gpu-scheduler-tests", "-l", "app.kubernetes.io/instance=gpu-scheduler-check"
    )
    sts = get(c, "statefulsets", "-n", "gpu-scheduler-tests")["items"][0]
    name = sts["metadata"]["name"]
    want = sts["spec"]["replicas"]
    c.kubectl(
        "patch",
        "statefulset",
        name,
        "-n",
        "gpu-scheduler-tests",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"replicas": want + 1}}),
    )
    assert cm is not None
    complete.wait(
        lambda: get(c, "statefulset", name, "-n", "gpu-scheduler-tests")["spec"]["replicas"] == want,
        "Argo CD to revert the edited replica count (selfHeal)",
        timeout=180,
    )
    complete.wait(
        lambda: complete.synced_healthy(CHECK_APP), "the check Application to be Synced and Healthy again"
    )


def test_the_project_refuses_a_destination_outside_it(complete: GitOps) -> None:
    app = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": "outside-the-project", "namespace": "argocd"},
        "spec": {
            "project": "gpu-scheduler",
            "source": {
                "repoURL": complete.repo_url,
                "targetRevision": "main",
                "path": "gpu-scheduler-check-chart",
            },
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "kube-system"},
        },
    }
    complete.cluster.apply(app)

    def refused() -> bool:
        conds = complete.app("outside-the-project").get("status", {}).get("conditions", [])
        return any(
            "kube-system" in c.get("message", "") and "not permitted" in c.get("message", "") for c in conds
        )

    complete.wait(refused, "Argo CD to refuse the destination kube-system", timeout=60)
    assert not complete.cluster.kubectl(
        "get", "statefulsets", "-n", "kube-system", "-o", "name"
    ).stdout.strip()
    complete.cluster.kubectl(
        "delete", "applications.argoproj.io", "outside-the-project", "-n", "argocd", "--wait=false"
    )
