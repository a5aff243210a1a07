"""gpu-scheduler-chart with tenancy.enabled, rendered by helm template: the CRD (a template, kept on
uninstall), the grants ConfigMap, the ValidatingAdmissionPolicy (policy mode only), the
scheduler's and the webhook's least privilege on them, and nothing of it by default."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.charts import SCHEDULER_CHART, find, one, render, template
from tests.unit.chart.test_chart_scheduler import (
    FULL,
    NS,
    WEBHOOK,
    container,
    env_of,
    rule_map,
    scheduler_deployment,
    webhook_deployment,
    webhook_values,
)

CHART = SCHEDULER_CHART
POLICY_MODE = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
GRANTS = f"{FULL}-grants"
CRD = "gpupinningpolicies.gpu-scheduler.io"
ON = {"tenancy": {"enabled": True}}


def test_tenancy_is_off_by_default_and_renders_nothing_of_it() -> None:
    """Nothing but the CRD, whose lifecycle is its own (crds.install): policies can be written
    before tenancy is turned on."""
    docs = render(CHART, extra=POLICY_MODE)
    assert find(docs, "CustomResourceDefinition")
    assert not find(
        render(CHART, values={"crds": {"install": False}}, extra=POLICY_MODE), "CustomResourceDefinition"
    )
    assert not find(docs, "ConfigMap", GRANTS)
    assert not find(docs, "ValidatingAdmissionPolicy", f"{FULL}-tenancy")
    env = env_of(container(scheduler_deployment(docs), "scheduler"))
    assert "GPU_SCHEDULER_TENANCY" not in env
    rules = rule_map(one(docs, "ClusterRole", FULL))
    assert ("gpu-scheduler.io", "gpupinningpolicies") not in rules


def test_the_crd_is_a_kept_template_with_printer_columns_and_a_status() -> None:
    crd = one(render(CHART, values=ON), "CustomResourceDefinition", CRD)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"]) == (
        "gpu-scheduler.io",
        "Cluster",
        "GPUPinningPolicy",
    )
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Max": ".spec.maxGPUs",
        "Held": ".status.held",
        "Nodes": ".status.nodes",
        "Age": ".metadata.creationTimestamp",
    }
    schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert schema["required"] == ["namespaceSelector", "nodeSelector"]
    assert set(schema["properties"]) == {
        "namespaceSelector",
        "nodeSelector",
        "maxGPUs",
        "gpuTypes",
        "allowSharedGPUs",
    }


def test_the_scheduler_reads_policies_writes_only_their_status_and_the_grants() -> None:
    docs = render(CHART, values={**ON, **webhook_values()})
    rules = rule_map(one(docs, "ClusterRole", FULL))
    assert rules[("gpu-scheduler.io", "gpupinningpolicies")] == ["get", "list", "watch"]
    assert rules[("gpu-scheduler.io", "gpupinningpolicies/status")] == ["update"]
    assert rules[("", "namespaces")] == ["list", "watch"]
    role = one(docs, "Role", f"{FULL}-leader-election")
    assert {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [GRANTS],
        "verbs": ["patch"],
    } in role["rules"]
    env = env_of(container(scheduler_deployment(docs), "scheduler"))
    assert env["GPU_SCHEDULER_TENANCY"] == "true"
    assert env["GPU_SCHEDULER_TENANCY_GRANTS"] == f"{NS}/{GRANTS}"
    grants = one(docs, "ConfigMap", GRANTS)
    assert grants["metadata"]["namespace"] == NS and "data" not in grants
    # The webhook reads that one ConfigMap, and is told where it is.
    wrole = one(docs, "Role", f"{WEBHOOK}-grants")
    assert wrole["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [GRANTS],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert one(docs, "RoleBinding", f"{WEBHOOK}-grants")["subjects"][0]["name"] == WEBHOOK
    assert (
        env_of(container(webhook_deployment(docs), "webhook"))["WEBHOOK_TENANCY_GRANTS"] == f"{NS}/{GRANTS}"
    )


def test_no_rbac_rule_gives_anyone_else_the_policies() -> None:
    """Tenants get nothing on the policies from the chart: no aggregated role, no other binding."""
    docs = render(CHART, values={**ON, **webhook_values()}, extra=POLICY_MODE)
    for role in find(docs, "ClusterRole") + find(docs, "Role"):
        labels = role["metadata"].get("labels") or {}
        assert not any(k.startswith("rbac.authorization.k8s.io/aggregate-to") for k in labels), role
        if role["metadata"]["name"] != FULL:
            assert all("gpu-scheduler.io" not in r["apiGroups"] for r in role["rules"]), role


def test_the_apply_check_is_a_policy_reading_the_grants_in_policy_mode_only() -> None:
    docs = render(CHART, values=ON, extra=POLICY_MODE)
    policy = one(docs, "ValidatingAdmissionPolicy", f"{FULL}-tenancy")
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = one(docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-tenancy")
    assert binding["spec"]["paramRef"] == {"name": GRANTS, "namespace": NS, "parameterNotFoundAction": "Deny"}
    map_binding = one(docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-map")
    assert binding["spec"]["matchResources"] == map_binding["spec"]["matchResources"]
    webhook_mode = render(CHART, values={**ON, **webhook_values()})
    assert not find(webhook_mode, "ValidatingAdmissionPolicy", f"{FULL}-tenancy")


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ({}, None),
        (webhook_values(), {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NS, "kube-system"]}]}),
        (
            {"injection": {"namespaceSelector": {"matchLabels": {"gpu-scheduling": "enabled"}}}, **webhook_values()},
            {
                "matchLabels": {"gpu-scheduling": "enabled"},
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NS, "kube-system"]}],
            },
        ),
    ],
)  # fmt: skip
def test_the_scheduler_is_told_which_namespaces_injection_serves(
    values: dict[str, Any], want: dict[str, Any] | None
) -> None:
    import json

    env = env_of(container(scheduler_deployment(render(CHART, values=values)), "scheduler"))
    got = env.get("GPU_SCHEDULER_INJECTION_NAMESPACES")
    assert (json.loads(got) if got else None) == want


def test_the_schema_knows_tenancy_and_nothing_else_under_it() -> None:
    res = template(CHART, set_args=["tenancy.enable=true"])
    assert res.returncode != 0 and "enable" in res.stderr
    assert template(CHART, set_args=["tenancy.enabled=yes"]).returncode != 0
