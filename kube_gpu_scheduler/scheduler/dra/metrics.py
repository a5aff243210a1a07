"""DRA mode's claim controller metrics, in the scheduler's registry (served on /metrics beside
:class:`kube_gpu_scheduler.scheduler.runtime.metrics.Metrics`'s).

* ``gpu_scheduler_dra_queue_depth``: keys in the controller's work queue (ready or retrying);
* ``gpu_scheduler_dra_keys_processed_total{kind,outcome}``: keys processed, ``kind`` ``pod`` (a
  replica) or ``claim`` (a claim of ours), ``outcome`` ``done``, ``again`` (changed under us or
  an API error: retried with the key's backoff), ``waiting`` (for a device another claim holds:
  retried too) or ``error`` (an unexpected exception, logged);
* ``gpu_scheduler_dra_key_processing_seconds{kind}``: the time one key's work took, its API
  writes included;
* ``gpu_scheduler_dra_key_cpu_seconds_total{kind}``: the CPU time the worker threads spent on
  keys (``time.thread_time``: the wait for an API answer left out), the controller's own work:
  what ``make bench`` reads to show that the work per replica does not grow with the cluster's
  other claims;
* ``gpu_scheduler_dra_events_total{reason}``: the Events the controller reported, by reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from kube_gpu_scheduler.domain.rules.catalogue import DRA_CLAIM_REASONS, EVICTED_FOR_ROLLOUT
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics

KINDS = ("pod", "claim")
OUTCOMES = ("done", "again", "waiting", "error")
# The controller's Events (exported at zero from the start, so rate() works).
REASONS = (*DRA_CLAIM_REASONS, EVICTED_FOR_ROLLOUT)
# One key's work: cache reads (microseconds) and, when it writes, one or two API round trips.
KEY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ClaimMetrics:
    def __init__(self, metrics: Metrics | None = None) -> None:
        r = (metrics or Metrics()).registry
        self.queue_depth = Gauge(
            "gpu_scheduler_dra_queue_depth",
            "Keys (replicas, claims of ours) in the DRA claim controller's work queue, ready or retrying.",
            registry=r,
        )
        self.processed = Counter(
            "gpu_scheduler_dra_keys_processed",
            "Keys the DRA claim controller processed, by kind (pod, claim) and outcome "
            "(done, again, waiting, error).",
            ["kind", "outcome"],
            registry=r,
        )
        for kind in KINDS:
            for outcome in OUTCOMES:
                self.processed.labels(kind, outcome)
        self.seconds = Histogram(
            "gpu_scheduler_dra_key_processing_seconds",
            "Time the DRA claim controller spent on one key (its API writes included), by kind.",
            ["kind"],
            buckets=KEY_BUCKETS,
            registry=r,
        )
        self.cpu = Counter(
            "gpu_scheduler_dra_key_cpu_seconds",
            "CPU time the DRA claim controller's worker threads spent on keys (waits for the API left out), by kind.",
            ["kind"],
            registry=r,
        )
        for kind in KINDS:
            self.cpu.labels(kind)
        self.events = Counter(
            "gpu_scheduler_dra_events",
            "Events the DRA claim controller reported, by reason (a repeated note counts each time; "
            "the recorder writes it as one Event's series).",
            ["reason"],
            registry=r,
        )
        for reason in REASONS:
            self.events.labels(reason)

    def track(self, queue_depth: Callable[[], float]) -> None:
        self.queue_depth.set_function(queue_depth)

    def key(self, kind: str, outcome: str, seconds: float, cpu_seconds: float) -> None:
        self.processed.labels(kind, outcome).inc()
        self.seconds.labels(kind).observe(seconds)
        self.cpu.labels(kind).inc(max(0.0, cpu_seconds))

    def counting(self, events: EventRecorder) -> EventRecorder:
        """``events``, each Event counted by reason on its way."""
        return _Counting(events, self.events)  # type: ignore[return-value]


class _Counting:
    """What the controller (and its eviction decision) calls of an :class:`EventRecorder`."""

    def __init__(self, events: EventRecorder, counter: Counter) -> None:
        self._events = events
        self._counter = counter

    def warning(self, pod: Mapping[str, Any], reason: str, note: str) -> bool:
        self._counter.labels(reason).inc()
        return self._events.warning(pod, reason, note)

    def normal(self, pod: Mapping[str, Any], reason: str, note: str) -> None:
        self._counter.labels(reason).inc()
        self._events.normal(pod, reason, note)
