"""gpu-scheduler-chart rendered with helm template: scenarios, values, security, webhook modes."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.charts import (
    KUBE_VERSIONS,
    SCHEDULER_CHART,
    ci_values,
    find,
    is_hook,
    one,
    pod_spec,
    render,
    template,
)

CHART = SCHEDULER_CHART
NS = "gpu-ns"
REL = "rel"
FULL = "rel-gpu-scheduler"
WEBHOOK = f"{FULL}-webhook"
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
SELECTOR = {"app.kubernetes.io/name": "gpu-scheduler", "app.kubernetes.io/instance": REL}
WEBHOOK_SELECTOR = {
    "app.kubernetes.io/name": "gpu-scheduler-webhook",
    "app.kubernetes.io/instance": REL,
    "app.kubernetes.io/component": "webhook",
}
SCHEDULER_USER = f"system:serviceaccount:{NS}:{FULL}"
KUBE_SCHEDULER = f"{FULL}-kube-scheduler"
KUBE_SCHEDULER_SELECTOR = {
    "app.kubernetes.io/name": "gpu-scheduler-kube-scheduler",
    "app.kubernetes.io/instance": REL,
    "app.kubernetes.io/component": "kube-scheduler",
}
TEST_SELECTOR = {
    "app.kubernetes.io/name": "gpu-scheduler-test",
    "app.kubernetes.io/instance": REL,
    "app.kubernetes.io/component": "test",
}


# The chart's default placement: control-plane nodes preferred (preferControlPlane), never required.
PREFER_CONTROL_PLANE = {
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "preference": {
                    "matchExpressions": [
                        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                    ]
                },
            }
        ]
    }
}


def webhook_values(**extra: Any) -> dict[str, Any]:
    return {"webhook": {"enabled": True, "caBundle": CA, **extra}}


def container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in pod_spec(doc)["containers"] if c["name"] == name]
    assert found, f"no container {name}"
    return found[0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs if not is_hook(d)}


def scheduler_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", FULL)


def webhook_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", WEBHOOK)


POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


# ---------------------------------------------------------------- scenarios
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_every_ci_scenario_renders(values_file: Path, kube_version: str) -> None:
    docs = render(CHART, [values_file], kube_version=kube_version)
    assert "ServiceAccount" in kinds(docs)
    assert "ClusterRole" in kinds(docs)


def test_ci_scenarios_are_the_documented_ones() -> None:
    names = {p.name.removesuffix("-values.yaml") for p in ci_values(CHART)}
    assert {
        "scheduler-only",
        "webhook-cabundle",
        "webhook-existing-secret",
        "webhook-cert-manager",
        "ha",
        "webhook-client-auth",
    } <= names


def test_defaults_are_scheduler_only() -> None:
    docs = render(CHART)
    # The GPUPinningPolicy CRD too (crds.install), whether tenancy is on or not.
    assert kinds(docs) == RBAC_KINDS | POLICY_KINDS | {
        "Service",
        "Deployment",
        "NetworkPolicy",
        "CustomResourceDefinition",
    }
    dep = one(docs, "Deployment")
    assert dep["metadata"]["name"] == FULL
    assert [c["name"] for c in pod_spec(dep)["containers"]] == ["scheduler"]
    assert not find(docs, "MutatingWebhookConfiguration")
    # Without the webhook: one ServiceAccount, one ClusterRole (the scheduler's).
    assert [d["metadata"]["name"] for d in find(docs, "ServiceAccount")] == [FULL]
    assert [d["metadata"]["name"] for d in find(docs, "ClusterRole")] == [FULL]


# ---------------------------------------------------------------- schema
@pytest.mark.parametrize(
    "bad",
    [
        "webhook.enabeld=true",
        "scheduler.nmae=x",
        "replicas=2",
        "securityContext.readOnlyRootFileSystem=true",
        "webhook.certManager.enable=true",
        "image.tags=v1",
        "podDisruptionBudget.maxUnavailable=1",
        "networkPolicy.egress.enable=true",
        "networkPolicy.apiserver.cidrs=10.0.0.0/8",
    ],
)
def test_schema_rejects_misspelled_keys(bad: str) -> None:
    res = template(CHART, set_args=[bad])
    assert res.returncode != 0
    assert "additional properties" in res.stderr.lower() or "not allowed" in res.stderr.lower(), res.stderr


@pytest.mark.parametrize(
    "bad",
    [
        "webhook.failurePolicy=Sometimes",
        "webhook.injectionMode=rocm",
        "webhook.gpuResourcePolicy=maybe",
        "replicaCount=-1",
        "webhook.url=http://127.0.0.1:8443",
        "scheduler.name=Not_A_Name",
    ],
)
def test_schema_rejects_bad_values(bad: str) -> None:
    assert template(CHART, set_args=[bad]).returncode != 0


# `global` is the one open object: a parent chart's globals (any keys of its own) reach every
# subchart, and a schema closing it would refuse them (docs/charts.md "As a subchart").
OPEN_OBJECTS = {"$.properties.global"}


def walk_schema(node: Any, path: str = "$") -> list[str]:
    """Object schemas with named properties that do not forbid other keys."""
    bad: list[str] = []
    if isinstance(node, dict):
        if (
            "properties" in node
            and node.get("additionalProperties") is not False
            and path not in OPEN_OBJECTS
        ):
            bad.append(path)
        for key, value in node.items():
            bad += walk_schema(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            bad += walk_schema(value, f"{path}[{i}]")
    return bad


@pytest.mark.parametrize("chart", [SCHEDULER_CHART, SCHEDULER_CHART.parent / "gpu-scheduler-check-chart"])
def test_schema_closes_every_object(chart: Path) -> None:
    schema = json.loads((chart / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert walk_schema(schema) == []


# ---------------------------------------------------------------- security, selectors
@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_restricted_security_context_everywhere(values_file: Path) -> None:
    docs = render(CHART, [values_file])
    workloads = [d for d in docs if d["kind"] in ("Deployment", "Pod")]
    assert workloads
    for doc in workloads:
        spec = pod_spec(doc)
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True
        assert psc["runAsUser"] == 65532
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]
            assert c["resources"]["limits"] and c["resources"]["requests"], c["name"]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_every_selector_selects_one_component(values_file: Path) -> None:
    """The scheduler's selectors (Deployment, Service, PDB, NetworkPolicy, anti-affinity)
    select scheduler pods only, the webhook's webhook pods only, the tests' NetworkPolicy
    the helm test pods only. The scheduler Deployment's selector is the old chart's
    (immutable on upgrade)."""
    docs = render(CHART, [values_file])
    pods = {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"][
            "metadata"
        ]["labels"]
        for d in find(docs, "Deployment")
    }
    test_pods = [d["metadata"]["labels"] for d in find(docs, "Pod") if is_hook(d)]
    assert test_pods and all(labels == test_pods[0] for labels in test_pods)
    pods["test"] = test_pods[0]
    assert scheduler_deployment(docs)["spec"]["selector"] == {"matchLabels": SELECTOR}
    selectors: list[tuple[str, dict[str, str]]] = []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "Deployment":
            selectors.append((name, doc["spec"]["selector"]["matchLabels"]))
            for term in (
                pod_spec(doc)
                .get("affinity", {})
                .get("podAntiAffinity", {})
                .get("preferredDuringSchedulingIgnoredDuringExecution", [])
            ):
                selectors.append((name, term["podAffinityTerm"]["labelSelector"]["matchLabels"]))
        elif kind == "Service":
            selectors.append((name, doc["spec"]["selector"]))
        elif kind == "PodDisruptionBudget":
            selectors.append((name, doc["spec"]["selector"]["matchLabels"]))
        elif kind == "NetworkPolicy":
            selectors.append((name, doc["spec"]["podSelector"]["matchLabels"]))
    assert selectors
    for name, selector in selectors:
        selected = [component for component, labels in pods.items() if matches(selector, labels)]
        expected = {WEBHOOK: "webhook", KUBE_SCHEDULER: "kube-scheduler", f"{FULL}-test": "test"}.get(
            name, "scheduler"
        )
        assert selected == [expected], f"{name}: {selector} selects {selected}"
        assert selector in (SELECTOR, WEBHOOK_SELECTOR, KUBE_SCHEDULER_SELECTOR, TEST_SELECTOR), (
            f"{name}: {selector}"
        )


def test_upgrade_from_the_single_deployment_chart_keeps_the_scheduler_deployment() -> None:
    """The old chart ran the webhook as a second container of Deployment FULL. The new
    one keeps that Deployment (same name, same immutable selector) without the webhook
    container, and adds Deployment FULL-webhook whose pods the old selector cannot adopt."""
    docs = render(CHART, values=webhook_values())
    sched, hook = scheduler_deployment(docs), webhook_deployment(docs)
    assert sched["spec"]["selector"]["matchLabels"] == SELECTOR
    assert [c["name"] for c in pod_spec(sched)["containers"]] == ["scheduler"]
    assert [c["name"] for c in pod_spec(hook)["containers"]] == ["webhook"]
    assert not matches(SELECTOR, hook["spec"]["template"]["metadata"]["labels"])
    assert not matches(WEBHOOK_SELECTOR, sched["spec"]["template"]["metadata"]["labels"])
    assert hook["spec"]["selector"] == {"matchLabels": WEBHOOK_SELECTOR}
    assert one(docs, "Service", WEBHOOK)["spec"]["selector"] == WEBHOOK_SELECTOR
    assert one(docs, "Service", FULL)["spec"]["selector"] == SELECTOR
    # Nothing of the webhook is left in the scheduler's pod.
    assert {v["name"] for v in pod_spec(sched)["volumes"]} == {"tmp"}
    assert "annotations" not in sched["spec"]["template"]["metadata"]


@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_tmp_is_an_emptydir_in_every_container(values_file: Path) -> None:
    for dep in find(render(CHART, [values_file]), "Deployment"):
        volumes = {v["name"]: v for v in pod_spec(dep)["volumes"]}
        assert "emptyDir" in volumes["tmp"]
        for c in pod_spec(dep)["containers"]:
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


# ---------------------------------------------------------------- scheduler container
def test_scheduler_container() -> None:
    dep = one(render(CHART, set_args=["scheduler.name=my-sched", "scheduler.logLevel=DEBUG"]), "Deployment")
    c = container(dep, "scheduler")
    assert c["command"] == ["gpu-scheduler"]
    env = env_of(c)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["GPU_SCHEDULER_NAME"] == "my-sched"
    assert env["GPU_SCHEDULER_LEADER_ELECT"] == "true"
    assert env["GPU_SCHEDULER_LEASE_NAME"] == FULL
    assert env["GPU_SCHEDULER_LEASE_NAMESPACE"] == NS
    assert env["GPU_SCHEDULER_HTTP_PORT"] == "8080"
    assert env["GPU_SCHEDULER_LOG_LEVEL"] == "DEBUG"
    # No webhook: nothing to require; recreation of not-injected pods on by default.
    assert env["GPU_SCHEDULER_REQUIRE_INJECTION"] == "false"
    assert env["GPU_SCHEDULER_RECREATE_NOT_INJECTED"] == "true"
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    spec = pod_spec(dep)
    assert spec["serviceAccountName"] == FULL
    assert spec["nodeSelector"] == {
        "kubernetes.io/os": "linux"
    }  # control-plane nodes preferred, never required
    assert spec["affinity"] == PREFER_CONTROL_PLANE
    assert {t["key"] for t in spec["tolerations"]} == {
        "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/master",
    }


@pytest.mark.parametrize(
    ("values", "require", "recreate"),
    [
        ({"webhook": {"enabled": True, "caBundle": CA}}, "true", "true"),
        ({"webhook": {"enabled": True, "caBundle": CA, "url": "https://127.0.0.1:9443"}}, "true", "true"),
        (
            {
                "webhook": {"enabled": True, "caBundle": CA},
                "scheduler": {"name": "gpu-scheduler", "recreateNotInjected": False},
            },
            "true",
            "false",
        ),
        ({"webhook": {"enabled": False}}, "false", "true"),
    ],
)
def test_scheduler_injection_settings_follow_the_webhook(
    values: dict[str, Any], require: str, recreate: str
) -> None:
    env = env_of(container(scheduler_deployment(render(CHART, values=values)), "scheduler"))
    assert env["GPU_SCHEDULER_REQUIRE_INJECTION"] == require
    assert env["GPU_SCHEDULER_RECREATE_NOT_INJECTED"] == recreate


@pytest.mark.parametrize(
    ("values", "want"),
    [({}, "false"), ({"scheduler": {"name": "s", "rollout": {"evictOtherWorkloads": True}}}, "true")],
)
def test_scheduler_rollout_may_evict_other_workloads_only_when_asked(
    values: dict[str, Any], want: str
) -> None:
    env = env_of(container(scheduler_deployment(render(CHART, values=values)), "scheduler"))
    assert env["GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS"] == want


def test_image_defaults_to_app_version_and_can_be_pinned() -> None:
    dep = one(render(CHART), "Deployment")
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert (
        container(dep, "scheduler")["image"]
        == f"registry.gitlab.com/evgenii19/gpu-scheduler/gpu-scheduler:{app_version}"
    )
    dep = one(
        render(
            CHART, set_args=["image.repository=reg.example/gs", "image.tag=abc123", "image.pullPolicy=Always"]
        ),
        "Deployment",
    )
    c = container(dep, "scheduler")
    assert (c["image"], c["imagePullPolicy"]) == ("reg.example/gs:abc123", "Always")


def test_health_service() -> None:
    svc = one(render(CHART), "Service", FULL)
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]


# ---------------------------------------------------------------- RBAC
def rule_map(role: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                assert (g, r) not in out, f"{g}/{r} listed twice"
                out[(g, r)] = sorted(rule["verbs"])
    return out


def test_scheduler_rbac_is_exactly_what_it_calls() -> None:
    docs = render(CHART, values=webhook_values())
    role = one(docs, "ClusterRole", FULL)
    assert rule_map(role) == {
        ("", "pods"): ["delete", "get", "list", "watch"],
        ("", "pods/binding"): ["create"],
        ("", "pods/eviction"): ["create"],
        ("apps", "statefulsets"): ["get"],
        ("", "pods/status"): ["patch"],
        ("", "nodes"): ["list", "watch"],
        ("events.k8s.io", "events"): ["create", "patch"],
        # Which namespaces injection serves (a replica admitted without its variables elsewhere
        # waits instead of being recreated): something injects here.
        ("", "namespaces"): ["list", "watch"],
    }
    binding = one(docs, "ClusterRoleBinding", FULL)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": FULL,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULL, "namespace": NS}]
    lease_role = one(docs, "Role")
    assert lease_role["metadata"]["namespace"] == NS
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [FULL],
            "verbs": ["get", "update"],
        },
    ]
    rb = one(docs, "RoleBinding")
    assert rb["roleRef"]["name"] == lease_role["metadata"]["name"]
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": FULL, "namespace": NS}]


def test_webhook_rbac_is_nodes_list_watch_only() -> None:
    docs = render(CHART, values=webhook_values())
    role = one(docs, "ClusterRole", WEBHOOK)
    assert rule_map(role) == {("", "nodes"): ["list", "watch"]}
    binding = one(docs, "ClusterRoleBinding", WEBHOOK)
    assert binding["roleRef"]["name"] == WEBHOOK
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": WEBHOOK, "namespace": NS}]
    # Its own ServiceAccount, bound to nothing else.
    sa = one(docs, "ServiceAccount", WEBHOOK)
    assert sa["automountServiceAccountToken"] is False
    bound = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any(s["name"] == WEBHOOK for s in d["subjects"])
    ]
    assert bound == [WEBHOOK]
    assert pod_spec(webhook_deployment(docs))["serviceAccountName"] == WEBHOOK
    assert pod_spec(scheduler_deployment(docs))["serviceAccountName"] == FULL


def test_rbac_objects_carry_their_component() -> None:
    """localcluster/rbac.py picks each component's RBAC by this label."""
    docs = render(CHART, values=webhook_values())
    for doc in docs:
        if doc["kind"] in RBAC_KINDS:
            expected = "webhook" if doc["metadata"]["name"] == WEBHOOK else "scheduler"
            assert doc["metadata"]["labels"]["app.kubernetes.io/component"] == expected, doc["metadata"]


