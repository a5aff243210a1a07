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
* A record that claims more than ``ABSURD_FACTOR`` times our own
  ``lease_duration`` (a garbage or hostile Lease, e.g. 2147483647 s) is
  trusted for ``lease_duration`` only: taken over once it went unrenewed
  that long, with a WARNING log and an Event on the Lease.
* Health (:meth:`LeaderElector.health`, :func:`renewing`): the Lease counts
  as kept while this process leads, or while its record changed less than
  ``RENEWAL_GRACE`` times ``lease_duration`` ago (as observed here) and does
  not claim an absurd duration. Readiness and a gauge report it; liveness
  does not (a restart cannot make anyone renew).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.domain.objects import Meta
from kube_gpu_scheduler.domain.rules import ABSURD_LEASE_DURATION
from kube_gpu_scheduler.kube.errors import ApiError, api_error, error_message
from kube_gpu_scheduler.kube.jsonio import discard, read_json
from kube_gpu_scheduler.kube.timefmt import micro_datetime, parse_time

log = logging.getLogger("gpu_scheduler.leader")

# A record claiming more than ABSURD_FACTOR x our lease duration is trusted for our duration only.
ABSURD_FACTOR = 10
# Nobody renewed for RENEWAL_GRACE x our lease duration: scheduling is stalled (readiness fails).
RENEWAL_GRACE = 2
EVENT_ACTION = "LeaderElection"


