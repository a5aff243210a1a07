"""Arm KT of the DRA phase (bench/dra.py): the way a team without gpu-scheduler asks for GPUs.

Per workload of the DRA plan, a StatefulSet (``podManagementPolicy: Parallel``) whose pod
template asks for one GPU through a ResourceClaimTemplate (DeviceClass ``gpu.nvidia.com``, the
one the kwok nodes' ResourceSlices publish): kube-controller-manager's StatefulSet controller makes
the replicas, its resourceclaim controller makes each replica's claim from the template, and
kube-scheduler (arm B2's tuned profile, as in D and K) allocates a GPU and binds. No replica is
pinned: one template cannot name a node per replica, which is what the map adds.

Both controllers run in a kube-controller-manager of their own, started for the DRA phase only
(localcluster ``start_controller_manager``), its client limits raised as B2's are (QPS 5000,
burst 10000); the control plane's own kube-controller-manager runs neither (bench/gang.py's
``CONTROLLERS_OFF``): a StatefulSet controller would make the pods of the gang arms' and the
apiserver phase's StatefulSets, which the harness makes itself or not at all.

The clock runs from the first StatefulSet's POST to the last replica seen bound on a pod watch
(the ResourceClaimTemplate is made beforehand, untimed). The read-back: every replica bound, its
claim (``status.resourceClaimStatuses``) allocated exactly one device of the node it runs on, and
no device allocated to two claims in the whole cluster.
"""

from __future__ import annotations

import json
from typing import Any

from bench.raw import Raw
from bench.workload import BENCH, IMAGE, PART_OF, WORKLOAD_LABEL, Plan
from kube_gpu_scheduler.domain import dra

KT_NAME = "kube-scheduler (B2's) allocating claims the resourceclaim controller makes from a StatefulSet's ResourceClaimTemplate, nothing pinned"
# The second kube-controller-manager (started for the DRA phase): what it runs, its client.
DRA_CONTROLLERS = ("statefulset-controller", "resourceclaim-controller")
DRA_KCM = "kube-controller-manager-dra"
DRA_KCM_QPS, DRA_KCM_BURST = 5000, 10000
TEMPLATE = "gpu"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"
STATEFULSETS = "/apis/apps/v1/namespaces/{ns}/statefulsets"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
POD_CLAIM = "gpu"


def claim_template() -> dict[str, Any]:
    """One GPU of the class the kwok nodes publish, any of them."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "labels": {PART_OF: BENCH}},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]}
            }
        },
    }


def replicas(plan: Plan) -> dict[str, int]:
    """workload -> its replica count, as the plan cuts its pods."""
    out: dict[str, int] = {}
    for w, *_ in plan.placements():
        out[w] = out.get(w, 0) + 1
    return out


def pod_names(plan: Plan) -> list[str]:
    """The replicas the StatefulSets make: ``<workload>-<ordinal>``."""
    return [f"{w}-{k}" for w, k, *_ in plan.placements()]


def statefulsets(plan: Plan, scheduler_name: str) -> list[bytes]:
    """One StatefulSet per workload of ``plan``, its replicas made all at once (Parallel)."""
    out = []
    for workload, count in replicas(plan).items():
        labels = {PART_OF: BENCH, WORKLOAD_LABEL: workload}
        doc = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": workload, "labels": labels},
            "spec": {
                "replicas": count,
                "podManagementPolicy": "Parallel",
                "serviceName": workload,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "schedulerName": scheduler_name,
                        "terminationGracePeriodSeconds": 0,
                        "resourceClaims": [{"name": POD_CLAIM, "resourceClaimTemplateName": TEMPLATE}],
                        "containers": [
                            {"name": "main", "image": IMAGE, "resources": {"claims": [{"name": POD_CLAIM}]}}
                        ],
                    },
                },
            },
        }
        out.append(json.dumps(doc).encode())
    return out


def claim_of(pod: dict[str, Any]) -> str | None:
    """The claim the resourceclaim controller made for the pod's template claim."""
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == POD_CLAIM:
            return status.get("resourceClaimName")
    return None


def shared_devices(raw: Raw) -> list[str]:
    """Devices allocated to more than one claim in the whole cluster (the read-back of every DRA arm)."""
    held: dict[tuple[str, str, str], list[str]] = {}
    for c in raw.list_items("/apis/resource.k8s.io/v1/resourceclaims"):
        for a in dra.allocation(c):
            held.setdefault((a.driver, a.pool, a.device), []).append(
                f"{c['metadata']['namespace']}/{c['metadata']['name']}"
            )
    return [f"device {'/'.join(d)} allocated to {v}" for d, v in held.items() if len(v) > 1]


def check_kt(raw: Raw, namespace: str, plan: Plan) -> list[str]:
    """Every replica bound, its claim allocated exactly one device of its own node; no device
    allocated twice in the cluster."""
    pods = {p["metadata"]["name"]: p for p in raw.list_items(f"/api/v1/namespaces/{namespace}/pods")}
    claims = {c["metadata"]["name"]: c for c in raw.list_items(CLAIMS.format(ns=namespace))}
    problems = []
    for name in pod_names(plan):
        pod = pods.get(name)
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        if pod is None or not node:
            problems.append(f"{namespace}/{name}: {'not bound' if pod else 'missing'}")
            continue
        claim = claims.get(claim_of(pod) or "")
        got = dra.allocation(claim or {})
        if len(got) != 1 or got[0].pool != node or got[0].driver != dra.DRIVER:
            problems.append(f"{namespace}/{name} on {node}: claim {claim_of(pod)!r} allocated {got}")
    if len(pods) != plan.pods:
        problems.append(f"{namespace}: {len(pods)} pods, expected {plan.pods}")
    return (problems + shared_devices(raw))[:20]
