"""List-then-watch caches of API objects, kept as plain dicts: the one informer.

One :class:`Informer` per resource: it lists (in pages), then watches from the
list's resourceVersion, resumes from the last resourceVersion it saw when the
stream ends or breaks, lists again on ``410 Gone``, and backs off (capped) on
errors. Handlers run on the informer's thread and must only record and
enqueue; every per-pod decision answers from these caches, never from a LIST.

``transform`` (client-go's SetTransform) decides what is kept of each object
before it is cached and handed to the handlers: the scheduler drops
``managedFields``, the webhook keeps a node's name and GPU count. What it
returns must keep ``metadata`` (name, namespace, uid, resourceVersion): the cache
is keyed and compared by them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kube_gpu_scheduler.kube import watchstream
from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.errors import ApiError, ApiStatus, api_error, event_status, short_error
from kube_gpu_scheduler.kube.jsonio import decode, list_all

log = logging.getLogger("gpu_scheduler.watch")

Obj = dict[str, Any]


class Handler(Protocol):
    """THE handler an informer calls (on its own thread): every user of an informer gives one."""

    def on_add(self, obj: Obj) -> None: ...
    def on_update(self, old: Obj, new: Obj) -> None: ...
    def on_delete(self, obj: Obj) -> None: ...


class Watched(Protocol):
    """An informer as the scheduler starts, waits for and reports it."""

    synced: threading.Event

    def alive(self) -> bool: ...
    def start(self, stop: threading.Event) -> threading.Thread: ...


class Cache(Watched, Protocol):
    """What the scheduler reads of an informer (``kube_gpu_scheduler.kube.informer.Informer``)."""

    def get(self, key: str) -> Obj | None: ...
    def items(self) -> list[Obj]: ...
    def view(self) -> Mapping[str, Obj]: ...
    def __len__(self) -> int: ...


class Callbacks:
    """A :class:`Handler` of three functions (add, update, delete)."""

    __slots__ = ("on_add", "on_delete", "on_update")

    def __init__(
        self, add: Callable[[Obj], None], update: Callable[[Obj, Obj], None], delete: Callable[[Obj], None]
    ) -> None:
        self.on_add = add
        self.on_update = update
        self.on_delete = delete


def _nothing(*_objs: Obj) -> None:
    return None


# For a cache that is only read (the webhook's nodes and grants): no handler work.
IGNORE = Callbacks(_nothing, _nothing, _nothing)


class Gone(Exception):
    """The watch's resourceVersion is too old (410, reason ``Expired`` or ``Gone``): list again."""

    def __init__(self, status: ApiStatus) -> None:
        super().__init__(str(status))
        self.status = status


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if type(meta) is dict:  # as decoded: no ABC check on every event
        return meta
    return meta if isinstance(meta, Mapping) else {}


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object: the cache's key."""
    meta = _meta(obj)
    ns, name = meta.get("namespace"), meta.get("name")
    name = name if isinstance(name, str) else None
    return f"{ns}/{name}" if isinstance(ns, str) and ns else str(name)


