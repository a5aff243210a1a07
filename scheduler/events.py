"""Events about pods (events.k8s.io/v1), written off the scheduling path.

(Plus the odd one-off Warning about another object: the leader's Lease, see
:meth:`EventRecorder.object_warning`.)

``kubectl describe pod`` and ``kubectl get events`` show them. A pod that
stays unschedulable for the same reason gets one Event, not one per retry:
the repeat is counted and, at most every ``refresh`` seconds, written as the
Event's ``series`` (which also keeps the Event from expiring). A new reason or
a new message makes a new Event.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_scheduling.kubeclient import ApiError, api_error, error_message
from gpu_scheduling.objects import Pod
from scheduler.binding import MERGE_PATCH, TIMEOUT
from scheduler.kube import discard, micro_datetime, micro_time

log = logging.getLogger("gpu_scheduler.events")

NOTE_LIMIT = 1024  # the apiserver rejects longer notes
ACTION = "Scheduling"


@dataclass
class _Seen:
    reason: str
    note: str
    name: str  # the Event object's name
    count: int
    written: float  # monotonic time of the last write


@dataclass(frozen=True)
class _Write:
    kind: str  # "create" or "series"
    namespace: str
    name: str
    body: Any


def truncate(note: str) -> str:
    return note if len(note) <= NOTE_LIMIT else note[: NOTE_LIMIT - 3] + "..."


class EventRecorder:
    def __init__(
        self,
        events_api: client.EventsV1Api,
        controller: str,
        instance: str,
        refresh: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        capacity: int = 10000,
    ) -> None:
        self._api = events_api
        self._controller = controller[:63]
        self._instance = instance[:128]
        self._refresh = refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}  # pod uid -> the last Warning written about it
        self._queue: queue.Queue[_Write | None] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None
        self.dropped = 0

    # -- recording (any thread; never blocks on the API) ------------------------------

    def warning(self, pod: Mapping[str, Any], reason: str, note: str) -> bool:
        """Record a Warning; returns True when it causes a write (new, or a due series update)."""
        view = Pod(pod)
        uid = view.uid
        note = truncate(note)
        now = self._clock()
        with self._lock:
            seen = self._seen.get(uid)
            if seen is not None and seen.reason == reason and seen.note == note:
                seen.count += 1
                if now - seen.written < self._refresh:
                    return False
                seen.written = now
                write = _Write(
                    "series",
                    view.namespace or "",
                    seen.name,
                    {"series": {"count": seen.count, "lastObservedTime": micro_time()}},
                )
            else:
                name = self._name(view.name)
                self._seen[uid] = _Seen(reason, note, name, 1, now)
                write = _Write(
                    "create", view.namespace or "", name, self._event(view, name, "Warning", reason, note)
                )
        self._put(write)
        return True

    def normal(self, pod: Mapping[str, Any], reason: str, note: str) -> None:
        view = Pod(pod)
        name = self._name(view.name)
        self._put(
            _Write(
                "create",
                view.namespace or "",
                name,
                self._event(view, name, "Normal", reason, truncate(note)),
            )
        )

    def object_warning(
        self, regarding: client.V1ObjectReference, reason: str, note: str, action: str = ACTION
    ) -> None:
        """A one-off Warning about any namespaced object (the leader's Lease); no series."""
        name = self._name(regarding.name)
        self._put(
            _Write(
                "create",
                regarding.namespace or "",
                name,
                self._event_about(regarding, name, "Warning", reason, truncate(note), action),
            )
        )

    def forget(self, uid: str) -> None:
        with self._lock:
            self._seen.pop(uid, None)

    def pending(self) -> int:
        return self._queue.qsize()

    # -- the sender thread ------------------------------------------------------------------

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to ``timeout``), then stop."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _put(self, write: _Write) -> None:
        try:
            self._queue.put_nowait(write)
        except queue.Full:
            self.dropped += 1
            log.warning("event queue full, dropping an event", extra={"event": write.name})

    def _run(self) -> None:
        while True:
            write = self._queue.get()
            if write is None:
                return
            try:
                self._send(write)
            except Exception as err:
                log.warning(
                    "could not write event",
                    extra={"event": f"{write.namespace}/{write.name}", "error": error_message(err)},
                )

    def _send(self, write: _Write) -> None:
        if write.kind == "series":
            try:
                resp = self._api.patch_namespaced_event(
                    write.name,
                    write.namespace,
                    write.body,
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=TIMEOUT,
                )
                discard(resp)
                return
            except ApiException as err:
                if api_error(err) is not ApiError.NOT_FOUND:
                    raise
            # The Event expired or was deleted: the next warning creates a fresh one.
            with self._lock:
                for uid, seen in list(self._seen.items()):
                    if seen.name == write.name:
                        del self._seen[uid]
            return
        try:
            resp = self._api.create_namespaced_event(
                write.namespace, write.body, _preload_content=False, _request_timeout=TIMEOUT
            )
            discard(resp)
        except ApiException as err:
            if api_error(err) is not ApiError.CONFLICT:  # the same name already written: nothing to add
                raise

    # -- building ---------------------------------------------------------------------------

    @staticmethod
    def _name(name: str | None) -> str:
        # Like client-go: the object's name and a timestamp in hex.
        return f"{(name if name is not None else 'pod')[:230]}.{time.time_ns():x}"

    def _event(self, pod: Pod, name: str, kind: str, reason: str, note: str) -> client.EventsV1Event:
        regarding = client.V1ObjectReference(
            api_version="v1",
            kind="Pod",
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid or None,
            resource_version=pod.resource_version,
        )
        return self._event_about(regarding, name, kind, reason, note, ACTION)

    def _event_about(
        self, regarding: client.V1ObjectReference, name: str, kind: str, reason: str, note: str, action: str
    ) -> client.EventsV1Event:
        return client.EventsV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace=regarding.namespace),
            event_time=micro_datetime(),
            type=kind,
            reason=reason,
            action=action,
            note=note,
            regarding=regarding,
            reporting_controller=self._controller,
            reporting_instance=self._instance,
        )
