"""The one Kubernetes client loader, and the apiserver's errors in a small vocabulary.

:func:`load_client` is how every product component (the scheduler, the
webhook's node cache, ``gpu-scheduler-check verify-release``) gets an
``ApiClient``. The configuration is looked for in this order:

1. the kubeconfig file the caller names (``--kubeconfig``, or the setting read
   from ``KUBECONFIG`` by the component's settings);
2. ``$KUBECONFIG`` (a user who sets it means it, in a pod too);
3. the pod's ServiceAccount (in-cluster), when ``KUBERNETES_SERVICE_HOST`` is set;
4. ``~/.kube/config`` when it exists;

and otherwise :class:`KubeConfigError` says which of them were tried.

:func:`api_error` maps an exception to an :class:`ApiError` kind, so callers
test ``api_error(err) is ApiError.NOT_FOUND`` instead of ``err.status == 404``.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


class KubeConfigError(Exception):
    """No usable Kubernetes client configuration; the message says what was tried."""


def _source(kubeconfig: str | None, env: Mapping[str, str], fallbacks: bool) -> str | None:
    """The kubeconfig file to load, ``""`` for in-cluster; raises KubeConfigError when none applies."""
    if kubeconfig:
        return kubeconfig
    if fallbacks and env.get("KUBECONFIG"):
        return env["KUBECONFIG"]
    if env.get(IN_CLUSTER_ENV):
        return ""
    home = Path(os.path.expanduser("~/.kube/config"))
    if fallbacks and home.is_file():
        return str(home)
    why = "neither KUBECONFIG nor an in-cluster service account is available"
    raise KubeConfigError(why + (f", and {home} does not exist" if fallbacks else ""))


def load_client(
    kubeconfig: str | None = None,
    *,
    pool_size: int | None = None,
    user_agent: str | None = None,
    fallbacks: bool = True,
    env: Mapping[str, str] | None = None,
) -> client.ApiClient:
    """An ApiClient (see the module docstring for the order); raises KubeConfigError.

    ``fallbacks=False`` tries only ``kubeconfig`` and in-cluster (steps 1 and 3): for a
    component whose settings already read ``KUBECONFIG`` and that runs without API
    access rather than with a developer's own ``~/.kube/config``.
    ``pool_size`` bounds the connections kept open to the apiserver (the scheduler's
    watches, lease and workers share them); ``user_agent`` names the component in
    the apiserver's audit log.
    """
    env = os.environ if env is None else env
    source = _source(kubeconfig, env, fallbacks)
    configuration = client.Configuration()
    try:
        if source:
            config.load_kube_config(config_file=source, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError, TypeError) as err:
        where = f"kubeconfig {source}" if source else "in-cluster service account"
        raise KubeConfigError(f"cannot load the {where}: {type(err).__name__}: {err}") from err
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    api = client.ApiClient(configuration)
    if user_agent:
        api.user_agent = user_agent
    return api


class ApiError(enum.Enum):
    """What an apiserver answer (or its absence) means to a caller."""

    NOT_FOUND = "NotFound"  # 404: the object (or the version asked for) is gone
    CONFLICT = "Conflict"  # 409: exists already, a precondition or a resourceVersion failed
    GONE = "Gone"  # 410: the resourceVersion or continue token is too old: list again
    UNAUTHORIZED = "Unauthorized"  # 401: the credentials are refused
    FORBIDDEN = "Forbidden"  # 403: RBAC (or an admission policy) says no
    INVALID = "Invalid"  # 422: the body is refused
    TOO_MANY_REQUESTS = "TooManyRequests"  # 429: priority and fairness, retry later
    SERVER_ERROR = "ServerError"  # 5xx
    OTHER = "Other"  # any other HTTP status
    NO_ANSWER = "NoAnswer"  # not an apiserver answer: refused, timed out, TLS, a bug

    @property
    def denied(self) -> bool:
        """401 or 403: waiting will not change the answer."""
        return self in (ApiError.UNAUTHORIZED, ApiError.FORBIDDEN)


_BY_STATUS = {
    401: ApiError.UNAUTHORIZED,
    403: ApiError.FORBIDDEN,
    404: ApiError.NOT_FOUND,
    409: ApiError.CONFLICT,
    410: ApiError.GONE,
    422: ApiError.INVALID,
    429: ApiError.TOO_MANY_REQUESTS,
}


def status_kind(code: Any) -> ApiError:
    """The kind of an HTTP status code (an ApiException's, or a watch ERROR event's ``code``)."""
    if not isinstance(code, int):
        return ApiError.NO_ANSWER
    if code in _BY_STATUS:
        return _BY_STATUS[code]
    return ApiError.SERVER_ERROR if code >= 500 else ApiError.OTHER


def api_error(err: BaseException) -> ApiError:
    """The kind of ``err``: :attr:`ApiError.NO_ANSWER` for anything not an apiserver answer."""
    if isinstance(err, ApiException):
        return status_kind(err.status)
    return ApiError.NO_ANSWER


def short_error(err: BaseException, limit: int = 300) -> str:
    """``403 Forbidden`` for an apiserver answer, else ``Type: text``, at most ``limit`` characters."""
    if isinstance(err, ApiException):
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"[:limit]


def error_message(err: BaseException) -> str:
    """The apiserver's Status message when there is one, else :func:`short_error`'s text."""
    if isinstance(err, ApiException):
        try:
            body = json.loads(err.body or "")
            if isinstance(body, dict) and body.get("message"):
                return f"{err.status}: {body['message']}"
        except ValueError:
            pass
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"


def list_all(
    list_fn: Any, *, page_size: int = 500, request_timeout: Any = (10, 60), **kwargs: Any
) -> tuple[list[dict[str, Any]], str]:
    """Every object a list call returns, read in pages, and the list's resourceVersion.

    ``list_fn`` is a client list method (``CoreV1Api.list_node``...) and is called
    with ``_preload_content=False`` (raw JSON: what a watch sends too). An expired
    continue token (410 Gone) starts the list over.
    """
    items: list[dict[str, Any]] = []
    version = ""
    token: str | None = None
    while True:
        page: dict[str, Any] = dict(kwargs, limit=page_size)
        if token:
            page["_continue"] = token
        try:
            resp = list_fn(_preload_content=False, _request_timeout=request_timeout, **page)
        except ApiException as err:
            if token and api_error(err) is ApiError.GONE:  # the continue token expired: start over
                items, token = [], None
                continue
            raise
        body = read_json(resp)
        items.extend(i for i in body.get("items") or [] if isinstance(i, dict))
        meta = body.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        token = meta.get("continue") or None
        if not token:
            return items, version


def decode(data: bytes | str) -> Any:
    """JSON from the apiserver (lists, watch events) into plain dicts and lists.

    orjson: the watches carry every pod whole, map annotation included (20 KB with a
    1,000-entry map), and ``json.loads`` was the scheduler's largest CPU cost under load
    (docs/benchmarks.md). The API sends nothing orjson refuses (NaN, integers past 64 bits).
    """
    return orjson.loads(data)


def read_json(resp: Any) -> Any:
    """Body of a ``_preload_content=False`` response as JSON; releases the connection."""
    try:
        return decode(resp.data or b"null")
    finally:
        resp.release_conn()
