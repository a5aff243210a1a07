"""The gang arms of ``make bench`` (docs/operate.md "Gang placement").

* ``AO``: arm A's pods each owned by its workload's StatefulSet, as every StatefulSet's replicas
  are in a user's cluster, placed one by one (no gang annotation): G's twin.
* ``G``: the same pods as ``AO``, as gangs: each workload's pods also carry
  ``gpu-scheduler.io/gang: "true"`` (one gang per workload), nothing blocks: the price of
  all-or-none against the same pods placed one by one, in the same repetition (target:
  throughput G/AO >= 0.95). G/A is printed too: it adds what the owner references cost the
  control plane (the garbage collector's graph, the apiserver's bigger objects), which is no
  price of the gang (AO/A, printed beside it).
* ``GR``: a released gang: workload ``w0``'s replicas are created while a pod of another
  workload holds the GPU of its replica 0, so the gang waits whole (the scheduler's
  ``gpu_scheduler_gangs_waiting`` says so); the clock starts when that pod is deleted and stops
  when the last replica is seen bound: how long a released gang takes to bind all its replicas.

Each workload's pods are owned by a real ``apps/v1`` StatefulSet of that name, created in the
run's namespace before its pods (``owners``): what the scheduler reads for the gang's replicas
(``spec.replicas``), and what the garbage collector finds, as in a user's cluster. The bench
creates the replicas itself, as in arm A: its control plane runs no StatefulSet controller
(``Cluster.start(controllers_off=...)``), which would otherwise make the same pods. (Until stop 37
the owner was a StatefulSet of an API group nobody serves: the garbage collector retried each one,
and the scheduler's read of each gang's StatefulSet was a 404.)
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from bench.raw import ApiError, Raw
from bench.workload import IMAGE, WORKLOAD_LABEL, PodSpec
from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION

GANG_ARMS = ("G", "GR")
# The arms whose pods are owned by real StatefulSets.
OWNED_ARMS = ("AO", *GANG_ARMS)
# kube-controller-manager's controllers the bench's control plane leaves off (see above); the DRA
# phase runs both in a kube-controller-manager of its own, for arm KT (bench/drakt.py).
CONTROLLERS_OFF = ("statefulset-controller", "resourceclaim-controller")
BLOCKER_NS = "bench-gang-blocker"


def workload_of(pod: PodSpec) -> str:
    return pod.name.rsplit("-", 1)[0]


def owners(raw: Raw, namespace: str, pods: list[PodSpec], gang: bool = True) -> dict[str, str]:
    """A StatefulSet for each workload of ``pods`` (as many replicas as it has pods here; its
    template a gang's when ``gang``): workload -> the StatefulSet's uid."""
    counts: dict[str, int] = {}
    for pod in pods:
        counts[workload_of(pod)] = counts.get(workload_of(pod), 0) + 1
    uids = {}
    for workload, replicas in counts.items():
        labels = {WORKLOAD_LABEL: workload}
        sts = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": workload},
            "spec": {
                "replicas": replicas,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels, "annotations": {GANG_ANNOTATION: "true"} if gang else {}},
                    "spec": {"containers": [{"name": "main", "image": IMAGE}]},
                },
            },
        }
        made = raw.post(f"/apis/apps/v1/namespaces/{namespace}/statefulsets", sts, ok=(201,))
        uids[workload] = made["metadata"]["uid"]
    return uids


def owned(pods: list[PodSpec], uids: dict[str, str], gang: bool) -> list[PodSpec]:
    """The same pods, each owned by its workload's StatefulSet (``uids``), and a member of its
    gang when ``gang``."""
    out = []
    for pod in pods:
        body = json.loads(pod.body)
        meta = body["metadata"]
        workload = workload_of(pod)
        if gang:
            meta.setdefault("annotations", {})[GANG_ANNOTATION] = "true"
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": workload,
                "uid": uids[workload],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        out.append(PodSpec(pod.name, pod.node, pod.gpu, json.dumps(body).encode()))
    return out


def released(pods: list[PodSpec]) -> list[PodSpec]:
    """Arm GR's pods: workload w0's."""
    return [p for p in pods if workload_of(p) == "w0"]


class Release:
    """``hold()``: a pod of another workload takes w0's replica 0's GPU (bound by ``spec.nodeName``,
    its variable naming the GPU); ``waiting()``: the scheduler reports the gang waiting;
    ``go()``: that pod is deleted, and the moment returned."""

    def __init__(self, raw: Raw, metrics_url: str, first: PodSpec, scheduler_name: str) -> None:
        self._raw, self._url, self._first, self._name = raw, metrics_url, first, scheduler_name

    def _metric(self, name: str) -> float:
        with urllib.request.urlopen(self._url, timeout=5) as resp:  # noqa: S310 (http://127.0.0.1)
            for line in resp.read().decode().splitlines():
                if line.startswith(name + " ") or (line.startswith(name + "{") and "}" not in name):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def _wait(self, cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise ApiError(f"arm GR: {what} not within {timeout:.0f} s")
            time.sleep(0.05)

    def hold(self) -> None:
        from bench.arms import create_namespace

        create_namespace(self._raw, BLOCKER_NS)
        held = self._count("gpu_scheduler_gpu_holder_info")
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "blocker", "namespace": BLOCKER_NS},
            "spec": {
                "schedulerName": self._name,
                "nodeName": self._first.node,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": str(self._first.gpu)}],
                    }
                ],
            },
        }
        self._raw.post(f"/api/v1/namespaces/{BLOCKER_NS}/pods", pod, ok=(201,))
        self._wait(lambda: self._count("gpu_scheduler_gpu_holder_info") > held, "the blocker in the ledger")

    def _count(self, name: str) -> int:
        with urllib.request.urlopen(self._url, timeout=5) as resp:  # noqa: S310 (http://127.0.0.1)
            return sum(1 for line in resp.read().decode().splitlines() if line.startswith(name + "{"))

    def waiting(self) -> None:
        # Reported waiting (not only its pods being created): its rules ran and its GPU is held.
        waiting = 'gpu_scheduler_waiting_pods{reason="GangWaiting"}'
        self._wait(lambda: self._metric(waiting) >= 1, "the gang waiting")

    def go(self) -> float:
        self.waiting()
        start = time.monotonic()
        self._raw.delete(f"/api/v1/namespaces/{BLOCKER_NS}/pods/blocker?gracePeriodSeconds=0")
        return start

    def clean(self) -> None:
        self._raw.delete(f"/api/v1/namespaces/{BLOCKER_NS}")
