"""Leader election decisions and the time formats the apiserver accepts."""

from __future__ import annotations

import datetime as dt
import logging
import re

import pytest
from kubernetes import client

from kube_gpu_scheduler.kube.timefmt import micro_datetime, micro_time, parse_time, rfc3339
from kube_gpu_scheduler.scheduler.runtime.leader import (
    ABSURD_FACTOR,
    RENEWAL_GRACE,
    LeaderElector,
    LeaseRecord,
    effective_duration,
    may_acquire,
    renewing,
)

INT32_MAX = 2147483647


def record(
    holder: str = "other", duration: float = 15, version: str = "42", renew_time: str | None = None
) -> LeaseRecord:
    return LeaseRecord(holder, duration, None, renew_time, 3, version)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def elector(clock: FakeClock, lease_duration: float = 15.0, identity: str = "me") -> LeaderElector:
    """An elector driven by hand: observe() and the clock; it never calls the API it is given."""
    return LeaderElector(
        client.CoordinationV1Api(client.ApiClient()),
        "ns",
        "gpu-scheduler",
        identity,
        lease_duration=lease_duration,
        renew_deadline=lease_duration * 2 / 3,
        retry_period=lease_duration / 7.5,
        clock=clock,
    )


def test_free_or_own_lease_may_be_taken_at_once() -> None:
    assert may_acquire(None, "me", observed_at=100, now=100)
    assert may_acquire(record(holder=""), "me", observed_at=100, now=100)
    assert may_acquire(record(holder="me"), "me", observed_at=100, now=100)


def test_someone_elses_lease_only_after_it_went_unrenewed_for_its_duration() -> None:
    held = record(holder="other", duration=15)
    assert not may_acquire(held, "me", observed_at=100, now=100)
    assert not may_acquire(held, "me", observed_at=100, now=114.9)
    assert may_acquire(held, "me", observed_at=100, now=115)


def test_an_absurd_duration_is_trusted_for_the_configured_duration_only() -> None:
    garbage = record(holder="garbage", duration=INT32_MAX)
    assert not may_acquire(garbage, "me", observed_at=100, now=114.9, configured=15)
    assert may_acquire(garbage, "me", observed_at=100, now=115, configured=15)
    # Without our duration the record's claim holds (for decades).
    assert not may_acquire(garbage, "me", observed_at=100, now=100 + 10 * 365 * 86400)


def test_absurd_means_over_ten_times_the_configured_duration() -> None:
    assert ABSURD_FACTOR == 10
    at_limit = record(duration=150)  # 10 x 15: a long but honest lease, trusted as written
    assert effective_duration(150, 15) == 150
    assert not may_acquire(at_limit, "me", observed_at=100, now=249.9, configured=15)
    assert may_acquire(at_limit, "me", observed_at=100, now=250, configured=15)
    over = record(duration=151)
    assert effective_duration(151, 15) == 15
    assert may_acquire(over, "me", observed_at=100, now=115, configured=15)
    # A shorter claim than ours is trusted as written (a released Lease says 1 s).
    assert effective_duration(1, 15) == 1
    assert may_acquire(record(duration=1), "me", observed_at=100, now=101, configured=15)


@pytest.mark.parametrize(
    "renew_time", [None, "", "2999-12-31T23:59:59.999999Z", "1970-01-01T00:00:00.000001Z"]
)
def test_renew_time_is_never_trusted(renew_time: str | None) -> None:
    # Only the local observation time counts: an empty or far-future renewTime blocks nothing,
    # an ancient one does not let anyone in early.
    held = record(duration=15, renew_time=renew_time)
    assert not may_acquire(held, "me", observed_at=100, now=114, configured=15)
    assert may_acquire(held, "me", observed_at=100, now=115, configured=15)


def test_renewing_rule() -> None:
    assert RENEWAL_GRACE == 2
    assert renewing(None, 15, leading=False)  # not read yet: no verdict
    assert renewing(29.9, 15, leading=False)
    assert not renewing(30, 15, leading=False)
    assert renewing(1000, 15, leading=True)  # the leader renews itself
    assert not renewing(0, 15, leading=False, absurd=True)
    assert renewing(0, 15, leading=True, absurd=True)