def test_webhook_service_account_name_and_annotations() -> None:
    docs = render(
        CHART,
        values=webhook_values(serviceAccount={"name": "hook-sa", "annotations": {"a": "b"}}),
    )
    sa = one(docs, "ServiceAccount", "hook-sa")
    assert sa["metadata"]["annotations"] == {"a": "b"}
    assert one(docs, "ClusterRoleBinding", WEBHOOK)["subjects"][0]["name"] == "hook-sa"
    assert pod_spec(webhook_deployment(docs))["serviceAccountName"] == "hook-sa"


def test_rbac_can_be_left_out() -> None:
    docs = render(CHART, values={**webhook_values(), "rbac": {"create": False}})
    assert not find(docs, "ClusterRole") and not find(docs, "Role")
    assert not find(docs, "ClusterRoleBinding") and not find(docs, "RoleBinding")


# ---------------------------------------------------------------- webhook
def test_webhook_deployment_container_and_service() -> None:
    docs = render(
        CHART,
        values={
            "scheduler": {"name": "my-sched"},
            **webhook_values(injectionMode="nvidia", gpuResourcePolicy="deny", failurePolicy="Fail"),
        },
    )
    dep = webhook_deployment(docs)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    (c,) = pod_spec(dep)["containers"]
    assert c["name"] == "webhook" and c["command"] == ["gpu-scheduler-webhook"]
    env = env_of(c)
    assert env["WEBHOOK_INJECTION_MODE"] == "nvidia"
    assert env["WEBHOOK_GPU_RESOURCE_POLICY"] == "deny"
    assert env["WEBHOOK_PORT"] == "8443"
    assert env["WEBHOOK_TLS_CERT_FILE"] == "/etc/webhook/certs/tls.crt"
    assert env["WEBHOOK_TLS_KEY_FILE"] == "/etc/webhook/certs/tls.key"
    assert env["WEBHOOK_SCHEDULER_NAME"] == "my-sched"
    assert "WEBHOOK_CLIENT_CA_FILE" not in env
    assert c["ports"][0]["containerPort"] == 8443
    for probe, path in (
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": "webhook", "scheme": "HTTPS"}
    assert {"name": "webhook-certs", "mountPath": "/etc/webhook/certs", "readOnly": True} in c["volumeMounts"]
    assert c["resources"] == {
        "requests": {"cpu": "50m", "memory": "96Mi", "ephemeral-storage": "64Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi", "ephemeral-storage": "256Mi"},
    }
    spec = pod_spec(dep)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["webhook-certs"]["secret"]["secretName"] == f"{WEBHOOK}-tls"
    assert spec["automountServiceAccountToken"] is True
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["affinity"]["nodeAffinity"] == PREFER_CONTROL_PLANE["nodeAffinity"]
    assert "checksum/webhook-tls" in dep["spec"]["template"]["metadata"]["annotations"]
    svc = one(docs, "Service", WEBHOOK)
    assert svc["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    mutating = one(docs, "MutatingWebhookConfiguration")
    assert mutating["webhooks"][0]["failurePolicy"] == "Fail"


def test_webhook_replicas_pdb_and_anti_affinity() -> None:
    docs = render(CHART, values=webhook_values())
    pdb = one(docs, "PodDisruptionBudget", WEBHOOK)
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": WEBHOOK_SELECTOR}}
    term = pod_spec(webhook_deployment(docs))["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ][0]["podAffinityTerm"]
    assert term == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": WEBHOOK_SELECTOR},
    }
    # The scheduler (1 replica) gets neither (only the control-plane preference).
    assert not find(docs, "PodDisruptionBudget", FULL)
    assert pod_spec(scheduler_deployment(docs))["affinity"] == PREFER_CONTROL_PLANE
    # One webhook replica: no PDB, no anti-affinity; an explicit affinity wins.
    docs = render(CHART, values=webhook_values(replicaCount=1))
    assert not find(docs, "PodDisruptionBudget")
    assert pod_spec(webhook_deployment(docs))["affinity"] == PREFER_CONTROL_PLANE
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    docs = render(CHART, values=webhook_values(affinity=aff))
    assert pod_spec(webhook_deployment(docs))["affinity"] == aff
    assert template(CHART, values=webhook_values(replicaCount=0)).returncode != 0


def test_webhook_runs_without_a_scheduler_pod() -> None:
    docs = render(CHART, values={"replicaCount": 0, **webhook_values()})
    assert [d["metadata"]["name"] for d in find(docs, "Deployment")] == [WEBHOOK]
    assert one(docs, "Service")["metadata"]["name"] == WEBHOOK


def test_webhook_client_auth_mounts_the_ca() -> None:
    crt, _ = self_signed()
    client_ca = base64.b64encode(crt.encode()).decode()
    docs = render(CHART, values=webhook_values(clientAuth={"enabled": True, "caBundle": client_ca}))
    cm = one(docs, "ConfigMap", f"{WEBHOOK}-client-ca")
    assert cm["data"]["ca.crt"].strip() == crt.strip()
    dep = webhook_deployment(docs)
    c = container(dep, "webhook")
    assert env_of(c)["WEBHOOK_CLIENT_CA_FILE"] == "/etc/webhook/client-ca/ca.crt"
    assert {"name": "client-ca", "mountPath": "/etc/webhook/client-ca", "readOnly": True} in c["volumeMounts"]
    volumes = {v["name"]: v for v in pod_spec(dep)["volumes"]}
    assert volumes["client-ca"]["configMap"]["name"] == f"{WEBHOOK}-client-ca"
    # Off by default: no ConfigMap, no variable, no mount.
    docs = render(CHART, values=webhook_values())
    assert [d["metadata"]["name"] for d in find(docs, "ConfigMap") if not is_hook(d)] == [f"{FULL}-test-ca"]
    assert "WEBHOOK_CLIENT_CA_FILE" not in env_of(container(webhook_deployment(docs), "webhook"))


def test_webhook_pods_roll_when_a_certificate_value_changes() -> None:
    def checksum(**extra: Any) -> str:
        dep = webhook_deployment(render(CHART, values=webhook_values(**extra)))
        return str(dep["spec"]["template"]["metadata"]["annotations"]["checksum/webhook-tls"])

    crt, _ = self_signed()
    base = checksum()
    assert checksum(existingSecret="other") != base
    assert checksum(clientAuth={"enabled": True, "caBundle": base64.b64encode(crt.encode()).decode()}) != base
    assert checksum() == base


def test_network_policies_per_component() -> None:
    docs = render(CHART, [CHART / "ci" / "ha-values.yaml"])
    sched = one(docs, "NetworkPolicy", FULL)["spec"]
    assert sched["podSelector"] == {"matchLabels": SELECTOR}
    assert sched["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}]}]
    hook = one(docs, "NetworkPolicy", WEBHOOK)["spec"]
    assert hook["podSelector"] == {"matchLabels": WEBHOOK_SELECTOR}
    assert hook["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]


TEST_PEER = {"podSelector": {"matchLabels": TEST_SELECTOR}}
APISERVER_RULE = {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
DNS_RULE = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}


def test_network_policies_by_default_restrict_ingress_only() -> None:
    """On by default: each component accepts only the port it serves, the helm test pods
    nothing; egress stays open until networkPolicy.egress.enabled."""
    docs = render(CHART, values=webhook_values())
    policies = {d["metadata"]["name"]: d["spec"] for d in find(docs, "NetworkPolicy")}
    assert set(policies) == {FULL, WEBHOOK, f"{FULL}-test"}
    for spec in policies.values():
        assert spec["policyTypes"] == ["Ingress"]
        assert "egress" not in spec
    assert policies[FULL]["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}]}]
    assert policies[WEBHOOK]["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]
    tests = policies[f"{FULL}-test"]
    assert tests["podSelector"] == {"matchLabels": TEST_SELECTOR}
    assert "ingress" not in tests  # policyTypes Ingress without rules: nothing may connect
    assert not find(render(CHART, values={"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_network_policy_peers_keep_the_helm_test_pods_in() -> None:
    health = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    apiserver = [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "10.0.0.11/32"}}]
    docs = render(
        CHART,
        values={
            **webhook_values(),
            "networkPolicy": {"healthFrom": health, "apiserver": {"peers": apiserver}},
        },
    )
    (sched,) = one(docs, "NetworkPolicy", FULL)["spec"]["ingress"]
    assert sched["from"] == [*health, TEST_PEER]
    (hook,) = one(docs, "NetworkPolicy", WEBHOOK)["spec"]["ingress"]
    assert hook == {"ports": [{"port": 8443, "protocol": "TCP"}], "from": [*apiserver, TEST_PEER]}
    # The test pods' labels are what the peer selects, and nothing else of the release selects them.
    pods = [d for d in find(docs, "Pod") if is_hook(d)]
    assert len(pods) == 2
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert matches(TEST_SELECTOR, labels)
        assert not matches(SELECTOR, labels) and not matches(WEBHOOK_SELECTOR, labels)


def test_network_policy_egress() -> None:
    values = {
        **webhook_values(),
        "networkPolicy": {
            "egress": {"enabled": True},
            "apiserver": {"peers": [{"ipBlock": {"cidr": "192.0.2.0/28"}}], "ports": [8443]},
        },
    }
    docs = render(CHART, values=values)
    policies = {d["metadata"]["name"]: d["spec"] for d in find(docs, "NetworkPolicy")}
    apiserver = {"ports": [{"port": 8443, "protocol": "TCP"}], "to": [{"ipBlock": {"cidr": "192.0.2.0/28"}}]}
    for name in (FULL, WEBHOOK):
        assert policies[name]["policyTypes"] == ["Ingress", "Egress"], name
        assert policies[name]["egress"] == [apiserver], name
    tests = policies[f"{FULL}-test"]
    assert tests["policyTypes"] == ["Ingress", "Egress"]
    assert tests["egress"] == [
        DNS_RULE,
        {"ports": [{"port": 8080, "protocol": "TCP"}], "to": [{"podSelector": {"matchLabels": SELECTOR}}]},
        {
            "ports": [{"port": 8443, "protocol": "TCP"}],
            "to": [{"podSelector": {"matchLabels": WEBHOOK_SELECTOR}}],
        },
    ]
    # Defaults: the apiserver on 443 or 6443 anywhere; DNS towards dnsPeers when given.
    dns_peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]
    docs = render(CHART, values={"networkPolicy": {"egress": {"enabled": True, "dnsPeers": dns_peers}}})
    assert one(docs, "NetworkPolicy", FULL)["spec"]["egress"] == [APISERVER_RULE]
    assert one(docs, "NetworkPolicy", f"{FULL}-test")["spec"]["egress"][0] == {**DNS_RULE, "to": dns_peers}
    # tests.schedulerUrl points somewhere of the user's: the test pod's egress is left open.
    docs = render(
        CHART,
        values={
            "networkPolicy": {"egress": {"enabled": True}},
            "tests": {"schedulerUrl": "http://10.1.2.3:8080/healthz"},
        },
    )
    tests = one(docs, "NetworkPolicy", f"{FULL}-test")["spec"]
    assert tests["policyTypes"] == ["Ingress"] and "egress" not in tests


@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_every_container_bounds_its_ephemeral_storage(values_file: Path) -> None:
    """Requests and limits of ephemeral-storage on every container (the helm test pods
    included), and a sizeLimit on every emptyDir, so no pod can fill its node's disk."""
    for doc in render(CHART, [values_file]):
        if doc["kind"] not in ("Deployment", "Pod"):
            continue
        spec = pod_spec(doc)
        for c in spec["containers"]:
            res = c["resources"]
            assert res["requests"]["ephemeral-storage"], (doc["metadata"]["name"], c["name"])
            assert res["limits"]["ephemeral-storage"], (doc["metadata"]["name"], c["name"])
        for v in spec.get("volumes", []):
            if "emptyDir" in v:
                assert v["emptyDir"]["sizeLimit"], (doc["metadata"]["name"], v["name"])


def test_mutating_webhook_configuration() -> None:
    docs = render(CHART, values=webhook_values())
    cfg = one(docs, "MutatingWebhookConfiguration", WEBHOOK)
    (hook,) = cfg["webhooks"]
    assert hook["clientConfig"] == {
        "service": {"name": WEBHOOK, "namespace": NS, "path": "/mutate", "port": 443},
        "caBundle": CA,
    }
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == "Ignore"
    assert 1 <= hook["timeoutSeconds"] <= 30
    cond, whose = hook["matchConditions"]
    assert "'gpu-scheduling-map' in object.metadata.annotations" in cond["expression"]
    # This release's scheduler's pods, or a map no scheduler reads: never another release's.
    assert whose["expression"] == (
        "object.?spec.?schedulerName.orValue('') in ['gpu-scheduler', '', 'default-scheduler']"
    )
    # The webhook's integration tests register the same condition with the real apiserver.
    from tests.integration.fixtures_webhook import POD_SCHEDULER_CONDITION

    assert whose["expression"] == POD_SCHEDULER_CONDITION
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
    assert NS in expr["values"] and "kube-system" in expr["values"]


def test_validating_webhook_configuration() -> None:
    docs = render(CHART, values=webhook_values())
    cfg = one(docs, "ValidatingWebhookConfiguration", WEBHOOK)
    (hook,) = cfg["webhooks"]
    assert hook["clientConfig"]["service"]["path"] == "/validate"
    assert hook["rules"] == [
        {
            "apiGroups": ["apps"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["statefulsets"],
            "scope": "Namespaced",
        }
    ]
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    cond, whose = hook["matchConditions"]
    assert "object.spec.template.metadata.annotations" in cond["expression"]
    assert whose["expression"] == (
        "object.?spec.?template.?spec.?schedulerName.orValue('') in ['gpu-scheduler', '', 'default-scheduler']"
    )
    from tests.integration.fixtures_webhook import STATEFULSET_SCHEDULER_CONDITION

    assert whose["expression"] == STATEFULSET_SCHEDULER_CONDITION
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"][0] == NS
    docs = render(CHART, values={**webhook_values(validating={"enabled": False})})
    assert not find(docs, "ValidatingWebhookConfiguration")


def test_extra_namespace_selector_is_anded() -> None:
    docs = render(
        CHART,
        values=webhook_values(
            excludeNamespaces=[],
            namespaceSelector={
                "matchLabels": {"gpu": "on"},
                "matchExpressions": [{"key": "tier", "operator": "Exists"}],
            },
        ),
    )
    sel = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]
    assert sel["matchLabels"] == {"gpu": "on"}
    assert sel["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NS]},
        {"key": "tier", "operator": "Exists"},
    ]


def test_webhook_url_mode_renders_only_the_configurations() -> None:
    url = "https://127.0.0.1:9443"
    docs = render(CHART, values={"replicaCount": 0, **webhook_values(url=url)})
    assert kinds(docs) == RBAC_KINDS | POLICY_KINDS | {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "CustomResourceDefinition",
    }
    # Both ServiceAccounts, for the processes run outside the cluster.
    assert {d["metadata"]["name"] for d in find(docs, "ServiceAccount")} == {FULL, WEBHOOK}
    assert not [d for d in docs if is_hook(d)]
    m = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]
    v = one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]
    assert m == {"url": f"{url}/mutate", "caBundle": CA}
    assert v == {"url": f"{url}/validate", "caBundle": CA}
    # With the scheduler in the cluster: the scheduler only, no webhook Deployment/Service/Secret.
    docs = render(CHART, values=webhook_values(url=url + "/"))
    dep = one(docs, "Deployment")
    assert dep["metadata"]["name"] == FULL
    assert [c["name"] for c in pod_spec(dep)["containers"]] == ["scheduler"]
    assert not find(docs, "PodDisruptionBudget") and not find(docs, "NetworkPolicy", WEBHOOK)
    assert not find(docs, "Secret") and not find(docs, "Service", WEBHOOK)
    assert one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["url"] == f"{url}/mutate"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"webhook": {"enabled": True}}, "caBundle"),
        (
            {"webhook": {"enabled": True, "url": "https://127.0.0.1:1", "certManager": {"enabled": True}}},
            "caBundle",
        ),
        (
            {"webhook": {"enabled": True, "caBundle": CA, "clientAuth": {"enabled": True}}},
            "clientAuth.caBundle",
        ),
        (
            {
                "webhook": {
                    "enabled": True,
                    "caBundle": CA,
                    "url": "https://127.0.0.1:1",
                    "clientAuth": {"enabled": True, "caBundle": CA},
                }
            },
            "WEBHOOK_CLIENT_CA_FILE",
        ),
        ({"webhook": {"enabled": True, "caBundle": CA, "tls": {"crt": "x"}}}, "go together"),
        (
            {
                "webhook": {
                    "enabled": True,
                    "caBundle": CA,
                    "existingSecret": "s",
                    "tls": {"crt": "c", "key": "k"},
                }
            },
            "excludes",
        ),
    ],
)
def test_webhook_misconfigurations_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    res = template(CHART, values=values)
    assert res.returncode != 0
    assert message in res.stderr