class LeaseEvents(Protocol):
    """Where the elector reports a takeover worth an Event (kube_gpu_scheduler.scheduler.report.events.EventRecorder)."""

    def object_warning(
        self, regarding: client.V1ObjectReference, reason: str, note: str, action: str
    ) -> None: ...


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration: float
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str
    uid: str = ""

    @classmethod
    def from_object(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        view = Meta(lease)
        spec = view.spec
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration=float(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=view.resource_version or "",
            uid=view.uid,
        )


def is_absurd(duration: float, configured: float) -> bool:
    """A claimed duration over ``ABSURD_FACTOR`` times ours."""
    return duration > ABSURD_FACTOR * configured


def effective_duration(duration: float, configured: float | None) -> float:
    """How long a record that stopped changing is trusted: its own claim, unless absurd (then ours)."""
    if configured is not None and is_absurd(duration, configured):
        return configured
    return duration


def may_acquire(
    record: LeaseRecord | None,
    identity: str,
    observed_at: float,
    now: float,
    configured: float | None = None,
) -> bool:
    """Whether ``identity`` may write the Lease now.

    ``observed_at`` is when this process last saw the record change (monotonic);
    ``now`` is the same clock. ``configured`` is our own lease duration: a
    record claiming over ``ABSURD_FACTOR`` times it is trusted for
    ``configured`` seconds only. The record's renewTime is never read (other
    clocks are not trusted), so an empty or far-future renewTime blocks
    nothing.
    """
    if record is None or not record.holder or record.holder == identity:
        return True
    return now >= observed_at + effective_duration(record.duration, configured)


def renewing(age: float | None, lease_duration: float, leading: bool, absurd: bool = False) -> bool:
    """Whether a sound leader keeps the Lease.

    True while this process leads, or while the record changed less than
    ``RENEWAL_GRACE`` x ``lease_duration`` ago (``age``, observed here; None:
    not read yet, so no verdict) and its holder does not claim an ``absurd``
    duration (no replica of ours writes one: garbage, or replicas that
    disagree on their timings).
    """
    if leading or age is None:
        return True
    return age < RENEWAL_GRACE * lease_duration and not absurd


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True)
class LeaderHealth:
    """What /health, /readyz and /metrics report about the Lease."""

    holder: str  # the holder last observed ("" when free or not read yet)
    leading: bool
    # Since the record last changed, as observed here (monotonic); None before the first try.
    last_renewal_age_s: float | None
    lease_duration_s: float  # ours (GPU_SCHEDULER_LEASE_DURATION), not the record's claim
    holder_lease_duration_s: float | None  # what the record claims
    absurd_duration: bool  # another holder claims over ABSURD_FACTOR x lease_duration_s
    renewing: bool  # see renewing()

    def as_dict(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "leading": self.leading,
            "last_renewal_age_s": _rounded(self.last_renewal_age_s),
            "lease_duration_s": self.lease_duration_s,
            "holder_lease_duration_s": self.holder_lease_duration_s,
            "absurd_duration": self.absurd_duration,
            "renewing": self.renewing,
        }


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
        events: LeaseEvents | None = None,
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
        self._events = events
        self._clock = clock
        self._lock = threading.Lock()
        self._leading = False
        self._renewed_at = 0.0  # start of the last successful write (monotonic)
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._started_at: float | None = None  # first try (monotonic); health is unknown before
        self._warned: tuple[str, float] | None = None  # (holder, duration) last warned about as absurd
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

    def health(self) -> LeaderHealth:
        """The Lease as this process sees it (for /health, /readyz, /metrics)."""
        leading = self.is_leader()
        with self._lock:
            observed = self._observed
            age = None if self._started_at is None else max(0.0, self._clock() - self._observed_at)
        absurd = (
            observed is not None
            and bool(observed.holder)
            and observed.holder != self.identity
            and is_absurd(observed.duration, self.lease_duration)
        )
        return LeaderHealth(
            holder=observed.holder if observed else "",
            leading=leading,
            last_renewal_age_s=age,
            lease_duration_s=self.lease_duration,
            holder_lease_duration_s=observed.duration if observed else None,
            absurd_duration=absurd,
            renewing=renewing(age, self.lease_duration, leading, absurd),
        )

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

    def begin(self) -> None:
        """Start the renewal clock: from now on, no change for long enough makes health fail."""
        with self._lock:
            if self._started_at is None:
                self._started_at = self._observed_at = self._clock()

    def run(self, stop: threading.Event) -> None:
        log.info(
            "leader election started",
            extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
        )
        self.begin()
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
            if api_error(err) is ApiError.NOT_FOUND:
                return None
            raise
        return LeaseRecord.from_object(read_json(resp))

    def observe(self, record: LeaseRecord | None) -> None:
        """Record what a read or a write of the Lease returned (its change time is the local clock)."""
        with self._lock:
            if record is None:
                if self._observed is not None:  # deleted: a change too
                    self._observed = None
                    self._observed_at = self._clock()
                return
            if self._observed is not None and record.resource_version == self._observed.resource_version:
                return
            self._observed = record
            self._observed_at = self._clock()
        if (
            record.holder
            and record.holder != self.identity
            and is_absurd(record.duration, self.lease_duration)
            and self._warned != (record.holder, record.duration)
        ):
            self._warned = (record.holder, record.duration)
            log.warning(
                f"lease holder {record.holder} claims leaseDurationSeconds={record.duration:.0f}, over "
                f"{ABSURD_FACTOR}x the configured {self.lease_duration:g}s: trusting it for "
                f"{self.lease_duration:g}s only",
                extra={
                    "lease": f"{self.namespace}/{self.name}",
                    "holder": record.holder,
                    "leaseDurationSeconds": int(record.duration),
                },
            )

    def _took_over_absurd(self, record: LeaseRecord) -> None:
        """We replaced a record whose duration was absurd: say so in the log and on the Lease."""
        note = (
            f"lease holder {record.holder!r} claimed leaseDurationSeconds={record.duration:.0f}, over "
            f"{ABSURD_FACTOR}x the configured {self.lease_duration:g}s, and did not renew for "
            f"{self.lease_duration:g}s: taken over by {self.identity!r}"
        )
        log.warning(
            "took over a lease with an absurd duration",
            extra={
                "lease": f"{self.namespace}/{self.name}",
                "holder": record.holder,
                "leaseDurationSeconds": int(record.duration),
                "detail": note,
            },
        )
        if self._events is None:
            return
        try:
            self._events.object_warning(
                client.V1ObjectReference(
                    api_version="coordination.k8s.io/v1",
                    kind="Lease",
                    namespace=self.namespace,
                    name=self.name,
                    uid=record.uid or None,
                ),
                ABSURD_LEASE_DURATION,
                note,
                EVENT_ACTION,
            )
        except Exception as err:  # an Event is best effort; leading is not
            log.warning("could not record the lease event", extra={"error": error_message(err)})

    def _write(self, call: Any, *args: Any) -> bool:
        """Create or replace the Lease; False (nothing written) when another candidate wrote first (409)."""
        try:
            resp = call(*args, _preload_content=False, _request_timeout=self._timeout)
        except ApiException as err:
            if api_error(err) is ApiError.CONFLICT:
                return False
            raise
        self.observe(LeaseRecord.from_object(read_json(resp)))
        return True

    def try_acquire_or_renew(self) -> bool:
        record = self._get()
        if record is None:
            lease = self._lease(None, self.identity, self.lease_duration)
            return self._write(self._api.create_namespaced_lease, self.namespace, lease)
        self.observe(record)
        if not may_acquire(record, self.identity, self._observed_at, self._clock(), self.lease_duration):
            return False
        lease = self._lease(record, self.identity, self.lease_duration)
        if not self._write(self._api.replace_namespaced_lease, self.name, self.namespace, lease):
            return False
        if (
            record.holder
            and record.holder != self.identity
            and is_absurd(record.duration, self.lease_duration)
        ):
            self._took_over_absurd(record)
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
