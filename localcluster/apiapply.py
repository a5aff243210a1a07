"""``kubectl apply -f -`` without a kubectl process, where the apiserver can do it alone.

:meth:`localcluster.clients.ClusterClients.apply` took a kubectl process per call: about 0.15 s
of CPU for kubectl and three times the apiserver's CPU of the request itself (its discovery and
OpenAPI reads), and one `make test` made over 500 of them (process accounting and a per-test
process log). :func:`apply` sends each document as a server-side apply instead (a PATCH
``application/apply-patch+yaml`` with ``force``, field manager ``localcluster``), through the
admin's API client: the object ends as the document says, created or updated, as with kubectl.

A document it cannot place (no ``metadata.name``, a kind the apiserver does not serve yet, a
``List``) or that the apiserver refuses is handed to kubectl unchanged, as before: a server-side
apply that fails stores nothing, so kubectl meets the same state and fails (or succeeds) with
its own words. The differences from ``kubectl apply``: no
``kubectl.kubernetes.io/last-applied-configuration`` annotation is written, and fields are
owned by the ``localcluster`` manager (managedFields) rather than
``kubectl-client-side-apply``. Nothing here reads either.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from localcluster.apiget import Resource, resolve

MANAGER = "localcluster"


def _patch(api: Any, path: str, body: Mapping[str, Any]) -> int:
    method, url, headers, data, _ = api.param_serialize(
        method="PATCH",
        resource_path=path,
        query_params=[("fieldManager", MANAGER), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=json.dumps(body),
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(method, url, header_params=headers, body=data, _request_timeout=(10, 60))
    try:
        resp.read()
        return int(resp.status)
    finally:
        release = getattr(resp.response, "release_conn", None)
        if release is not None:
            release()


def _where(api: Any, doc: Mapping[str, Any]) -> str | None:
    """The object's path, or None where this module does not apply it (kubectl does)."""
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    meta = doc.get("metadata") or {}
    if not isinstance(api_version, str) or not isinstance(kind, str) or not meta.get("name"):
        return None
    if kind == "List" or meta.get("generateName") or meta.get("managedFields"):
        return None
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    try:
        found = resolve(api, f"{kind.lower()}.{group}" if group else kind.lower())
    except LookupError:
        return None
    found_group = found.group_version.rsplit("/", 1)[0] if "/" in found.group_version else ""
    if found.kind != kind or found_group != group:
        return None
    res = Resource(api_version, found.plural, kind, found.namespaced)
    return res.path(meta.get("namespace") or "default", meta["name"])


def _applied(api: Any, doc: Mapping[str, Any]) -> bool:
    try:
        path = _where(api, doc)
        return path is not None and 200 <= _patch(api, path, doc) < 300
    except Exception:  # a connection lost: kubectl tries again, and says why it fails
        return False


def apply(
    api: Any, docs: Iterable[Mapping[str, Any]], kubectl_apply: Callable[[list[Mapping[str, Any]]], None]
) -> None:
    """Apply ``docs`` in order: each through the API where it can be, else (or when the apiserver
    refuses it) through ``kubectl_apply`` with the documents not applied yet, in order."""
    pending: list[Mapping[str, Any]] = []
    for doc in docs:
        if pending or not _applied(api, doc):
            pending.append(doc)
    if pending:
        kubectl_apply(pending)
