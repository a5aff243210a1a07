"""gpu-scheduler-chart rendered with helm template: scenarios, values, security, webhook modes."""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fixtures_chart import (
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
    } <= names


def test_defaults_are_scheduler_only() -> None:
    docs = render(CHART)
    assert kinds(docs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} | {
        "Service",
        "Deployment",
    }
    dep = one(docs, "Deployment")
    assert [c["name"] for c in pod_spec(dep)["containers"]] == ["scheduler"]
    assert not find(docs, "MutatingWebhookConfiguration")


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


def walk_schema(node: Any, path: str = "$") -> list[str]:
    """Object schemas with named properties that do not forbid other keys."""
    bad: list[str] = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
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


@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_selectors_are_name_and_instance_only(values_file: Path) -> None:
    docs = render(CHART, [values_file])
    for doc in docs:
        if doc["kind"] == "Deployment":
            assert doc["spec"]["selector"] == {"matchLabels": SELECTOR}
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert SELECTOR.items() <= labels.items()
        elif doc["kind"] == "Service":
            assert doc["spec"]["selector"] == SELECTOR
        elif doc["kind"] in ("PodDisruptionBudget", "NetworkPolicy"):
            sel = doc["spec"]["selector" if doc["kind"] == "PodDisruptionBudget" else "podSelector"]
            assert sel == {"matchLabels": SELECTOR}


def test_tmp_is_an_emptydir_in_every_container() -> None:
    dep = one(render(CHART, [CHART / "ci" / "webhook-cabundle-values.yaml"]), "Deployment")
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
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    spec = pod_spec(dep)
    assert spec["serviceAccountName"] == FULL
    assert spec["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert {t["key"] for t in spec["tolerations"]} == {
        "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/master",
    }


def test_image_defaults_to_app_version_and_can_be_pinned() -> None:
    dep = one(render(CHART), "Deployment")
    assert container(dep, "scheduler")["image"] == "gpu-scheduler:0.1.0"
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
def test_rbac_is_least_privilege() -> None:
    docs = render(CHART)
    role = one(docs, "ClusterRole")
    rules = {
        (g, r): sorted(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert rules == {
        ("", "pods"): ["get", "list", "patch", "watch"],
        ("", "pods/binding"): ["create"],
        ("", "pods/status"): ["patch", "update"],
        ("", "nodes"): ["get", "list", "watch"],
        ("", "events"): ["create", "patch"],
        ("events.k8s.io", "events"): ["create", "patch"],
    }
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULL, "namespace": NS}]
    lease_role = one(docs, "Role")
    assert lease_role["metadata"]["namespace"] == NS
    verbs: set[str] = set()
    for rule in lease_role["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
        verbs |= set(rule["verbs"])
        if "resourceNames" in rule:
            assert rule["resourceNames"] == [FULL]
    assert verbs == {"get", "create", "update"}
    rb = one(docs, "RoleBinding")
    assert rb["roleRef"]["name"] == lease_role["metadata"]["name"]


def test_rbac_can_be_left_out() -> None:
    docs = render(CHART, set_args=["rbac.create=false"])
    assert not find(docs, "ClusterRole") and not find(docs, "Role")


# ---------------------------------------------------------------- webhook
def test_webhook_container_and_service() -> None:
    docs = render(
        CHART, values=webhook_values(injectionMode="nvidia", gpuResourcePolicy="deny", failurePolicy="Fail")
    )
    dep = one(docs, "Deployment")
    c = container(dep, "webhook")
    assert c["command"] == ["gpu-scheduler-webhook"]
    env = env_of(c)
    assert env["WEBHOOK_INJECTION_MODE"] == "nvidia"
    assert env["WEBHOOK_GPU_RESOURCE_POLICY"] == "deny"
    assert env["WEBHOOK_PORT"] == "8443"
    assert env["WEBHOOK_TLS_CERT_FILE"] == "/etc/webhook/certs/tls.crt"
    assert env["WEBHOOK_TLS_KEY_FILE"] == "/etc/webhook/certs/tls.key"
    assert c["ports"][0]["containerPort"] == 8443
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "webhook", "scheme": "HTTPS"}
    assert {"name": "webhook-certs", "mountPath": "/etc/webhook/certs", "readOnly": True} in c["volumeMounts"]
    volumes = {v["name"]: v for v in pod_spec(dep)["volumes"]}
    assert volumes["webhook-certs"]["secret"]["secretName"] == f"{WEBHOOK}-tls"
    svc = one(docs, "Service", WEBHOOK)
    assert svc["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    mutating = one(docs, "MutatingWebhookConfiguration")
    assert mutating["webhooks"][0]["failurePolicy"] == "Fail"


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
    (cond,) = hook["matchConditions"]
    assert "'gpu-scheduling-map' in object.metadata.annotations" in cond["expression"]
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
    (cond,) = hook["matchConditions"]
    assert "object.spec.template.metadata.annotations" in cond["expression"]
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
    assert kinds(docs) == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    assert not [d for d in docs if is_hook(d)]
    m = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]
    v = one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]
    assert m == {"url": f"{url}/mutate", "caBundle": CA}
    assert v == {"url": f"{url}/validate", "caBundle": CA}
    # With the scheduler in the cluster: the scheduler only, no webhook container/Service/Secret.
    docs = render(CHART, values=webhook_values(url=url + "/"))
    dep = one(docs, "Deployment")
    assert [c["name"] for c in pod_spec(dep)["containers"]] == ["scheduler"]
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
        ({"replicaCount": 0, "webhook": {"enabled": True, "caBundle": CA}}, "replicaCount"),
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
    volumes = {v["name"]: v for v in pod_spec(one(docs, "Deployment"))["volumes"]}
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
    volumes = {v["name"]: v for v in pod_spec(one(docs, "Deployment"))["volumes"]}
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