def test_health_of_a_standby_follows_the_renewals_it_observes() -> None:
    clock = FakeClock()
    e = elector(clock, lease_duration=3)
    h = e.health()
    assert (h.renewing, h.last_renewal_age_s, h.holder, h.leading) == (True, None, "", False)
    e.begin()
    e.observe(record(holder="leader", duration=3, version="1"))
    clock.now += 5.9
    h = e.health()
    assert h.renewing and h.holder == "leader" and h.last_renewal_age_s == pytest.approx(5.9)
    # The leader renews (a new resourceVersion): the age starts over.
    e.observe(record(holder="leader", duration=3, version="2"))
    clock.now += 5.9
    assert e.health().renewing
    # Re-reading the same record is no renewal.
    e.observe(record(holder="leader", duration=3, version="2"))
    clock.now += 0.1
    h = e.health()
    assert not h.renewing
    assert h.last_renewal_age_s == pytest.approx(6.0)
    assert h.lease_duration_s == 3
    assert not e.is_leader()
    # Someone takes over: healthy again at once.
    e.observe(record(holder="other", duration=3, version="3"))
    assert e.health().renewing
    assert e.health().as_dict() == {
        "holder": "other",
        "leading": False,
        "last_renewal_age_s": 0.0,
        "lease_duration_s": 3,
        "holder_lease_duration_s": 3,
        "absurd_duration": False,
        "renewing": True,
    }


def test_health_when_the_lease_is_never_read() -> None:
    # The apiserver does not answer: nothing is observed, the age grows from the first try.
    clock = FakeClock()
    e = elector(clock, lease_duration=3)
    e.begin()
    clock.now += 5.9
    assert e.health().renewing
    clock.now += 0.1
    assert not e.health().renewing


def test_a_holder_claiming_an_absurd_duration_is_not_a_healthy_leader(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    e = elector(clock, lease_duration=3)
    e.begin()
    with caplog.at_level(logging.WARNING, logger="gpu_scheduler.leader"):
        e.observe(record(holder="garbage", duration=INT32_MAX, version="1"))
        e.observe(record(holder="garbage", duration=INT32_MAX, version="2"))  # renewed: no second warning
    h = e.health()
    assert h.absurd_duration and not h.renewing
    assert h.holder_lease_duration_s == INT32_MAX
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "garbage" in warnings[0] and str(INT32_MAX) in warnings[0]
    # Our own record is never absurd to us, whatever it says.
    e.observe(record(holder="me", duration=INT32_MAX, version="3"))
    assert not e.health().absurd_duration


def test_lease_record_from_the_api_object() -> None:
    obj = {
        "metadata": {"name": "gpu-scheduler", "resourceVersion": "77"},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "acquireTime": "2024-01-01T00:00:00.000000Z",
            "renewTime": "2024-01-01T00:00:10.000000Z",
            "leaseTransitions": 2,
        },
    }
    obj["metadata"]["uid"] = "u-1"
    r = LeaseRecord.from_object(obj)
    assert (r.holder, r.duration, r.transitions, r.resource_version, r.uid) == ("a", 15.0, 2, "77", "u-1")
    released = LeaseRecord.from_object({"metadata": {}, "spec": {}})
    assert (released.holder, released.duration, released.transitions) == ("", 0.0, 0)


def test_micro_time_always_has_six_fraction_digits() -> None:
    whole = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert micro_time(whole) == "2024-01-01T00:00:00.000000Z"
    assert rfc3339(whole) == "2024-01-01T00:00:00Z"
    # What the typed client sends for a datetime: isoformat, which drops a zero fraction.
    serialized = client.ApiClient().sanitize_for_serialization(
        client.V1LeaseSpec(renew_time=micro_datetime(whole))
    )["renewTime"]
    assert re.fullmatch(r"2024-01-01T00:00:00\.\d{6}\+00:00", serialized), serialized


def test_parse_time() -> None:
    assert parse_time("2024-01-01T00:00:05.000001Z") == dt.datetime(2024, 1, 1, 0, 0, 5, 1, tzinfo=dt.UTC)
    assert parse_time(None) is None
    assert parse_time("yesterday") is None
