"""Leader election on a coordination.k8s.io/v1 Lease, as client-go does it.

* A candidate takes the Lease when it is free (no holder), already its own,
  or when its record has not changed for ``lease_duration`` seconds *as this
  process observed it* (local monotonic time: no trust in other clocks).
* Writes carry the resourceVersion read, so two candidates cannot both win.
* The leader renews every ``retry_period``. It counts as leader only while its
  last successful renewal started less than ``renew_deadline`` ago; past that
  it stops binding at once and goes back to standing by. Because
  ``renew_deadline < lease_duration``, a leader has stopped before any other
  candidate can take over.
* On shutdown the leader releases the Lease (no holder, 1 s duration) so a
  standby takes over at its next try instead of after ``lease_duration``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.kube import discard, error_message, micro_datetime, parse_time, read_json

log = logging.getLogger("gpu_scheduler.leader")


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration: float
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str

    @classmethod
    def from_object(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration=float(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=(lease.get("metadata") or {}).get("resourceVersion") or "",
        )


def may_acquire(record: LeaseRecord | None, identity: str, observed_at: float, now: float) -> bool:
    """Whether ``identity`` may write the Lease now.

    ``observed_at`` is when this process last saw the record change (monotonic);
    ``now`` is the same clock.
    """
    if record is None or not record.holder or record.holder == identity:
        return True
    return now >= observed_at + record.duration


class LeaderElector:
    def __init__(
        self,
        coordination: client.CoordinationV1Api,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = coordination
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._clock = clock
        self._lock = threading.Lock()
        self._leading = False
        self._renewed_at = 0.0  # start of the last successful write (monotonic)
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._timeout = max(1.0, renew_deadline / 2)
        self._thread: threading.Thread | None = None

    # -- state -------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True only while a renewal that started less than renew_deadline ago succeeded."""
        with self._lock:
            return self._leading and self._clock() - self._renewed_at < self.renew_deadline

    @property
    def holder(self) -> str:
        """The holder this process last saw (for /health)."""
        return self._observed.holder if self._observed else ""

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # -- loop ---------------------------------------------------------------------------

    def start(self, stop: threading.Event) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, args=(stop,), name="leader", daemon=True)
        self._thread.start()
        return self._thread

    def run(self, stop: threading.Event) -> None:
        log.info(
            "leader election started",
            extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
        )
        while not stop.is_set():
            started = self._clock()
            try:
                won = self.try_acquire_or_renew()
            except Exception as err:
                won = False
                log.warning("lease request failed", extra={"error": error_message(err)})
            if won:
                with self._lock:
                    self._renewed_at = started
                    became = not self._leading
                    self._leading = True
                if became:
                    log.info("became leader", extra={"lease": f"{self.namespace}/{self.name}"})
                    self._on_started()
            else:
                self._maybe_lose()
            period = self.retry_period if self._leading else self.retry_period * (1 + 0.2 * random.random())
            stop.wait(period)
        # Still leading here: the caller stops its workers, then calls release().

    def _maybe_lose(self) -> None:
        """Stop leading when another holder took the Lease, or when renewing failed for too long."""
        other = self._observed.holder if self._observed else ""
        taken = bool(other) and other != self.identity
        with self._lock:
            lost = self._leading and (taken or self._clock() - self._renewed_at >= self.renew_deadline)
            if lost:
                self._leading = False
        if lost:
            log.warning(
                f"lost the lease to {other}, standing by"
                if taken
                else "lost the lease: could not renew within the deadline, standing by",
                extra={"lease": f"{self.namespace}/{self.name}", "holder": other},
            )
            self._on_stopped()

    # -- the Lease ---------------------------------------------------------------------------

    def _lease(self, record: LeaseRecord | None, holder: str | None, duration: float) -> client.V1Lease:
        now = micro_datetime()
        keep = record is not None and record.holder == holder and holder
        acquire = parse_time(record.acquire_time) if keep and record else None
        transitions = (record.transitions if record else 0) + (0 if keep or holder is None else 1)
        return client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                resource_version=record.resource_version if record else None,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=holder,
                lease_duration_seconds=max(1, round(duration)),
                acquire_time=micro_datetime(acquire) if acquire else now,
                renew_time=now,
                lease_transitions=transitions if record else 0,
            ),
        )

    def _get(self) -> LeaseRecord | None:
        try:
            resp = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return LeaseRecord.from_object(read_json(resp))

    def _observe(self, record: LeaseRecord | None) -> None:
        if record is None:
            self._observed = None
            return
        if self._observed is None or record.resource_version != self._observed.resource_version:
            self._observed = record
            self._observed_at = self._clock()

    def try_acquire_or_renew(self) -> bool:
        record = self._get()
        if record is None:
            try:
                resp = self._api.create_namespaced_lease(
                    self.namespace,
                    self._lease(None, self.identity, self.lease_duration),
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            except ApiException as err:
                if err.status == 409:  # someone created it first
                    return False
                raise
            self._observe(LeaseRecord.from_object(read_json(resp)))
            return True
        self._observe(record)
        if not may_acquire(record, self.identity, self._observed_at, self._clock()):
            return False
        try:
            resp = self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                self._lease(record, self.identity, self.lease_duration),
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except ApiException as err:
            if err.status == 409:  # another candidate wrote first
                return False
            raise
        self._observe(LeaseRecord.from_object(read_json(resp)))
        return True

    def release(self) -> bool:
        """Give the Lease up if this process holds it (on shutdown, after the loop stopped)."""
        with self._lock:
            was_leading = self._leading
            self._leading = False
        if not was_leading:
            return False
        self._on_stopped()
        try:
            record = self._get()
            if record is None or record.holder != self.identity:
                return False
            resp = self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                self._lease(record, None, 1),
                _preload_content=False,
                _request_timeout=self._timeout,
            )
            discard(resp)
        except Exception as err:
            log.warning("could not release the lease", extra={"error": error_message(err)})
            return False
        log.info("released the lease", extra={"lease": f"{self.namespace}/{self.name}"})
        return True
