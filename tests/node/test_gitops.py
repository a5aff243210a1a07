"""`make gitops-demo` on the real node: Argo CD syncs argocd/ from a local bare repository,
the scheduler (and in webhook mode the webhook) runs as pods on the real kubelet from the
image built here, and the check chart's verification hook pod runs there too, so the
scheduler Application's Healthy is the readiness of real pods.

Both modes: policy (argocd/'s default; no cert-manager, no certificate anywhere) and webhook
(`GITOPS_ARGS=--webhook`: argocd/README.md's webhook mode, cert-manager issuing the webhook's
certificate). Each starts a control plane with a real node of its own (Argo CD, and
cert-manager in webhook mode, as host processes, as the demo does): tests/node/conftest.py
runs them before the package's node, as only one real node runs on a host at a time.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import KWOK_ANNOTATION, REPO, Cluster
from localcluster.gitops import bare_repository, start_argocd, start_cert_manager
from localcluster.gitops_demo import report, sync_argocd
from localcluster.gitops_timeline import APPS, CHECK_NS, RELEASE, SYSTEM_NS, get
from localcluster.image import Image
from localcluster.node import NODE_NAME

pytestmark = pytest.mark.cluster
SCHED_APP, CHECK_APP = APPS


def _ts(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def _pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


@pytest.mark.slow(
    reason="real Argo CD syncs both steps onto the real node, each with its image's pods", budget=360
)
@pytest.mark.parametrize("mode", ["policy", "webhook"])
def test_argocd_syncs_the_product_onto_the_real_node(tmp_path: Path, product_image: Image, mode: str) -> None:
    webhook = mode == "webhook"
    components_expected = {"scheduler", "webhook"} if webhook else {"scheduler"}
    c = Cluster.start(
        tmp_path / "cluster", gpu_nodes=3, gpus_per_node=4, real_node=True, images=[product_image.archive]
    )
    try:
        if webhook:
            start_cert_manager(c)
        start_argocd(c)
        repo_url = bare_repository(tmp_path / "git" / "gpu-scheduler.git", REPO)
        outcome = sync_argocd(c, product_image, repo_url, timeout=300, webhook=webhook)
        report(outcome)  # in the test's output, for a failure

        # Both Applications Synced and Healthy, their syncs Succeeded; every replica placed.
        assert outcome.synced, c.kubectl(
            "get", "applications.argoproj.io", "-n", "argocd", "-o", "yaml"
        ).stdout
        assert outcome.placed, outcome.placement
        # The RollingSync is over: no sync of either Application is queued or running.
        assert outcome.settled, get(
            c, "applicationsets.argoproj.io", "gpu-scheduler-complete", "-n", "argocd"
        )

        # The scheduler (and the webhook): Argo CD's Deployments, running as containers on the
        # real kubelet node from the image built here, Ready.
        resources = get(c, "applications.argoproj.io", SCHED_APP, "-n", "argocd")["status"]["resources"]
        kinds = {r["kind"] for r in resources}
        if webhook:
            assert {"MutatingWebhookConfiguration", "Certificate"} <= kinds, kinds
            assert "MutatingAdmissionPolicy" not in kinds, kinds
        else:
            # No certificate anywhere: no webhook, no Secret, no cert-manager (not even its CRDs).
            assert "MutatingAdmissionPolicy" in kinds, kinds
            assert not kinds & {"MutatingWebhookConfiguration", "Secret", "Certificate", "Issuer"}, kinds
            assert c.kubectl("get", "crd", "certificates.cert-manager.io", check=False).returncode != 0
            tls = c.kubectl(
                "get", "secrets", "-A", "--field-selector", "type=kubernetes.io/tls", "-o", "name"
            )
            assert not tls.stdout.split(), tls.stdout
        deployments = ("gpu-scheduler", "gpu-scheduler-webhook") if webhook else ("gpu-scheduler",)
        for dep in deployments:
            d = get(c, "deployment", dep, "-n", SYSTEM_NS)
            tracking = d["metadata"].get("annotations", {}).get("argocd.argoproj.io/tracking-id", "")
            assert tracking.startswith(f"{SCHED_APP}:apps/Deployment:{SYSTEM_NS}/{dep}"), d["metadata"]
        node = get(c, "node", NODE_NAME)
        assert KWOK_ANNOTATION not in (node["metadata"].get("annotations") or {}), "not the real kubelet"
        pods = _pods(c, SYSTEM_NS, f"app.kubernetes.io/instance={RELEASE}")
        components = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
        assert components_expected <= components, components
        ready_at = []
        for p in pods:
            if p["metadata"]["labels"].get("app.kubernetes.io/component") not in ("scheduler", "webhook"):
                continue
            name = p["metadata"]["name"]
            assert p["spec"]["nodeName"] == NODE_NAME, name
            assert p["status"]["phase"] == "Running", (name, p["status"])
            (ready,) = [x for x in p["status"]["conditions"] if x["type"] == "Ready"]
            assert ready["status"] == "True", (name, p["status"]["conditions"])
            ready_at.append((name, _ts(ready["lastTransitionTime"])))
            for cs in p["status"]["containerStatuses"]:
                assert cs["containerID"].startswith("containerd://"), (name, cs)
                assert cs["image"].endswith(product_image.ref.split("/", 1)[1]), (name, cs["image"])
                assert cs["ready"] and "running" in cs["state"], (name, cs)
        assert outcome.components_ok, outcome.components

        # Argo CD's Healthy waited for those pods: the check's first sync (step 2 of the
        # RollingSync, started when step 1 was Healthy) began after every one of them was Ready.
        history = get(c, "applications.argoproj.io", CHECK_APP, "-n", "argocd")["status"]["history"]
        check_started = min(_ts(h["deployStartedAt"]) for h in history)
        late = [(n, t.isoformat()) for n, t in ready_at if t > check_started]
        assert not late, (check_started.isoformat(), late)

        # The verification hook ran for real on the real node and passed: Argo CD's record,
        # and the hook pods themselves (deleted by Argo CD once they succeeded).
        assert outcome.hooks_ok, (outcome.hook_results, outcome.hooks)
        assert outcome.hooks and all(
            h["node"] == NODE_NAME and h["container"].startswith("containerd://") for h in outcome.hooks
        ), outcome.hooks
        assert all(h["pod"].startswith(f"{CHECK_NS}/") for h in outcome.hooks), outcome.hooks
        assert outcome.ok
    finally:
        c.stop()
