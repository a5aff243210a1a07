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
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

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
    ) -> Any:
        """One call; retried on 429/5xx; returns the decoded JSON answer."""
        wanted = set(ok)
        for attempt in range(tries):
            resp = self.pool.request(method, self.server + path, body=body, headers=self.headers)
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


@dataclass
class PodWatch:
    """A watch on the pods of one namespace; records when each pod was first seen and first bound.

    Times are ``time.monotonic()`` at the arrival of the event on this client, so the
    create and bound ends of a latency are measured the same way (creationTimestamp has a
    resolution of one second). ``on_added`` is called (in the watch thread) for every new pod.
    """

    raw: Raw
    namespace: str
    on_added: Callable[[str, dict[str, Any]], None] | None = None
    seen: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    node: dict[str, str] = field(default_factory=dict)
    error: BaseException | None = None
    resumed: int = 0  # times the apiserver ended the watch and it was resumed

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.namespace}", daemon=True)

    def start(self) -> PodWatch:
        # The apiserver answers the headers once the watch is registered: what follows is seen.
        self._resp = self._open(None)
        self._thread.start()
        return self

    def _open(self, resource_version: str | None) -> Any:
        path = (
            f"/api/v1/namespaces/{self.namespace}/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=3600"
        )
        if resource_version:
            path += f"&resourceVersion={resource_version}"
        resp = self.raw.pool.request(
            "GET",
            self.raw.server + path,
            headers=self.raw.headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=None),
        )
        if resp.status != 200:
            raise ApiError(f"watch pods in {self.namespace}: HTTP {resp.status}")
        return resp

    def _run(self) -> None:
        """Read the watch; when the apiserver ends it (a consumer it finds too slow on saturated
        cores is closed: "Forcing pods watcher close due to unresponsiveness"), resume from the
        last resourceVersion seen, so no event is missed."""
        rv: str | None = None
        try:
            while not self._stop.is_set():
                try:
                    for line in self._resp:
                        if self._stop.is_set():
                            return
                        if not line.strip():
                            continue
                        rv = self._apply(json.loads(line), time.monotonic()) or rv
                except (urllib3.exceptions.ProtocolError, OSError):
                    pass  # the connection went away mid-stream: resume as below
                if self._stop.is_set():
                    return
                self.resumed += 1
                self._resp.release_conn()
                self._resp = self._open(rv)
        except BaseException as exc:
            if not self._stop.is_set():
                self.error = exc
                with self._cond:
                    self._cond.notify_all()

    def _apply(self, event: dict[str, Any], now: float) -> str | None:
        if event.get("type") == "ERROR":
            raise ApiError(f"watch error: {event.get('object')}")
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if event.get("type") == "BOOKMARK":
            return meta.get("resourceVersion")
        name = meta.get("name", "")
        node = (obj.get("spec") or {}).get("nodeName")
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
        return meta.get("resourceVersion")

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
        if self._resp is not None:
            # Shut the socket down first: that wakes the watch thread blocked in a read (closing
            # the response from this thread would wait for that read). Then close the
            # connection and give its (closed) slot back to the pool.
            # The watch may have ended and closed its socket already (its stream timed out or the
            # server closed it): then there is nothing to wake.
            with contextlib.suppress(OSError, ValueError):
                self._resp.shutdown()
            self._thread.join(timeout=10)
            self._resp.close()
            self._resp.release_conn()


def run_parallel(threads: int, fn: Callable[[Any], Any], items: Iterable[Any]) -> tuple[float, float]:
    """``fn`` over ``items`` with ``threads`` workers; (start, end) in ``time.monotonic()``."""
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in pool.map(fn, items):
            pass
    return start, time.monotonic()
