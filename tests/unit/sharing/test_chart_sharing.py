"""gpu-scheduler-chart's value sharing.allowed, rendered by helm template: the scheduler's and the
webhook's GPU_SCHEDULER_ALLOW_SHARING, the map policies (policy mode) that admit a shared map
with a warning or refuse it, in the Python's very words (kube_gpu_scheduler.domain.sharing), and
the GPUPinningPolicy field allowSharedGPUs that the tenancy policy reads. What the policies
decide on the real apiserver: tests/integration/test_injection_policy.py, test_tenancy.py."""

from __future__ import annotations

from typing import Any

import pytest

from kube_gpu_scheduler.domain import sharing
from tests.support.charts import SCHEDULER_CHART, one, render, template
from tests.unit.chart.test_chart_scheduler import (
    FULL,
    container,
    env_of,
    scheduler_deployment,
    webhook_deployment,
    webhook_values,
)

CHART = SCHEDULER_CHART
POLICY_MODE = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
FORBIDDEN = {"sharing": {"allowed": False}}


def variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"].get("variables", [])}


def validations(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return list(policy["spec"]["validations"])


def map_policies(values: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = render(CHART, values=values, extra=POLICY_MODE)
    return (
        one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map"),
        one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map-warnings"),
    )


@pytest.mark.parametrize(("values", "want"), [(None, "true"), (FORBIDDEN, "false")])
def test_both_deployments_get_the_setting(values: dict[str, Any] | None, want: str) -> None:
    docs = render(CHART, values={**webhook_values(), **(values or {})})
    assert env_of(container(scheduler_deployment(docs), "scheduler"))[sharing.ENV] == want
    (hook,) = webhook_deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert env_of(hook)[sharing.ENV] == want


def test_by_default_a_shared_map_is_admitted_and_warned_about_in_the_pythons_words() -> None:
    deny, warn = map_policies()
    # The map policy does not look for a GPU named twice.
    assert not {"owned", "pairsOnce", "sharingMessage"} & set(variables(deny))
    assert "pairsOnce" not in variables(deny)["problem"]
    # The warning policy names them, ending with the advice sharing.warning gives.
    found = [v for v in validations(warn) if v.get("messageExpression") == "variables.sharingMessage"]
    assert len(found) == 1 and found[0]["expression"] == "variables.sharingMessage == ''"
    message = variables(warn)["sharingMessage"]
    assert f"'; {sharing.ADVICE}'" in message
    assert "'gpu-scheduling-map shares GPUs between replicas: '" in message
    # Only for a StatefulSet or a pod not created by the StatefulSet controller (the policy's
    # matchConditions leave the controller's pods out), of this release's scheduler.
    assert variables(warn)["sharingChecked"] == "variables.onTemplate && variables.ours"
    conditions = {c["name"]: c["expression"] for c in warn["spec"]["matchConditions"]}
    assert (
        "system:serviceaccount:kube-system:statefulset-controller"
        in (conditions["not-from-the-statefulset-controller"])
    )


def test_a_release_that_forbids_sharing_refuses_in_the_pythons_words() -> None:
    deny, warn = map_policies(FORBIDDEN)
    found = variables(deny)
    assert {"owned", "pairsOnce", "sharingMessage", "sharingMessageWhy"} <= set(found)
    assert f"'{sharing.RELEASE_FORBIDS}'" in found["sharingMessageWhy"]
    # This scheduler's StatefulSets and pods only (the policy matches no other): another release
    # may allow sharing.
    assert "!variables.pairsOnce ? variables.sharingMessage :" in found["problem"]
    assert "'gpu-scheduler'" in deny["spec"]["matchConditions"][0]["expression"]
    assert "sharingMessage" not in variables(warn)
    assert not [v for v in validations(warn) if "sharing" in v.get("messageExpression", "")]


def test_the_schema_takes_a_boolean_only() -> None:
    assert template(CHART, set_args=["sharing.allowed=maybe"]).returncode != 0
    assert template(CHART, set_args=["sharing.allowd=false"]).returncode != 0
    assert template(CHART, set_args=["sharing.allowed=false"]).returncode == 0


def test_the_policy_field_and_the_tenancy_policy_words() -> None:
    docs = render(CHART, values={"tenancy": {"enabled": True}}, extra=POLICY_MODE)
    crd = one(docs, "CustomResourceDefinition", "gpupinningpolicies.gpu-scheduler.io")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"][sharing.POLICY_FIELD]["type"] == "boolean"
    assert spec["properties"][sharing.POLICY_FIELD]["default"] is True
    policy = one(docs, "ValidatingAdmissionPolicy", f"{FULL}-tenancy")
    found = variables(policy)
    assert "'unshared.' + p" in found["unshared"]
    # tenant_forbids(policy, namespace), its two names as CEL puts them in.
    before, rest = sharing.tenant_forbids("POLICY", "NS").split("'POLICY'")
    between, after = rest.split("NS")
    assert found["sharingMessageWhy"].endswith(
        f"\"{before}'\" + variables.unshared[0] + \"'{between}\" + request.namespace + '{after}'"
    )
    (refusal,) = [v for v in validations(policy) if "sharingOnce" in v["expression"]]
    assert refusal["reason"] == "Forbidden"