# ---------------------------------------------------------------- HA and optional features
def test_ha_scenario_has_pdb_and_anti_affinity() -> None:
    docs = render(CHART, [CHART / "ci" / "ha-values.yaml"])
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    term = pod_spec(dep)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": SELECTOR}
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert one(docs, "NetworkPolicy")["spec"]["policyTypes"] == ["Ingress"]


def test_single_replica_has_no_pdb_and_no_affinity() -> None:
    docs = render(CHART)
    assert not find(docs, "PodDisruptionBudget")
    assert "affinity" not in pod_spec(one(docs, "Deployment"))


def test_explicit_affinity_wins() -> None:
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    dep = one(render(CHART, values={"replicaCount": 3, "affinity": aff}), "Deployment")
    assert pod_spec(dep)["affinity"] == aff


def test_optional_features_are_off_by_default() -> None:
    assert not {"NetworkPolicy", "ServiceMonitor", "PodDisruptionBudget"} & kinds(render(CHART))


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
def render_notes(chart: Path, tmp_path: Path, *set_args: str) -> str:
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
    docs = render(copy, set_args=set_args, extra=["--show-only", "templates/zz-notes.yaml"])
    return str(docs[0]["data"]["notes"])


def test_notes_tell_what_to_run_next(tmp_path: Path) -> None:
    text = render_notes(CHART, tmp_path)
    assert f"rollout status deployment/{FULL}" in text
    assert f"helm test {REL}" in text
    text = render_notes(CHART, tmp_path / "2", "webhook.enabled=true", f"webhook.caBundle={CA}")
    assert f"mutatingwebhookconfiguration,validatingwebhookconfiguration {WEBHOOK}" in text
    assert f"{WEBHOOK}-tls" in text


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
    import yaml

    docs = (SCHEDULER_CHART.parent / "docs" / "charts.md").read_text()
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
                assert f"`{key}.{sub}" in docs, f"{key}.{sub} missing from docs/charts.md"
        else:
            assert f"`{key}`" in docs, f"{key} missing from docs/charts.md"
