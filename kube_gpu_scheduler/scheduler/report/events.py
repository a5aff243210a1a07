"""Events about pods (events.k8s.io/v1), written off the scheduling path.

(Plus the odd one-off Warning about another object: the leader's Lease, see
:meth:`EventRecorder.object_warning`.)

``kubectl describe pod`` and ``kubectl get events`` show them. A pod that
stays unschedulable for the same reason gets one Event, not one per retry:
the repeat is counted and, at most every ``refresh`` seconds, written as the
Event's ``series`` (which also keeps the Event from expiring). A new reason or
a new message makes a new Event.

Warnings go first. Normal Events (``Scheduled``) are deferred while the
scheduler is placing pods (``busy``: pods queued or in hand, or a Binding within
the last second, see ``Scheduler.placing``), for at most ``defer_max`` seconds each:
on a shared apiserver an Event costs about what a Binding costs, so during a
burst the Bindings go first and the Events follow (kube-scheduler's events are
asynchronous and best-effort too). Nothing is dropped unless ``capacity`` Events
are waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.kube.errors import ApiError, api_error, api_status, error_message
from kube_gpu_scheduler.kube.jsonio import discard, send_json
from kube_gpu_scheduler.kube.timefmt import micro_time
from kube_gpu_scheduler.scheduler.state.binding import MERGE_PATCH, TIMEOUT

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
        busy: Callable[[], bool] | None = None,
        defer_max: float = 30.0,
    ) -> None:
        self._api = events_api
        self._controller = controller[:63]
        self._instance = instance[:128]
        self._refresh = refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}  # pod uid -> the last Warning written about it
        self._capacity = capacity
        self._cond = threading.Condition()
        self._urgent: deque[_Write] = deque()  # Warnings (and their series updates)
        self._deferrable: deque[tuple[float, _Write]] = deque()  # (queued at, Normal event)
        self._stopping = False
        self.busy = busy or (lambda: False)
        self._defer_max = defer_max
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
        """Record a Normal Event; sent once the scheduler is not busy (or ``defer_max`` passed)."""
        view = Pod(pod)
        name = self._name(view.name)
        write = _Write(
            "create", view.namespace or "", name, self._event(view, name, "Normal", reason, truncate(note))
        )
        self._put(write, deferrable=True)

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
                self._event_about(_reference(regarding), name, "Warning", reason, truncate(note), action),
            )
        )

    def forget(self, uid: str) -> None:
        with self._lock:
            self._seen.pop(uid, None)

    def pending(self) -> int:
        with self._cond:
            return len(self._urgent) + len(self._deferrable)

    # -- the sender thread ------------------------------------------------------------------

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to ``timeout``, deferred ones included), then stop."""
        if self._thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _put(self, write: _Write, deferrable: bool = False) -> None:
        with self._cond:
            if len(self._urgent) + len(self._deferrable) >= self._capacity:
                self.dropped += 1
                full = True
            else:
                full = False
                # The sender sleeps up to 0.5 s with nothing queued and looks again every 50 ms
                # while Normal Events wait: woken for a Warning, or for the first Event after a
                # lull, not once per bound pod (a thread switch each, in the busiest moments).
                idle = not self._urgent and not self._deferrable
                if deferrable:
                    self._deferrable.append((self._clock(), write))
                else:
                    self._urgent.append(write)
                if idle or not deferrable:
                    self._cond.notify()
        if full:
            log.warning("event queue full, dropping an event", extra={"event": write.name})

    def _next(self) -> _Write | None:
        """The next write to send: Warnings first; a Normal Event when the scheduler is not busy
        or it has waited ``defer_max``. None when stopping with nothing left."""
        with self._cond:
            while True:
                if self._urgent:
                    return self._urgent.popleft()
                if self._deferrable:
                    queued_at, write = self._deferrable[0]
                    waited = self._clock() - queued_at
                    if self._stopping or waited >= self._defer_max or not self.busy():
                        self._deferrable.popleft()
                        return write
                    self._cond.wait(min(0.05, self._defer_max - waited))
                    continue
                if self._stopping:
                    return None
                self._cond.wait(0.5)

    def _run(self) -> None:
        while True:
            write = self._next()
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
            send_json(
                self._api.api_client,
                "POST",
                f"/apis/events.k8s.io/v1/namespaces/{write.namespace}/events",
                write.body,
                TIMEOUT,
            )
        except ApiException as err:
            # 409 AlreadyExists: the same name already written, nothing to add. A 409 with
            # another reason (or any other answer) is a failure.
            if not api_status(err).already_exists:
                raise

    # -- building ---------------------------------------------------------------------------

    @staticmethod
    def _name(name: str | None) -> str:
        # Like client-go: the object's name and a timestamp in hex.
        return f"{(name if name is not None else 'pod')[:230]}.{time.time_ns():x}"

    def _event(self, pod: Pod, name: str, kind: str, reason: str, note: str) -> dict[str, Any]:
        regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name}
        if pod.uid:
            regarding["uid"] = pod.uid
        if pod.resource_version:
            regarding["resourceVersion"] = pod.resource_version
        return self._event_about(regarding, name, kind, reason, note, ACTION)

    def _event_about(
        self, regarding: Mapping[str, Any], name: str, kind: str, reason: str, note: str, action: str
    ) -> dict[str, Any]:
        """An events.k8s.io/v1 Event as the API takes it (a plain dict: no model objects)."""
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": regarding.get("namespace")},
            "eventTime": micro_time(),
            "type": kind,
            "reason": reason,
            "action": action,
            "note": note,
            "regarding": dict(regarding),
            "reportingController": self._controller,
            "reportingInstance": self._instance,
        }


def _reference(ref: client.V1ObjectReference) -> dict[str, Any]:
    """A typed object reference as the API's JSON (camelCase, no empty fields)."""
    fields = {
        "apiVersion": ref.api_version,
        "kind": ref.kind,
        "namespace": ref.namespace,
        "name": ref.name,
        "uid": ref.uid,
        "resourceVersion": ref.resource_version,
    }
    return {k: v for k, v in fields.items() if v}
