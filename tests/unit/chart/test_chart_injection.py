"""injection.mode: `webhook` (the webhook injects, as before), `policy` (a MutatingAdmissionPolicy
injects and ValidatingAdmissionPolicies check the map, with no webhook anywhere) or `auto` (the
default: policy where the cluster serves MutatingAdmissionPolicy v1 and the webhook is not enabled).

What the policies decide is tested on the real apiserver (tests/integration/test_injection_policy.py);
here: what each mode renders, with and without the API in helm's capabilities, and the values each
refuses.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.charts import SCHEDULER_CHART, find, one, render, template
from tests.unit.chart.test_chart_scheduler import render_notes

CHART = SCHEDULER_CHART
FULL = "rel-gpu-scheduler"
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
POLICY = {"injection": {"mode": "policy"}}
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
# helm's capabilities of a cluster that serves MutatingAdmissionPolicy v1 (Kubernetes >= 1.36).
SERVED = ["--api-versions", MAP_API]
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


def mode_of(docs: list[dict[str, Any]]) -> str:
    """What a rendering injects with: policy, webhook or nothing."""
    policy = bool(find(docs, "MutatingAdmissionPolicy"))
    webhook = bool(find(docs, "MutatingWebhookConfiguration"))
    assert not (policy and webhook), "both injection modes rendered"
    return "policy" if policy else "webhook" if webhook else "none"


def scheduler_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    deployment = one(docs, "Deployment", FULL)
    return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


WEBHOOK_ON = {"webhook": {"enabled": True, "caBundle": CA}}


@pytest.mark.parametrize(
    ("kube_version", "served", "values", "mode", "require"),
    [
        # auto (the default): policy where the cluster serves the API, nothing injected where not.
        ("1.37.0", True, {}, "policy", "true"),
        ("1.36.0", True, {}, "policy", "true"),
        ("1.37.0", False, {}, "none", "false"),
        ("1.31.0", False, {}, "none", "false"),
        # An installation that enabled the webhook keeps it, whatever the cluster serves.
        ("1.37.0", True, WEBHOOK_ON, "webhook", "true"),
        ("1.31.0", False, WEBHOOK_ON, "webhook", "true"),
        ("1.37.0", True, {"injection": {"mode": "auto"}, **WEBHOOK_ON}, "webhook", "true"),
        # Explicit modes.
        ("1.37.0", True, {"injection": {"mode": "webhook"}}, "none", "false"),
        ("1.37.0", True, {"injection": {"mode": "webhook"}, **WEBHOOK_ON}, "webhook", "true"),
        ("1.31.0", False, {"injection": {"mode": "webhook"}, **WEBHOOK_ON}, "webhook", "true"),
        ("1.37.0", True, POLICY, "policy", "true"),
        ("1.37.0", True, {**POLICY, "webhook": {"enabled": False}}, "policy", "true"),
    ],
)
def test_auto_is_policy_where_the_cluster_serves_it(
    kube_version: str, served: bool, values: dict[str, Any], mode: str, require: str
) -> None:
    docs = render(CHART, values=values, kube_version=kube_version, extra=SERVED if served else [])
    assert mode_of(docs) == mode
    if mode != "policy":
        assert not find(docs, "ValidatingAdmissionPolicy", f"{FULL}-map")
        assert names(docs, "ValidatingAdmissionPolicy") == {f"{FULL}-pods"}
    env = scheduler_env(docs)
    # The scheduler binds only injected pods wherever something injects them.
    assert env["GPU_SCHEDULER_REQUIRE_INJECTION"] == require
    assert env["GPU_SCHEDULER_RECREATE_NOT_INJECTED"] == "true"
    off = render(
        CHART,
        values={**values, "scheduler": {"recreateNotInjected": False}},
        kube_version=kube_version,
        extra=SERVED if served else [],
    )
    assert scheduler_env(off)["GPU_SCHEDULER_RECREATE_NOT_INJECTED"] == "false"
    assert scheduler_env(off)["GPU_SCHEDULER_REQUIRE_INJECTION"] == require


def test_webhook_mode_renders_the_same_with_or_without_the_api() -> None:
    for values in (WEBHOOK_ON, {"injection": {"mode": "webhook"}}):
        with_api = template(CHART, values=values, extra=SERVED)
        without = template(CHART, values=values)
        assert with_api.returncode == 0 and with_api.stdout == without.stdout


@pytest.mark.parametrize("kube_version", ["1.31.0", "1.37.0"])
def test_policy_where_the_cluster_does_not_serve_it_fails_naming_the_version(kube_version: str) -> None:
    res = template(CHART, values=POLICY, kube_version=kube_version)
    assert res.returncode != 0
    assert (
        "injection.mode=policy needs admissionregistration.k8s.io/v1 MutatingAdmissionPolicy "
        f"(Kubernetes >= 1.36), which this cluster does not serve (Kubernetes v{kube_version}"
    ) in res.stderr, res.stderr
    assert f"--api-versions {MAP_API}" in res.stderr


@pytest.mark.parametrize("device_mode", ["cuda", "nvidia", "nvidia-cdi"])
def test_policy_mode_renders_the_policies_and_nothing_of_the_webhook(device_mode: str) -> None:
    docs = render(
        CHART, values={**POLICY, "injection": {"mode": "policy", "deviceMode": device_mode}}, extra=SERVED
    )
    assert names(docs, "MutatingAdmissionPolicy") == {f"{FULL}-inject"}
    assert names(docs, "MutatingAdmissionPolicyBinding") == {f"{FULL}-inject"}
    # The trust rules stay; the map's grammar and its warnings are new; nvidia-cdi: the RuntimeClass.
    vaps = {f"{FULL}-pods", f"{FULL}-map", f"{FULL}-map-warnings"}
    if device_mode == "nvidia-cdi":
        vaps.add(f"{FULL}-runtime-class")
    assert names(docs, "ValidatingAdmissionPolicy") == vaps
    assert names(docs, "ValidatingAdmissionPolicyBinding") == vaps
    assert not {d["kind"] for d in docs} & WEBHOOK_KINDS
    assert not [d["metadata"]["name"] for d in docs if mentions_webhook(d)]
    mutation = one(docs, "MutatingAdmissionPolicy")
    text = str(mutation["spec"])
    assert ("NVIDIA_VISIBLE_DEVICES" in text) == (device_mode != "cuda")
    assert ("runtime.nvidia.com/gpu=" in text) == (device_mode == "nvidia-cdi")
    assert "CUDA_VISIBLE_DEVICES" in text and "PCI_BUS_ID" in text
    # ONE server-side-apply merge for containers and init containers (each merge converts the
    # whole pod: two cost the apiserver measurably more, bench/story.md).
    (patch,) = [m["applyConfiguration"]["expression"] for m in mutation["spec"]["mutations"]]
    fields = ["containers", "initContainers"]
    if device_mode == "nvidia-cdi":
        fields.insert(0, "runtimeClassName")  # given unless the pod names one (then refused)
        assert "optional.of('nvidia')" in patch
    assert re.findall(r"\?(\w+): has\(object\.spec\.\1\)", patch) == fields
    assert mutation["spec"]["failurePolicy"] == "Fail"


@pytest.mark.parametrize(
    ("values", "runtime_class"),
    [
        ({"deviceMode": "nvidia-cdi"}, "nvidia"),
        ({"deviceMode": "nvidia-cdi", "runtimeClassName": "nvidia-cdi"}, "nvidia-cdi"),
        ({"deviceMode": "nvidia-cdi", "runtimeClassName": ""}, None),
        ({"deviceMode": "nvidia", "runtimeClassName": "nvidia"}, None),
    ],
)
def test_nvidia_cdi_gives_the_runtime_class_and_refuses_another(
    values: dict[str, Any], runtime_class: str | None
) -> None:
    """injection.runtimeClassName: what the mutation gives a mapped pod (nvidia-cdi only; "" none),
    what <fullname>-runtime-class refuses, what the webhook is told (WEBHOOK_RUNTIME_CLASS_NAME)."""
    docs = render(CHART, values={"injection": {"mode": "policy", **values}}, extra=SERVED)
    patch = str(one(docs, "MutatingAdmissionPolicy")["spec"]["mutations"])
    assert ("runtimeClassName" in patch) == (runtime_class is not None)
    vap = find(docs, "ValidatingAdmissionPolicy", f"{FULL}-runtime-class")
    binding = find(docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-runtime-class")
    assert len(vap) == len(binding) == (runtime_class is not None)
    if runtime_class is not None:
        assert f"optional.of('{runtime_class}')" in patch
        (validation,) = vap[0]["spec"]["validations"]
        assert validation["expression"] == f"variables.named == '' || variables.named == '{runtime_class}'"
        assert f"RuntimeClass \\'{runtime_class}\\'" in validation["messageExpression"]
        assert binding[0]["spec"]["validationActions"] == ["Deny"]
        # Every pod of this scheduler carrying the map, the StatefulSet controller's too.
        assert "userInfo" not in str(vap[0]["spec"])
    hooked = render(CHART, values={"injection": {"mode": "webhook", **values}, **WEBHOOK_ON}, extra=SERVED)
    env = webhook_env(hooked)
    assert env["WEBHOOK_INJECTION_MODE"] == values["deviceMode"]
    assert env["WEBHOOK_RUNTIME_CLASS_NAME"] == values.get("runtimeClassName", "nvidia")
    assert not find(hooked, "ValidatingAdmissionPolicy", f"{FULL}-runtime-class")


def test_policy_mode_matches_the_schedulers_mapped_replicas() -> None:
    docs = render(CHART, values={**POLICY, "scheduler": {"name": "my-gpus"}}, extra=SERVED)
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


def test_the_map_policy_leaves_the_statefulset_controllers_pods_to_the_statefulset_check() -> None:
    docs = render(CHART, values=POLICY, extra=SERVED)
    conditions = {
        c["name"]: c["expression"]
        for c in one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map")["spec"]["matchConditions"]
    }
    skip = conditions["not-from-the-statefulset-controller"]
    # Who created the pod, as the apiserver authenticated it (a tenant cannot claim it).
    assert "request.userInfo.username != 'system:serviceaccount:kube-system:statefulset-controller'" in skip
    assert "request.userInfo.username != 'system:kube-controller-manager'" in skip
    assert "request.kind.kind != 'Pod' ||" in skip
    # The mutation still sees every pod; the warnings skip the controller's too (they would reach
    # no user, and the template was warned about when written).
    assert "userInfo" not in str(one(docs, "MutatingAdmissionPolicy", f"{FULL}-inject")["spec"])
    warnings = one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map-warnings")["spec"]
    assert {c["name"]: c["expression"] for c in warnings["matchConditions"]}[
        "not-from-the-statefulset-controller"
    ] == skip
    assert not [v["name"] for v in warnings["variables"] if "userInfo" in v["expression"]]


# The policies that read the map, and what each matches besides this release's scheduler's objects.
MAP_READERS = {
    f"{FULL}-map": (),
    f"{FULL}-map-warnings": ("''", "'default-scheduler'"),
    f"{FULL}-inject": (),
    f"{FULL}-tenancy": (),
    f"{FULL}-runtime-class": (),
}


def test_each_policy_that_reads_the_map_matches_its_own_schedulers_objects_only() -> None:
    """N releases side by side cost what one does: a release's policies evaluate the objects
    whose schedulerName is its own (a pod's spec.schedulerName, a StatefulSet's
    spec.template.spec.schedulerName), the warnings also a map no scheduler reads."""
    values = {**POLICY, "scheduler": {"name": "my-gpus"}, "tenancy": {"enabled": True}}
    docs = render(
        CHART,
        values={**values, "injection": {**POLICY["injection"], "deviceMode": "nvidia-cdi"}},
        extra=SERVED,
    )
    policies = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy")
    }
    assert set(MAP_READERS) <= set(policies), sorted(policies)
    for name, also in MAP_READERS.items():
        conditions = " && ".join(c["expression"] for c in policies[name]["spec"]["matchConditions"])
        assert "'my-gpus'" in conditions, name
        kinds = {r["resources"][0] for r in policies[name]["spec"]["matchConstraints"]["resourceRules"]}
        assert "object.?spec.?schedulerName" in conditions, name
        if "statefulsets" in kinds:
            assert "object.?spec.?template.?spec.?schedulerName" in conditions, name
        for other in also:
            assert other in conditions, name
        # Nothing in the policy asks again whose the object is.
        assert "variables.checked" not in str(policies[name]["spec"]), name


@pytest.mark.parametrize("dra", [False, True])
def test_the_map_policy_refuses_pci_bus_ids_outside_dra_mode_only(dra: bool) -> None:
    """GPUNameNeedsDRA: a second validation, rendered unless dra.enabled (the grammar's own
    validation accepts the three forms either way)."""
    served = [*SERVED, "--api-versions", "resource.k8s.io/v1/ResourceClaim"]
    docs = render(CHART, values={**POLICY, "dra": {"enabled": dra}}, extra=served)
    validations = one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map")["spec"]["validations"]
    pci = [v for v in validations if "pciNamed" in v["expression"]]
    assert len(pci) == (0 if dra else 1)
    if not dra:
        assert "PCI bus IDs name GPUs only in DRA mode (chart value dra.enabled=true)" in pci[0]["message"]


@pytest.mark.parametrize("key", ["injection", "webhook"])
def test_the_gpu_resource_policy_is_a_warning_or_a_denial(key: str) -> None:
    for policy, vap in (("warn", f"{FULL}-map-warnings"), ("deny", f"{FULL}-map")):
        docs = render(
            CHART, values={**POLICY, key: {**POLICY.get(key, {}), "gpuResourcePolicy": policy}}, extra=SERVED
        )
        assert "nvidia.com/gpu" in str(one(docs, "ValidatingAdmissionPolicy", vap)["spec"]["validations"])
        other = ({f"{FULL}-map-warnings", f"{FULL}-map"} - {vap}).pop()
        assert "nvidia.com/gpu" not in str(
            one(docs, "ValidatingAdmissionPolicy", other)["spec"]["validations"]
        )


def webhook_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    deployment = one(docs, "Deployment", f"{FULL}-webhook")
    return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def selectors(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The namespaceSelector of every webhook and policy binding rendered."""
    found = [
        w["namespaceSelector"]
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for d in find(docs, kind)
        for w in d["webhooks"]
    ]
    found += [
        d["spec"]["matchResources"]["namespaceSelector"]
        for kind in ("MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding")
        for d in find(docs, kind)
        if d["metadata"]["name"] != f"{FULL}-pods"
    ]
    return found


