"""``wait-ready``'s first condition, pure: does a scheduler hold its Lease?

The Lease (the scheduler chart's leader election) has a ``holderIdentity``, and its
``renewTime`` is within its ``leaseDurationSeconds`` of this process's clock, or the record
changed less than ``leaseDurationSeconds`` ago as observed here (:class:`LeaseTracker`), so a
node whose clock is off does not keep a working scheduler from counting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def parse_time(value: Any) -> datetime | None:
    """A Lease's MicroTime (``2026-01-01T10:00:00.123456Z``) as an aware datetime."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class LeaseView:
    holder: str
    duration: float
    renew_time: datetime | None
    raw_renew_time: str

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> LeaseView:
        spec = lease.get("spec") or {}
        raw = spec.get("renewTime")
        try:
            duration = float(spec.get("leaseDurationSeconds") or 0)
        except (TypeError, ValueError):
            duration = 0.0
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration=duration,
            renew_time=parse_time(raw),
            raw_renew_time=str(raw or ""),
        )


def lease_problem(
    lease: Mapping[str, Any] | None,
    namespace: str,
    name: str,
    now: datetime,
    changed_ago: float | None = None,
) -> str | None:
    """None when a scheduler holds the Lease, else what is missing, in words.

    ``now`` is this process's wall clock; ``changed_ago`` how long ago (seconds, this
    process's monotonic clock) it saw the holder or renewTime change, None when it has
    not seen a change yet.
    """
    where = f"Lease {name} in namespace {namespace}"
    if lease is None:
        return f"no scheduler holds {where}: the Lease does not exist (no scheduler has started)"
    view = LeaseView.of(lease)
    if not view.holder:
        return f"no scheduler holds {where}: its holderIdentity is empty (released by a stopping scheduler)"
    if view.duration <= 0:
        return f"no scheduler holds {where}: {view.holder!r} holds it with no leaseDurationSeconds"
    if changed_ago is not None and changed_ago <= view.duration:
        return None  # renewed, as seen here: whatever the clocks say
    if view.renew_time is None:
        return f"no scheduler holds {where}: {view.holder!r} holds it but never renewed it (no renewTime)"
    age = (now - view.renew_time).total_seconds()
    if abs(age) <= view.duration:
        return None
    when = f"{age:.0f} s ago" if age > 0 else f"{-age:.0f} s in the future (clock skew?)"
    return (
        f"no scheduler holds {where}: {view.holder!r} last renewed it {when}, "
        f"beyond its leaseDurationSeconds {view.duration:g} (that scheduler has stopped renewing)"
    )


class LeaseTracker:
    """When this process last saw the Lease's holder or renewTime change (its own clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: tuple[str, str] | None = None
        self._changed_at: float | None = None

    def observe(self, lease: Mapping[str, Any] | None) -> float | None:
        """Record ``lease``; seconds since its (holder, renewTime) last changed, or None when
        it has not changed since it was first seen (or there is none)."""
        now = self._clock()
        if lease is None:
            self._last, self._changed_at = None, None
            return None
        view = LeaseView.of(lease)
        key = (view.holder, view.raw_renew_time)
        if self._last is not None and key != self._last:
            self._changed_at = now
        self._last = key
        return None if self._changed_at is None else now - self._changed_at
