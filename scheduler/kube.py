"""Small helpers every writer shares: API time formats, releasing raw responses.

The client itself comes from :func:`gpu_scheduling.kubeclient.load_client`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

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


def discard(resp: Any) -> None:
    """Release a ``_preload_content=False`` response whose body is not needed.

    The body is read first: a connection returned to the pool with unread bytes
    would hand them to the next request as its status line.
    """
    try:
        resp.read()
    finally:
        resp.release_conn()


def send_json(
    api_client: Any,
    method: str,
    path: str,
    body: Mapping[str, Any],
    timeout: tuple[float, float],
    query: Sequence[tuple[str, str]] = (),
) -> None:
    """One write on the hot path, a plain dict in and nothing read back but the status.

    The generated API methods validate every argument with pydantic and build model
    objects, which the profile showed to be most of this process's CPU per pod
    (docs/benchmarks.md). This uses the same ApiClient (its connection pool, TLS, and
    credentials, refreshed tokens included) one layer down. Errors are the client's own
    ``ApiException`` (``api_error`` reads them as before).
    """
    method, url, headers, data, post = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=list(query),
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=dict(body),
        auth_settings=["BearerToken"],
    )
    resp = api_client.call_api(
        method, url, header_params=headers, body=data, post_params=post, _request_timeout=timeout
    )
    try:
        resp.read()
        if not 200 <= resp.status <= 299:
            text = resp.data.decode("utf-8", "replace") if resp.data else None
            raise ApiException.from_response(http_resp=resp, body=text, data=None)
    finally:
        release = getattr(resp.response, "release_conn", None)
        if release is not None:
            release()
