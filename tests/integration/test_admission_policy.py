"""The chart's ValidatingAdmissionPolicy (templates/admission-policy.yaml) in the local
control plane's apiserver, exercised with real tokens: a tenant ServiceAccount whose Role
lets it create, patch, update and delete pods in its namespace, the scheduler's
ServiceAccount with the chart's RBAC, and the admin for what no tenant may even try
(subresources, Bindings). Each rule is refused with its message, and next to every
refusal a positive control shows that the same identity may do the legitimate thing.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from localcluster.cluster import Cluster
from localcluster.rbac import ChartIdentity, chart_identity, render_chart, scheduler_chart_values

MAP_KEY = "gpu-scheduling-map"
ASSIGNED = "gpu-scheduler/assigned"
POD_INDEX = "apps.kubernetes.io/pod-index"
MAP = "0=node1:0\n"
SCHEDULER = "gpu-scheduler"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"

RULE1 = f"may not set spec.nodeName: the scheduler {SCHEDULER} binds it to the node its map names"
RULE2 = "cannot be changed, added or removed"
RULE2_BINDING = "a Binding may not carry the gpu-scheduling-map annotation"
RULE4_OPS = (
    "may only bind pods, set their PodScheduled condition, evict pods, delete pending mapped pods and remove the"
    " gpu-scheduler.io/claim scheduling gate"
)
RULE4_BINDING = "the scheduler's Binding may not carry annotations"
RULE4_METADATA = "may not change a pod's labels, annotations or finalizers through pods/status"
RULE4_STATUS = "may change only the PodScheduled condition through pods/status"
RULE4_DELETE = f"may delete only pending pods (no spec.nodeName) that carry gpu-scheduling-map and have spec.schedulerName {SCHEDULER}"


@dataclass
class Guarded:
    cluster: Cluster
    namespace: str
    policy: str
    scheduler: ChartIdentity
    tenant: Path

    def rule3(self) -> str:
        return f"only the scheduler's ServiceAccount ({self.scheduler.username}) may set, change or remove"

    # -- requests -------------------------------------------------------------------
    def kubectl(
        self, kubeconfig: Path | None, *args: str, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(
            *args, "-n", self.namespace, input=input, kubeconfig=kubeconfig, check=False
        )

    def create(self, kubeconfig: Path | None, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.kubectl(kubeconfig, "create", "-f", "-", input=json.dumps(manifest))

    def patch(
        self,
        kubeconfig: Path | None,
        name: str,
        patch: dict[str, Any],
        subresource: str = "",
        kind: str = "merge",
    ) -> subprocess.CompletedProcess[str]:
        args = ["patch", "pod", name, f"--type={kind}", "-p", json.dumps(patch)]
        if subresource:
            args.append(f"--subresource={subresource}")
        return self.kubectl(kubeconfig, *args)

    def patch_status(
        self, kubeconfig: Path, name: str, body: dict[str, Any], content_type: str = STRATEGIC
    ) -> subprocess.CompletedProcess[str]:
        """PATCH pods/status as the scheduler sends it (no GET first, unlike
        ``kubectl patch --subresource``, which the scheduler's RBAC does not allow)."""
        api = config.new_client_from_config(config_file=str(kubeconfig))
        args = ["PATCH", f"pods/{name}/status"]
        try:
            client.CoreV1Api(api).patch_namespaced_pod_status(
                name, self.namespace, body, _content_type=content_type, _preload_content=False
            )
        except client.ApiException as exc:
            message = json.loads(exc.body or "{}").get("message", exc.body)
            return subprocess.CompletedProcess(args, 1, "", f"{exc.status}: {message}")
        finally:
            api.close()
        return subprocess.CompletedProcess(args, 0, "", "")

    def bind(
        self, kubeconfig: Path | None, name: str, node: str, annotations: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        binding: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}/binding"
        return self.cluster.kubectl(
            "create", "--raw", path, "-f", "-", input=json.dumps(binding), kubeconfig=kubeconfig, check=False
        )

    def delete(self, kubeconfig: Path | None, name: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl(kubeconfig, "delete", "pod", name, "--wait=false")

    def get(self, name: str) -> dict[str, Any]:
        res = self.kubectl(None, "get", "pod", name, "-o", "json")
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout))

    def exists(self, name: str) -> bool:
        res = self.kubectl(None, "get", "pod", name, "-o", "jsonpath={.metadata.deletionTimestamp}")
        return res.returncode == 0 and not res.stdout.strip()

    # -- verdicts -------------------------------------------------------------------
    def refused(self, res: subprocess.CompletedProcess[str], message: str) -> None:
        assert res.returncode != 0, f"admitted, expected a refusal with {message!r}: {res.stdout}"
        one_line = " ".join(res.stderr.split())
        assert f"ValidatingAdmissionPolicy '{self.policy}'" in one_line, res.stderr
        assert message in one_line, res.stderr

    @staticmethod
    def admitted(res: subprocess.CompletedProcess[str]) -> None:
        assert res.returncode == 0, res.stderr


