"""Prometheus metrics, in a registry of their own (served on /metrics)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sized

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kube_gpu_scheduler.domain.rules import ALL_REASONS, API_ERROR, BOUND_ELSEWHERE, GANG_WAITING

# Seconds from the moment this process first saw the pod pending to its Binding.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=r)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, buckets=LATENCY_BUCKETS, registry=r)

        self.pods_bound = counter(
            "gpu_scheduler_pods_bound", "Pods bound to their mapped node by this process."
        )
        self.failures = counter(
            "gpu_scheduler_scheduling_failures",
            "Scheduling attempts that did not bind, by reason (each retry counts).",
            "reason",
        )
        for reason in (*ALL_REASONS, API_ERROR, BOUND_ELSEWHERE, GANG_WAITING):
            self.failures.labels(reason)  # export zeros, so rate() works from the start
        self.bind_latency = histogram(
            "gpu_scheduler_bind_latency_seconds", "Time from first seeing a pod pending to binding it."
        )
        self.leader = gauge("gpu_scheduler_leader", "1 while this process holds the Lease.")
        self.leader_renewal_age = gauge(
            "gpu_scheduler_leader_last_renewal_age_seconds",
            "Seconds since this process saw the Lease record change (NaN without leader election).",
        )
        self.leader_renewal_age.set(math.nan)
        self.leader_healthy = gauge(
            "gpu_scheduler_leader_healthy",
            "1 while some replica keeps the Lease (renewed within 2x the lease duration), else 0.",
        )
        self.leader_healthy.set(1)
        self.queue_depth = gauge(
            "gpu_scheduler_queue_depth", "Pods waiting in the work queue (ready or retrying)."
        )
        self.unschedulable = gauge(
            "gpu_scheduler_unschedulable_pods", "Pods last refused and waiting for their cause to go."
        )
        self.not_injected = counter(
            "gpu_scheduler_not_injected_pods",
            "Mapped pods seen without the webhook's GPU variables (admitted while it was down or slow).",
        )
        self.recreated = counter(
            "gpu_scheduler_pods_recreated",
            "Pods admitted without injection that were deleted so that their controller recreates them.",
        )
        self.kubelet_refusals = counter(
            "gpu_scheduler_kubelet_refusals",
            "Pods this scheduler bound that the node's kubelet refused at admission, by status.reason.",
            "reason",
        )
        self.gc_full = counter(
            "gpu_scheduler_gc_full_collections",
            "Full garbage collections, by when they ran: quiet (no pod being placed) or deadline.",
            "when",
        )
        self.gc_full_seconds = counter(
            "gpu_scheduler_gc_full_collection_seconds",
            "Seconds spent in full garbage collections (the process holds its interpreter lock).",
        )
        for when in ("quiet", "deadline"):
            self.gc_full.labels(when)
        self.watch_relists = counter(
            "gpu_scheduler_watch_relists", "Full lists of a watched resource (start, 410 Gone).", "resource"
        )

        self.gangs_waiting = gauge(
            "gpu_scheduler_gangs_waiting",
            "Gangs (gpu-scheduler.io/gang) with no replica bound yet because one cannot be placed.",
        )
        self.gangs_admitted = counter(
            "gpu_scheduler_gangs_admitted",
            "Gangs whose every replica could be placed, so all were reserved and bound together.",
        )
        self.gang_wait = histogram(
            "gpu_scheduler_gang_wait_seconds",
            "Time a gang waited, from its first refusal to its admission (0 when it never waited).",
        )
        self._view = _View(list, dict)
        r.register(self._view)

    def track(self, queue_depth: Callable[[], float], unschedulable: Callable[[], float]) -> None:
        self.queue_depth.set_function(queue_depth)
        self.unschedulable.set_function(unschedulable)

    def track_leader(self, age: Callable[[], float | None], healthy: Callable[[], bool]) -> None:
        """Read the Lease's health at each scrape (``age`` None: not known yet, exported as NaN)."""

        def age_or_nan() -> float:
            value = age()
            return math.nan if value is None else value

        self.leader_renewal_age.set_function(age_or_nan)
        self.leader_healthy.set_function(lambda: 1.0 if healthy() else 0.0)

    def track_gangs(self, waiting: Callable[[], float]) -> None:
        self.gangs_waiting.set_function(waiting)

    def track_view(
        self,
        holders: Callable[[], list[dict[str, str]]],
        waiting: Callable[[], dict[str, int]],
        caches: Callable[[], Mapping[str, object]] = dict,
    ) -> None:
        """Read at each scrape: one ``gpu_scheduler_gpu_holder_info`` sample per held GPU
        (``holders``: its labels), ``gpu_scheduler_waiting_pods{reason}`` (``waiting``) and
        ``gpu_scheduler_watch_cache_objects{resource}`` (``caches``: each watch's cache)."""
        self._view.holders, self._view.waiting, self._view.caches = holders, waiting, caches

    def gc_collected(self, when: str, seconds: float) -> None:
        self.gc_full.labels(when).inc()
        self.gc_full_seconds.inc(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


HOLDER_LABELS = ("node", "gpu", "namespace", "pod", "statefulset", "ordinal", "mode")


class _View(Collector):
    """Who holds which GPU and who waits why, computed at scrape time from the caches."""

    def __init__(
        self, holders: Callable[[], list[dict[str, str]]], waiting: Callable[[], dict[str, int]]
    ) -> None:
        self.holders = holders
        self.waiting = waiting
        self.caches: Callable[[], Mapping[str, object]] = dict

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "gpu_scheduler_gpu_holder_info",
            "1 for each GPU a pod holds (bound, or reserved for it): the node, the GPU, and the holder.",
            labels=HOLDER_LABELS,
        )
        for held in self.holders():
            info.add_metric([held.get(k, "") for k in HOLDER_LABELS], 1.0)
        yield info
        waiting = GaugeMetricFamily(
            "gpu_scheduler_waiting_pods",
            "Pods this scheduler last refused and that still wait, by the reason of that refusal.",
            labels=("reason",),
        )
        counts = self.waiting()
        for reason in sorted({*ALL_REASONS, GANG_WAITING, *counts}):
            waiting.add_metric([reason], float(counts.get(reason, 0)))
        yield waiting
        objects = GaugeMetricFamily(
            "gpu_scheduler_watch_cache_objects",
            "Objects in each watch's cache: what this process has seen of the cluster "
            "(its memory grows with them).",
            labels=("resource",),
        )
        try:
            caches = self.caches()
        except AttributeError:  # scraped before the caches are attached
            caches = {}
        for resource, cache in sorted(caches.items()):
            if isinstance(cache, Sized):
                objects.add_metric([resource], float(len(cache)))
        yield objects

    def describe(self) -> list[GaugeMetricFamily]:
        return []
