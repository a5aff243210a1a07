"""``gpu-scheduler``: the console script.

Reads the settings once, serves the HTTP endpoints, syncs the caches, takes
part in leader election and places pods until SIGTERM or SIGINT; then it stops
placing pods, releases the Lease and exits 0.
"""

from __future__ import annotations

import functools
import logging
import signal
import ssl
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from kubernetes import client

from kube_gpu_scheduler.base import logs
from kube_gpu_scheduler.domain import dra, tenancy
from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.client import load_client
from kube_gpu_scheduler.kube.informer import Informer, Obj
from kube_gpu_scheduler.kube.tls import server_context
from kube_gpu_scheduler.scheduler.dra.controller import CACHES, ClaimController
from kube_gpu_scheduler.scheduler.dra.metrics import ClaimMetrics
from kube_gpu_scheduler.scheduler.dra.topology import Notifying, TopologyPublisher
from kube_gpu_scheduler.scheduler.dra.writer import ClaimWriter
from kube_gpu_scheduler.scheduler.placing.core import Scheduler
from kube_gpu_scheduler.scheduler.placing.extender import Extender
from kube_gpu_scheduler.scheduler.placing.extender_http import ExtenderServer
from kube_gpu_scheduler.scheduler.placing.optin import InjectionScope
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.runtime import settings as settings_mod
from kube_gpu_scheduler.scheduler.runtime.collector import QuietCollector
from kube_gpu_scheduler.scheduler.runtime.leader import LeaderElector
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from kube_gpu_scheduler.scheduler.runtime.server import HealthServer
from kube_gpu_scheduler.scheduler.state.binding import PodWriter
from kube_gpu_scheduler.scheduler.state.pods import share_map_text
from kube_gpu_scheduler.scheduler.state.usage import ASSIGNED_SELECTOR, compact
from kube_gpu_scheduler.scheduler.tenancy.holdings import Lookup, Tenancy
from kube_gpu_scheduler.scheduler.tenancy.status import PolicyWriter, TenancyController

log = logging.getLogger("gpu_scheduler")


def build(settings: settings_mod.Settings, api_client: Any) -> Scheduler:
    """The scheduler and everything it talks to the API with: the pod writer, the event
    recorder, the three informers (whose handlers are the scheduler's), the elector, and in
    DRA mode the claim controller with its five informers, all on the one API client."""
    core = client.CoreV1Api(api_client)
    name = settings.scheduler_name
    metrics = Metrics()
    sched: Scheduler | None = None
    events = EventRecorder(
        client.EventsV1Api(api_client),
        controller=name,
        instance=f"{name}-{settings.identity}",
        # Scheduled Events wait while pods are being placed: Bindings first.
        busy=lambda: sched is not None and sched.placing(),
    )
    sched = Scheduler(settings, PodWriter(core, field_manager=name), events, metrics)
    on_pods, on_assigned, on_nodes = sched.handlers()
    pods = Informer(
        "pods",
        core.list_pod_for_all_namespaces,
        on_pods,
        field_selector=f"spec.schedulerName={name}",
        on_relist=sched.relisted,
        transform=share_map_text,
    )
    # Every bound, non-terminated pod (whoever placed it), as a footprint: what the fit checks count.
    assigned = Informer(
        "assigned-pods",
        core.list_pod_for_all_namespaces,
        on_assigned,
        # Bound pods of every other scheduler; ours (spec.schedulerName is immutable, so a
        # pod is on exactly one of the two watches) are counted from the pods informer.
        field_selector=f"{ASSIGNED_SELECTOR},spec.schedulerName!={name}",
        on_relist=sched.relisted,
        transform=compact,
    )
    nodes = Informer("nodes", core.list_node, on_nodes, on_relist=sched.relisted)
    elector: LeaderElector | None = None
    if settings.leader_elect:
        elector = LeaderElector(
            client.CoordinationV1Api(api_client),
            settings.lease_namespace,
            settings.lease_name,
            settings.identity,
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
            on_started=sched.started_leading,
            on_stopped=sched.stopped_leading,
            events=events,
        )
        lease = elector
        metrics.track_leader(lambda: lease.health().last_renewal_age_s, lambda: lease.health().renewing)
    claims, topology = build_claims(settings, api_client, sched) if settings.dra else (None, None)
    sched.attach(pods, assigned, nodes, elector, claims)
    if topology is not None:
        sched.controllers.append(topology)
    scope = settings.injection_scope() if settings.require_injection else None
    if settings.tenancy or scope is not None:
        build_tenancy(settings, api_client, sched, scope)
    return sched