def self_signed() -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{WEBHOOK}.{NS}.svc")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem_cert = cert.public_bytes(serialization.Encoding.PEM).decode()
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return pem_cert, pem_key


def test_tls_from_values_creates_the_secret() -> None:
    crt, key = self_signed()
    ca = base64.b64encode(crt.encode()).decode()
    docs = render(
        CHART, values={"webhook": {"enabled": True, "caBundle": ca, "tls": {"crt": crt, "key": key}}}
    )
    secret = one(docs, "Secret", f"{WEBHOOK}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["tls.crt"]).decode() == crt
    assert base64.b64decode(secret["data"]["tls.key"]).decode() == key
    assert secret["data"]["ca.crt"] == ca
    # The test pod trusts the same CA.
    cm = one(docs, "ConfigMap", f"{FULL}-test-ca")
    assert cm["data"]["ca.crt"].strip() == crt.strip()


def test_existing_secret_is_mounted_not_created() -> None:
    docs = render(CHART, [CHART / "ci" / "webhook-existing-secret-values.yaml"])
    assert not find(docs, "Secret")
    volumes = {v["name"]: v for v in pod_spec(webhook_deployment(docs))["volumes"]}
    assert volumes["webhook-certs"]["secret"]["secretName"] == "gpu-scheduler-webhook-serving-cert"


def test_cert_manager_chain_and_ca_injection() -> None:
    docs = render(CHART, [CHART / "ci" / "webhook-cert-manager-values.yaml"])
    issuers = {d["metadata"]["name"]: d for d in find(docs, "Issuer")}
    certs = {d["metadata"]["name"]: d for d in find(docs, "Certificate")}
    assert issuers[f"{WEBHOOK}-selfsigned"]["spec"] == {"selfSigned": {}}
    ca_cert = certs[f"{WEBHOOK}-ca"]["spec"]
    assert ca_cert["isCA"] is True and ca_cert["issuerRef"]["name"] == f"{WEBHOOK}-selfsigned"
    assert issuers[f"{WEBHOOK}-ca"]["spec"] == {"ca": {"secretName": ca_cert["secretName"]}}
    serving = certs[f"{WEBHOOK}-serving"]["spec"]
    assert serving["issuerRef"]["name"] == f"{WEBHOOK}-ca"
    assert f"{WEBHOOK}.{NS}.svc" in serving["dnsNames"]
    assert serving["secretName"] == f"{WEBHOOK}-tls"
    assert "server auth" in serving["usages"]
    volumes = {v["name"]: v for v in pod_spec(webhook_deployment(docs))["volumes"]}
    assert volumes["webhook-certs"]["secret"]["secretName"] == serving["secretName"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cfg = one(docs, kind)
        assert cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NS}/{WEBHOOK}-serving"
        assert "caBundle" not in cfg["webhooks"][0]["clientConfig"]
    assert not find(docs, "Secret")


def test_cert_manager_with_an_external_issuer() -> None:
    docs = render(
        CHART,
        values={
            "webhook": {
                "enabled": True,
                "certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
            }
        },
    )
    assert not find(docs, "Issuer")
    (cert,) = find(docs, "Certificate")
    assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


# ---------------------------------------------------------------- ValidatingAdmissionPolicy
def policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "ValidatingAdmissionPolicy", f"{FULL}-pods")


