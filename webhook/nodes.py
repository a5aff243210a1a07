"""Node look-ups for ``/validate``'s warnings, answered from a watch cache of the nodes.

:class:`NodeCache` lists the nodes once, then watches them from the list's
resourceVersion (relisting on ``410 Gone``, retrying with a capped backoff), in
a daemon thread of the worker process. It keeps only what the warnings need: a
node's name and its GPU count (:func:`gpu_scheduling.resources.node_gpus`, as the scheduler reads it). A look-up reads memory and never
waits on the API: until the first list has arrived, or when the webhook has no
API access, :class:`NodeLookupUnavailable` is raised and the caller skips the
node warnings. Nothing here may make an admission fail.

RBAC: ``list`` and ``watch`` on nodes (no ``get``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from gpu_scheduling.kubeclient import (
    ApiError,
    KubeConfigError,
    api_error,
    list_all,
    load_client,
    short_error,
    status_kind,
)
from gpu_scheduling.objects import Node
from gpu_scheduling.resources import node_gpus

log = logging.getLogger("webhook.nodes")

# A list call may take this long (connect, read); a page holds this many nodes.
LIST_TIMEOUT = (5.0, 30.0)
LIST_PAGE = 500
# The apiserver ends a watch after about this long (randomised so workers do not reconnect together).
WATCH_TIMEOUT_S = 300
# Retry delays after a failure: doubling from the first to the cap.
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class NodeInfo:
    name: str
    # GPUs the node reports (resources.node_gpus: allocatable, else capacity); None when it reports none.
    gpus: int | None


class NodeLookupUnavailable(Exception):
    """The webhook cannot tell about nodes right now; the message says why."""


class NodeLookup(Protocol):
    def get(self, name: str) -> NodeInfo | None:
        """The node, ``None`` when it does not exist; raises NodeLookupUnavailable. Must not block."""
        ...


class _Relist(Exception):
    """The watch cannot resume (410 Gone): list again."""


class NodeCache:
    """Nodes from a list-then-watch of the API, kept in memory for :meth:`get`.

    The thread starts on the first :meth:`start` or :meth:`get` in a process, so a
    gunicorn worker starts its own after the fork (threads do not survive one).
    """

    def __init__(
        self,
        kubeconfig: str | None,
        *,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        backoff_max_s: float = BACKOFF_MAX_S,
    ):
        self._kubeconfig = kubeconfig
        self._watch_timeout_s = watch_timeout_s
        self._backoff_max_s = backoff_max_s
        self._lock = threading.Lock()
        self._nodes: dict[str, int | None] = {}
        self._synced = False
        self._why = "the node cache has not listed the nodes yet"
        self._pid: int | None = None
        self._stop = threading.Event()
        self.lists = 0  # completed lists (the first one and every relist), for tests and logs

    # ------------------------------------------------------------------ the request side
    def start(self) -> None:
        """Start the watch thread in this process unless it already runs (cheap: called per request)."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            # A fork copied the parent's memory but not its thread: start afresh.
            self._pid = os.getpid()
            self._nodes, self._synced = {}, False
            self._why = "the node cache has not listed the nodes yet"
            threading.Thread(target=self._run, name="webhook-node-cache", daemon=True).start()

    def stop(self) -> None:
        """Ask the thread to end (at its next event or retry; it is a daemon either way)."""
        self._stop.set()

    @property
    def synced(self) -> bool:
        return self._synced

    def get(self, name: str) -> NodeInfo | None:
        self.start()
        with self._lock:
            if not self._synced:
                raise NodeLookupUnavailable(self._why)
            if name not in self._nodes:
                return None
            return NodeInfo(name, self._nodes[name])

    # ------------------------------------------------------------------ the thread
    def _connect(self) -> Any:
        # The settings read KUBECONFIG already; without it and outside a pod, no API access
        # (never a developer's ~/.kube/config).
        return client.CoreV1Api(
            load_client(self._kubeconfig, fallbacks=False, user_agent="gpu-scheduler-webhook")
        )

    def _unavailable(self, why: str) -> None:
        with self._lock:
            if not self._synced:
                self._why = why

    def _run(self) -> None:
        try:
            api = self._connect()
        except Exception as exc:  # any config problem means "no API access", for good
            why = str(exc) if isinstance(exc, KubeConfigError) else f"{type(exc).__name__}: {exc}"
            self._unavailable(f"no Kubernetes API access ({why})")
            log.info("node checks disabled: no Kubernetes API access (%s)", why)
            return
        backoff = BACKOFF_FIRST_S
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list(api)
                    backoff = BACKOFF_FIRST_S
                version = self._watch(api, version)
                backoff = BACKOFF_FIRST_S  # the watch ran to its timeout: resume at once
            except _Relist:
                log.info("node watch expired (410 Gone): listing the nodes again")
                version = None
            except Exception as exc:  # API down, refused (RBAC), TLS, a malformed answer: retry later
                why = short_error(exc)
                self._unavailable(f"cannot list nodes: {why}")
                log.warning("node cache: %s; retrying in %.1f s", why, backoff)
                self._stop.wait(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, self._backoff_max_s)

    def _list(self, api: Any) -> str:
        """List every node (in pages); replace the cache; the resourceVersion to watch from."""
        items, version = list_all(api.list_node, page_size=LIST_PAGE, request_timeout=LIST_TIMEOUT)
        nodes = dict(_entry(item) for item in items)
        with self._lock:
            self._nodes, self._synced = nodes, True
            self.lists += 1
        log.info("node cache synced", extra={"nodes": len(nodes), "resource_version": version})
        return version

    def _watch(self, api: Any, version: str) -> str:
        """Apply watch events from ``version`` until the server ends the watch; the version reached."""
        timeout = int(self._watch_timeout_s * random.uniform(1.0, 1.2))
        try:
            resp = api.list_node(
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=(LIST_TIMEOUT[0], timeout + 30),
            )
        except ApiException as exc:
            if api_error(exc) is ApiError.GONE:
                raise _Relist() from exc
            raise
        try:
            for line in _lines(resp):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if status_kind(obj.get("code")) is ApiError.GONE:
                        raise _Relist()
                    raise RuntimeError(f"watch error {obj.get('code')}: {str(obj.get('message'))[:200]}")
                node = Node(obj)
                version = node.resource_version or version
                name = node.name
                if kind == "BOOKMARK" or name is None:
                    continue
                with self._lock:
                    if kind == "DELETED":
                        self._nodes.pop(name, None)
                    elif kind in ("ADDED", "MODIFIED"):
                        self._nodes[name] = node_gpus(node.status)
        finally:
            resp.close()
            resp.release_conn()
        return version


def _entry(obj: dict[str, Any]) -> tuple[str, int | None]:
    node = Node(obj)
    return str(node.name), node_gpus(node.status)


def _lines(resp: Any) -> Iterable[str]:
    for line in iter_resp_lines(resp):
        if line:
            yield line if isinstance(line, str) else line.decode("utf-8")
