"""``make gitops-demo``: argocd/ synced by a real Argo CD, the product running as real pods.

Builds the image of this tree (localcluster/image.py) and starts the control plane with the
kwok GPU nodes and one real kubelet node (localcluster/node.py) holding it, as ``make demo``
does; Argo CD runs as host processes (an upstream program, not ours). This checkout is
committed into a local bare repository and argocd/ is applied with only the repository URL
(the cluster Secret's annotation, and the AppProject allow-list entry that must equal it)
and the image (``image.*`` in each ApplicationSet's Helm values: the image built here,
``pullPolicy: Never``) rewritten. Argo CD then syncs the charts in the ApplicationSets'
default, policy mode: the apiserver injects the GPU variables (MutatingAdmissionPolicy), no
webhook, no certificate, no cert-manager. The scheduler runs as a pod on the real node, so
the scheduler Application's Healthy is the real readiness of real pods; the check chart's
verification hook pod runs there too. Prints a timeline, the product's pods, the hook pods
and the check chart's placement.

``--webhook`` (``make gitops-demo GITOPS_ARGS=--webhook``): argocd/README.md's webhook mode
instead, the webhook running as pods too, its certificate issued by a real cert-manager (host
processes; the apiserver reaches cert-manager's webhook through its Service, routed by the
node's kube-proxy) whose cainjector fills the caBundle.

What the demo watches is in localcluster/gitops_timeline.py; ``HostComponents`` (the
scheduler, the webhook and the hook pods' commands as host processes, for
tests/integration/test_argocd_real.py, which runs on kwok nodes only) in
localcluster/host_components.py.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.cluster import REPO, Cluster
from localcluster.gitops import argocd_manifest, bare_repository, start_argocd, start_cert_manager
from localcluster.gitops_timeline import (
    APPS,
    CHECK_NS,
    RELEASE,
    SYSTEM_NS,
    HookPods,
    Timeline,
    component_pods,
    get,
    observe,
    observe_pods,
    placement_table,
    rows_text,
    say,
)
from localcluster.image import Image
from localcluster.image import build as build_image
from localcluster.node import NODE_NAME


def apply_argocd(
    cluster: Cluster, repo_url: str, *files: str, image: str | None = None, webhook: bool = False
) -> None:
    for name in files:
        cluster.apply(argocd_manifest(name, repo_url, image=image, webhook=webhook))


@dataclass
class Outcome:
    """What the demo saw once both Applications settled (or the time ran out)."""

    synced: bool  # both Applications Synced and Healthy, their sync operations Succeeded
    settled: bool  # the RollingSync over: both steps Healthy, no sync queued or running
    timeline: Timeline
    components: list[dict[str, Any]]
    hooks: list[dict[str, Any]]
    hook_results: list[dict[str, Any]]  # the check sync's hook entries, from Argo CD's syncResult
    placement: str
    placed: bool
    webhook: bool = False  # webhook mode (else policy mode: no webhook pods)

    @property
    def components_ok(self) -> bool:
        """The scheduler (and in webhook mode the webhook) each run as Ready pods on the real
        node, in containers."""
        expected = {"scheduler", "webhook"} if self.webhook else {"scheduler"}
        return {r["component"] for r in self.components} == expected and all(
            r["node"] == NODE_NAME and r["phase"] == "Running" and r["ready"] and r["runtime"] == "containerd"
            for r in self.components
        )

    @property
    def hooks_ok(self) -> bool:
        """Argo CD's check sync ran its Pod hook(s), each Succeeded, and each of those pods ran on
        the real node and exited 0."""
        pods = [h for h in self.hook_results if h.get("kind") == "Pod"]
        if not pods or any(h.get("hookPhase") != "Succeeded" for h in pods):
            return False
        for h in pods:
            ran = [s for s in self.hooks if s["pod"] == f"{h.get('namespace') or CHECK_NS}/{h['name']}"]
            if not ran or not all(s["node"] == NODE_NAME for s in ran) or ran[-1]["exit"] != 0:
                return False
        return True

    @property
    def ok(self) -> bool:
        return self.synced and self.settled and self.components_ok and self.hooks_ok and self.placed


COMPLETE_APPSET = "gpu-scheduler-complete"


def rollout_settled(cluster: Cluster) -> tuple[bool, dict[str, Any]]:
    """Whether the RollingSync is over: the ApplicationSet reports both Applications Healthy
    (it stops triggering syncs) and neither has a sync queued or running; with the check
    Application's last sync operation. While the ApplicationSet waits to see step 2 start it
    may trigger its sync again, so a Succeeded sync can be followed by another one."""
    appset = get(cluster, "applicationsets.argoproj.io", COMPLETE_APPSET, "-n", "argocd")
    steps = {
        s["application"]: s.get("status") for s in appset.get("status", {}).get("applicationStatus") or []
    }
    settled = set(steps) == set(APPS) and all(s == "Healthy" for s in steps.values())
    op: dict[str, Any] = {}
    for name in APPS:
        app = get(cluster, "applications.argoproj.io", name, "-n", "argocd")
        op = app.get("status", {}).get("operationState") or {}
        settled = settled and not app.get("operation") and op.get("phase") == "Succeeded"
    return settled, op


def sync_argocd(
    cluster: Cluster, image: Image, repo_url: str, timeout: float = 300, webhook: bool = False
) -> Outcome:
    """Apply argocd/ (repository URL and image rewritten; with ``webhook``, in webhook mode) to
    a control plane with a real node and Argo CD (and, with ``webhook``, cert-manager) running,
    and follow it until both Applications are Synced and Healthy, the scheduler's (and the
    webhook's) pods Ready on the real node and the RollingSync settled (no sync queued or
    running), or ``timeout``."""
    tl = Timeline()
    hooks = HookPods(cluster)
    op: dict[str, Any] = {}
    settled = False
    try:
        apply_argocd(
            cluster,
            repo_url,
            "gpu-scheduler-project.yaml",
            "local-cluster-secret.yaml",
            "gpu-scheduler-complete-applicationset.yaml",
            image=image.ref,
            webhook=webhook,
        )
        deadline = time.monotonic() + timeout
        synced = False
        components: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            synced = observe(cluster, tl, APPS)
            components = component_pods(cluster)
            observe_pods(tl, components, hooks.seen())
            if synced and components and all(r["ready"] for r in components):
                settled, op = rollout_settled(cluster)
                if settled:
                    break
            time.sleep(0.5)
        # A pod's last events (its exit, its deletion) arrive within a moment of Argo CD's record.
        time.sleep(1)
        observe_pods(tl, components, hooks.seen())
    finally:
        hooks.stop()
    results = [r for r in (op.get("syncResult") or {}).get("resources") or [] if r.get("hookType")]
    placement, placed = placement_table(cluster)
    return Outcome(synced, settled, tl, components, hooks.seen(), results, placement, placed, webhook)


def report(outcome: Outcome) -> None:
    print("\nTimeline (seconds after argocd/ was applied):")
    print(outcome.timeline.text())
    print(f"\nThe scheduler chart's pods (Argo CD synced them; they run on the real node {NODE_NAME}):")
    print(
        rows_text(
            ("COMPONENT", "POD", "NODE", "PHASE", "READY", "RUNTIME", "RESTARTS", "IMAGE"),
            [
                (
                    r["component"],
                    r["pod"],
                    r["node"],
                    r["phase"],
                    "yes" if r["ready"] else "no",
                    r["runtime"],
                    str(r["restarts"]),
                    r["image"],
                )
                for r in outcome.components
            ],
        )
    )
    print("\nArgo CD hook pods (a successful hook's pod is deleted by Argo CD; seen by a watch):")
    print(
        rows_text(
            ("POD", "HOOK", "NODE", "PHASE", "EXIT"),
            [
                (h["pod"], h["hook"], h["node"], h["phase"], "-" if h["exit"] is None else str(h["exit"]))
                for h in outcome.hooks
            ],
        )
    )
    print("\nPlacement of the check chart's StatefulSet (gpu-scheduler-tests):")
    print(outcome.placement)


def run(workdir: Path | None = None, timeout: float = 300, webhook: bool = False) -> int:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gpu-scheduler-gitops-"))
    started = time.monotonic()
    say("building the image from the Dockerfile (make image: mmdebstrap base + buildah, no Docker)")
    image = build_image()
    say(
        "starting the local control plane (etcd, kube-apiserver, controller-manager, kube-scheduler, "
        "kwok GPU nodes) and a real kubelet node (containerd, runc, CNI bridge, kube-proxy)"
    )
    cluster = Cluster.start(workdir, gpu_nodes=3, gpus_per_node=4, real_node=True, images=[image.archive])
    try:
        if webhook:
            say("webhook mode: starting cert-manager (controller, cainjector, webhook) as host processes")
            start_cert_manager(cluster)
        else:
            say(
                "policy mode (argocd/'s default): no cert-manager; the apiserver will inject the GPU "
                "variables (MutatingAdmissionPolicy)"
            )
        say(
            "starting Argo CD (miniredis, repo-server, application-controller, applicationset-controller "
            "with --enable-progressive-syncs) as host processes"
        )
        start_argocd(cluster)
        repo_url = bare_repository(workdir / "git" / "gpu-scheduler.git", REPO)
        say(f"this checkout committed into {repo_url} (branch main)")
        say(
            f"applying argocd/ with gpu-scheduler.io/repo-url={repo_url} and image {image.ref} "
            "(pullPolicy Never) in the ApplicationSets' Helm values"
            + (", and webhook mode (argocd/README.md)" if webhook else "; nothing else changed")
        )
        outcome = sync_argocd(cluster, image, repo_url, timeout, webhook=webhook)
        report(outcome)
        print(f"\ngitops-demo took {time.monotonic() - started:.0f}s")
        if not outcome.ok:
            say(
                "NOT done: "
                + "; ".join(
                    what
                    for what, good in (
                        ("Applications not Synced+Healthy or their syncs not Succeeded", outcome.synced),
                        ("the RollingSync did not settle (a sync still queued or running)", outcome.settled),
                        (
                            f"scheduler{'/webhook' if webhook else ''} not Ready pods on {NODE_NAME}",
                            outcome.components_ok,
                        ),
                        (f"the verification hook did not Succeed on {NODE_NAME}", outcome.hooks_ok),
                        ("placement wrong", outcome.placed),
                    )
                    if not good
                )
                + f"; logs in {workdir / 'logs'}"
            )
            with contextlib.suppress(Exception):
                print(cluster.kubectl("get", "applications.argoproj.io", "-n", "argocd", "-o", "wide").stdout)
                print(cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout)
                print(
                    cluster.kubectl(
                        "logs",
                        "-n",
                        SYSTEM_NS,
                        "-l",
                        f"app.kubernetes.io/instance={RELEASE}",
                        "--tail=30",
                        "--all-containers",
                        "--prefix",
                        check=False,
                    ).stdout
                )
            return 1
        say(
            "both Applications Synced and Healthy, in order; the scheduler"
            + (" and the webhook" if webhook else "")
            + f" Ready as pods on {NODE_NAME}; the verification hook Succeeded there; every replica on its "
            "mapped node with its GPUs" + ("" if webhook else "; no certificate anywhere (policy mode)")
        )
        return 0
    finally:
        cluster.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m localcluster.gitops_demo", description=__doc__)
    parser.add_argument(
        "--webhook", action="store_true", help="argocd/README.md's webhook mode, with cert-manager"
    )
    args = parser.parse_args(argv)
    sys.exit(run(webhook=args.webhook))


if __name__ == "__main__":
    main()
