"""Extender mode: kube-scheduler places the pods and asks this process about the map.

kube-scheduler (a profile whose ``schedulerName`` is ours, see the chart's
KubeSchedulerConfiguration) runs every standard filter (resources, affinity,
inter-pod affinity, topology spread, volumes) and then calls:

* ``POST /filter`` (``ExtenderArgs`` in, ``ExtenderFilterResult`` out,
  ``nodeCacheCapable``: node names both ways). A pod carrying
  ``gpu-scheduling-map`` keeps only its mapped node, and only while the GPU rules
  of :mod:`kube_gpu_scheduler.domain.rules` pass there (``evaluate``, the standalone
  scheduler's checks, against the same node cache and GPU ledger); every other
  node is reported in ``FailedAndUnresolvableNodes`` with the reason, so
  preemption never evicts pods for a node the map does not name. A pod of another
  scheduler, or one without a map, passes through unchanged.
* ``POST /bind`` (``ExtenderBindingArgs`` in, ``ExtenderBindingResult`` out). The
  checks run again, the GPUs are reserved in the ledger (atomically with the
  conflict check, as the standalone loop does) and the Binding is POSTed with the
  pod's UID as a precondition. A refusal is an ``Error``: kube-scheduler forgets
  its assumption and retries the pod, and the next ``filter`` names the cause.

Only the leader answers (an ``Error`` otherwise), and readiness adds
``extender-leader``, so the Service sends kube-scheduler to the one process
whose ledger counts every reservation. The wire format is the JSON of
``k8s.io/kube-scheduler/extender/v1`` (Go field names, matched without regard to
case, as Go's decoder does). The endpoint and its bounds (body size, connections, TLS 1.2 or
later only) are :mod:`kube_gpu_scheduler.scheduler.placing.extender_http`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kubernetes import client
from prometheus_client import Counter, Histogram

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules import (
    API_ERROR,
    MAPPED_ELSEWHERE,
    NOT_A_CANDIDATE,
    NOT_LEADER,
    NOT_SYNCED,
    Decision,
)
from kube_gpu_scheduler.domain.schedmap import ANNOTATION
from kube_gpu_scheduler.kube.errors import error_message
from kube_gpu_scheduler.kube.jsonio import read_json
from kube_gpu_scheduler.scheduler.placing.placement import Outcome, Placed, Placement
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from kube_gpu_scheduler.scheduler.runtime.server import Probes
from kube_gpu_scheduler.scheduler.state.binding import TIMEOUT, truncate_message

log = logging.getLogger("gpu_scheduler.extender")

FILTER_PATH = "/filter"
BIND_PATH = "/bind"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


def field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]``, the key matched without regard to case (as Go's JSON decoder does)."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == low:
            return value
    return None


def is_mapped(pod: Mapping[str, Any]) -> bool:
    return Pod(pod).annotations.get(ANNOTATION) is not None


def refusal_text(decision: Decision) -> str:
    return truncate_message(f"{decision.reason}: {decision.message}")


class Backend(Protocol):
    """What the extender sees of the scheduler (``kube_gpu_scheduler.scheduler.placing.core.Scheduler``)."""

    metrics: Metrics
    placement: Placement

    @property
    def name(self) -> str: ...
    def synced(self) -> bool: ...
    def is_leader(self) -> bool: ...
    def leader_holder(self) -> str: ...
    def pod(self, key: str) -> Mapping[str, Any] | None: ...
    def decide(self, pod: Mapping[str, Any], room: bool = True) -> Decision: ...


class ExtenderMetrics:
    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.requests = Counter(
            "gpu_scheduler_extender_requests",
            "Extender calls by verb (filter, bind) and result (ok, refused, passthrough, error).",
            ["verb", "result"],
            registry=r,
        )
        for verb in ("filter", "bind"):
            for result in ("ok", "refused", "passthrough", "error"):
                self.requests.labels(verb, result)
        self.latency = Histogram(
            "gpu_scheduler_extender_request_seconds",
            "Time to answer one extender call, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )


class Extender:
    """The filter and bind verbs, answered from the scheduler's caches and ledger."""

    def __init__(self, backend: Backend, api_client: Any) -> None:
        self.sched = backend
        self.core = client.CoreV1Api(api_client)
        self.metrics = ExtenderMetrics(backend.metrics)

    @property
    def name(self) -> str:
        return self.sched.name

    def _not_serving(self) -> str | None:
        """Why this process may not answer now (caches not synced, not the leader), or None."""
        if not self.sched.synced():
            return f"{NOT_SYNCED}: {self.name} has not synced its pod and node caches yet"
        if not self.sched.is_leader():
            holder = self.sched.leader_holder()
            return f"{NOT_LEADER}: this replica of {self.name} does not lead" + (
                f" (the leader is {holder})" if holder else ""
            )
        return None

    def decide(self, pod: Mapping[str, Any]) -> Decision:
        """The standalone scheduler's checks (``rules.evaluate``) on its caches and ledger, less
        the fit checks (kube-scheduler's own filters ran them)."""
        return self.sched.decide(pod, room=False)

    # -- filter -------------------------------------------------------------------------

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = field(args, "Pod")
        names = field(args, "NodeNames")
        node_list = field(args, "Nodes")
        if not isinstance(pod, Mapping):
            self.metrics.requests.labels("filter", "error").inc()
            return {"Error": "ExtenderArgs.Pod is missing"}
        items = node_list.get("items") if isinstance(node_list, Mapping) else None
        if isinstance(names, list):
            candidates = [n for n in names if isinstance(n, str)]
        elif isinstance(items, list):
            candidates = [str(Pod(n).name) for n in items if isinstance(n, Mapping)]
        else:
            candidates = []

        def answer(keep: Sequence[str], failed: Mapping[str, str]) -> dict[str, Any]:
            out: dict[str, Any] = {"FailedNodes": {}, "FailedAndUnresolvableNodes": dict(failed), "Error": ""}
            if isinstance(items, list) and not isinstance(names, list):
                wanted = set(keep)
                kept = [n for n in items if isinstance(n, Mapping) and Pod(n).name in wanted]
                out["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": kept}
            else:
                out["NodeNames"] = list(keep)
            return out

        view = Pod(pod)
        if view.spec.get("schedulerName") != self.name or not is_mapped(pod):
            self.metrics.requests.labels("filter", "passthrough").inc()
            return answer(candidates, {})
        why_not = self._not_serving()
        if why_not:
            self.metrics.requests.labels("filter", "error").inc()
            return {"Error": why_not}
        decision = self.decide(pod)
        entry = decision.entry
        if entry is None:
            text = refusal_text(decision)
            self.metrics.requests.labels("filter", "refused").inc()
            return answer([], {n: text for n in candidates})
        # One message for every other node, so kube-scheduler's event counts them in one line.
        elsewhere = f"{MAPPED_ELSEWHERE}: replica {entry.ordinal} is mapped to {entry.node}:{entry.devices}"
        failed = {n: elsewhere for n in candidates if n != entry.node}
        keep: list[str] = []
        if entry.node in candidates:
            if decision.ok:
                keep = [entry.node]
            else:
                failed[entry.node] = refusal_text(decision)
        self.metrics.requests.labels("filter", "ok" if keep else "refused").inc()
        if not keep:
            log.debug(
                "filter: no node",
                extra={"pod": view.key, "mapped": entry.node, "reason": decision.reason or NOT_A_CANDIDATE},
            )
        return answer(keep, failed)

    # -- bind ---------------------------------------------------------------------------

    def bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        name, namespace = field(args, "PodName"), field(args, "PodNamespace")
        uid, node = field(args, "PodUID"), field(args, "Node")
        if not all(isinstance(v, str) and v for v in (name, namespace, uid, node)):
            self.metrics.requests.labels("bind", "error").inc()
            return {"Error": "ExtenderBindingArgs needs PodName, PodNamespace, PodUID and Node"}
        key = f"{namespace}/{name}"
        error = self._bind(key, str(name), str(namespace), str(uid), str(node))
        if error:
            log.info("bind refused", extra={"pod": key, "node": node, "detail": error})
        return {"Error": error}

    def _refused(self, message: str) -> str:
        self.metrics.requests.labels("bind", "refused").inc()
        return truncate_message(message)

    def _bind(self, key: str, name: str, namespace: str, uid: str, node: str) -> str:
        why_not = self._not_serving()
        if why_not:
            self.metrics.requests.labels("bind", "error").inc()
            return why_not
        pod = self.sched.pod(key)
        if pod is None or Pod(pod).uid != uid:
            # kube-scheduler's watch may be ahead of ours: read the pod once.
            try:
                resp = self.core.read_namespaced_pod(
                    name, namespace, _preload_content=False, _request_timeout=TIMEOUT
                )
                pod = read_json(resp)
            except Exception as err:
                self.metrics.requests.labels("bind", "error").inc()
                return f"cannot read pod {key}: {error_message(err)}"
        view = Pod(pod)
        if view.uid != uid:
            return self._refused(f"pod {key} is now another pod (UID {view.uid}, not {uid})")
        if view.spec.get("schedulerName") != self.name:
            return self._refused(f"pod {key} is not scheduled by {self.name}")
        if view.node_name:
            if view.node_name == node:
                self.metrics.requests.labels("bind", "ok").inc()
                return ""
            return self._refused(f"pod {key} is already bound to node {view.node_name!r}")
        if not is_mapped(pod):
            return self._answer(pod, self.sched.placement.bind(pod, node))
        decision = self.decide(pod)
        entry = decision.entry
        if entry is None or not decision.ok:
            return self._refused(refusal_text(decision))
        if entry.node != node:
            return self._refused(
                f"{MAPPED_ELSEWHERE}: replica {entry.ordinal} is mapped to {entry.node}:{entry.devices}, "
                f"not to node {node!r}"
            )
        return self._answer(pod, self.sched.placement.place(pod, decision, None, room=False))

    def _answer(self, pod: Mapping[str, Any], placed: Placed) -> str:
        """The bind verb's answer for the placement step's outcome ("" when bound)."""
        view, node = Pod(pod), placed.node
        if placed.bound:
            if placed.outcome is Outcome.BOUND:
                self.sched.metrics.pods_bound.inc()
            self.metrics.requests.labels("bind", "ok").inc()
            entry = placed.decision.entry if placed.decision else None
            log.info(
                "bound",
                extra={
                    "pod": view.key,
                    "node": node,
                    "gpus": entry.devices if entry else None,
                    "ordinal": entry.ordinal if entry else None,
                    "via": "extender",
                },
            )
            return ""
        if placed.outcome is Outcome.TAKEN and placed.decision is not None:
            return self._refused(refusal_text(placed.decision))
        if placed.outcome is Outcome.NOT_LEADER:
            self.metrics.requests.labels("bind", "error").inc()
            return f"{NOT_LEADER}: this replica of {self.name} lost the lease"
        if placed.error is not None:
            self.metrics.requests.labels("bind", "error").inc()
            self.sched.metrics.failures.labels(API_ERROR).inc()
            return f"{API_ERROR}: binding to node {node!r} failed: {error_message(placed.error)}"
        if placed.outcome is Outcome.ELSEWHERE:
            return self._refused(f"pod {view.key} was bound to node {node!r} by someone else")
        return self._refused(f"pod {view.key} was deleted or replaced")

    # -- health -------------------------------------------------------------------------

    def probes(self, base: Probes, server_alive: Callable[[], bool]) -> Probes:
        """The scheduler's probes, plus ``extender-leader`` (readiness) and ``extender`` (liveness).

        Readiness follows leadership so that the Service sends kube-scheduler to the
        leader only: its ledger is the one that holds every reservation.
        """

        def alive() -> dict[str, bool]:
            return {**base.alive(), "extender": server_alive()}

        def ready() -> dict[str, bool]:
            return {**base.ready(), "extender-leader": self.sched.is_leader()}

        def summary() -> dict[str, Any]:
            return {**base.summary(), "mode": "extender"}

        return Probes(alive, ready, summary, base.metrics)