def _labels_only(obj: Obj) -> Obj:
    """What the namespace cache keeps: the metadata the checks and the informer read."""
    meta = obj.get("metadata") or {}
    keep = ("name", "uid", "resourceVersion", "labels")
    return {"metadata": {k: meta[k] for k in keep if k in meta}}


class _Calls:
    """An informer handler made of three calls (add, update, delete)."""

    def __init__(self, *calls: object) -> None:
        self.calls = calls

    def on_add(self, obj: Obj) -> None:
        for call in self.calls:
            call(None, obj)  # type: ignore[operator]

    def on_update(self, old: Obj, new: Obj) -> None:
        for call in self.calls:
            call(old, new)  # type: ignore[operator]

    def on_delete(self, obj: Obj) -> None:
        for call in self.calls:
            call(obj, None)  # type: ignore[operator]


def build_tenancy(
    settings: settings_mod.Settings, api_client: Any, sched: Scheduler, scope_selector: Any
) -> None:
    """Tenancy (the policies' counts and checks, their status and grants writer) and the opt-in
    check, on two more informers of the one client: the GPUPinningPolicies (with tenancy) and
    the namespaces (their labels only)."""
    core = client.CoreV1Api(api_client)
    on_namespaces, on_policies = _Calls(), _Calls()  # their calls are set below
    namespaces = Informer(
        "namespaces",
        core.list_namespace,
        on_namespaces,
        on_relist=sched.relisted,
        transform=_labels_only,
    )
    policies: Informer | None = None
    counts: Tenancy | None = None
    if settings.tenancy:
        custom = client.CustomObjectsApi(api_client)
        list_fn = functools.partial(
            custom.list_cluster_custom_object, tenancy.GROUP, tenancy.VERSION, tenancy.PLURAL
        )
        policies = Informer("gpupinningpolicies", list_fn, on_policies, on_relist=sched.relisted)
        counts = Tenancy(
            sched.ledger, Lookup(sched.nodes.get, namespaces.get, policies.items), sched.queue.add
        )
        on_policies.calls = (counts.policy_changed,)
    scope = InjectionScope(scope_selector, namespaces.get, sched.queue.add) if scope_selector else None
    on_namespaces.calls = (
        *([counts.labels_changed] if counts else []),
        *([scope.namespace_changed] if scope else []),
    )
    controller = TenancyController(
        counts,
        PolicyWriter(api_client, field_manager=settings.scheduler_name),
        sched.is_leader,
        sched.nodes.items,
        settings.grants_configmap(),
        sched.metrics.registry,
    )
    controller.attach(policies, namespaces)
    sched.attach_tenancy(counts, scope, controller)


