"""A lean HTTPS client for the benchmark's own traffic (creates, binds, the pod watch).

The harness must cost as little CPU as possible on a 2-core machine where the
apiserver is the ceiling, so it sends pre-serialised JSON through one urllib3
pool with the admin client certificate and never builds model objects.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.errors import ApiError as KubeApiError
from kube_gpu_scheduler.kube.errors import api_error
from kube_gpu_scheduler.kube.informer import Informer

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
# Statuses worth a retry while the apiserver is busy (throttling, timeouts).
RETRY_STATUSES = {429, 500, 503, 504}


class ApiError(RuntimeError):
    """The apiserver answered with an unexpected status; the message quotes it."""


class Raw:
    def __init__(self, kubeconfig: Path, maxsize: int = 16) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.server = cluster["server"].rstrip("/")
        self.headers = dict(JSON_HEADERS)
        if "token" in user:
            self.headers["Authorization"] = f"Bearer {user['token']}"
        self.pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=maxsize,
            block=True,
            cert_reqs="CERT_REQUIRED",
            ca_certs=cluster["certificate-authority"],
            cert_file=user.get("client-certificate"),
            key_file=user.get("client-key"),
            retries=False,
            timeout=urllib3.Timeout(connect=10, read=120),
        )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        ok: Iterable[int] = (200, 201),
        tries: int = 5,
        as_user: str | None = None,
        content_type: str | None = None,
    ) -> Any:
        """One call; retried on 429/5xx; returns the decoded JSON answer. ``as_user``: made as that
        user (an ``Impersonate-User`` header: the apiserver's admission sees its userInfo);
        ``content_type``: the body's, when not JSON (a merge patch)."""
        wanted = set(ok)
        headers = self.headers if as_user is None else {**self.headers, "Impersonate-User": as_user}
        if content_type:
            headers = {**headers, "Content-Type": content_type}
        for attempt in range(tries):
            resp = self.pool.request(method, self.server + path, body=body, headers=headers)
            if resp.status in wanted:
                return json.loads(resp.data) if resp.data else None
            if resp.status not in RETRY_STATUSES or attempt == tries - 1:
                raise ApiError(
                    f"{method} {path}: HTTP {resp.status}: {resp.data[:300].decode(errors='replace')}"
                )
            time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, doc: Any, ok: Iterable[int] = (200, 201)) -> Any:
        return self.request("POST", path, json.dumps(doc).encode(), ok)

    def delete(self, path: str, ok: Iterable[int] = (200, 202, 404)) -> Any:
        return self.request("DELETE", path, None, ok)

    def list_items(self, path: str) -> list[dict[str, Any]]:
        return list(self.get(path).get("items") or [])

    def close(self) -> None:
        self.pool.clear()


