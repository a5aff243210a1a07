"""Both charts installed into the local control plane: every ci/ scenario with
`helm upgrade --install` (no --wait: nothing runs the images here), the objects exist,
the RBAC grants what the scheduler needs, and the helm test commands are readable.

The cert-manager scenario needs cert-manager's CRDs, which the local control plane does
not have: its rendered objects minus the cert-manager.io ones go through a server-side
dry-run instead, and the Issuer/Certificate objects are checked offline
(tests/unit/chart/test_chart_validate.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.clients import load_manifests
from localcluster.cluster import Cluster
from localcluster.release import release_service_account, release_status, webhook_host_values
from tests.integration.fixtures_chart import (
    CHECK_CHART,
    SCHEDULER_CHART,
    ci_values,
    hook_commands,
    is_hook,
    template,
)

SCHEDULER_SCENARIOS = [f for f in ci_values(SCHEDULER_CHART) if "cert-manager" not in f.name]
CERT_MANAGER = SCHEDULER_CHART / "ci" / "webhook-cert-manager-values.yaml"


def isolate_webhooks(values: dict[str, Any], namespace: str) -> dict[str, Any]:
    """Scope the webhook configurations, or in policy mode (what injection.mode auto picks on
    the local control plane when the webhook is off) the injection policies' bindings, to the
    release namespace, which they also exclude: they match nothing, so no other test's pods
    are sent to a webhook that does not run or checked by this release's policies."""
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    if values.get("webhook", {}).get("enabled"):
        values["webhook"]["namespaceSelector"] = selector
    values.setdefault("injection", {})["namespaceSelector"] = selector
    return values


def manifest_objects(cluster: Cluster, release: str, namespace: str) -> list[dict[str, Any]]:
    text = cluster.helm("get", "manifest", release, "--namespace", namespace).stdout
    return load_manifests(text)


def assert_objects_exist(cluster: Cluster, docs: list[dict[str, Any]], namespace: str) -> None:
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        args = [
            "get",
            f"{kind}.{doc['apiVersion'].split('/')[0]}" if "/" in doc["apiVersion"] else kind,
            name,
        ]
        if doc["metadata"].get("namespace"):
            args += ["-n", doc["metadata"]["namespace"]]
        res = cluster.kubectl(*args, "-o", "name", check=False)
        assert res.returncode == 0, f"{kind}/{name} missing: {res.stderr}"


def pods_selected(cluster: Cluster, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
    labels = ",".join(f"{k}={v}" for k, v in selector.items())
    return list(cluster.get_json("pods", "-n", namespace, "-l", labels)["items"])


def assert_selectors_pick_their_own_pods(
    cluster: Cluster, docs: list[dict[str, Any]], namespace: str
) -> None:
    """The controllers create the Deployments' pods (kwok may never run them): each
    Deployment's, Service's, PodDisruptionBudget's and NetworkPolicy's selector picks the
    pods of its own component only, and no Deployment adopts the other's pods."""
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for dep in deployments:
        selector = dep["spec"]["selector"]["matchLabels"]
        cluster.wait_until(
            lambda selector=selector, n=dep["spec"]["replicas"]: (
                len(pods_selected(cluster, namespace, selector)) == n
            ),
            60,
            f"the pods of Deployment {dep['metadata']['name']}",
        )
    component_of = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for d in deployments
    }
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        selector = {
            "Deployment": lambda d: d["spec"]["selector"]["matchLabels"],
            "Service": lambda d: d["spec"]["selector"],
            "PodDisruptionBudget": lambda d: d["spec"]["selector"]["matchLabels"],
            "NetworkPolicy": lambda d: d["spec"]["podSelector"]["matchLabels"],
        }.get(kind, lambda d: None)(doc)
        if not selector:
            continue
        if kind == "NetworkPolicy" and name.endswith("-test"):
            # The helm test pods' policy: no test pod runs here; it must select no other pod.
            assert not pods_selected(cluster, namespace, selector), f"{kind}/{name} selects pods"
            continue
        expected = (
            "webhook"
            if name.endswith("-webhook")
            else "kube-scheduler"
            if name.endswith("-kube-scheduler")
            else "scheduler"
        )
        pods = pods_selected(cluster, namespace, selector)
        assert pods, f"{kind}/{name} selects no pod"
        found = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
        assert found == {expected}, f"{kind}/{name} selects {found} pods"
        if kind == "Deployment":
            for p in pods:
                (owner,) = p["metadata"]["ownerReferences"]
                rs = f"{name}-{p['metadata']['labels']['pod-template-hash']}"
                assert (owner["kind"], owner["name"]) == ("ReplicaSet", rs), owner
                assert component_of[name] == expected


