"""argocd/ synced by a REAL Argo CD (v3.5, host processes) with a REAL cert-manager.

One control plane with its Service network, cert-manager and Argo CD for the whole
module (the cost is paid once); the scheduler and the webhook run as host processes
with the identities Argo CD and cert-manager created, and every Argo CD hook pod's
command (the check chart's verify-release) runs on the host, its outcome written into
the pod's status (see localcluster/host_components.py: kwok runs no containers).

The tests run in file order over one cluster: the complete ApplicationSet (order,
health, caBundle, drift under RollingSync, project, documented names), its deletion
(order), then each individual ApplicationSet alone (selfHeal), then fresh Applications
(a misplaced replica fails the sync; a path without cert-manager; policy mode, the
ApplicationSets' default, with no certificate at all). The ApplicationSets are applied in
webhook mode (argocd/README.md, "Webhook mode"), the path with cert-manager.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import REPO, Cluster
from localcluster.gitops import argocd_manifest, bare_repository, start_argocd, start_cert_manager
from localcluster.gitops_timeline import APPS, CHECK_NS, SYSTEM_NS, Timeline, app_events, get, observe
from localcluster.host_components import HostComponents
from localcluster.webhook_host import ca_bundle, make_certs

pytestmark = pytest.mark.cluster

SCHED_APP, CHECK_APP = APPS
COMPLETE = "gpu-scheduler-complete"
HOOK = "argocd.argoproj.io/hook"


class GitOps:
    def __init__(self, cluster: Cluster, repo_url: str) -> None:
        self.cluster = cluster
        self.repo_url = repo_url
        self.hosts = HostComponents(cluster)

    def apply(self, name: str) -> None:
        # Webhook mode (argocd/README.md): what these tests cover is the webhook's path with
        # cert-manager; the default, policy mode, is test_policy_mode_syncs_with_no_certificate.
        self.cluster.apply(argocd_manifest(name, self.repo_url, webhook=True))

    def app(self, name: str) -> dict[str, Any]:
        return get(self.cluster, "applications.argoproj.io", name, "-n", "argocd")

    def apps(self) -> dict[str, dict[str, Any]]:
        items = get(self.cluster, "applications.argoproj.io", "-n", "argocd").get("items", [])
        return {a["metadata"]["name"]: a for a in items}

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.hosts.poll()
            if cond():
                return
            time.sleep(0.5)
        apps = self.cluster.kubectl(
            "get", "applications.argoproj.io", "-n", "argocd", "-o", "yaml", check=False
        ).stdout
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}\n{apps[-6000:]}")

    def synced_healthy(self, *names: str) -> bool:
        for n in names:
            st = self.app(n).get("status", {})
            if (
                st.get("sync", {}).get("status") != "Synced"
                or st.get("health", {}).get("status") != "Healthy"
            ):
                return False
        return True

    def operation(self, name: str) -> dict[str, Any]:
        return self.app(name).get("status", {}).get("operationState") or {}

    def request_sync(self, name: str) -> None:
        """What `argocd app sync NAME` asks for (no retry): the Application's operation field."""
        op = {"initiatedBy": {"username": "test"}, "sync": {"syncStrategy": {"hook": {}}}}
        self.cluster.kubectl(
            "patch",
            "applications.argoproj.io",
            name,
            "-n",
            "argocd",
            "--type=merge",
            "-p",
            json.dumps({"operation": op}),
        )

    def delete_app(self, name: str) -> None:
        self.cluster.kubectl(
            "delete", "applications.argoproj.io", name, "-n", "argocd", "--wait=false", check=False
        )
        self.wait(lambda: not self.app(name), f"Application {name} (and its resources) to be deleted", 120)


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


def _hook_results(op: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in (op.get("syncResult") or {}).get("resources") or [] if r.get("hookType")]


