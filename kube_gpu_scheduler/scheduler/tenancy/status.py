"""What the scheduler writes and exports about tenancy: the policies' status, the grants for
admission, the metrics per policy.

:class:`TenancyController` runs beside the placement loop (core's ``Controller``): it owns the
informers of the GPUPinningPolicies and the namespaces (also read by the opt-in check,
:mod:`kube_gpu_scheduler.scheduler.placing.optin`) and, on the leader only, a thread that once a
second, when something changed (and every minute regardless):

* writes each policy's ``status`` (GPUs held in all, per namespace and type; the nodes it
  selects; ``observedGeneration``; the ``Enforced`` and ``LimitReached`` conditions) with a
  PUT of ``gpupinningpolicies/status`` carrying the cached resourceVersion, only where it
  changed (a conflict: the next round writes it again from the newer copy). The counts are
  written once they have been still for a round, or at the latest ``MAX_LAG_S`` after they
  first changed: during a burst of binds (hundreds a second, across as many policies) the
  apiserver's time goes to the Bindings, not to a status PUT per policy per second, and
  each write's watch event back to this scheduler;
* publishes the resolved grants (``policy.<name>`` -> the nodes it selects, ``ns.<namespace>``
  -> the policies that select it) into the ConfigMap the chart renders for them
  (``GPU_SCHEDULER_TENANCY_GRANTS``), by server-side apply: what the ValidatingAdmissionPolicy
  (as its parameter) and the webhook read to refuse a map naming an ungranted node at apply.

Its metrics are read from the counts at each scrape (:class:`PolicyCollector`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kube_gpu_scheduler.domain.rules import (
    POLICY_AT_LIMIT,
    POLICY_BELOW_LIMITS,
    POLICY_COUNTED,
    POLICY_INVALID,
)
from kube_gpu_scheduler.domain.tenancy import (
    API_VERSION,
    ENFORCED,
    KIND,
    LIMIT_REACHED,
    PLURAL,
    Grants,
    Policy,
    labels_of,
    same_status,
    status_of,
)
from kube_gpu_scheduler.kube.errors import ApiError, api_error, short_error
from kube_gpu_scheduler.kube.informer import Obj
from kube_gpu_scheduler.kube.jsonio import send_json
from kube_gpu_scheduler.kube.timefmt import rfc3339
from kube_gpu_scheduler.scheduler.state.binding import TIMEOUT
from kube_gpu_scheduler.scheduler.tenancy.holdings import Tenancy

log = logging.getLogger("gpu_scheduler.tenancy")

REASONS = {
    ENFORCED: POLICY_COUNTED,
    f"{ENFORCED}/False": POLICY_INVALID,
    LIMIT_REACHED: POLICY_AT_LIMIT,
    f"{LIMIT_REACHED}/False": POLICY_BELOW_LIMITS,
}
POLICIES = f"/apis/{API_VERSION}/{PLURAL}"
APPLY_PATCH = "application/apply-patch+yaml"
TICK_S = 1.0
RESYNC_S = 60.0
# The longest the status lags behind counts that keep changing (a long burst of binds).
MAX_LAG_S = 10.0


def status_due(changed: threading.Event, dirty_since: float | None, now: float) -> tuple[float | None, bool]:
    """One round of the writer: (when the counts first changed, unwritten, or None; whether to
    write now). ``changed`` set since the last round: the counts are still moving, so wait for
    a quiet round, unless they first changed ``MAX_LAG_S`` ago. Clears ``changed``."""
    moving = changed.is_set()
    if moving:
        changed.clear()
        if dirty_since is None:
            dirty_since = now
    if dirty_since is None:
        return None, False
    return dirty_since, not moving or now - dirty_since >= MAX_LAG_S


class PolicyWriter:
    """The tenancy writes, on the scheduler's one API client."""

    def __init__(self, api_client: Any, field_manager: str) -> None:
        self._api = api_client
        self._field_manager = field_manager

    def write_status(self, policy: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        """PUT the policy's status (its cached resourceVersion); False when it changed or went."""
        meta = dict(policy.get("metadata") or {})
        meta.pop("managedFields", None)
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "status": dict(status)}
        if "spec" in policy:
            body["spec"] = policy["spec"]
        try:
            send_json(
                self._api,
                "PUT",
                f"{POLICIES}/{meta.get('name')}/status",
                body,
                TIMEOUT,
                query=[("fieldManager", self._field_manager)],
            )
        except ApiException as err:
            if api_error(err) in (ApiError.CONFLICT, ApiError.NOT_FOUND):
                return False
            raise
        return True

    def publish_grants(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Server-side apply of the grants ConfigMap's ``data`` (this manager owns it all)."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": dict(data),
        }
        send_json(
            self._api,
            "PATCH",
            f"/api/v1/namespaces/{namespace}/configmaps/{name}",
            body,
            TIMEOUT,
            query=[("fieldManager", self._field_manager), ("force", "true")],
            content_type=APPLY_PATCH,
        )