@pytest.mark.parametrize("values_file", SCHEDULER_SCENARIOS, ids=lambda p: p.name)
def test_scheduler_chart_scenario_installs(
    cluster: Cluster, namespace: str, helm_release: Callable[..., str], values_file: Path
) -> None:
    values = isolate_webhooks(yaml.safe_load(values_file.read_text()) or {}, namespace)
    release = helm_release(f"gs-{namespace}", namespace, values, SCHEDULER_CHART)
    status = release_status(cluster, release, namespace)
    assert status and status["info"]["status"] == "deployed"
    docs = manifest_objects(cluster, release, namespace)
    assert {"Deployment", "ServiceAccount", "ClusterRole", "Role"} <= {d["kind"] for d in docs}
    assert_objects_exist(cluster, docs, namespace)
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    expected = {f"{release}-gpu-scheduler"}
    if values.get("webhook", {}).get("enabled"):
        expected.add(f"{release}-gpu-scheduler-webhook")
    if values.get("extender", {}).get("enabled"):
        expected.add(f"{release}-gpu-scheduler-kube-scheduler")
    assert deployments == expected
    # The 1.37 control plane serves MutatingAdmissionPolicy v1: without the webhook,
    # injection.mode auto installs the injection policies.
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "MutatingAdmissionPolicy"}
    webhook = bool(values.get("webhook", {}).get("enabled"))
    assert policies == (set() if webhook else {f"{release}-gpu-scheduler-inject"})
    assert bool([d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]) == webhook
    scheduler = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{release}-gpu-scheduler"
    )
    env = {e["name"]: e.get("value") for e in scheduler["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPU_SCHEDULER_REQUIRE_INJECTION"] == "true"
    assert_selectors_pick_their_own_pods(cluster, docs, namespace)
    commands = hook_commands(cluster, release, namespace)
    assert commands and all(c.argv[0] == "gpu-scheduler-check" and c.argv[1] == "http-get" for c in commands)
    assert commands[0].argv[2] == f"http://{release}-gpu-scheduler.{namespace}.svc:8080/healthz"
    if values.get("webhook", {}).get("enabled"):
        assert any(c.argv[2].startswith("https://") and "--cafile" in c.argv for c in commands)


def test_cert_manager_scenario_passes_server_dry_run(cluster: Cluster, namespace: str) -> None:
    values = isolate_webhooks(yaml.safe_load(CERT_MANAGER.read_text()), namespace)
    res = template(SCHEDULER_CHART, values=values, release=f"cm-{namespace}", namespace=namespace)
    assert res.returncode == 0, res.stderr
    docs = [d for d in load_manifests(res.stdout) if not is_hook(d)]
    cert_manager = [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]
    assert {d["kind"] for d in cert_manager} == {"Issuer", "Certificate"}
    rest = [d for d in docs if d not in cert_manager]
    out = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=yaml.safe_dump_all(rest)
    )
    assert "(server dry run)" in out.stdout


@pytest.mark.parametrize("values_file", ci_values(CHECK_CHART), ids=lambda p: p.name)
def test_check_chart_scenario_installs(
    cluster: Cluster, namespace: str, helm_release: Callable[..., str], values_file: Path
) -> None:
    values = yaml.safe_load(values_file.read_text()) or {}
    # No scheduler chart here: the scheduler's Lease "namespace" is this one (the helm test's
    # Lease Role, an object of the release, goes there even with --no-hooks).
    values = {**values, "waitReady": {**values.get("waitReady", {}), "lease": {"namespace": namespace}}}
    # --no-hooks: the pre-install wait-ready Pod would never finish on a kwok node (it runs
    # nothing); its command is checked below and run for real in test_check_wait_ready.py.
    release = helm_release(f"gc-{namespace}", namespace, values, CHECK_CHART, hooks=False)
    docs = manifest_objects(cluster, release, namespace)
    assert {"StatefulSet", "Service", "ServiceAccount"} <= {d["kind"] for d in docs}
    assert_objects_exist(cluster, docs, namespace)
    sts = json.loads(cluster.kubectl("get", "statefulset", "-n", namespace, "-o", "json").stdout)["items"][0]
    assert sts["spec"]["template"]["spec"]["schedulerName"] == values.get("schedulerName", "gpu-scheduler")
    (command,) = hook_commands(cluster, release, namespace)
    assert command.argv == [
        "gpu-scheduler-check",
        "verify-release",
        "--namespace",
        namespace,
        "--selector",
        f"app.kubernetes.io/name=gpu-scheduler-check,app.kubernetes.io/instance={release}",
        "--timeout",
        str(values.get("tests", {}).get("timeoutSeconds", 120)),
        "--termination-message-path",
        "/dev/termination-log",
    ]
    # The release records its pre-install/pre-upgrade hook: wait-ready on this release's map.
    (wait,) = hook_commands(cluster, release, namespace, "pre-install")
    assert wait.argv[:4] == ["gpu-scheduler-check", "wait-ready", "--namespace", namespace]
    assert wait.argv[wait.argv.index("--map") + 1] == sts["spec"]["template"]["metadata"]["annotations"][
        "gpu-scheduling-map"
    ].rstrip("\n")
    assert [c.argv for c in hook_commands(cluster, release, namespace, "pre-upgrade")] == [wait.argv]