SETTINGS = {
    "deviceMode": "nvidia",
    "gpuResourcePolicy": "deny",
    "excludeNamespaces": ["ops"],
    "namespaceSelector": {"matchLabels": {"gpu": "on"}},
}
OLD_NAMES = {"deviceMode": "injectionMode"}


@pytest.mark.parametrize("where", ["injection", "webhook (deprecated)"])
@pytest.mark.parametrize("mode", ["webhook", "policy"])
def test_injection_settings_serve_both_modes_under_either_name(where: str, mode: str) -> None:
    if where == "injection":
        values: dict[str, Any] = {"injection": dict(SETTINGS)}
    else:
        values = {"webhook": {OLD_NAMES.get(k, k): v for k, v in SETTINGS.items()}}
    values.setdefault("injection", {})["mode"] = mode
    if mode == "webhook":
        values.setdefault("webhook", {}).update(enabled=True, caBundle=CA)
    docs = render(CHART, values=values, extra=SERVED)
    assert mode_of(docs) == mode
    if mode == "webhook":
        env = webhook_env(docs)
        assert (env["WEBHOOK_INJECTION_MODE"], env["WEBHOOK_GPU_RESOURCE_POLICY"]) == ("nvidia", "deny")
    else:
        assert "NVIDIA_VISIBLE_DEVICES" in str(one(docs, "MutatingAdmissionPolicy")["spec"])
        assert "nvidia.com/gpu" in str(
            one(docs, "ValidatingAdmissionPolicy", f"{FULL}-map")["spec"]["validations"]
        )
    found = selectors(docs)
    assert len(found) == 2 if mode == "webhook" else 3
    for selector in found:
        assert selector["matchLabels"] == {"gpu": "on"}
        assert selector["matchExpressions"][0]["values"] == ["gpu-ns", "ops"]