class PolicyCollector(Collector):
    """The policies' counts as gauges, read at each scrape."""

    def __init__(self, tenancy: Tenancy) -> None:
        self._tenancy = tenancy

    def collect(self) -> Iterator[GaugeMetricFamily]:
        policies, held = self._tenancy.snapshot()
        total = GaugeMetricFamily(
            "gpu_scheduler_policy_gpus_held", "GPUs held through a GPUPinningPolicy now.", labels=["policy"]
        )
        per_ns = GaugeMetricFamily(
            "gpu_scheduler_policy_namespace_gpus_held",
            "GPUs a namespace holds through a GPUPinningPolicy now, by GPU type ('' unlabelled).",
            labels=["policy", "namespace", "product"],
        )
        limits = GaugeMetricFamily(
            "gpu_scheduler_policy_gpus_max",
            "A GPUPinningPolicy's limits: spec.maxGPUs (product '') and spec.gpuTypes.",
            labels=["policy", "product"],
        )
        for name, policy in sorted(policies.items()):
            counts = held.get(name)
            total.add_metric([name], counts.total if counts else 0)
            for (ns, product), gpus in sorted((counts.by if counts else {}).items()):
                per_ns.add_metric([name, ns, product], gpus)
            if policy.max_gpus is not None:
                limits.add_metric([name, ""], policy.max_gpus)
            for product, most in policy.types:
                limits.add_metric([name, product], most)
        yield from (total, per_ns, limits)


class TenancyController:
    """The tenancy informers and, on the leader, the status and grants writer."""

    def __init__(
        self,
        tenancy: Tenancy | None,
        writer: PolicyWriter,
        is_leader: Callable[[], bool],
        nodes: Callable[[], list[Obj]],
        grants: tuple[str, str] | None,
        registry: CollectorRegistry,
    ) -> None:
        self.tenancy = tenancy
        self._writer = writer
        self._is_leader = is_leader
        self._nodes = nodes
        self._grants = grants  # (namespace, name) of the ConfigMap, or None: not published
        self._published: dict[str, str] | None = None
        self._node_counts: dict[str, int] = {}
        self._wake = threading.Event()
        self.policies: Any = None
        self.namespaces: Any = None
        self.refusals = Counter(
            "gpu_scheduler_policy_refusals",
            "Replicas refused for a GPUPinningPolicy's limit (each retry counts).",
            ["policy"],
            registry=registry,
        )
        if tenancy is not None:
            registry.register(PolicyCollector(tenancy))
            tenancy.on_refused = lambda policy: self.refusals.labels(policy).inc()

    def attach(self, policies: Any, namespaces: Any) -> None:
        self.policies, self.namespaces = policies, namespaces

    # -- core's Controller ---------------------------------------------------------------------

    def caches(self) -> dict[str, Any]:
        out = {"namespaces": self.namespaces}
        if self.policies is not None:
            out["gpupinningpolicies"] = self.policies
        return out

    def busy(self) -> bool:
        return False

    def started_leading(self) -> None:
        self._published = None  # publish everything again: another leader may have written meanwhile
        if self.tenancy is not None:
            self.tenancy.changed.set()
            self.tenancy.grants_changed.set()
        self._wake.set()

    def start_workers(self, stop: threading.Event) -> list[threading.Thread]:
        if self.tenancy is None:
            return []
        thread = threading.Thread(target=self._run, args=(stop,), name="tenancy-status", daemon=True)
        thread.start()
        return [thread]

    def shutdown(self) -> None:
        self._wake.set()

    # -- the writer ----------------------------------------------------------------------------------

    def _run(self, stop: threading.Event) -> None:
        assert self.tenancy is not None
        last_full = 0.0
        dirty_since: float | None = None  # when the counts first changed since the last write
        while not stop.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            if stop.is_set() or not self._is_leader():
                continue
            now = time.monotonic()
            full = now - last_full > RESYNC_S
            try:
                if full or self.tenancy.grants_changed.is_set():
                    self.tenancy.grants_changed.clear()
                    self.publish_grants()
                dirty_since, due = status_due(self.tenancy.changed, dirty_since, now)
                if full or due:
                    dirty_since = None
                    self.write_statuses()
                if full:
                    last_full = now
            except Exception as err:
                log.warning(
                    "could not write the policies' status or grants", extra={"error": short_error(err)}
                )
                self.tenancy.changed.set()
                self.tenancy.grants_changed.set()

    def resolve(self) -> Grants:
        assert self.tenancy is not None
        policies, _ = self.tenancy.snapshot()
        namespaces = {str(o["metadata"]["name"]): labels_of(o) for o in self.namespaces.items()}
        nodes = {str(o["metadata"]["name"]): labels_of(o) for o in self._nodes()}
        return Grants.resolve(policies.values(), namespaces, nodes)

    def publish_grants(self) -> None:
        grants = self.resolve()
        self._node_counts = {name: len(nodes) for name, nodes in grants.nodes_of.items()}
        data = grants.to_data()
        if self._grants is None or data == self._published:
            return
        self._writer.publish_grants(*self._grants, data)
        self._published = data
        log.info(
            "published the grants",
            extra={"configmap": "/".join(self._grants), "policies": len(grants.nodes_of)},
        )

    def write_statuses(self) -> None:
        assert self.tenancy is not None
        policies, held = self.tenancy.snapshot()
        stamp = rfc3339()
        for obj in self.policies.items():
            name = str(obj["metadata"]["name"])
            policy = policies.get(name) or Policy.of(obj)
            old = obj.get("status") if isinstance(obj.get("status"), Mapping) else None
            counts = held.get(name)
            if counts is None:
                continue  # created since the snapshot: the next round
            status = status_of(policy, counts, self._node_counts.get(name, 0), old, stamp, REASONS)
            if same_status(old, status):
                continue
            if not self._writer.write_status(obj, status):
                self.tenancy.changed.set()  # changed under us: the next round, from the newer copy