def test_webhook_url_mode_install_and_rbac(
    cluster: Cluster, namespace: str, helm_release: Callable[..., str]
) -> None:
    """What the tests and the demo install: the webhook outside the cluster, no scheduler pod."""
    values = isolate_webhooks(webhook_host_values("https://127.0.0.1:9", cluster.ca_bundle()), namespace)
    release = helm_release(f"gu-{namespace}", namespace, values, SCHEDULER_CHART)
    docs = manifest_objects(cluster, release, namespace)
    # The GPUPinningPolicy CRD only when this release found it missing (crds.install; shared).
    assert {d["kind"] for d in docs} - {"CustomResourceDefinition"} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    mutating = json.loads(
        cluster.kubectl(
            "get", "mutatingwebhookconfiguration", f"{release}-gpu-scheduler-webhook", "-o", "json"
        ).stdout
    )
    assert mutating["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:9/mutate"
    assert release_service_account(cluster, release, namespace, "scheduler") == f"{release}-gpu-scheduler"
    assert (
        release_service_account(cluster, release, namespace, "webhook") == f"{release}-gpu-scheduler-webhook"
    )
    scheduler = f"system:serviceaccount:{namespace}:{release}-gpu-scheduler"
    webhook = f"system:serviceaccount:{namespace}:{release}-gpu-scheduler-webhook"
    lease = f"{release}-gpu-scheduler"
    allowed = [
        (scheduler, "create", "pods/binding", None),
        (scheduler, "delete", "pods", None),
        (scheduler, "watch", "pods", None),
        (scheduler, "patch", "pods/status", None),
        (scheduler, "list", "nodes", None),
        (scheduler, "create", "events.events.k8s.io", None),
        (scheduler, "create", "leases.coordination.k8s.io", namespace),
        (scheduler, "update", f"leases.coordination.k8s.io/{lease}", namespace),
        (webhook, "list", "nodes", None),
        (webhook, "watch", "nodes", None),
    ]
    denied = [
        (scheduler, "patch", "pods", None),
        (scheduler, "update", "pods", None),
        (scheduler, "create", "pods", None),
        (scheduler, "update", "pods/status", None),
        (scheduler, "get", "nodes", None),
        (scheduler, "update", "nodes", None),
        (scheduler, "get", "secrets", None),
        (scheduler, "create", "events", None),
        (scheduler, "update", "leases.coordination.k8s.io/someone-else", namespace),
        (scheduler, "create", "leases.coordination.k8s.io", "kube-system"),
        (webhook, "get", "pods", None),
        (webhook, "create", "pods/binding", None),
        (webhook, "get", "nodes", None),
        (webhook, "get", "secrets", None),
    ]
    for user, verb, resource, ns in allowed + denied:
        scope = ["-n", ns] if ns else ["--all-namespaces"]
        what, _, sub = resource.partition("/") if resource.startswith("pods/") else (resource, "", "")
        if sub:
            scope.append(f"--subresource={sub}")
        res = cluster.kubectl("auth", "can-i", verb, what, f"--as={user}", *scope, check=False)
        expected = "yes" if (user, verb, resource, ns) in allowed else "no"
        assert res.stdout.strip() == expected, (
            f"{user} can-i {verb} {resource} ({ns}): {res.stdout}{res.stderr}"
        )
    # The release's admission policy names the release's scheduler ServiceAccount.
    vap = json.loads(
        cluster.kubectl(
            "get", "validatingadmissionpolicy", f"{release}-gpu-scheduler-pods", "-o", "json"
        ).stdout
    )
    assert f"'{scheduler}'" in vap["spec"]["matchConditions"][0]["expression"]