def _hook_pods(op: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The hook Pods in a sync result by role: ``verify`` (the check chart's verification,
    whose init container is wait-ready), else by name."""
    out: dict[str, dict[str, Any]] = {}
    for h in _hook_results(op):
        if h["kind"] == "Pod":
            role = "verify" if h["name"].endswith("-test") else h["name"]
            assert role not in out, _hook_results(op)
            out[role] = h
    return out


@pytest.fixture(scope="module")
def complete(gitops: GitOps) -> GitOps:
    """The recommended path: the complete ApplicationSet, both steps Synced and Healthy."""
    gitops.apply("gpu-scheduler-complete-applicationset.yaml")
    tl = Timeline()

    def rolled_out() -> bool:
        """The ApplicationSet's RollingSync is over: both steps Healthy in its status. Until then
        it may still sync an Application that its automated sync has synced already (a second
        operation starts after the first Succeeded: seen when the polls came faster)."""
        appset = get(gitops.cluster, "applicationsets.argoproj.io", COMPLETE, "-n", "argocd")
        steps = (appset.get("status") or {}).get("applicationStatus") or []
        return len(steps) == len(APPS) and all(s.get("status") == "Healthy" for s in steps)

    gitops.wait(
        lambda: (
            observe(gitops.cluster, tl, APPS)
            and gitops.hosts.webhook is not None
            and gitops.operation(CHECK_APP).get("phase") == "Succeeded"
            and rolled_out()
            and observe(gitops.cluster, tl, APPS)  # still Synced, Healthy and Succeeded after it
        ),
        "both Applications Synced and Healthy, their syncs Succeeded, the RollingSync over",
    )
    return gitops


# ---------------------------------------------------------------- the complete ApplicationSet
def test_step_two_syncs_only_after_step_one_is_healthy(complete: GitOps) -> None:
    sched_op, check_op = complete.operation(SCHED_APP), complete.operation(CHECK_APP)
    assert sched_op["phase"] == "Succeeded" and check_op["phase"] == "Succeeded"
    # Step 2's sync began after step 1's sync finished (and the ApplicationSet saw it Healthy).
    assert _ts(check_op["startedAt"]) >= _ts(sched_op["finishedAt"]), (sched_op, check_op)
    appset = get(complete.cluster, "applicationsets.argoproj.io", COMPLETE, "-n", "argocd")
    steps = {s["application"]: s for s in appset["status"]["applicationStatus"]}
    assert steps[SCHED_APP]["step"] == "1" and steps[CHECK_APP]["step"] == "2", steps
    assert all(s["status"] == "Healthy" for s in steps.values()), steps


def test_both_end_synced_and_healthy_with_the_replicas_placed(complete: GitOps) -> None:
    from localcluster.gitops_timeline import placement_table

    assert complete.synced_healthy(SCHED_APP, CHECK_APP)
    table, good = placement_table(complete.cluster)
    assert good, table


def test_the_verification_hook_passes_a_correct_placement(complete: GitOps) -> None:
    """The check chart's verify-release ran as the check sync's Sync hook and passed."""
    pods = _hook_pods(complete.operation(CHECK_APP))
    assert set(pods) == {"verify"}, pods  # the pre-install wait-ready hook is Helm's: Argo CD skips it
    pod = pods["verify"]
    assert pod["hookType"] == "Sync" and pod["hookPhase"] == "Succeeded", pods
    ran = [v for v in complete.hosts.hooks_done.values() if v[0] == f"{CHECK_NS}/{pod['name']}"]
    assert ran and ran[-1][1] == 0, complete.hosts.hooks_done
    # HookSucceeded: the pod and its RBAC are gone after the successful sync.
    assert not get(complete.cluster, "pod", pod["name"], "-n", CHECK_NS)
    # Its first (init) container, wait-ready, found the placement path working.
    logs = [(run / "output.log").read_text() for run in _wait_runs(complete.cluster)]
    assert logs and all('"msg":"placement path ready after ' in log for log in logs), logs


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


def test_the_argocd_app_get_names_in_the_docs_exist(complete: GitOps) -> None:
    docs = [REPO / "argocd" / "README.md", REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = {
        (doc.name, m)
        for doc in docs
        for m in re.findall(r"argocd app (?:get|sync|diff) ([a-z0-9][-a-z0-9]*)", doc.read_text())
    }
    assert named, "the docs name no Application"
    existing = set(complete.apps())
    assert {n for _, n in named} <= existing, (named, existing)


def test_under_rolling_sync_drift_is_reported_and_reverted_by_a_sync(complete: GitOps) -> None:
    """RollingSync turns automated sync (so selfHeal) off and re-syncs only on a new revision
    or spec (Argo CD v3.5 applicationset/progressivesync): a live edit shows OutOfSync and
    stays until a sync is requested. argocd/README.md says so."""
    c = complete.cluster
    app = complete.app(CHECK_APP)
    assert app["spec"]["syncPolicy"]["automated"].get("enabled") is False, app["spec"]["syncPolicy"]
    sts = get(c, "statefulsets", "-n", CHECK_NS)["items"][0]
    name, want = sts["metadata"]["name"], sts["spec"]["replicas"]
    c.kubectl("patch", "statefulset", name, "-n", CHECK_NS, "--type=merge", "-p", '{"spec":{"replicas":4}}')

    def drift_reported() -> bool:
        st = complete.app(CHECK_APP).get("status", {})
        return st.get("sync", {}).get("status") == "OutOfSync" and any(
            r["kind"] == "StatefulSet" and r.get("status") == "OutOfSync" for r in st.get("resources", [])
        )

    complete.wait(drift_reported, "Argo CD to report the edited StatefulSet OutOfSync", timeout=60)
    assert get(c, "statefulset", name, "-n", CHECK_NS)["spec"]["replicas"] == 4
    before = complete.operation(CHECK_APP).get("startedAt")
    complete.request_sync(CHECK_APP)
    complete.wait(
        lambda: (
            get(c, "statefulset", name, "-n", CHECK_NS)["spec"]["replicas"] == want
            and complete.operation(CHECK_APP).get("startedAt") != before
            and complete.operation(CHECK_APP).get("phase") == "Succeeded"
            and complete.synced_healthy(CHECK_APP)
        ),
        "the requested sync to restore the replica count",
        timeout=180,
    )


LEASE_MISSING = f"no scheduler holds Lease gpu-scheduler in namespace {SYSTEM_NS}"


def _wait_runs(c: Cluster, release: str = "gpu-scheduler-check") -> set[Path]:
    """The folders where HostComponents ran the wait-ready init container of the check's
    verification hook pods (one per sync)."""
    return set((c.workdir / "hooks").glob(f"{CHECK_NS}-{release}-test-*/wait-ready"))


def _first_sync_of(app: dict[str, Any], revision: str) -> dict[str, Any]:
    """The history entry of the first sync of ``revision`` (RollingSync may sync it twice)."""
    entries = [h for h in app["status"].get("history") or [] if h.get("revision") == revision]
    assert entries, app["status"].get("history")
    return min(entries, key=lambda h: _ts(h["deployStartedAt"]))


def _waiting_polls(log: str) -> list[dict[str, Any]]:
    """wait-ready's "not ready yet" lines that name the missing Lease (one per poll)."""
    return [
        rec
        for rec in (json.loads(line) for line in log.splitlines() if line.startswith("{"))
        if str(rec.get("msg", "")).startswith("not ready yet") and LEASE_MISSING in rec["msg"]
    ]


def _applied_at(obj: dict[str, Any], manager: str = "argocd-controller") -> datetime:
    """When ``manager`` last wrote ``obj``: the apiserver's own record (managedFields[].time)."""
    times = [
        _ts(m["time"]) for m in obj["metadata"].get("managedFields") or [] if m.get("manager") == manager
    ]
    assert times, obj["metadata"].get("managedFields")
    return max(times)


def test_one_commit_changing_both_charts_still_rolls_out_in_order(complete: GitOps) -> None:
    """A new revision of both charts while the scheduler is not ready (stopped: its Lease
    released, as while a new scheduler pod is not up yet). RollingSync may count the
    scheduler's step complete on its previous Healthy (argo-cd issue 29410); the check chart's
    Sync hook does not trust it: its first container (wait-ready) waits, naming the Lease, and
    the verification, which decides the sync, starts only once a scheduler holds it again."""
    from localcluster.gitops import commit_changes

    c = complete.cluster
    assert complete.hosts.scheduler is not None
    before = _wait_runs(c)
    # The scheduler stops; HostComponents restarts it only once told to (scheduler = None).
    stopped = complete.hosts.scheduler
    c.procs.pop("gpu-scheduler", None)
    stopped.stop()
    changes = {}
    for chart in ("gpu-scheduler-chart", "gpu-scheduler-check-chart"):
        text = (REPO / chart / "values.yaml").read_text()
        assert "\npodAnnotations: {}\n" in text, chart
        changes[f"{chart}/values.yaml"] = text.replace(
            "\npodAnnotations: {}\n", '\npodAnnotations:\n  gpu-scheduler.io/test-revision: "2"\n'
        )
    revision = commit_changes(complete.repo_url, changes, "both charts: a pod annotation (a new revision)")
    for app in APPS:  # what a Git webhook does: look at the repository now
        c.kubectl(
            "annotate",
            "applications.argoproj.io",
            app,
            "-n",
            "argocd",
            "argocd.argoproj.io/refresh=normal",
            "--overwrite",
        )

    def waiting_hook() -> Path | None:
        for run in _wait_runs(c) - before:
            if len(_waiting_polls((run / "output.log").read_text(errors="replace"))) >= 2:
                return run  # two polls naming the Lease: it keeps waiting
        return None

    complete.wait(waiting_hook, "the check's wait-ready to wait for the scheduler's Lease", timeout=240)
    (run,) = _wait_runs(c) - before
    assert not (run.parent / "output.log").exists(), "the verification started while wait-ready waited"
    complete.hosts.scheduler = None  # the scheduler comes back (next poll)
    # The check's sync of the new revision, as read when it had Succeeded: RollingSync may start
    # another sync of the same revision right after (CI read an operation without finishedAt a
    # second later), which is not the one these assertions are about.
    synced: dict[str, Any] = {}

    def rolled_out() -> bool:
        op = complete.operation(CHECK_APP)
        done = (
            complete.synced_healthy(SCHED_APP, CHECK_APP)
            and all(complete.app(a)["status"]["sync"].get("revision") == revision for a in APPS)
            and op.get("phase") == "Succeeded"
            and (op.get("syncResult") or {}).get("revision") == revision
        )
        if done:
            synced.update(op)
        return done

    complete.wait(
        rolled_out,
        "both Applications Synced to the new revision and Healthy, the check's sync Succeeded",
        timeout=240,
    )
    sched, check = complete.app(SCHED_APP), complete.app(CHECK_APP)
    lease = get(c, "lease", "gpu-scheduler", "-n", SYSTEM_NS)
    taken = _ts(lease["spec"]["acquireTime"]).replace(microsecond=0)
    sts = get(c, "statefulset", "gpu-scheduler-check", "-n", CHECK_NS, "--show-managed-fields")
    applied = _applied_at(sts)
    log = (run / "output.log").read_text(errors="replace")
    verdict = [json.loads(line) for line in log.splitlines() if '"placement path ready after' in line]
    sched_entry, check_entry = _first_sync_of(sched, revision), _first_sync_of(check, revision)
    print(
        f"new revision {revision[:7]}: scheduler sync {sched_entry['deployStartedAt']}..{sched_entry['deployedAt']}, "
        f"Healthy since {sched['status']['health']['lastTransitionTime']}; check sync from "
        f"{check_entry['deployStartedAt']}; wait-ready waited {len(_waiting_polls(log))} polls, then "
        f"{verdict[-1]['msg'] if verdict else '?'}; Lease taken {lease['spec']['acquireTime']}; "
        f"StatefulSet applied {applied.isoformat()} (in the hook's wave: Argo CD does not gate it)"
    )
    tl = Timeline()
    tl.wall0 = _ts(sched_entry["deployStartedAt"])
    tl.add([*app_events(sched), *app_events(check)])
    print(tl.text())
    # The hook waited while no scheduler held the Lease, and passed once one did.
    assert len(_waiting_polls(log)) >= 2 and verdict and verdict[-1]["ready"] is True, log[-3000:]
    assert verdict[-1]["elapsed_s"] >= 2, verdict
    assert sts["spec"]["template"]["metadata"]["annotations"]["gpu-scheduler.io/test-revision"] == "2"
    # The verification (the hook's container, which decides the sync) started after wait-ready
    # passed, and that was after the restarted scheduler took its Lease; the sync's success too.
    verified = json.loads(
        next(line for line in (run.parent / "output.log").read_text().splitlines() if line.startswith("{"))
    )
    assert _ts(verified["ts"]) >= _ts(verdict[-1]["ts"]) >= _ts(lease["spec"]["acquireTime"]), (
        verified,
        verdict,
    )
    assert _ts(synced["finishedAt"]) >= taken
    # Argo CD's records: the check's sync of this revision finished after the scheduler's own
    # sync of it started. Not that it *started* after it: RollingSync may count the step complete
    # on the previous Healthy (argo-cd issue 29410) and start both syncs in one pass, in either
    # order (seen: the check's 1 s before the scheduler's, and 2 s before its Healthy transition),
    # which is why wait-ready exists and why the assertions above, on the Lease and the hook's own
    # times, decide this test.
    assert _ts(synced["finishedAt"]) >= _ts(sched_entry["deployStartedAt"]), (
        check_entry,
        sched_entry,
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
        conds = (complete.app("outside-the-project").get("status") or {}).get("conditions") or []
        return any(
            c.get("type") == "InvalidSpecError"
            and "namespace 'kube-system'" in c.get("message", "")
            and "allowed destinations in project 'gpu-scheduler'" in c.get("message", "")
            for c in conds
        )

    complete.wait(refused, "Argo CD to refuse the destination kube-system", timeout=60)
    assert not complete.cluster.kubectl(
        "get", "statefulsets", "-n", "kube-system", "-o", "name"
    ).stdout.strip()
    complete.delete_app("outside-the-project")


class AppWatch:
    """Every Application watch event from the apiserver, in its order (a thread)."""

    def __init__(self, cluster: Cluster) -> None:
        from kubernetes import client, watch

        self.events: list[dict[str, Any]] = []
        self._watch = watch.Watch()
        api = client.CustomObjectsApi(cluster.api_client())
        self._stream = self._watch.stream(
            api.list_namespaced_custom_object,
            "argoproj.io",
            "v1alpha1",
            "argocd",
            "applications",
            timeout_seconds=300,
        )
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for ev in self._stream:
                self.events.append({"type": ev["type"], "object": ev["object"]})
                self.ready.set()
        except Exception:  # the connection closed by stop()
            return

    def stop(self) -> None:
        self._watch.stop()
        self._thread.join(timeout=10)


def test_deleting_the_complete_applicationset_removes_the_check_before_the_scheduler(
    complete: GitOps,
) -> None:
    c = complete.cluster
    watch = AppWatch(c)
    assert watch.ready.wait(30), "the watch listed no Application"
    # What existed of the check's workload when the scheduler's Application began to go.
    seen: dict[str, Any] = {}

    def gone() -> bool:
        sched = complete.app(SCHED_APP)
        if sched.get("metadata", {}).get("deletionTimestamp") and "check_sts" not in seen:
            seen["check_sts"] = [
                s["metadata"]["name"] for s in get(c, "statefulsets", "-n", CHECK_NS)["items"]
            ]
        return not complete.apps() and not get(c, "applicationsets.argoproj.io", COMPLETE, "-n", "argocd")

    try:
        c.kubectl("delete", "applicationsets.argoproj.io", COMPLETE, "-n", "argocd", "--wait=false")
        complete.wait(gone, "the ApplicationSet and both Applications to be deleted", timeout=240)
    finally:
        watch.stop()
    complete.hosts.stop()
    events = watch.events

    def first(pred: Callable[[dict[str, Any]], bool]) -> int:
        return next(i for i, e in enumerate(events) if pred(e))

    check_deleted = first(lambda e: e["type"] == "DELETED" and e["object"]["metadata"]["name"] == CHECK_APP)
    sched_deleting = first(
        lambda e: (
            e["object"]["metadata"]["name"] == SCHED_APP
            and bool(e["object"]["metadata"].get("deletionTimestamp"))
        )
    )
    # In the apiserver's own order: the check Application (with its resources: Argo CD's
    # resources finalizer) was gone before the scheduler's deletion started.
    assert check_deleted < sched_deleting, [
        (e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"].get("deletionTimestamp"))
        for e in events
    ]
    assert seen.get("check_sts") == [], seen
    assert not get(c, "deployments", "-n", SYSTEM_NS)["items"]


# ---------------------------------------------------------------- each ApplicationSet alone
def _generated_by(g: GitOps, appset: str) -> list[str]:
    return sorted(
        name
        for name, a in g.apps().items()
        if any(
            o["kind"] == "ApplicationSet" and o["name"] == appset
            for o in a["metadata"].get("ownerReferences", [])
        )
    )


def test_the_scheduler_applicationset_alone(gitops: GitOps) -> None:
    assert not gitops.apps(), "the complete ApplicationSet's Applications are still there"
    gitops.apply("gpu-scheduler-applicationset.yaml")
    gitops.wait(
        lambda: gitops.synced_healthy(SCHED_APP) and gitops.hosts.webhook is not None,
        "the scheduler Application alone Synced and Healthy",
    )
    assert _generated_by(gitops, "gpu-scheduler") == [SCHED_APP]
    assert set(gitops.apps()) == {SCHED_APP}
    # Without RollingSync the Application keeps its automated sync (and selfHeal).
    assert gitops.app(SCHED_APP)["spec"]["syncPolicy"]["automated"].get("enabled") is not False


def test_the_check_applicationset_alone(gitops: GitOps) -> None:
    gitops.apply("gpu-scheduler-check-applicationset.yaml")
    gitops.wait(
        lambda: gitops.synced_healthy(CHECK_APP) and gitops.operation(CHECK_APP).get("phase") == "Succeeded",
        "the check Application Synced and Healthy, its verification hook passed",
    )
    assert _generated_by(gitops, "gpu-scheduler-check") == [CHECK_APP]
    pods = _hook_pods(gitops.operation(CHECK_APP))
    assert {role: h["hookPhase"] for role, h in pods.items()} == {"verify": "Succeeded"}


def test_a_kubectl_edit_of_a_chart_resource_is_reverted_by_self_heal(gitops: GitOps) -> None:
    c = gitops.cluster
    sts = get(c, "statefulsets", "-n", CHECK_NS)["items"][0]
    name, want = sts["metadata"]["name"], sts["spec"]["replicas"]
    c.kubectl("patch", "statefulset", name, "-n", CHECK_NS, "--type=merge", "-p", '{"spec":{"replicas":4}}')
    gitops.wait(
        lambda: (
            get(c, "statefulset", name, "-n", CHECK_NS)["spec"]["replicas"] == want
            and gitops.synced_healthy(CHECK_APP)
            and gitops.operation(CHECK_APP).get("phase") == "Succeeded"
        ),
        "Argo CD to revert the edited replica count (selfHeal)",
        timeout=180,
    )
    op = gitops.operation(CHECK_APP)["operation"]
    assert op["initiatedBy"].get("automated") is True, op
    assert op["sync"].get("autoHealAttemptsCount", 0) >= 1, op


# ---------------------------------------------------------------- fresh Applications
def _application(
    g: GitOps, name: str, path: str, namespace: str, release: str, values: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": name,
            "namespace": "argocd",
            "finalizers": ["resources-finalizer.argocd.argoproj.io"],
        },
        "spec": {
            "project": "gpu-scheduler",
            "source": {
                "repoURL": g.repo_url,
                "targetRevision": "main",
                "path": path,
                "helm": {"releaseName": release, "values": json.dumps(values)},
            },
            "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
            "syncPolicy": {"syncOptions": ["ServerSideApply=true", "ApplyOutOfSyncOnly=true"]},
        },
    }


def test_a_misplaced_replica_fails_the_sync_naming_the_replica(gitops: GitOps) -> None:
    """Replica 1 is mapped to a node that does not exist: the scheduler cannot place it, the
    verification hook fails, the sync ends Failed and the hook's message names the replica."""
    values = {
        "replicaCount": 2,
        "schedulerName": "gpu-scheduler",
        "gpuScheduling": {
            "schedulingMap": [
                {"podIndex": 0, "nodeName": "node1", "gpuDevices": "3"},
                {"podIndex": 1, "nodeName": "no-such-node", "gpuDevices": "0"},
            ]
        },
        "tests": {"timeoutSeconds": 15},
    }
    app = "misplaced-check"
    gitops.cluster.apply(
        _application(gitops, app, "gpu-scheduler-check-chart", CHECK_NS, "misplaced", values)
    )
    gitops.request_sync(app)
    gitops.wait(
        lambda: gitops.operation(app).get("phase") in ("Failed", "Error"), "the sync to fail", timeout=180
    )
    op = gitops.operation(app)
    assert op["phase"] == "Failed", op
    pods = _hook_pods(op)
    # The placement path works (the init container, wait-ready, passes); the verification names
    # the misplaced replica.
    assert set(pods) == {"verify"} and pods["verify"]["hookPhase"] == "Failed", op
    message = pods["verify"]["message"]
    assert not message.startswith("placement path"), message
    assert "misplaced-gpu-scheduler-check-1" in message and "no-such-node" in message, message
    assert "misplaced-gpu-scheduler-check-0" not in message, message  # replica 0 is placed right
    assert "completed unsuccessfully" in op["message"], op["message"]
    # The failed hook pod stays for `kubectl logs` (HookSucceeded deletes only on success).
    failed = get(gitops.cluster, "pod", pods["verify"]["name"], "-n", CHECK_NS)
    assert failed["status"]["phase"] == "Failed"
    gitops.delete_app(app)


def test_a_path_without_cert_manager_syncs(gitops: GitOps, tmp_path: Path) -> None:
    """The scheduler chart with an existing TLS Secret and its caBundle: no cert-manager objects."""
    c = gitops.cluster
    release = "nocm"
    certs = make_certs(tmp_path / "certs", service=f"{release}-gpu-scheduler-webhook", namespace=SYSTEM_NS)
    secret = f"{release}-serving-cert"
    c.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": SYSTEM_NS},
            "data": {
                k: base64.b64encode((certs / f).read_bytes()).decode()
                for k, f in (("tls.crt", "tls.crt"), ("tls.key", "tls.key"), ("ca.crt", "ca.crt"))
            },
        }
    )
    values = {
        "scheduler": {"name": "nocm-scheduler"},
        # Argo CD renders without the cluster: one Application installs the CRD (docs/charts.md).
        "crds": {"install": False},
        "webhook": {
            "enabled": True,
            "existingSecret": secret,
            "caBundle": ca_bundle(certs),
            "failurePolicy": "Ignore",
            # Matches no namespace (the chart also excludes its own): this release's webhook
            # is never called, the other tests' pods keep the cert-manager release's webhook.
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SYSTEM_NS}},
        },
    }
    app = "gpu-scheduler-without-cert-manager"
    c.apply(_application(gitops, app, "gpu-scheduler-chart", SYSTEM_NS, release, values))
    gitops.request_sync(app)
    gitops.wait(
        lambda: gitops.operation(app).get("phase") == "Succeeded" and gitops.synced_healthy(app),
        "the Application without cert-manager Synced and Healthy",
        timeout=180,
    )
    resources = gitops.app(app)["status"]["resources"]
    assert not [r for r in resources if r.get("group") == "cert-manager.io"], resources
    assert {"Deployment", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} <= {
        r["kind"] for r in resources
    }
    hooks = get(c, "mutatingwebhookconfigurations", "-l", f"app.kubernetes.io/instance={release}")["items"]
    assert hooks and all(
        h["clientConfig"]["caBundle"] == ca_bundle(certs) for w in hooks for h in w["webhooks"]
    )
    gitops.delete_app(app)


