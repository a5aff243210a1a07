"""``kubectl get ... -o json`` without a kubectl process: the same arguments, read through the
admin's API client.

A kubectl process costs the machine about 80 ms of CPU (a Go binary's start, the kubeconfig,
the discovery cache) where the request costs a few; the tests' and the demos' polling loops made
thousands of them in one `make test` (process accounting: 4,902 kubectl processes, 384 CPU-s of
a 2-core run). :func:`get` takes the arguments those loops gave kubectl::

    get(api, "applications.argoproj.io", "my-app", "-n", "argocd")   # the object, {} if absent
    get(api, "pods", "-A", "-l", "app=x")                            # {"kind": "List", "items": [...]}

A resource is named as kubectl names it (plural, singular, kind or short name, optionally
``.group``), resolved by the apiserver's discovery (cached per client, read again when a name
is not found: a CRD installed since). As ``kubectl get -o json``: list items carry their
``apiVersion`` and ``kind``, and ``managedFields`` are left out unless
``--show-managed-fields``. Where kubectl would fail, {} (no such object, no such resource type:
a CRD not installed yet); a flag not read here raises ValueError.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resource:
    group_version: str  # "v1", "apps/v1"
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        ns = f"/namespaces/{namespace}" if namespace and self.namespaced else ""
        return f"{base}{ns}/{self.plural}" + (f"/{name}" if name else "")


_LOCK = threading.Lock()
_TABLE = "_apiget_discovery"  # the attribute of an API client holding its cluster's names, and when read
REDISCOVER_AFTER = 2.0


def _raw(api: Any, path: str, query: list[tuple[str, str]] | None = None) -> tuple[int, Any]:
    """GET ``path``: its status and, when 200, its JSON (the client's connection pool and
    credentials, one layer below the generated methods, as kube_gpu_scheduler/kube/jsonio.py)."""
    method, url, headers, _, _ = api.param_serialize(
        method="GET",
        resource_path=path,
        query_params=query or [],
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(method, url, header_params=headers, _request_timeout=(10, 60))
    try:
        resp.read()
        return resp.status, json.loads(resp.data) if resp.status == 200 else None
    finally:
        release = getattr(resp.response, "release_conn", None)
        if release is not None:
            release()


def _discover(api: Any) -> dict[str, list[Resource]]:
    names: dict[str, list[Resource]] = {}
    versions = ["v1"]
    _, groups = _raw(api, "/apis")
    for g in (groups or {}).get("groups", []):
        versions.append(g["preferredVersion"]["groupVersion"])
    for gv in versions:
        _, doc = _raw(api, "/api/v1" if gv == "v1" else f"/apis/{gv}")
        group = gv.rsplit("/", 1)[0] if "/" in gv else ""
        for r in (doc or {}).get("resources", []):
            if "/" in r["name"] or "get" not in r.get("verbs", []):
                continue  # a subresource, or not readable
            res = Resource(gv, r["name"], r["kind"], bool(r["namespaced"]))
            for alias in {
                r["name"],
                r.get("singularName") or "",
                r["kind"].lower(),
                *r.get("shortNames", []),
            }:
                if alias:
                    names.setdefault(alias, []).append(res)
                    if group:
                        names.setdefault(f"{alias}.{group}", []).append(res)
    return names


def resolve(api: Any, name: str) -> Resource:
    """The resource kubectl would read for ``name`` (the core group first, as kubectl prefers it).
    A name not found reads the discovery again (a CRD installed since), at most every
    :data:`REDISCOVER_AFTER` seconds: a loop polling a CRD not installed costs no more than kubectl."""
    for attempt in range(2):
        with _LOCK:
            table, read_at = getattr(api, _TABLE, (None, 0.0))
            if table is None or (attempt and time.monotonic() - read_at >= REDISCOVER_AFTER):
                table, read_at = _discover(api), time.monotonic()
                setattr(api, _TABLE, (table, read_at))
        found = table.get(name.lower())
        if found:
            return next((r for r in found if r.group_version == "v1"), found[0])
    raise LookupError(f'the server doesn\'t have a resource type "{name}"')


def get(api: Any, *args: str) -> dict[str, Any]:
    """``kubectl get <args> -o json``'s document, or {} where kubectl would fail (not found)."""
    positional: list[str] = []
    namespace, all_ns, selector, field, managed = "default", False, "", "", False
    it = iter(args)
    for arg in it:
        if arg in ("-n", "--namespace"):
            namespace = next(it)
        elif arg.startswith("--namespace="):
            namespace = arg.split("=", 1)[1]
        elif arg in ("-A", "--all-namespaces"):
            all_ns = True
        elif arg in ("-l", "--selector"):
            selector = next(it)
        elif arg.startswith("--selector="):
            selector = arg.split("=", 1)[1]
        elif arg.startswith("--field-selector="):
            field = arg.split("=", 1)[1]
        elif arg == "--show-managed-fields":
            managed = True
        elif arg.startswith("-"):
            raise ValueError(f"get: the flag {arg!r} is not read here (localcluster/apiget.py)")
        else:
            positional.append(arg)
    if not positional or len(positional) > 2:
        raise ValueError(f"get: one resource and at most one name, not {positional}")
    try:
        res = resolve(api, positional[0])
    except LookupError:  # no such resource type (yet: a CRD not installed): kubectl fails too
        return {}
    name = positional[1] if len(positional) == 2 else None
    query = [(k, v) for k, v in (("labelSelector", selector), ("fieldSelector", field)) if v]
    code, doc = _raw(api, res.path(None if all_ns else namespace, name), query)
    if code != 200:
        return {}
    objs = [doc] if name else doc.get("items", [])
    for obj in objs:
        obj.setdefault("apiVersion", res.group_version)
        obj.setdefault("kind", res.kind)
        if not managed:
            obj.get("metadata", {}).pop("managedFields", None)
    if name:
        return dict(doc)
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": objs}