class _RawList:
    """A client-style list method (what :class:`Informer` calls) over :class:`Raw`'s pool.

    Keeps the watch response it opened last, so that :meth:`PodWatch.stop` can wake the
    thread blocked reading it, and counts the watches opened.
    """

    def __init__(self, raw: Raw, path: str) -> None:
        self.raw = raw
        self.path = path
        self.watches = 0
        self.resp: Any = None
        self.opened = threading.Event()

    def __call__(self, *, watch: bool = False, _request_timeout: Any = None, **kwargs: Any) -> Any:
        query = {"watch": "1" if watch else None}
        for key, value in kwargs.items():
            if key != "_preload_content" and value is not None:
                query[_QUERY_NAMES.get(key, key)] = (
                    str(value).lower() if isinstance(value, bool) else str(value)
                )
        url = (
            self.raw.server + self.path + "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        )
        timeout = urllib3.Timeout(connect=10, read=None if watch else 120)
        resp = self.raw.pool.request(
            "GET", url, headers=self.raw.headers, preload_content=False, timeout=timeout
        )
        if resp.status != 200:
            body = resp.read().decode("utf-8", "replace")
            resp.release_conn()
            raise ApiException(status=resp.status, reason=resp.reason, body=body)
        if watch:
            self.watches += 1
            self.resp = resp
            self.opened.set()
        return resp


# The client's argument names, as query parameters.
_QUERY_NAMES = {
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
    "_continue": "continue",
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
}


def _slim_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """What the harness reads of a pod: its identity and the node it is bound to."""
    meta = obj.get("metadata") or {}
    keep = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return {"metadata": keep, "spec": {"nodeName": (obj.get("spec") or {}).get("nodeName")}}


@dataclass
class PodWatch:
    """A watch on the pods of one namespace; records when each pod was first seen and first bound.

    An :class:`~kube_gpu_scheduler.kube.informer.Informer` of the namespace's pods (list,
    then watch; resumed from the last resourceVersion when the apiserver ends it: a
    consumer it finds too slow on saturated cores is closed, "Forcing pods watcher close
    due to unresponsiveness"; listed again on 410). Times are ``time.monotonic()`` at
    the arrival of the event on this client, so the create and bound ends of a latency
    are measured the same way (creationTimestamp has a resolution of one second).
    ``on_added`` is called (in the watch thread) for every new pod.
    """

    raw: Raw
    namespace: str
    on_added: Callable[[str, dict[str, Any]], None] | None = None
    seen: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    node: dict[str, str] = field(default_factory=dict)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._list = _RawList(self.raw, f"/api/v1/namespaces/{self.namespace}/pods")
        self._informer = Informer(
            f"pods-{self.namespace}",
            self._list,
            self,
            watch_timeout=3600,
            # Resume at once (a late resume would delay the events, and so the measured times).
            backoff=Backoff(0.05, 2.0),
            transform=_slim_pod,
            on_error=self._failed,
        )

    @property
    def resumed(self) -> int:
        """Times the watch ended (the apiserver closed it, or the connection broke) and was resumed."""
        return max(0, self._list.watches - 1)

    def start(self, timeout: float = 60.0) -> PodWatch:
        """Start, and return once the watch is open: every pod created after this is seen."""
        self._informer.start(self._stop)
        if not self._list.opened.wait(timeout):
            raise ApiError(f"watch pods in {self.namespace}: not open after {timeout:.0f} s ({self.error})")
        return self

    def _failed(self, err: BaseException) -> None:
        """A refused list or watch (or an ERROR event) fails the run; a dropped connection is resumed."""
        if isinstance(err, (ApiException, RuntimeError)) and api_error(err) is not KubeApiError.GONE:
            with self._cond:
                self.error = err
                self._cond.notify_all()

    # -- the informer's handler (its thread) ------------------------------------------------

    def on_add(self, obj: dict[str, Any]) -> None:
        self._record(obj, time.monotonic())

    def on_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self._record(new, time.monotonic())

    def on_delete(self, obj: dict[str, Any]) -> None:
        pass

    def _record(self, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"].get("name", "")
        node = obj["spec"].get("nodeName")
        fresh = False
        with self._cond:
            if name not in self.seen:
                self.seen[name] = now
                fresh = True
            if node and name not in self.bound:
                self.bound[name] = now
                self.node[name] = node
            self._cond.notify_all()
        if fresh and self.on_added is not None:
            self.on_added(name, obj)

    # -- waiting -------------------------------------------------------------------------------

    def wait_bound(self, count: int, timeout: float) -> bool:
        return self._wait(lambda: len(self.bound) >= count, timeout)

    def wait_seen(self, count: int, timeout: float) -> bool:
        return self._wait(lambda: len(self.seen) >= count, timeout)

    def _wait(self, cond: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not cond():
                if self.error is not None:
                    raise ApiError(f"the pod watch failed: {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def stop(self) -> None:
        self._stop.set()
        resp = self._list.resp
        if resp is not None:
            # Shut the socket down first: that wakes the watch thread blocked in a read (closing
            # the response from this thread would wait for that read). The informer then closes
            # the response and gives its (closed) slot back to the pool.
            # The watch may have ended and closed its socket already (its stream timed out or the
            # server closed it): then there is nothing to wake.
            with contextlib.suppress(OSError, ValueError):
                resp.shutdown()
            self._informer.join(timeout=10)


def run_parallel(threads: int, fn: Callable[[Any], Any], items: Iterable[Any]) -> tuple[float, float]:
    """``fn`` over ``items`` with ``threads`` workers; (start, end) in ``time.monotonic()``."""
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in pool.map(fn, items):
            pass
    return start, time.monotonic()