def test_the_deprecated_name_wins_and_notes_say_where_it_moved(tmp_path) -> None:
    docs = render(
        CHART,
        values={
            **POLICY,
            "injection": {"mode": "policy", "deviceMode": "cuda"},
            "webhook": {"injectionMode": "nvidia"},
        },
        extra=SERVED,
    )
    assert "NVIDIA_VISIBLE_DEVICES" in str(one(docs, "MutatingAdmissionPolicy")["spec"])
    defaults = render(CHART, values=POLICY, extra=SERVED)
    assert "NVIDIA_VISIBLE_DEVICES" not in str(one(defaults, "MutatingAdmissionPolicy")["spec"])
    assert all(s["matchExpressions"][0]["values"] == ["gpu-ns", "kube-system"] for s in selectors(defaults))
    text = render_notes(
        CHART, tmp_path / "old", "webhook.injectionMode=nvidia", "webhook.excludeNamespaces={ops}"
    )
    assert (
        "Deprecated: webhook.injectionMode is set; it still works, but move it to injection.deviceMode"
        in text
    )
    assert (
        "Deprecated: webhook.excludeNamespaces is set; it still works, but move it to injection.excludeNamespaces"
        in text
    )
    assert "gpuResourcePolicy" not in text
    assert "Deprecated" not in render_notes(CHART, tmp_path / "new", "injection.deviceMode=nvidia")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"injection": {"mode": "policies"}}, "injection/mode"),
        ({"injection": {"mode": ""}}, "injection/mode"),
        ({"injection": {"mdoe": "policy"}}, "mdoe"),
        ({"injection": {"deviceMode": "rocm"}}, "injection/deviceMode"),
        ({"webhook": {"injectionMode": "rocm"}}, "webhook/injectionMode"),
        ({"injection": {"runtimeClassName": "Nvidia"}}, "injection/runtimeClassName"),
        ({"injection": {"runtimeClassName": "nvidia;x"}}, "injection/runtimeClassName"),
        ({**POLICY}, "injection.mode=policy needs admissionregistration.k8s.io/v1 MutatingAdmissionPolicy"),
    ],
)
def test_bad_injection_values_fail_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    res = template(CHART, values=values, extra=SERVED if "needs" not in message else [])
    assert res.returncode != 0
    assert message in res.stderr, res.stderr


