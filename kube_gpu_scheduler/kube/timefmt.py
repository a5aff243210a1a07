"""The API's time formats: metav1.Time, MicroTime, and reading them back."""

from __future__ import annotations

import datetime as dt

UTC = dt.UTC


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def micro_datetime(when: dt.datetime | None = None) -> dt.datetime:
    """A datetime for MicroTime fields of typed models (Event.eventTime, Lease.renewTime).

    The client serialises datetimes with ``isoformat()``, which drops the
    fraction when it is zero; the apiserver parses MicroTime with exactly six
    fraction digits and would reject that. Never zero, so always six digits.
    """
    when = when or now()
    return when if when.microsecond else when.replace(microsecond=1)


def micro_time(when: dt.datetime | None = None) -> str:
    """MicroTime as the apiserver writes it, for raw (patch) bodies."""
    return (when or now()).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(when: dt.datetime | None = None) -> str:
    """metav1.Time: whole seconds."""
    return (when or now()).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
