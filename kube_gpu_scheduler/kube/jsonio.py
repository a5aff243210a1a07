"""JSON in and out of the apiserver without the generated models.

Reading: :func:`decode` (orjson), :func:`read_json` for a ``_preload_content=False``
response, :func:`list_all` for a paged list. Writing: :func:`send_json`, one
write on the hot path, and :func:`discard` for an answer whose body is not needed.
The client itself comes from :func:`kube_gpu_scheduler.kube.client.load_client`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import orjson
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.kube.errors import ApiError, api_error
from kube_gpu_scheduler.kube.wire import wire_for


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


def list_all(
    list_fn: Any,
    *,
    page_size: int = 500,
    request_timeout: Any = (10, 60),
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    **kwargs: Any,
) -> tuple[list[dict[str, Any]], str]:
    """Every object a list call returns, read in pages, and the list's resourceVersion.

    ``list_fn`` is a client list method (``CoreV1Api.list_node``...) and is called
    with ``_preload_content=False`` (raw JSON: what a watch sends too). An expired
    continue token (410 Gone) starts the list over. ``transform`` is applied to each
    object as its page is read (an informer's: what it keeps), so that what it drops
    (managedFields, much of a pod) is never held for the whole list at once.
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
        meta = body.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        token = meta.get("continue") or None
        page_items = [i for i in body.get("items") or [] if isinstance(i, dict)]
        del body  # the page's raw objects go (as transformed) before the next page is decoded
        items.extend(map(transform, page_items) if transform is not None else page_items)
        if not token:
            return items, version


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
    body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    timeout: tuple[float, float],
    query: Sequence[tuple[str, str]] = (),
    content_type: str = "application/json",
) -> None:
    """One write on the hot path, a plain dict in and nothing read back but the status.

    The generated API methods validate every argument with pydantic and build model
    objects, which the profile showed to be most of this process's CPU per pod
    (docs/benchmarks.md). This uses the same ApiClient (its connection pool, TLS, and
    credentials, refreshed tokens included) one layer down. Errors are the client's own
    ``ApiException`` (``api_error`` reads them as before).

    Where the configuration allows (no proxy), the request goes over
    :mod:`kube_gpu_scheduler.kube.wire`'s kept-alive connections instead of urllib3's: the same
    address, CA, certificate and token, a third of the CPU per request.
    """
    wire = wire_for(api_client)
    if wire is not None:
        path_query = path + ("?" + urlencode(list(query)) if query else "")
        data = orjson.dumps(dict(body) if isinstance(body, Mapping) else list(body))
        answer = wire.request(method, path_query, data, timeout, content_type)
        if not 200 <= answer.status <= 299:
            raise ApiException.from_response(
                http_resp=answer, body=answer.data.decode("utf-8", "replace") or None, data=None
            )
        return
    method, url, headers, data, post = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=list(query),
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=dict(body) if isinstance(body, Mapping) else list(body),
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