def all_expressions(spec: dict[str, Any]) -> list[str]:
    exprs = [c["expression"] for c in spec["matchConditions"]]
    exprs += [v["expression"] for v in spec["variables"]]
    for v in spec["validations"]:
        exprs.append(v["expression"])
        if "messageExpression" in v:
            exprs.append(v["messageExpression"])
    return exprs


def test_admission_policy_and_binding() -> None:
    docs = render(CHART, values={"scheduler": {"name": "my-sched"}})
    spec = policy(docs)["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["pods", "pods/*"],
            "scope": "Namespaced",
        }
    ]
    (cond,) = spec["matchConditions"]
    assert f"request.?userInfo.?username.orValue('') == '{SCHEDULER_USER}'" in cond["expression"]
    assert "'gpu-scheduling-map'" in cond["expression"] and "'gpu-scheduler/assigned'" in cond["expression"]
    for v in spec["validations"]:
        assert v["message"].strip() and v["reason"] in ("Invalid", "Forbidden"), v
    messages = " ".join(v["message"] for v in spec["validations"])
    assert "may not set spec.nodeName" in messages and "my-sched" in messages
    assert "cannot be changed, added or removed" in messages
    assert SCHEDULER_USER in messages
    assert "PodScheduled" in messages
    assert "spec.schedulerName my-sched" in messages
    binding = one(docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-pods")
    assert binding["spec"] == {"policyName": f"{FULL}-pods", "validationActions": ["Deny"]}


def test_admission_policy_follows_the_scheduler_service_account() -> None:
    docs = render(CHART, values={"serviceAccount": {"name": "sched-sa"}})
    user = f"system:serviceaccount:{NS}:sched-sa"
    spec = policy(docs)["spec"]
    assert f"'{user}'" in spec["matchConditions"][0]["expression"]
    assert {v["name"]: v["expression"] for v in spec["variables"]}["isScheduler"] == (
        f"request.?userInfo.?username.orValue('') == '{user}'"
    )


def test_admission_policy_expressions_are_null_safe() -> None:
    """Under failurePolicy Fail an expression error refuses the request: object and
    oldObject (null on CREATE/DELETE) are only ever compared with null or read with
    optional selection, the request's fields other than operation (absent when empty,
    e.g. subResource) likewise, and every map of a variable is read with `in` or `[?key]`."""
    import re

    spec = policy(render(CHART))["spec"]
    for expr in all_expressions(spec):
        flat = " ".join(expr.split())
        # object.field / oldObject.field without the optional `?`.
        assert not re.search(r"\b(object|oldObject)\.(?!\?)", flat), flat
        assert not re.search(r"\brequest\.(?!\?|operation\b)", flat), flat
        # variables.x[key] without `?` (a missing key is an error), except keys known present.
        for m in re.finditer(r"variables\.(\w+)\[(?!\?)", flat):
            assert m.group(1) in ("newStatus", "oldStatus"), flat
        # Every object/oldObject access is guarded by a null check in the same expression.
        if re.search(r"\b(object|oldObject)\.\?", flat) and "request.operation != 'CREATE'" not in flat:
            assert "!= null" in flat or "== null ?" in flat, flat


def test_admission_policy_can_be_turned_off() -> None:
    docs = render(CHART, values={"admissionPolicy": {"enabled": False}})
    assert not POLICY_KINDS & kinds(docs)


# ---------------------------------------------------------------- HA and optional features
def test_ha_scenario_has_pdb_and_anti_affinity() -> None:
    docs = render(CHART, [CHART / "ci" / "ha-values.yaml"])
    dep = scheduler_deployment(docs)
    assert dep["spec"]["replicas"] == 2
    pdb = one(docs, "PodDisruptionBudget", FULL)
    assert pdb["spec"]["minAvailable"] == 1
    term = pod_spec(dep)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": SELECTOR}
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    for policy in find(docs, "NetworkPolicy"):
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert policy["spec"]["egress"], policy["metadata"]["name"]
    assert webhook_deployment(docs)["spec"]["replicas"] == 2


def test_single_replica_has_no_pdb_and_no_anti_affinity() -> None:
    docs = render(CHART)
    assert not find(docs, "PodDisruptionBudget")
    assert pod_spec(one(docs, "Deployment"))["affinity"] == PREFER_CONTROL_PLANE
    off = render(CHART, values={"preferControlPlane": False})
    assert "affinity" not in pod_spec(one(off, "Deployment"))


def test_explicit_affinity_wins() -> None:
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    dep = one(render(CHART, values={"replicaCount": 3, "affinity": aff}), "Deployment")
    assert pod_spec(dep)["affinity"] == aff


def test_optional_features_are_off_by_default() -> None:
    assert not {"ServiceMonitor", "PodDisruptionBudget"} & kinds(render(CHART))


def test_service_monitor() -> None:
    docs = render(CHART, values={"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}})
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["spec"]["endpoints"][0]["port"] == "http"


def test_pod_annotations_labels_pull_secrets_priority() -> None:
    dep = one(
        render(
            CHART,
            values={
                "podAnnotations": {"a": "b"},
                "podLabels": {"team": "gpu"},
                "imagePullSecrets": [{"name": "reg"}],
                "priorityClassName": "system-cluster-critical",
            },
        ),
        "Deployment",
    )
    meta = dep["spec"]["template"]["metadata"]
    assert meta["annotations"] == {"a": "b"}
    assert meta["labels"]["team"] == "gpu"
    assert dep["spec"]["selector"]["matchLabels"] == SELECTOR
    spec = pod_spec(dep)
    assert spec["imagePullSecrets"] == [{"name": "reg"}]
    assert spec["priorityClassName"] == "system-cluster-critical"


# ---------------------------------------------------------------- helm test
def test_helm_test_pods() -> None:
    docs = render(CHART, [CHART / "ci" / "webhook-cabundle-values.yaml"])
    hooks = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pod"}
    assert all(is_hook(d) and d["metadata"]["annotations"]["helm.sh/hook"] == "test" for d in hooks.values())
    health = hooks[f"{FULL}-test-health"]["spec"]["containers"][0]
    assert [*health["command"], *health["args"]] == [
        "gpu-scheduler-check",
        "http-get",
        f"http://{FULL}.{NS}.svc:8080/healthz",
    ]
    webhook = hooks[f"{FULL}-test-webhook"]["spec"]["containers"][0]
    assert [*webhook["command"], *webhook["args"]] == [
        "gpu-scheduler-check",
        "http-get",
        f"https://{WEBHOOK}.{NS}.svc/healthz",
        "--cafile",
        "/etc/gpu-scheduler-test/ca.crt",
    ]
    for pod in hooks.values():
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_helm_test_scheduler_url_override() -> None:
    docs = render(
        CHART, values={"replicaCount": 0, "tests": {"schedulerUrl": "http://127.0.0.1:18080/healthz"}}
    )
    (pod,) = find(docs, "Pod")
    assert pod["spec"]["containers"][0]["args"] == ["http-get", "http://127.0.0.1:18080/healthz"]


# ---------------------------------------------------------------- NOTES, values.yaml
def render_notes(chart: Path, tmp_path: Path, *set_args: str, extra: Sequence[str] = ()) -> str:
    """NOTES.txt as helm prints it after an install. helm template never renders
    NOTES.txt, so a copy of the chart renders it through tpl into a ConfigMap."""
    import shutil

    copy = tmp_path / chart.name
    shutil.copytree(chart, copy)
    (copy / "templates" / "NOTES.txt").rename(copy / "notes.txt")
    (copy / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n'
    )
    docs = render(copy, set_args=set_args, extra=[*extra, "--show-only", "templates/zz-notes.yaml"])
    return str(docs[0]["data"]["notes"])


def test_notes_tell_what_to_run_next(tmp_path: Path) -> None:
    text = render_notes(CHART, tmp_path)
    assert f"rollout status deployment/{FULL}" in text
    assert f"helm test {REL}" in text
    assert f"validatingadmissionpolicy,validatingadmissionpolicybinding {FULL}-pods" in text
    text = render_notes(CHART, tmp_path / "2", "webhook.enabled=true", f"webhook.caBundle={CA}")
    assert f"mutatingwebhookconfiguration,validatingwebhookconfiguration {WEBHOOK}" in text
    assert f"{WEBHOOK}-tls" in text
    assert f"rollout status deployment/{WEBHOOK}" in text
    # The webhook's NetworkPolicy admits any address until the apiserver's are given.
    assert "set\n   networkPolicy.apiserver.peers" in text
    text = render_notes(
        CHART,
        tmp_path / "3",
        "webhook.enabled=true",
        f"webhook.caBundle={CA}",
        "networkPolicy.apiserver.peers[0].ipBlock.cidr=10.0.0.10/32",
    )
    assert "networkPolicy.apiserver.peers" not in text


def documented_keys(values_yaml: Path) -> list[str]:
    """Leaf keys of values.yaml with no comment above them or above an ancestor."""
    undocumented: list[str] = []
    stack: list[tuple[int, bool]] = []  # (indent, documented)
    prev_comment = False
    for line in values_yaml.read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            prev_comment = False
            continue
        if stripped.startswith("#"):
            prev_comment = True
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("- ") or ":" not in stripped:
            prev_comment = False
            continue
        key = stripped.split(":", 1)[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        documented = prev_comment or any(d for _, d in stack)
        stack.append((indent, documented))
        if not documented and stripped.split(":", 1)[1].strip() != "":
            undocumented.append(key)
        prev_comment = False
    return undocumented


@pytest.mark.parametrize("chart", [SCHEDULER_CHART, SCHEDULER_CHART.parent / "gpu-scheduler-check-chart"])
def test_every_value_is_commented(chart: Path) -> None:
    assert documented_keys(chart / "values.yaml") == []


def test_chart_metadata() -> None:
    import yaml

    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["kubeVersion"] == ">=1.31.0-0"
    assert meta["type"] == "application"
    res = template(CHART, kube_version="1.30.0")
    assert res.returncode != 0 and "kubeVersion" in res.stderr


@pytest.mark.parametrize("chart", [SCHEDULER_CHART, SCHEDULER_CHART.parent / "gpu-scheduler-check-chart"])
def test_docs_list_every_value(chart: Path) -> None:
    """The chart's README (its generated values table, the one table of values: docs/charts.md
    links to it) names every value."""
    import yaml

    docs = (chart / "README.md").read_text()
    values = yaml.safe_load((chart / "values.yaml").read_text())
    free_form = {
        "resources",
        "podSecurityContext",
        "securityContext",
        "nodeSelector",
        "podAnnotations",
        "podLabels",
    }
    for key, value in values.items():
        if isinstance(value, dict) and value and key not in free_form:
            for sub in value:
                assert f"`{key}.{sub}" in docs, f"{key}.{sub} missing from {chart.name}/README.md"
        else:
            assert f"`{key}`" in docs, f"{key} missing from {chart.name}/README.md"