def _slim(obj: Obj) -> Obj:
    """Drop what no check reads and that dominates an object's size."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class Informer:
    """Cache of one resource, filtered by field/label selectors, kept current by a watch."""

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        handler: Handler,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        on_relist: Callable[[str], None] | None = None,
        transform: Callable[[Obj], Obj] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        jitter: float = 0.0,
        list_timeout: tuple[float, float] = (10, 60),
    ) -> None:
        """``on_relist(name)`` after each full list, ``on_error(err)`` after each failed
        list or watch (metrics, a reason to report); ``jitter`` spreads the watch timeout
        (up to that fraction longer) and each retry delay (that fraction either way), so
        that many processes do not reconnect together."""
        self.name = name
        self._list_fn = list_fn
        self._handler = handler
        self._selectors = {
            k: v for k, v in (("field_selector", field_selector), ("label_selector", label_selector)) if v
        }
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff = backoff or Backoff(0.5, 30.0)
        self._on_relist = on_relist
        self._on_error = on_error
        self._jitter = jitter
        self._list_timeout = list_timeout
        # What is kept of each object (client-go's SetTransform): by default all but managedFields.
        self._transform = transform or _slim
        self._lock = threading.Lock()
        self._store: dict[str, Obj] = {}
        self.synced = threading.Event()
        self.resource_version: str | None = None
        self.last_contact = time.monotonic()
        self._thread: threading.Thread | None = None

    # -- cache reads (any thread) ------------------------------------------------------

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._store.get(key)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    def view(self) -> Mapping[str, Obj]:
        """A read-only mapping over the cache (lookups take the lock)."""
        return _View(self)

    # -- running ----------------------------------------------------------------------------

    def start(self, stop: threading.Event) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, args=(stop,), name=f"watch-{self.name}", daemon=True)
        self._thread.start()
        return self._thread

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread :meth:`start` started to end (after its ``stop`` is set)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self, stop: threading.Event) -> None:
        rv: str | None = None
        while not stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                    self._backoff.forget(self.name)
                rv = self._watch(rv, stop)
                self._backoff.forget(self.name)
            except Gone as gone:
                log.info(
                    "watch expired (410 Gone), listing again",
                    extra={"resource": self.name, "reason": gone.status.reason},
                )
                rv = None
            except Exception as err:
                if stop.is_set():
                    break  # the stream was closed to stop this informer: not a failure
                delay = self._backoff.next(self.name)
                if self._jitter:
                    delay *= random.uniform(1 - self._jitter, 1 + self._jitter)
                if self._on_error:
                    self._on_error(err)
                status = getattr(err, "status", None)
                log.warning(
                    "watch failed, retrying",
                    extra={
                        "resource": self.name,
                        "error": short_error(err),
                        "status": status,
                        "retry_in": delay,
                    },
                )
                if api_error(err) is ApiError.GONE:
                    rv = None
                elif rv is not None:
                    # Resume after the last event applied, not from where this watch began:
                    # a stream broken mid-way would otherwise deliver its events twice.
                    rv = self.resource_version or rv
                stop.wait(delay)

    def _relist(self) -> str:
        # Each object is transformed as its page is read: a full list of 15,000 pods never
        # holds every pod's managedFields at once (a restart's peak memory).
        items, rv = list_all(
            self._list_fn,
            page_size=self._page_size,
            request_timeout=self._list_timeout,
            transform=self._transform,
            **self._selectors,
        )
        self.last_contact = time.monotonic()
        fresh = {object_key(o): o for o in items}
        with self._lock:
            old = self._store
            self._store = fresh
        # Tell the handlers what changed while we were not watching.
        for key, obj in old.items():
            new = fresh.get(key)
            if new is None or _uid(new) != _uid(obj):
                self._handler.on_delete(obj)
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None or _uid(prev) != _uid(obj):
                self._handler.on_add(obj)
            elif _rv(prev) != _rv(obj):
                self._handler.on_update(prev, obj)
        self.resource_version = rv
        if not self.synced.is_set():
            log.info("cache synced", extra={"resource": self.name, "objects": len(fresh)})
        self.synced.set()
        if self._on_relist:  # after synced: a hook may announce the cache as ready
            self._on_relist(self.name)
        return rv

    def _watch(self, rv: str, stop: threading.Event) -> str:
        timeout = self._watch_timeout
        if self._jitter:
            timeout = int(timeout * random.uniform(1.0, 1 + self._jitter))
        resp = self._list_fn(
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=(self._list_timeout[0], timeout + 30),
            **self._selectors,
        )
        ended, reuse = False, watchstream.reusable(resp)
        try:
            for line in watchstream.lines(resp):  # decoded here: one generator less per event
                if stop.is_set():
                    break
                if not line:
                    continue
                self.last_contact = time.monotonic()
                rv = self._apply(decode(line)) or rv
                self.resource_version = rv
            else:
                ended = True
        finally:
            # Left mid-stream, the connection still holds unread bytes; read by watchstream,
            # urllib3 does not know its body was read.
            if not ended or not reuse:
                resp.close()
            resp.release_conn()
        return rv

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            status = event_status(obj)
            if status.kind is ApiError.GONE:
                raise Gone(status)
            raise RuntimeError(f"watch error: {obj.get('code')} {obj.get('message')}")
        rv = _rv(obj)
        if kind == "BOOKMARK":
            return rv
        obj = self._transform(obj)
        key = object_key(obj)
        with self._lock:
            old = self._store.get(key)
            if kind == "DELETED":
                self._store.pop(key, None)
            else:
                self._store[key] = obj
        if kind == "DELETED":
            self._handler.on_delete(obj)
        elif old is None:
            self._handler.on_add(obj)
        elif _uid(old) != _uid(obj):
            self._handler.on_delete(old)
            self._handler.on_add(obj)
        else:
            self._handler.on_update(old, obj)
        return rv


class _View(Mapping[str, Obj]):
    def __init__(self, informer: Informer) -> None:
        self._informer = informer

    def __getitem__(self, key: str) -> Obj:
        obj = self._informer.get(key)
        if obj is None:
            raise KeyError(key)
        return obj

    def __iter__(self) -> Iterator[str]:
        return iter([object_key(o) for o in self._informer.items()])

    def __len__(self) -> int:
        return len(self._informer)


def _uid(obj: Mapping[str, Any]) -> str | None:
    return str(_meta(obj).get("uid") or "") or None


def _rv(obj: Mapping[str, Any]) -> str | None:
    rv = _meta(obj).get("resourceVersion")
    return str(rv) if rv else None