def test_policy_mode_with_the_webhook_on_renders_both_the_middle_step_of_a_migration(tmp_path: Path) -> None:
    """Moving a running release from webhook to policy (docs/injection.md): the policy is added
    while the webhook still injects, and the webhook removed once the policy is in place; the
    release in between runs both (tests/node/test_upgrades.py shows there is no window)."""
    values = {**POLICY, "webhook": {"enabled": True, "caBundle": CA, "tls": {"crt": "c", "key": "k"}}}
    docs = render(CHART, values=values, extra=SERVED)
    assert names(docs, "MutatingAdmissionPolicy") == {f"{FULL}-inject"}
    assert find(docs, "MutatingWebhookConfiguration")
    assert {d["kind"] for d in docs} >= {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    notes = render_notes(
        CHART,
        tmp_path,
        "injection.mode=policy",
        "webhook.enabled=true",
        f"webhook.caBundle={CA}",
        extra=SERVED,
    )
    assert "AND the webhook is on: both inject" in notes and "--set webhook.enabled=false" in notes, notes


def test_notes_say_what_nvidia_cdi_mode_needs_of_the_nodes(tmp_path: Path) -> None:
    text = render_notes(CHART, tmp_path / "a", "injection.deviceMode=nvidia-cdi", extra=SERVED)
    assert (
        "Device mode nvidia-cdi: a mapped replica gets NVIDIA_VISIBLE_DEVICES=runtime.nvidia.com/gpu=" in text
    )
    assert "and runtimeClassName nvidia" in text
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged = true" in text
    assert "kubectl get runtimeclass nvidia" in text
    none = render_notes(
        CHART, tmp_path / "b", "injection.deviceMode=nvidia-cdi", "injection.runtimeClassName=", extra=SERVED
    )
    assert "the nodes' DEFAULT runtime must be NVIDIA's" in none
    assert "nvidia-cdi" not in render_notes(CHART, tmp_path / "c", extra=SERVED)