def pod(
    name: str,
    *,
    mapped: bool = True,
    node: str | None = None,
    scheduler: str = SCHEDULER,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app": "vap"}}
    notes = dict(annotations or {})
    if mapped:
        notes[MAP_KEY] = MAP
        meta["labels"][POD_INDEX] = "0"
    if notes:
        meta["annotations"] = notes
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "automountServiceAccountToken": False,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def tenant_objects(namespace: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "tenant", "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "tenant-pods", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-pods", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
        },
    ]


def _policy_refuses_probe(cluster: Cluster, namespace: str, policy: str) -> bool:
    res = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-",
        input=json.dumps(pod("probe", node="node1")), check=False,
    )  # fmt: skip
    return res.returncode != 0 and f"ValidatingAdmissionPolicy '{policy}'" in res.stderr


@pytest.fixture
def guarded(cluster: Cluster, namespace: str) -> Iterator[Guarded]:
    """The chart's policy (release ``vap-<namespace>``, scheduler ServiceAccount
    ``<namespace>/gpu-scheduler`` with the chart's RBAC) and a tenant; waits until the
    apiserver enforces the policy, and until it stopped enforcing it afterwards."""
    release = f"vap-{namespace}"
    values = scheduler_chart_values(SCHEDULER)
    policy_docs = [d for d in render_chart(cluster, release, namespace, values) if d["kind"] in POLICY_KINDS]
    assert sorted(d["kind"] for d in policy_docs) == sorted(POLICY_KINDS)
    (policy,) = {d["metadata"]["name"] for d in policy_docs}
    cluster.apply(tenant_objects(namespace))
    tenant = cluster.service_account_kubeconfig(namespace, "tenant")
    with chart_identity(cluster, namespace, "scheduler", release, values) as scheduler:
        cluster.apply(policy_docs)
        try:
            cluster.wait_until(
                lambda: _policy_refuses_probe(cluster, namespace, policy), 30, f"policy {policy} enforced"
            )
            yield Guarded(cluster, namespace, policy, scheduler, tenant)
        finally:
            for doc in reversed(policy_docs):
                cluster.kubectl("delete", doc["kind"].lower(), policy, "--ignore-not-found", check=False)
            cluster.wait_until(
                lambda: not _policy_refuses_probe(cluster, namespace, policy), 30, f"policy {policy} gone"
            )


# ---------------------------------------------------------------- rule 1
def test_rule1_a_mapped_pod_cannot_be_created_with_a_node(guarded: Guarded) -> None:
    g = guarded
    g.refused(g.create(g.tenant, pod("bypass", node="node1")), RULE1)
    # Even the admin: the policy binds every identity.
    g.refused(g.create(None, pod("bypass", node="node1")), RULE1)
    # Positive controls: a pod without the map may set nodeName; a mapped pod without one is admitted.
    g.admitted(g.create(g.tenant, pod("plain", mapped=False, node="node1", scheduler="default-scheduler")))
    g.admitted(g.create(g.tenant, pod("mapped")))
    assert not g.get("mapped")["spec"].get("nodeName")


# ---------------------------------------------------------------- rule 2
def test_rule2_the_map_and_pod_index_of_a_mapped_pod_are_fixed(guarded: Guarded) -> None:
    g = guarded
    g.admitted(g.create(g.tenant, pod("p")))
    g.refused(g.patch(g.tenant, "p", {"metadata": {"annotations": {MAP_KEY: "0=node2:3\n"}}}), RULE2)
    g.refused(g.patch(g.tenant, "p", {"metadata": {"annotations": {MAP_KEY: None}}}), RULE2)
    g.refused(g.patch(g.tenant, "p", {"metadata": {"labels": {POD_INDEX: "1"}}}), RULE2)
    g.refused(g.patch(g.tenant, "p", {"metadata": {"labels": {POD_INDEX: None}}}), RULE2)
    current = g.get("p")
    assert current["metadata"]["annotations"][MAP_KEY] == MAP
    assert current["metadata"]["labels"][POD_INDEX] == "0"
    # Positive control: other annotations and labels stay the tenant's to edit.
    g.admitted(g.patch(g.tenant, "p", {"metadata": {"annotations": {"team": "ml"}, "labels": {"tier": "a"}}}))
    assert g.get("p")["metadata"]["annotations"]["team"] == "ml"


def test_rule2_the_map_cannot_be_added_to_a_pod(guarded: Guarded) -> None:
    """A pod created without the map (so with any nodeName) cannot get one later."""
    g = guarded
    g.admitted(g.create(g.tenant, pod("plain", mapped=False, node="node1", scheduler="default-scheduler")))
    g.refused(g.patch(g.tenant, "plain", {"metadata": {"annotations": {MAP_KEY: MAP}}}), RULE2)
    # Positive control: the same pod's other annotations are the tenant's.
    g.admitted(g.patch(g.tenant, "plain", {"metadata": {"annotations": {"note": "x"}}}))


def test_rule2_holds_through_subresources_and_bindings(guarded: Guarded) -> None:
    """Through pods/status (which may carry metadata) and a Binding (whose annotations
    the apiserver copies onto the pod), even for the admin."""
    g = guarded
    g.admitted(g.create(g.tenant, pod("p")))
    g.refused(
        g.patch(None, "p", {"metadata": {"annotations": {MAP_KEY: "0=node2:3\n"}}}, subresource="status"),
        RULE2,
    )
    g.refused(g.patch(None, "p", {"metadata": {"labels": {POD_INDEX: "7"}}}, subresource="status"), RULE2)
    g.refused(g.bind(None, "p", "node1", annotations={MAP_KEY: "0=node2:3\n"}), RULE2_BINDING)
    assert not g.get("p")["spec"].get("nodeName")
    # Positive control: the admin's status patch that leaves the map alone is admitted.
    g.admitted(g.patch(None, "p", {"metadata": {"annotations": {"seen": "yes"}}}, subresource="status"))


# ---------------------------------------------------------------- rule 3
def test_rule3_only_the_scheduler_may_touch_the_assigned_annotation(guarded: Guarded) -> None:
    g = guarded
    g.refused(g.create(g.tenant, pod("forged", annotations={ASSIGNED: "node1:0,1"})), g.rule3())
    g.refused(g.create(g.tenant, pod("forged2", mapped=False, annotations={ASSIGNED: "node1:0"})), g.rule3())
    g.admitted(g.create(g.tenant, pod("p")))
    g.refused(g.patch(g.tenant, "p", {"metadata": {"annotations": {ASSIGNED: "node1:0"}}}), g.rule3())
    g.refused(g.patch(None, "p", {"metadata": {"annotations": {ASSIGNED: "node1:0"}}}), g.rule3())
    g.refused(g.bind(None, "p", "node1", annotations={ASSIGNED: "node1:0"}), g.rule3())
    assert ASSIGNED not in g.get("p")["metadata"].get("annotations", {})


# ---------------------------------------------------------------- rule 4
def scheduled_condition(status: str = "False") -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": status,
                    "reason": "Unschedulable",
                    "message": "node1: no GPU 0",
                }
            ]
        }
    }


def test_rule4_the_scheduler_may_set_pod_scheduled_and_nothing_else_in_status(guarded: Guarded) -> None:
    g, sched = guarded, guarded.scheduler.kubeconfig
    g.admitted(g.create(g.tenant, pod("p")))
    # Positive control: the strategic-merge patch the scheduler sends.
    g.admitted(g.patch_status(sched, "p", scheduled_condition()))
    (cond,) = [c for c in g.get("p")["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    # A label, an annotation or a finalizer through pods/status: refused.
    g.refused(g.patch_status(sched, "p", {"metadata": {"labels": {"x": "y"}}}, MERGE), RULE4_METADATA)
    g.refused(g.patch_status(sched, "p", {"metadata": {"annotations": {"x": "y"}}}, MERGE), RULE4_METADATA)
    g.refused(
        g.patch_status(sched, "p", {"metadata": {"finalizers": ["example.com/hold"]}}, MERGE), RULE4_METADATA
    )
    # The pod's map through pods/status: refused (rule 2 holds for the scheduler too).
    g.refused(
        g.patch_status(sched, "p", {"metadata": {"annotations": {MAP_KEY: "0=node3:1\n"}}}, MERGE), RULE2
    )
    # Any other status field or condition: refused.
    g.refused(g.patch_status(sched, "p", {"status": {"message": "hello"}}, MERGE), RULE4_STATUS)
    forged = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Forged"}]}}
    g.refused(g.patch_status(sched, "p", forged), RULE4_STATUS)
    meta = g.get("p")["metadata"]
    assert "x" not in meta.get("labels", {}) and not meta.get("finalizers")


def test_rule4_the_scheduler_may_bind_without_annotations_and_never_update_a_pod(guarded: Guarded) -> None:
    g, sched = guarded, guarded.scheduler.kubeconfig
    g.admitted(g.create(g.tenant, pod("p")))
    g.refused(g.bind(sched, "p", "node1", annotations={"x": "y"}), RULE4_BINDING)
    # Positive control: the Binding the scheduler sends.
    g.admitted(g.bind(sched, "p", "node1"))
    assert g.get("p")["spec"]["nodeName"] == "node1"
    # An update of the pod itself: RBAC refuses it already (no pods patch/update) ...
    res = g.patch(sched, "p", {"metadata": {"labels": {"x": "y"}}})
    assert res.returncode != 0 and 'cannot patch resource "pods"' in res.stderr, res.stderr
    # ... and the policy refuses it even where RBAC is too broad: grant the scheduler's
    # ServiceAccount pods patch/update here (as the old chart's ClusterRole did).
    g.cluster.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "too-broad", "namespace": g.namespace},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch", "update"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "too-broad", "namespace": g.namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "too-broad"},
                "subjects": [
                    {"kind": "ServiceAccount", "name": g.scheduler.service_account, "namespace": g.namespace}
                ],
            },
        ]
    )
    g.cluster.wait_until(
        lambda: g.kubectl(sched, "auth", "can-i", "patch", "pods").stdout.strip() == "yes", 30, "RBAC grant"
    )
    g.refused(g.patch(sched, "p", {"metadata": {"labels": {"x": "y"}}}), f"{RULE4_OPS}, not UPDATE pods")
    # The old ledger write: exempt from rule 3 (the scheduler's), refused by rule 4.
    g.refused(g.patch(sched, "p", {"metadata": {"annotations": {ASSIGNED: "node1:0"}}}), RULE4_OPS)
    image = {"spec": {"containers": [{"name": "main", "image": "evil.example/x:1"}]}}
    g.refused(g.patch(sched, "p", image, kind="strategic"), RULE4_OPS)
    assert g.get("p")["spec"]["containers"][0]["image"] == "registry.k8s.io/pause:3.10"


def test_rule4_the_scheduler_may_delete_only_pending_mapped_pods_of_its_name(guarded: Guarded) -> None:
    g, sched = guarded, guarded.scheduler.kubeconfig
    g.admitted(g.create(g.tenant, pod("pending")))
    g.admitted(g.create(g.tenant, pod("bound")))
    g.admitted(g.bind(sched, "bound", "node2"))
    g.admitted(g.create(g.tenant, pod("plain", mapped=False)))
    g.admitted(g.create(g.tenant, pod("others", scheduler="other-scheduler")))
    # A bound pod, a pod without the map, a mapped pod of another scheduler: refused.
    g.refused(g.delete(sched, "bound"), RULE4_DELETE)
    g.refused(g.delete(sched, "plain"), RULE4_DELETE)
    g.refused(g.delete(sched, "others"), RULE4_DELETE)
    assert g.exists("bound") and g.exists("plain") and g.exists("others")
    # Positive control: the pending mapped pod of its schedulerName.
    g.admitted(g.delete(sched, "pending"))
    assert not g.exists("pending")
    # The tenant keeps deleting its own pods, bound or not.
    g.admitted(g.delete(g.tenant, "bound"))


def test_requests_that_do_not_concern_the_scheduler_are_not_evaluated(guarded: Guarded) -> None:
    """matchConditions: pods without the map (and without the ledger annotation) are
    untouched by the policy, whoever sends the request."""
    g = guarded
    g.admitted(g.create(g.tenant, pod("plain", mapped=False, node="node3", scheduler="default-scheduler")))
    g.admitted(g.patch(g.tenant, "plain", {"metadata": {"labels": {POD_INDEX: "5"}}}))
    g.admitted(g.patch(None, "plain", {"metadata": {"labels": {"x": "y"}}}, subresource="status"))
    g.admitted(g.delete(g.tenant, "plain"))


def test_policy_type_checks_against_the_pod_schema(guarded: Guarded) -> None:
    """The apiserver type-checks every expression against the Pod schema and reports
    what does not fit (a misspelled field, a wrong type) in status.typeChecking."""
    g = guarded

    def checked() -> dict[str, Any] | None:
        out = g.cluster.kubectl("get", "validatingadmissionpolicy", g.policy, "-o", "json").stdout
        status = json.loads(out).get("status") or {}
        return status if status.get("typeChecking") is not None else None

    g.cluster.wait_until(lambda: checked() is not None, 30, "type checking of the policy")
    status = checked()
    assert status is not None
    assert status["typeChecking"].get("expressionWarnings", []) == []
