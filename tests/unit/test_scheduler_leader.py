"""Leader election decisions and the time formats the apiserver accepts."""

from __future__ import annotations

import datetime as dt
import re

from kubernetes import client

from scheduler.kube import micro_datetime, micro_time, parse_time, rfc3339
from scheduler.leader import LeaseRecord, may_acquire


def record(holder: str = "other", duration: float = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, None, None, 3, "42")


def test_free_or_own_lease_may_be_taken_at_once() -> None:
    assert may_acquire(None, "me", observed_at=100, now=100)
    assert may_acquire(record(holder=""), "me", observed_at=100, now=100)
    assert may_acquire(record(holder="me"), "me", observed_at=100, now=100)


def test_someone_elses_lease_only_after_it_went_unrenewed_for_its_duration() -> None:
    held = record(holder="other", duration=15)
    assert not may_acquire(held, "me", observed_at=100, now=100)
    assert not may_acquire(held, "me", observed_at=100, now=114.9)
    assert may_acquire(held, "me", observed_at=100, now=115)


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
    r = LeaseRecord.from_object(obj)
    assert (r.holder, r.duration, r.transitions, r.resource_version) == ("a", 15.0, 2, "77")
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