def build_claims(
    settings: settings_mod.Settings, api_client: Any, sched: Scheduler
) -> tuple[ClaimController, TopologyPublisher | None]:
    """DRA mode's claim controller: the scheduler's events, pod writer (evictions), leadership and
    metrics registry, a claim writer and five informers (whose handlers are the controller's:
    DRA replicas, ResourceClaims, ResourceSlices, StatefulSets, DeviceTaintRules) on the same client;
    with ``GPU_SCHEDULER_DRA_TOPOLOGY``, the publisher of the slices' topology for admission, told
    of each slice change by the slices informer."""
    claims = ClaimController(
        sched.events,
        ClaimWriter(api_client, field_manager=settings.scheduler_name),
        sched.writer,
        sched.is_leader,
        driver=settings.dra_driver,
        device_class=settings.dra_device_class,
        evict_other_workloads=settings.rollout_evict_other_workloads,
        workers=settings.workers,
        backoff=Backoff(settings.backoff_initial, settings.backoff_max),
        metrics=ClaimMetrics(sched.metrics),
    )
    core, resource, apps = (
        client.CoreV1Api(api_client),
        client.ResourceV1Api(api_client),
        client.AppsV1Api(api_client),
    )
    lists: tuple[tuple[Any, dict[str, Any]], ...] = (
        (core.list_pod_for_all_namespaces, {"label_selector": f"{dra.POD_LABEL}=true"}),
        (resource.list_resource_claim_for_all_namespaces, {}),
        (resource.list_resource_slice, {}),
        (apps.list_stateful_set_for_all_namespaces, {}),
        (resource.list_device_taint_rule, {}),
    )
    handlers: list[Any] = list(claims.handlers())
    topology = None
    configmap = settings.topology_configmap()
    if configmap is not None:
        topology = TopologyPublisher(
            configmap,
            lambda: claims.slices.items(),  # noqa: PLW0108 (attach() sets the cache below)
            ClaimWriter(api_client, field_manager=settings.scheduler_name).publish_topology,
            sched.is_leader,
            settings.dra_driver,
        )
        handlers[2] = Notifying(handlers[2], topology.changed)
    claims.attach(
        *(
            Informer(name, list_fn, on, on_relist=sched.relisted, **kwargs)
            for name, (list_fn, kwargs), on in zip(CACHES, lists, handlers, strict=True)
        )
    )
    return claims, topology


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = settings_mod.load(argv)
    except settings_mod.SettingsError as err:
        logs.setup("INFO")
        log.error("invalid settings", extra={"error": str(err)})
        return 2
    logs.setup(settings.log_level)
    log.info(
        "starting",
        extra={
            "schedulerName": settings.scheduler_name,
            "identity": settings.identity,
            "leaderElect": settings.leader_elect,
            "lease": f"{settings.lease_namespace}/{settings.lease_name}",
            "httpPort": settings.http_port,
            "mode": settings.mode,
        },
    )
    try:
        api_client = load_client(
            settings.kubeconfig,
            # The workers, the watches, the Lease and the events; in DRA mode also the claim
            # controller's workers and its five watches.
            pool_size=settings.workers + 10 + (settings.workers + 5 if settings.dra else 0),
            user_agent=f"gpu-scheduler/{settings.identity}",
        )
    except Exception as err:
        log.error("cannot load the Kubernetes client configuration", extra={"error": str(err)})
        return 1

    scheduler = build(settings, api_client)

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("shutting down", extra={"signal": signal.Signals(signum).name})
        scheduler.stop_event.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    probes = scheduler.probes()
    extender_server: ExtenderServer | None = None
    if settings.mode == settings_mod.EXTENDER:
        try:
            ctx = server_context(
                settings.extender_tls_cert_file,
                settings.extender_tls_key_file,
                settings.extender_client_ca_file,
                require_client_cert=True,
            )
            extender = Extender(scheduler, api_client)
            extender_server = ExtenderServer(settings.extender_address, settings.extender_port, extender, ctx)
        except (OSError, ssl.SSLError) as err:
            log.error("cannot serve the extender", extra={"port": settings.extender_port, "error": str(err)})
            return 1
        probes = extender.probes(probes, extender_server.alive)
    try:
        server = HealthServer(settings.http_address, settings.http_port, probes)
    except OSError as err:
        log.error("cannot listen", extra={"port": settings.http_port, "error": str(err)})
        return 1
    server.start()
    if extender_server is not None:
        extender_server.start()
    scheduler.start()
    # Full garbage collections out of the bursts (kube_gpu_scheduler/scheduler/runtime/collector.py); the start-up
    # state, frozen once every cache has listed, is never walked again.
    QuietCollector(
        scheduler.placing,
        settings.gc_max_defer,
        on_collected=scheduler.metrics.gc_collected,
    ).start(scheduler.stop_event, ready=lambda: all(c.synced.is_set() for c in scheduler.caches().values()))
    try:
        scheduler.run_until_stopped()
    finally:
        if extender_server is not None:
            extender_server.stop()  # no bind may start while the Lease is being released
        scheduler.shutdown()
        server.stop()
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
