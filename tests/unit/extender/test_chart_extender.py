"""gpu-scheduler-chart in extender mode (extender.enabled), rendered with helm template."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from tests.support.charts import SCHEDULER_CHART, find, one, pod_spec, render, template

CHART = SCHEDULER_CHART
NS = "gpu-ns"
FULL = "rel-gpu-scheduler"
KUBE_SCHEDULER = f"{FULL}-kube-scheduler"
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()


def extender_values(**extra: Any) -> dict[str, Any]:
    return {"extender": {"enabled": True, "tls": {"caBundle": CA, "existingSecret": "ext-tls"}, **extra}}


def env_of(doc: dict[str, Any], container: str) -> dict[str, Any]:
    (c,) = [c for c in pod_spec(doc)["containers"] if c["name"] == container]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(yaml.safe_load(one(docs, "ConfigMap", KUBE_SCHEDULER)["data"]["config.yaml"]))


def test_off_by_default() -> None:
    docs = render(CHART)
    assert not find(docs, "ConfigMap") and not find(docs, "Deployment", KUBE_SCHEDULER)
    assert "GPU_SCHEDULER_MODE" not in env_of(one(docs, "Deployment", FULL), "scheduler")


def test_kube_scheduler_profile_calls_the_extender() -> None:
    docs = render(CHART, values={**extender_values(), "scheduler": {"name": "my-gpus"}})
    config = scheduler_config(docs)
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["my-gpus"]
    assert config["percentageOfNodesToScore"] == 100
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceName": KUBE_SCHEDULER,
        "resourceNamespace": NS,
    }
    (ext,) = config["extenders"]
    assert ext["urlPrefix"] == f"https://{FULL}-extender.{NS}.svc:8443"
    assert (ext["filterVerb"], ext["bindVerb"]) == ("filter", "bind")
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False and ext["enableHTTPS"] is True
    assert ext["tlsConfig"] == {"caData": CA}
    assert "managedResources" not in ext


def test_kube_scheduler_image_follows_the_cluster_version_unless_pinned() -> None:
    docs = render(CHART, values=extender_values(), kube_version="1.31.4")
    (c,) = pod_spec(one(docs, "Deployment", KUBE_SCHEDULER))["containers"]
    assert c["image"] == "registry.k8s.io/kube-scheduler:v1.31.4"
    assert "--config=/etc/kube-scheduler/config.yaml" in c["command"]
    pinned = extender_values(kubeScheduler={"image": {"repository": "r/ks", "tag": "v1.37.0"}})
    (c,) = pod_spec(one(render(CHART, values=pinned), "Deployment", KUBE_SCHEDULER))["containers"]
    assert c["image"] == "r/ks:v1.37.0"


def test_gpu_scheduler_runs_in_extender_mode_behind_its_service() -> None:
    docs = render(CHART, values=extender_values())
    dep = one(docs, "Deployment", FULL)
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    env = env_of(dep, "scheduler")
    assert env["GPU_SCHEDULER_MODE"] == "extender"
    assert env["GPU_SCHEDULER_EXTENDER_PORT"] == "8443"
    assert env["GPU_SCHEDULER_EXTENDER_TLS_CERT_FILE"].startswith("/etc/gpu-scheduler/extender-tls/")
    volumes = {v["name"]: v for v in pod_spec(dep)["volumes"]}
    assert volumes["extender-tls"]["secret"]["secretName"] == "ext-tls"
    svc = one(docs, "Service", f"{FULL}-extender")
    assert svc["spec"]["ports"] == [
        {"name": "extender", "port": 8443, "targetPort": "extender", "protocol": "TCP"}
    ]
    assert svc["spec"]["selector"] == one(docs, "Service", FULL)["spec"]["selector"]


def test_tls_pair_in_values_creates_the_secret() -> None:
    values = {"extender": {"enabled": True, "tls": {"caBundle": CA, "crt": "CRT", "key": "KEY"}}}
    secret = one(render(CHART, values=values), "Secret", f"{FULL}-extender-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["tls.crt"]) == b"CRT"


def test_url_mode_renders_no_extender_service() -> None:
    docs = render(CHART, values=extender_values(url="https://127.0.0.1:9443/"))
    assert not find(docs, "Service", f"{FULL}-extender")
    assert scheduler_config(docs)["extenders"][0]["urlPrefix"] == "https://127.0.0.1:9443"


def test_kube_scheduler_rbac() -> None:
    docs = render(CHART, values=extender_values())
    sa = one(docs, "ServiceAccount", KUBE_SCHEDULER)
    assert sa["metadata"]["labels"]["app.kubernetes.io/component"] == "kube-scheduler"
    roles = {
        d["roleRef"]["name"]
        for d in find(docs, "ClusterRoleBinding")
        if d["subjects"] == [{"kind": "ServiceAccount", "name": KUBE_SCHEDULER, "namespace": NS}]
    }
    assert roles == {"system:kube-scheduler", "system:volume-scheduler"}
    role = one(docs, "Role", f"{KUBE_SCHEDULER}-leader-election")
    assert {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [KUBE_SCHEDULER],
        "verbs": ["get", "update"],
    } in role["rules"]
    (reader,) = [d for d in find(docs, "RoleBinding") if d["metadata"]["namespace"] == "kube-system"]
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    assert pod_spec(one(docs, "Deployment", KUBE_SCHEDULER))["serviceAccountName"] == KUBE_SCHEDULER


def test_network_policy_admits_only_kube_scheduler_to_the_extender() -> None:
    docs = render(CHART, values={**extender_values(), "networkPolicy": {"enabled": True}})
    ingress = one(docs, "NetworkPolicy", FULL)["spec"]["ingress"]
    (rule,) = [r for r in ingress if r["ports"][0]["port"] == 8443]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "kube-scheduler"


def test_kube_scheduler_network_policy() -> None:
    """kube-scheduler accepts only its secure port; with egress restricted it reaches the
    apiserver, DNS (its extender URL is a Service name) and the scheduler pods' extender port."""
    docs = render(CHART, values=extender_values())
    spec = one(docs, "NetworkPolicy", KUBE_SCHEDULER)["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "kube-scheduler"
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [{"ports": [{"port": 10259, "protocol": "TCP"}]}]
    docs = render(CHART, values={**extender_values(), "networkPolicy": {"egress": {"enabled": True}}})
    spec = one(docs, "NetworkPolicy", KUBE_SCHEDULER)["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    apiserver, dns, extender = spec["egress"]
    assert [p["port"] for p in apiserver["ports"]] == [443, 6443]
    assert [(p["port"], p["protocol"]) for p in dns["ports"]] == [(53, "UDP"), (53, "TCP")]
    assert extender["ports"] == [{"port": 8443, "protocol": "TCP"}]
    (peer,) = extender["to"]
    assert peer["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gpu-scheduler",
        "app.kubernetes.io/instance": "rel",
    }
    # The extender outside the cluster (extender.url): its address is the user's, so open.
    docs = render(
        CHART,
        values={
            **extender_values(url="https://10.1.2.3:8443"),
            "replicaCount": 0,
            "networkPolicy": {"egress": {"enabled": True}},
        },
    )
    assert one(docs, "NetworkPolicy", KUBE_SCHEDULER)["spec"]["egress"][-1] == {}
    c = pod_spec(one(docs, "Deployment", KUBE_SCHEDULER))["containers"][0]
    assert c["resources"]["requests"]["ephemeral-storage"] and c["resources"]["limits"]["ephemeral-storage"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"extender": {"enabled": True, "tls": {"existingSecret": "s"}}}, "extender.tls.caBundle"),
        ({**extender_values(), "replicaCount": 2}, "replicaCount: 1"),
        ({"extender": {"enabled": True, "tls": {"caBundle": CA}}}, "serving certificate"),
        ({"extender": {"enabled": True, "tls": {"caBundle": CA, "crt": "C"}}}, "go together"),
        (extender_values(url="http://127.0.0.1:1"), "url"),
    ],
    ids=["no-ca", "two-replicas", "no-certificate", "crt-without-key", "http-url"],
)
def test_misconfigurations_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    res = template(CHART, values=values)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr
