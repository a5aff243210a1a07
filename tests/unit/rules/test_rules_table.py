"""One table of placement-rule cases, run through every front end: the same verdict from each.

Each case is a StatefulSet (its pod template), the nodes, the GPUs other pods
hold, and the replica looked at. It goes through

* the scheduler's decision (``kube_gpu_scheduler.domain.rules.evaluate`` with the real
  ``Ledger``, for the pod the StatefulSet would create; the scheduler never
  sees a pod of another scheduler or one with ``spec.nodeName``: ``is_pending``
  and its field selector),
* the webhook: ``POST /mutate`` with that pod and ``POST /validate`` with the
  StatefulSet, through ``create_app`` with a NodeLookup built from the same
  nodes the way the node cache builds it,
* the CLI: ``gpu-scheduler-map validate --format json`` on a file holding the
  StatefulSet and the pod (the CLI does not read nodes: ``RULES`` says which
  rules it does not evaluate).

The expected verdict comes from ``kube_gpu_scheduler.domain.rules.RULES``: each front end
reports the case's reason with the severity the rule declares for it (REFUSE:
the pod waits / a denial / an error; WARN: a warning Event / an admission
warning / a CLI warning), or nothing where the rule is not one it evaluates.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_gpu_scheduler.domain import rules as R
from kube_gpu_scheduler.domain.fit import PodFootprint
from kube_gpu_scheduler.domain.injection import InjectionMode, desired_env
from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL, entry_for
from kube_gpu_scheduler.domain.resources import GPU_RESOURCE, node_gpus
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, GPU, MapError
from kube_gpu_scheduler.mapcli import cli
from kube_gpu_scheduler.scheduler.state.ledger import Claim, Ledger
from kube_gpu_scheduler.scheduler.state.pods import is_pending
from kube_gpu_scheduler.scheduler.state.usage import NodeUsage
from kube_gpu_scheduler.webhook.app import create_app
from kube_gpu_scheduler.webhook.nodes import NodeInfo
from kube_gpu_scheduler.webhook.settings import Settings
from localcluster.admission import admission_review

OURS = "gpu-scheduler"
MAP = "0=node1:0,1\n1=node2:2\n"
# The same placement with the GPUs named by UUID (written in upper case: the map keeps them lower).
UUIDS = [f"GPU-8a3c0d4e-1234-5678-9abc-{i:012x}" for i in range(3)]
UUID_MAP = f"0=node1:{UUIDS[0].upper()},{UUIDS[1]}\n1=node2:{UUIDS[2]}\n"
OK = "ok"


def node(name: str, gpus: str | None = "4", **spec: Any) -> dict[str, Any]:
    ready = spec.pop("ready", "True")
    status: dict[str, Any] = {
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": ready}],
    }
    if gpus is not None:
        status["allocatable"][GPU_RESOURCE] = gpus
    labels = spec.pop("labels", {"kubernetes.io/hostname": name})
    return {"metadata": {"name": name, "labels": labels}, "spec": spec, "status": status}


NODES = {"node1": node("node1"), "node2": node("node2")}


@dataclass
class Case:
    id: str
    reason: str  # OK: no rule fires
    map_text: str | None = MAP
    replicas: int = 2
    ordinal: int = 0
    pod_name: str | None = None  # default w-<ordinal>, with the pod-index label
    spec: dict[str, Any] = field(default_factory=dict)  # merged into the template's pod spec
    container: dict[str, Any] = field(default_factory=dict)  # merged into its container
    nodes: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(NODES))
    holders: list[tuple[str, GPU]] = field(default_factory=list)  # (node, gpu) held by another pod
    # Pods of any scheduler bound to a node: (node, their pod spec).
    node_pods: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    injected: bool = True
    map_on_statefulset: bool = False
    mode: InjectionMode = "cuda"  # the webhook's device mode (WEBHOOK_INJECTION_MODE)
    # A front end whose verdict is another rule's (the case's object is what that front end sees).
    other: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("placeable", OK),
    Case("zero-gpu-request-is-no-request", OK, container={"resources": {"limits": {GPU_RESOURCE: "0"}}}),
    Case("no-map", R.NO_MAP, map_text=None),
    Case("malformed-map", R.INVALID_MAP, map_text="0=node1:x\n"),
    Case("no-ordinal", R.NO_ORDINAL, pod_name="solo"),
    Case("replica-without-entry", R.ORDINAL_NOT_MAPPED, replicas=3, ordinal=2),
    Case("node-missing", R.NODE_NOT_FOUND, nodes={"node2": NODES["node2"]}),
    Case("node-cordoned", R.NODE_UNSCHEDULABLE, nodes={**NODES, "node1": node("node1", unschedulable=True)}),
    Case("node-not-ready", R.NODE_NOT_READY, nodes={**NODES, "node1": node("node1", ready="False")}),
    Case(
        "taint",
        R.TAINT_NOT_TOLERATED,
        nodes={**NODES, "node1": node("node1", taints=[{"key": "k", "effect": "NoSchedule"}])},
    ),
    Case("node-without-gpus", R.NO_GPU_RESOURCE, nodes={**NODES, "node1": node("node1", gpus=None)}),
    Case("gpu-index-beyond-node", R.GPU_OUT_OF_RANGE, nodes={**NODES, "node1": node("node1", gpus="1")}),
    Case("gpu-held", R.GPU_IN_USE, holders=[("node1", 1)]),
    Case("gpus-by-uuid", OK, map_text=UUID_MAP),
    # Replicas 0 and 1 share node1:1: admitted with a warning, bound as mapped.
    Case("shared-gpu", R.GPU_SHARED, map_text="0=node1:0,1\n1=node1:1\n"),
    Case(
        "more-uuids-than-the-node-has",
        R.GPU_OUT_OF_RANGE,
        map_text=UUID_MAP,
        nodes={**NODES, "node1": node("node1", gpus="1")},
    ),
    Case("gpu-held-by-uuid", R.GPU_IN_USE, map_text=UUID_MAP, holders=[("node1", UUIDS[1])]),
    Case("gpu-by-pci-bus-id", R.GPU_NAME_NEEDS_DRA, map_text="0=node1:00000000:3B:00.0\n1=node2:2\n"),
    Case("gpu-count", R.GPU_COUNT_NEEDS_DRA, map_text="0=node1:auto(2)\n1=node2:2\n"),
    Case("node-selector", R.NODE_AFFINITY, spec={"nodeSelector": {"disk": "ssd"}}),
    Case(
        "required-node-affinity",
        R.NODE_AFFINITY,
        spec={
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "NotIn", "values": ["node1"]}
                                ]
                            }
                        ]
                    }
                }
            }
        },
    ),
    Case(
        "more-cpu-than-the-node",
        R.INSUFFICIENT_RESOURCES,
        container={"resources": {"requests": {"cpu": "9"}}},
    ),
    Case(
        "memory-taken-by-other-pods",
        R.INSUFFICIENT_RESOURCES,
        container={"resources": {"requests": {"memory": "4Gi"}}},
        node_pods=[("node1", {"containers": [{"name": "c", "resources": {"requests": {"memory": "30Gi"}}}]})],
    ),
    Case(
        "host-port-taken",
        R.HOST_PORT_CONFLICT,
        container={"ports": [{"containerPort": 80, "hostPort": 8080}]},
        node_pods=[
            ("node1", {"containers": [{"name": "c", "ports": [{"containerPort": 1, "hostPort": 8080}]}]})
        ],
    ),
    Case("admitted-without-injection", R.NOT_INJECTED, injected=False),
    Case(
        "device-plugin-gpus",
        R.GPU_RESOURCE_REQUESTED,
        container={"resources": {"limits": {GPU_RESOURCE: "1"}}},
    ),
    Case("default-scheduler", R.SCHEDULER_NAME_MISMATCH, spec={"schedulerName": "default-scheduler"}),
    Case("other-scheduler", R.SCHEDULER_NAME_MISMATCH, spec={"schedulerName": "volcano"}),
    Case("node-name", R.NODE_NAME_SET, spec={"nodeName": "node1"}),
    Case("unused-entry", R.ORDINAL_UNUSED, map_text=MAP + "7=node2:3\n"),
    # The pods of such a StatefulSet carry no map: the scheduler and /mutate see a pod without one.
    Case("map-on-statefulset", R.MAP_NOT_ON_TEMPLATE, map_on_statefulset=True, other={R.SCHEDULER: R.NO_MAP}),
    # nvidia-cdi mode: the injector gives the pod RuntimeClass nvidia; naming it is no conflict.
    Case("nvidia-cdi", OK, mode="nvidia-cdi"),
    Case("nvidia-cdi-with-its-class", OK, mode="nvidia-cdi", spec={"runtimeClassName": "nvidia"}),
    Case("nvidia-cdi-by-uuid", OK, mode="nvidia-cdi", map_text=UUID_MAP),
    Case(
        "another-runtime-class",
        R.RUNTIME_CLASS_CONFLICT,
        mode="nvidia-cdi",
        spec={"runtimeClassName": "kata"},
    ),
    # Outside nvidia-cdi mode the runtime class is the pod's business.
    Case("runtime-class-in-cuda-mode", OK, spec={"runtimeClassName": "kata"}),
]


# -- the objects -------------------------------------------------------------------------------


def statefulset(case: Case) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox", **case.container}
    pod_spec: dict[str, Any] = {"schedulerName": OURS, "containers": [container], **case.spec}
    annotations = {ANNOTATION: case.map_text} if case.map_text is not None else {}
    meta: dict[str, Any] = {"name": "w", "namespace": "team"}
    template_meta: dict[str, Any] = {"labels": {"app": "w"}}
    if case.map_on_statefulset:
        meta["annotations"] = annotations
    else:
        template_meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "replicas": case.replicas,
            "serviceName": "w",
            "selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def pod_of(case: Case) -> dict[str, Any]:
    """The pod the StatefulSet controller creates for ``case.ordinal`` (before admission)."""
    template = copy.deepcopy(statefulset(case)["spec"]["template"])
    meta = template["metadata"]
    labels = dict(meta.get("labels") or {})
    if case.pod_name is None:
        labels[POD_INDEX_LABEL] = str(case.ordinal)
    meta.update(
        name=case.pod_name or f"w-{case.ordinal}", namespace="team", uid=f"uid-{case.id}", labels=labels
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"], "status": {}}


def admitted(pod: dict[str, Any], injected: bool, mode: InjectionMode = "cuda") -> dict[str, Any]:
    """The pod as stored: with the webhook's variables when ``injected`` and it has an entry."""
    pod = copy.deepcopy(pod)
    pod["status"] = {"phase": "Pending"}
    try:
        _, entry = entry_for(pod["metadata"])
    except MapError:
        entry = None
    if injected and entry is not None:
        for c in pod["spec"]["containers"]:
            c["env"] = [{"name": n, "value": v} for n, v in desired_env(entry, mode)]
    return pod


# -- the front ends: each returns (severity, reasons) -----------------------------------------

Verdict = tuple[str, set[str]]


def scheduler_verdict(case: Case) -> Verdict:
    pod = admitted(pod_of(case), case.injected, case.mode)
    if pod["spec"].get("schedulerName") != OURS or not is_pending(pod):
        return OK, set()  # never queued: its field selector / bound already
    ledger = Ledger()
    for n, (node_name, gpu) in enumerate(case.holders):
        holder = {"metadata": {"name": f"h-{n}", "namespace": "team", "uid": f"h-{n}"}, "spec": {}}
        assert ledger.reserve(holder, Claim.of(node_name, [gpu])) == []
    usage = NodeUsage()
    for n, (node_name, spec) in enumerate(case.node_pods):
        usage.observe(f"o-{n}", PodFootprint.of(f"other/o-{n}", node_name, spec))
    decision = R.evaluate(pod, case.nodes, ledger, usage=usage)
    if decision.refusals:
        return R.REFUSE, {r.reason for r in decision.refusals}
    if decision.warnings:
        return R.WARN, {w.reason for w in decision.warnings}
    return OK, set()


class Nodes:
    """The NodeLookup seam, from the case's node objects as the node cache reads them."""

    def __init__(self, nodes: dict[str, dict[str, Any]]):
        self.nodes = nodes

    def get(self, name: str) -> NodeInfo | None:
        obj = self.nodes.get(name)
        return None if obj is None else NodeInfo(name, node_gpus(obj.get("status")))


