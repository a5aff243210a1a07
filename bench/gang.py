"""The gang arms of ``make bench`` (docs/operate.md "Gang placement").

* ``G``: arm A's pods as gangs: each workload's pods carry ``gpu-scheduler.io/gang: "true"``
  and a StatefulSet owner (one gang per workload), nothing blocks: the price of all-or-none
  against A in the same run (target: throughput G/A >= 0.95).
* ``GR``: a released gang: workload ``w0``'s replicas are created while a pod of another
  workload holds the GPU of its replica 0, so the gang waits whole (the scheduler's
  ``gpu_scheduler_gangs_waiting`` says so); the clock starts when that pod is deleted and stops
  when the last replica is seen bound: how long a released gang takes to bind all its replicas.

The owner reference names a StatefulSet of an API group nobody serves
(``bench.gpu-scheduler.io/v1``): the garbage collector cannot resolve it, so it never deletes the
pods as orphans, and the scheduler, finding no ``apps/v1`` StatefulSet of that name, takes the
gang's replicas from the map (each workload's map names exactly its replicas).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from bench.raw import ApiError, Raw
from bench.workload import PodSpec
from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION

GANG_ARMS = ("G", "GR")
OWNER_API = "bench.gpu-scheduler.io/v1"
BLOCKER_NS = "bench-gang-blocker"


def as_gang(pods: list[PodSpec]) -> list[PodSpec]:
    """The same pods, each a member of its workload's gang."""
    out = []
    for pod in pods:
        body = json.loads(pod.body)
        meta = body["metadata"]
        workload = pod.name.rsplit("-", 1)[0]
        meta.setdefault("annotations", {})[GANG_ANNOTATION] = "true"
        meta["ownerReferences"] = [
            {
                "apiVersion": OWNER_API,
                "kind": "StatefulSet",
                "name": workload,
                "uid": f"bench-{workload}",
                "controller": True,
            }
        ]
        out.append(PodSpec(pod.name, pod.node, pod.gpu, json.dumps(body).encode()))
    return out


def released(pods: list[PodSpec]) -> list[PodSpec]:
    """Arm GR's pods: workload w0's gang."""
    return [p for p in as_gang(pods) if p.name.startswith("w0-")]


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