def test_policy_mode_syncs_with_no_certificate(gitops: GitOps) -> None:
    """The ApplicationSets' default values (injection.mode auto, no webhook): Argo CD renders the
    chart with the cluster's API versions, so the MutatingAdmissionPolicy injects and nothing
    of the webhook or cert-manager is created."""
    c = gitops.cluster
    release = "pol"
    values = {
        "scheduler": {"name": "pol-scheduler"},
        "crds": {"install": False},
        "injection": {
            "mode": "auto",
            # Matches no namespace (the chart also excludes its own): the other tests' pods
            # keep the cert-manager release's webhook alone.
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SYSTEM_NS}},
        },
    }
    app = "gpu-scheduler-policy-mode"
    # The Application below does not create it (no CreateNamespace); run alone, nothing has.
    c.kubectl("create", "namespace", SYSTEM_NS, check=False)
    c.apply(_application(gitops, app, "gpu-scheduler-chart", SYSTEM_NS, release, values))
    gitops.request_sync(app)
    gitops.wait(
        lambda: gitops.operation(app).get("phase") == "Succeeded" and gitops.synced_healthy(app),
        "the policy-mode Application Synced and Healthy",
        timeout=180,
    )
    resources = gitops.app(app)["status"]["resources"]
    kinds = {r["kind"] for r in resources}
    assert {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "Deployment"} <= kinds, kinds
    assert f"{release}-gpu-scheduler-map" in {
        r["name"] for r in resources if r["kind"] == "ValidatingAdmissionPolicy"
    }
    assert not kinds & {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Secret"}, kinds
    assert not [r for r in resources if r.get("group") == "cert-manager.io"], resources
    deployment = get(c, "deployment", f"{release}-gpu-scheduler", "-n", SYSTEM_NS)
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPU_SCHEDULER_REQUIRE_INJECTION"] == "true"
    gitops.delete_app(app)
