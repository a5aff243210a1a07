"""injection.mode: `webhook` (the webhook injects, as before) or `policy` (a MutatingAdmissionPolicy
injects and ValidatingAdmissionPolicies check the map, with no webhook anywhere).

What the policies decide is tested on the real apiserver (tests/integration/test_injection_policy.py);
here: what each mode renders, and the values each refuses.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.charts import SCHEDULER_CHART, find, one, render, template
from tests.unit.test_chart_scheduler import render_notes

CHART = SCHEDULER_CHART
FULL = "rel-gpu-scheduler"
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
POLICY = {"injection": {"mode": "policy"}}
# Every kind only the webhook needs.
WEBHOOK_KINDS = {
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "Secret",
    "Certificate",
    "Issuer",
    "ConfigMap",
    "PodDisruptionBudget",
}


def names(docs: list[dict[str, Any]], kind: str) -> set[str]:
    return {d["metadata"]["name"] for d in find(docs, kind)}


def mentions_webhook(doc: dict[str, Any]) -> bool:
    meta = doc["metadata"]
    labels = meta.get("labels") or {}
    return "webhook" in meta["name"] or labels.get("app.kubernetes.io/component") == "webhook"


def test_webhook_is_the_default_mode_and_renders_no_policy() -> None:
    for values in ({}, {"webhook": {"enabled": True, "caBundle": CA}}):
        docs = render(CHART, values=values)
        assert not find(docs, "MutatingAdmissionPolicy")
        assert names(docs, "ValidatingAdmissionPolicy") == {f"{FULL}-pods"}


@pytest.mark.parametrize("device_mode", ["cuda", "nvidia"])
def test_policy_mode_renders_the_policies_and_nothing_of_the_webhook(device_mode: str) -> None:
    docs = render(CHART, values={**POLICY, "webhook": {"injectionMode": device_mode}})
    assert names(docs, "MutatingAdmissionPolicy") == {f"{FULL}-inject"}
    assert names(docs, "MutatingAdmissionPolicyBinding") == {f"{FULL}-inject"}
    # The trust rules stay; the map's grammar and its warnings are new.
    vaps = {f"{FULL}-pods", f"{FULL}-map", f"{FULL}-map-warnings"}
    assert names(docs, "ValidatingAdmissionPolicy") == vaps
    assert names(docs, "ValidatingAdmissionPolicyBinding") == vaps
    assert not {d["kind"] for d in docs} & WEBHOOK_KINDS
    assert not [d["metadata"]["name"] for d in docs if mentions_webhook(d)]
    mutation = one(docs, "MutatingAdmissionPolicy")
    text = str(mutation["spec"])
    assert ("NVIDIA_VISIBLE_DEVICES" in text) == (device_mode == "nvidia")
    assert "CUDA_VISIBLE_DEVICES" in text and "PCI_BUS_ID" in text
    patches = [m["applyConfiguration"]["expression"] for m in mutation["spec"]["mutations"]]
    assert [re.search(r"Object\.spec\{(\w+):", p).group(1) for p in patches] == [  # type: ignore[union-attr]
        "containers",
        "initContainers",
    ]
    assert mutation["spec"]["failurePolicy"] == "Fail"


def test_policy_mode_matches_the_schedulers_mapped_replicas() -> None:
    docs = render(CHART, values={**POLICY, "scheduler": {"name": "my-gpus"}})
    condition = one(docs, "MutatingAdmissionPolicy")["spec"]["matchConditions"][0]["expression"]
    assert "'gpu-scheduling-map'" in condition
    assert "== 'my-gpus'" in condition
    assert "'apps.kubernetes.io/pod-index'" in condition
    grammar = one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map")
    rules = grammar["spec"]["matchConstraints"]["resourceRules"]
    assert {r["resources"][0] for r in rules} == {"pods", "statefulsets"}
    assert one(docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-map")["spec"]["validationActions"] == [
        "Deny"
    ]
    warnings = one(docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-map-warnings")
    assert warnings["spec"]["validationActions"] == ["Warn"]
    assert one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map-warnings")["spec"]["failurePolicy"] == "Ignore"


def test_policy_mode_makes_the_scheduler_require_the_injection() -> None:
    for values, require in (({}, "false"), (POLICY, "true")):
        deployment = one(render(CHART, values=values), "Deployment", FULL)
        env = {
            e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["GPU_SCHEDULER_REQUIRE_INJECTION"] == require


def test_the_gpu_resource_policy_is_a_warning_or_a_denial() -> None:
    for policy, vap in (("warn", f"{FULL}-map-warnings"), ("deny", f"{FULL}-map")):
        docs = render(CHART, values={**POLICY, "webhook": {"gpuResourcePolicy": policy}})
        assert "nvidia.com/gpu" in str(one(docs, "ValidatingAdmissionPolicy", vap)["spec"]["validations"])
        other = ({f"{FULL}-map-warnings", f"{FULL}-map"} - {vap}).pop()
        assert "nvidia.com/gpu" not in str(
            one(docs, "ValidatingAdmissionPolicy", other)["spec"]["validations"]
        )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"injection": {"mode": "policies"}}, "injection/mode"),
        ({"injection": {"mode": ""}}, "injection/mode"),
        ({"injection": {"mdoe": "policy"}}, "mdoe"),
    ],
)
def test_bad_injection_values_fail_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    res = template(CHART, values=values)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr


def test_policy_mode_with_the_webhook_on_renders_both_the_middle_step_of_a_migration(tmp_path: Path) -> None:
    """Moving a running release from webhook to policy (docs/injection.md): the policy is added
    while the webhook still injects, and the webhook removed once the policy is in place; the
    release in between runs both (tests/node/test_upgrades.py shows there is no window)."""
    values = {**POLICY, "webhook": {"enabled": True, "caBundle": CA, "tls": {"crt": "c", "key": "k"}}}
    docs = render(CHART, values=values)
    assert names(docs, "MutatingAdmissionPolicy") == {f"{FULL}-inject"}
    assert find(docs, "MutatingWebhookConfiguration")
    assert {d["kind"] for d in docs} >= {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    notes = render_notes(
        CHART, tmp_path, "injection.mode=policy", "webhook.enabled=true", f"webhook.caBundle={CA}"
    )
    assert "AND the webhook is on: both inject" in notes and "--set webhook.enabled=false" in notes, notes
