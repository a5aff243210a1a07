"""The API client and the small helpers every writer shares."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

UTC = dt.UTC


def build_api_client(kubeconfig: str | None, pool_size: int = 16, user_agent: str = "gpu-scheduler") -> Any:
    """An ApiClient from ``kubeconfig``, or the in-cluster ServiceAccount when None."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    # Two long watches, the lease, the event sender and the workers share the pool.
    configuration.connection_pool_maxsize = pool_size
    api = client.ApiClient(configuration)
    api.user_agent = user_agent
    return api


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


def status_of(err: BaseException) -> int | None:
    return err.status if isinstance(err, ApiException) else None


def error_message(err: BaseException) -> str:
    """The apiserver's Status message when there is one, else the exception text."""
    if isinstance(err, ApiException):
        try:
            body = json.loads(err.body or "")
            if isinstance(body, dict) and body.get("message"):
                return f"{err.status}: {body['message']}"
        except ValueError:
            pass
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"


def read_json(resp: Any) -> Any:
    """Body of a ``_preload_content=False`` response as JSON; releases the connection."""
    try:
        return json.loads(resp.data or b"null")
    finally:
        resp.release_conn()


def discard(resp: Any) -> None:
    """Release a ``_preload_content=False`` response whose body is not needed.

    The body is read first: a connection returned to the pool with unread bytes
    would hand them to the next request as its status line.
    """
    try:
        resp.read()
    finally:
        resp.release_conn()
