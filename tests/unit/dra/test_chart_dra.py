"""gpu-scheduler-chart in DRA mode (dra.enabled, docs/dra.md): what it renders and refuses."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.support.charts import SCHEDULER_CHART, one, render, template

CHART = SCHEDULER_CHART
FULL = "rel-gpu-scheduler"
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
DRA_API = "resource.k8s.io/v1/ResourceClaim"
SERVED = ["--api-versions", MAP_API, "--api-versions", DRA_API]
DRA = {"dra": {"enabled": True}}
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    deployment = one(docs, "Deployment", FULL)
    return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(one(docs, "ClusterRole", FULL)["rules"])


def test_dra_mode_renders_the_claim_mutation_the_settings_and_the_rbac() -> None:
    docs = render(
        CHART, values={**DRA, "dra": {"enabled": True, "schedulerName": "my-kube-scheduler"}}, extra=SERVED
    )
    env = env_of(docs)
    assert env["GPU_SCHEDULER_DRA"] == "true"
    assert env["GPU_SCHEDULER_DRA_DRIVER"] == "gpu.nvidia.com"
    assert env["GPU_SCHEDULER_DRA_DEVICE_CLASS"] == "gpu.nvidia.com"
    policy = one(docs, "MutatingAdmissionPolicy", f"{FULL}-inject")
    apply, patch = policy["spec"]["mutations"]
    expression = apply["applyConfiguration"]["expression"]
    for needle in (
        "schedulerName: 'my-kube-scheduler'",
        "resourceClaims: variables.claims.map(c, Object.spec.resourceClaims{name: c[0], resourceClaimName: c[1]})",
        "schedulingGates: [Object.spec.schedulingGates{name: 'gpu-scheduler.io/claim'}]",
        "'gpu-scheduler.io/dra': 'true'",
        "claims: variables.claims.map(r, Object.spec.containers.resources.claims{name: r[0]})",
        "claims: variables.claims.map(r, Object.spec.initContainers.resources.claims{name: r[0]})",
    ):
        assert needle in expression, needle
    # The claims: the own one <pod>-gpus, and one per group of GPUs the same replicas share
    # (tests/integration/test_dra_sharing.py holds them to kube_gpu_scheduler.domain.draclaims).
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "['gpu-scheduler', object.metadata.name + '-gpus']" in variables["claims"]
    assert "'-shared-'" in variables["groups"] and "'gpu-scheduler-shared-'" in variables["claims"]
    assert "CUDA_VISIBLE_DEVICES" not in expression
    assert (
        "key: 'metadata.name', operator: 'In', values: [variables.node]" in patch["jsonPatch"]["expression"]
    )
    granted = {
        (g, r, v)
        for rule in rules(docs)
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    for wanted in [
        ("resource.k8s.io", "resourceclaims", "create"),
        ("resource.k8s.io", "resourceclaims", "delete"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
        ("resource.k8s.io", "resourceclaims/binding", "update"),
        ("resource.k8s.io", "resourceslices", "watch"),
        ("resource.k8s.io", "devicetaintrules", "list"),
        ("resource.k8s.io", "devicetaintrules", "watch"),
        ("apps", "statefulsets", "watch"),
        ("", "pods", "patch"),
    ]:
        assert wanted in granted, wanted
    # Never the allocation's writer's other rights: no update of the claims themselves, no slices writes.
    assert ("resource.k8s.io", "resourceclaims", "update") not in granted
    assert not [w for w in granted if w[1] == "resourceslices" and w[2] not in ("list", "watch")]
    # The DeviceTaintRules are an admin's: read, never written (nor their status).
    assert not [w for w in granted if w[1].startswith("devicetaintrules") and w[2] not in ("list", "watch")]


def test_without_dra_nothing_of_it_is_rendered() -> None:
    docs = render(CHART, values={"injection": {"mode": "policy"}}, extra=SERVED)
    assert "GPU_SCHEDULER_DRA" not in env_of(docs)
    assert not [r for r in rules(docs) if "resource.k8s.io" in r["apiGroups"]]
    assert not [r for r in rules(docs) if "patch" in r["verbs"] and "pods" in r["resources"]]
    expression = one(docs, "MutatingAdmissionPolicy", f"{FULL}-inject")["spec"]["mutations"][0][
        "applyConfiguration"
    ]["expression"]
    assert "resourceClaims" not in expression


@pytest.mark.parametrize(
    ("values", "extra", "message"),
    [
        ({**DRA, "injection": {"mode": "webhook"}}, SERVED, "dra.enabled needs the injection policy"),
        (
            {**DRA, "webhook": {"enabled": True, "caBundle": CA}},
            SERVED,
            "dra.enabled needs the injection policy",
        ),
        (
            {**DRA, "injection": {"mode": "policy"}, "webhook": {"enabled": True, "caBundle": CA}},
            SERVED,
            "dra.enabled and webhook.enabled exclude each other",
        ),
        ({**DRA}, ["--api-versions", MAP_API], "dra.enabled needs resource.k8s.io/v1 (Kubernetes >= 1.34)"),
        ({"dra": {"enabled": True, "driver": "Not A Name"}}, SERVED, "dra/driver"),
        ({"dra": {"enabled": True, "schedulerNmae": "x"}}, SERVED, "schedulerNmae"),
    ],
)
def test_bad_dra_values_fail_with_a_clear_message(
    values: dict[str, Any], extra: list[str], message: str
) -> None:
    res = template(CHART, values=values, extra=extra)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr


def test_notes_say_where_the_gpus_are_and_what_to_do_before_uninstalling(tmp_path: Any) -> None:
    from tests.unit.chart.test_chart_scheduler import render_notes

    notes = render_notes(CHART, tmp_path / "dra", "dra.enabled=true", extra=SERVED)
    assert "DRA mode: each mapped replica gets the ResourceClaim <pod>-gpus" in notes
    assert "allocated by default-scheduler" in notes
    assert 'docs/dra.md "Leftover claims"' in notes
    assert "DRA mode" not in render_notes(CHART, tmp_path / "plain", "injection.mode=policy", extra=SERVED)


def test_the_topology_warning_is_a_policy_of_its_own_with_its_configmap_and_rbac() -> None:
    """A binding whose parameter is missing evaluates nothing (the apiserver skips it), so the
    topology warning has its own policy and the map-warnings policy keeps no parameter: before the
    scheduler publishes the ConfigMap, only the topology warning is missing."""
    docs = render(CHART, values={**DRA, "injection": {"mode": "policy"}}, extra=SERVED)
    assert "paramKind" not in one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map-warnings")["spec"]
    policy = one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map-topology")
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert policy["spec"]["failurePolicy"] == "Ignore"
    binding = one(docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-map-topology")["spec"]
    assert binding["validationActions"] == ["Warn"]
    assert binding["paramRef"] == {
        "name": f"{FULL}-topology",
        "namespace": "gpu-ns",
        "parameterNotFoundAction": "Allow",
    }
    assert env_of(docs)["GPU_SCHEDULER_DRA_TOPOLOGY"] == f"gpu-ns/{FULL}-topology"
    role = one(docs, "Role", f"{FULL}-leader-election")
    assert {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [f"{FULL}-topology"],
        "verbs": ["create", "patch"],
    } in role["rules"]
    # Outside DRA mode: none of it.
    plain = render(CHART, values={"injection": {"mode": "policy"}}, extra=SERVED)
    assert not [d for d in plain if d["metadata"]["name"].endswith(("-map-topology", "-topology"))]
    assert "GPU_SCHEDULER_DRA_TOPOLOGY" not in env_of(plain)