def webhook_verdict(case: Case, path: str, caplog: pytest.LogCaptureFixture) -> Verdict:
    obj = pod_of(case) if path == "/mutate" else statefulset(case)
    body = admission_review(obj, kind="Pod" if path == "/mutate" else "StatefulSet", uid="u")
    app = create_app(Settings(scheduler_name=OURS, injection_mode=case.mode), node_lookup=Nodes(case.nodes))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="webhook"):
        resp = app.test_client().post(path, json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    answer = resp.get_json()["response"]
    logged = [set(r.reasons) for r in caplog.records if hasattr(r, "reasons")]
    reasons = logged[-1] if logged else set()
    if not answer["allowed"]:
        return R.REFUSE, reasons
    assert len(answer.get("warnings") or []) == len(reasons), (answer, reasons)
    return (R.WARN if reasons else OK), reasons


def cli_verdict(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Verdict:
    manifest = tmp_path / f"{case.id}.yaml"
    manifest.write_text(yaml.safe_dump_all([statefulset(case), pod_of(case)], sort_keys=False))
    capsys.readouterr()
    code = cli.main(["validate", "--format", "json", "--scheduler-name", OURS, str(manifest)])
    report = json.loads(capsys.readouterr().out)
    maps = [m for i in report["inputs"] for m in i["maps"]]
    errors = {e["reason"] for m in maps for e in m["errors"]}
    warnings = {w["reason"] for m in maps for w in m["warnings"]}
    if errors:
        assert code == cli.EXIT_INVALID
        return R.REFUSE, errors
    assert code == cli.EXIT_OK
    return (R.WARN if warnings else OK), warnings


# -- the table ------------------------------------------------------------------------------


def expected(case: Case, front_end: str) -> Verdict:
    reason = case.other.get(front_end, case.reason)
    severity = R.RULES[reason].severity.get(front_end) if reason != OK else None
    return (severity, {reason}) if severity else (OK, set())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_front_end_gives_the_rules_verdict(
    case: Case, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    got = {
        R.SCHEDULER: scheduler_verdict(case),
        R.MUTATE: webhook_verdict(case, "/mutate", caplog),
        R.VALIDATE: webhook_verdict(case, "/validate", caplog),
        R.LINT: cli_verdict(case, tmp_path, capsys),
    }
    want = {f: expected(case, f) for f in R.FRONT_ENDS}
    assert got == want


def test_the_table_covers_every_rule() -> None:
    covered = {c.reason for c in CASES} | {r for c in CASES for r in c.other.values()}
    # YAML-only lints, and the one rule that is the scheduler's memory of a pod that failed
    # (tests/integration/test_scheduler_fit.py). The tenancy rules need policies and namespaces,
    # which no front end of this table reads: tests/unit/tenancy/test_tenancy_*.py run them through each;
    # so do the sharing refusals (a release's setting or a policy: tests/unit/sharing/test_sharing_admission.py).
    left = set(R.RULES) - covered - {R.MISSPELT_ANNOTATION, R.FOLDED_MAP, R.NO_ORDINALS, R.KUBELET_REFUSED}
    left -= {R.NOT_GRANTED, R.GPU_LIMIT_REACHED, R.NAMESPACE_NOT_OPTED_IN, R.GPU_SHARING_FORBIDDEN}
    assert not left, f"rules without a case in the table: {sorted(left)}"
    # Every front end evaluates at least one rule, and every rule says what unblocks it.
    for front_end in R.FRONT_ENDS:
        assert any(front_end in r.severity for r in R.RULES.values()), front_end
    for rule in R.RULES.values():
        assert set(rule.severity) <= set(R.FRONT_ENDS), rule
        assert set(rule.severity.values()) <= {R.REFUSE, R.WARN}, rule
        assert rule.unblocked_by <= {
            R.ON_NODE,
            R.ON_GPU_HOLDER,
            R.ON_POD,
            R.ON_NODE_PODS,
            R.ON_POLICY,
            R.ON_NAMESPACE,
        }, rule


def test_scheduler_refusals_are_the_metrics_reasons() -> None:
    refusing = {r.reason for r in R.RULES.values() if r.severity.get(R.SCHEDULER) == R.REFUSE}
    assert refusing == set(R.ALL_REASONS)
