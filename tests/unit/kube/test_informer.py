"""kube_gpu_scheduler.kube.informer against a scripted apiserver: no sockets, no apiserver.

The fake list method answers list calls and watch calls from a script; a watch
answer is a list of event lines (and exceptions, raised mid-stream). When the
script runs out of watches, the watch stays open (blocks) until the informer stops.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.errors import api_status
from kube_gpu_scheduler.kube.informer import Informer, Obj
from tests.support.kubeapi import status

Line = bytes | BaseException


def pod(name: str, rv: str, uid: str | None = None, **extra: Any) -> Obj:
    meta = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "resourceVersion": rv}
    return {"metadata": meta, **extra}


def event(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def bookmark(rv: str) -> bytes:
    return event("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": rv}})


def status_error(code: int, reason: str, message: str) -> bytes:
    return event("ERROR", status(code, reason, message))


EXPIRED_BODY = json.dumps(status(410, "Expired", "too old resource version: 10 (25)"))


class Response:
    """What ``_preload_content=False`` returns: ``data`` for a list, ``stream`` for a watch."""

    def __init__(
        self, lines: list[Line] | None = None, data: bytes = b"", hold: threading.Event | None = None
    ):
        self.lines = lines or []
        self.data = data
        self.hold = hold
        self.released = False
        self.closed = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for line in self.lines:
            if isinstance(line, BaseException):
                raise line
            yield line
        if self.hold is not None:  # the script is done: an open watch with nothing to say
            self.hold.wait()

    def release_conn(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


class Script:
    """A scripted list method: ``lists`` and ``watches`` are answered in order."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.lists: deque[tuple[list[Obj], str] | BaseException] = deque()
        self.watches: deque[list[Line] | BaseException] = deque()
        self.calls: list[dict[str, Any]] = []
        self.responses: list[Response] = []

    def __call__(self, **kwargs: Any) -> Response:
        self.calls.append(kwargs)
        if kwargs.get("watch"):
            answer: Any = self.watches.popleft() if self.watches else None
            if isinstance(answer, BaseException):
                raise answer
            resp = Response(answer, hold=None if answer is not None else self.stop)
        else:
            listed = self.lists.popleft()
            if isinstance(listed, BaseException):
                raise listed
            items, rv = listed
            body = {"kind": "PodList", "metadata": {"resourceVersion": rv}, "items": items}
            resp = Response(data=json.dumps(body).encode())
        self.responses.append(resp)
        return resp

    def watch_versions(self) -> list[str]:
        return [c["resource_version"] for c in self.calls if c.get("watch")]

    def list_count(self) -> int:
        return sum(1 for c in self.calls if not c.get("watch"))


class Recorder:
    """A handler that records every call, in order."""

    def __init__(self, block: threading.Event | None = None) -> None:
        self.calls: list[tuple[str, str, str | None]] = []
        self.block = block
        self._lock = threading.Lock()

    def _add(self, what: str, obj: Obj) -> None:
        if self.block is not None:
            self.block.wait()
        with self._lock:
            self.calls.append((what, obj["metadata"]["name"], obj["metadata"].get("uid")))

    def on_add(self, obj: Obj) -> None:
        self._add("add", obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        self._add("update", new)

    def on_delete(self, obj: Obj) -> None:
        self._add("delete", obj)


class RecordingBackoff(Backoff):
    def __init__(self) -> None:
        super().__init__(0.01, 0.05)
        self.delays: list[float] = []

    def next(self, key: str) -> float:
        delay = super().next(key)
        self.delays.append(delay)
        return delay


def eventually(cond: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Run:
    def __init__(self, **informer_args: Any) -> None:
        self.stop = threading.Event()
        self.script = Script(self.stop)
        self.handler = informer_args.pop("handler", None) or Recorder()
        self.relists: list[str] = []
        self.errors: list[BaseException] = []
        self.backoff = RecordingBackoff()
        self.informer = Informer(
            "pods",
            self.script,
            self.handler,
            backoff=self.backoff,
            on_relist=self.relists.append,
            on_error=self.errors.append,
            **informer_args,
        )

    def __enter__(self) -> Run:
        return self

    def start(self) -> None:
        self.informer.start(self.stop)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.informer.join(5)
        assert not self.informer.alive()


@pytest.fixture
def run() -> Iterator[Run]:
    with Run() as r:
        yield r


def test_lists_then_watches_from_the_lists_version(run: Run) -> None:
    run.script.lists.append(([pod("a", "5")], "10"))
    run.script.watches.append(
        [event("ADDED", pod("b", "11")), event("MODIFIED", pod("a", "12")), event("DELETED", pod("b", "13"))]
    )
    run.start()
    eventually(lambda: len(run.handler.calls) == 4, "four handler calls")
    assert run.handler.calls == [
        ("add", "a", "uid-a"),
        ("add", "b", "uid-b"),
        ("update", "a", "uid-a"),
        ("delete", "b", "uid-b"),
    ]
    watch = run.script.calls[1]
    assert watch["watch"] is True and watch["resource_version"] == "10"
    assert watch["allow_watch_bookmarks"] is True
    assert run.informer.synced.is_set() and run.relists == ["pods"]
    assert [o["metadata"]["name"] for o in run.informer.items()] == ["a"]
    assert run.informer.get("ns/a") == pod("a", "12")
    # The watch ran out (the apiserver ended it): resumed from the last version, no relist.
    eventually(lambda: len(run.script.watch_versions()) == 2, "the watch to resume")
    assert run.script.watch_versions() == ["10", "13"]
    assert run.script.list_count() == 1
    assert run.script.responses[1].released


def test_relist_tells_the_handler_what_changed_while_not_watching(run: Run) -> None:
    run.script.lists.append(([pod("a", "5"), pod("b", "6")], "10"))
    run.script.watches.append([status_error(410, "Expired", "too old resource version: 10 (25)")])
    # While not watching: a changed, b deleted, c created.
    run.script.lists.append(([pod("a", "20"), pod("c", "21")], "25"))
    run.start()
    eventually(lambda: len(run.handler.calls) == 5, "the relist's handler calls")
    assert run.handler.calls[2:] == [
        ("delete", "b", "uid-b"),
        ("update", "a", "uid-a"),
        ("add", "c", "uid-c"),
    ]
    assert run.relists == ["pods", "pods"]
    eventually(lambda: len(run.script.watch_versions()) == 2, "the second watch")
    assert run.script.watch_versions() == ["10", "25"]
    assert run.backoff.delays == []  # a 410 event is not a failure: listed again at once
    assert run.informer.resource_version == "25"


def test_gone_as_an_api_exception_lists_again(run: Run) -> None:
    run.script.lists.append(([pod("a", "5")], "10"))
    run.script.watches.append(ApiException(status=410, reason="Gone"))
    run.script.watches[0].body = EXPIRED_BODY  # type: ignore[union-attr]
    run.script.lists.append(([pod("a", "5")], "30"))
    run.start()
    eventually(lambda: len(run.script.watch_versions()) == 2, "a watch after the relist")
    assert run.script.list_count() == 2
    assert run.script.watch_versions() == ["10", "30"]
    assert len(run.errors) == 1
    status = api_status(run.errors[0])
    assert (status.code, status.reason) == (410, "Expired")
    assert status.message == "too old resource version: 10 (25)"
    # The same object, listed again: no handler call beyond the first add.
    assert run.handler.calls == [("add", "a", "uid-a")]


def test_a_new_uid_under_the_same_key_is_a_delete_then_an_add(run: Run) -> None:
    run.script.lists.append(([pod("a", "5", uid="one")], "10"))
    run.script.watches.append([event("MODIFIED", pod("a", "11", uid="two"))])
    run.start()
    eventually(lambda: len(run.handler.calls) == 3, "delete and add")
    assert run.handler.calls == [("add", "a", "one"), ("delete", "a", "one"), ("add", "a", "two")]
    assert run.informer.get("ns/a") == pod("a", "11", uid="two")


def test_a_new_uid_found_by_a_relist_is_a_delete_then_an_add(run: Run) -> None:
    run.script.lists.append(([pod("a", "5", uid="one")], "10"))
    run.script.watches.append([status_error(410, "Gone", "")])
    run.script.lists.append(([pod("a", "15", uid="two")], "20"))
    run.start()
    eventually(lambda: len(run.handler.calls) == 3, "delete and add")
    assert run.handler.calls == [("add", "a", "one"), ("delete", "a", "one"), ("add", "a", "two")]


def test_bookmarks_advance_the_version_without_handler_calls(run: Run) -> None:
    run.script.lists.append(([pod("a", "5")], "10"))
    run.script.watches.append([bookmark("40"), bookmark("50")])
    run.start()
    eventually(lambda: len(run.script.watch_versions()) == 2, "the watch to resume")
    assert run.script.watch_versions() == ["10", "50"]
    assert run.handler.calls == [("add", "a", "uid-a")]
    assert run.informer.resource_version == "50"
    assert run.informer.get("ns/a") == pod("a", "5")


@pytest.mark.parametrize(
    "broken",
    [
        urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(0 bytes read)"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_a_connection_broken_mid_stream_resumes_after_a_backoff(broken: BaseException) -> None:
    with Run() as run:
        run.script.lists.append(([pod("a", "5")], "10"))
        run.script.watches.append([event("ADDED", pod("b", "11")), broken])
        run.script.watches.append(OSError("connection refused"))  # reconnecting fails once, too
        run.start()
        eventually(lambda: len(run.script.watch_versions()) == 3, "the third watch")
        assert run.script.watch_versions() == ["10", "11", "11"]
        assert run.script.list_count() == 1  # resumed, not listed again
        assert run.backoff.delays == [0.01, 0.02]  # capped exponential, per failure
        assert run.errors == [broken, run.errors[1]] and isinstance(run.errors[1], OSError)
        # The broken response was closed (unread bytes) and its connection given back.
        assert run.script.responses[1].closed and run.script.responses[1].released
        assert run.handler.calls == [("add", "a", "uid-a"), ("add", "b", "uid-b")]


def test_an_error_event_other_than_410_is_retried_from_the_same_version(run: Run) -> None:
    run.script.lists.append(([], "10"))
    run.script.watches.append([event("ADDED", pod("b", "11")), status_error(500, "InternalError", "etcd")])
    run.start()
    eventually(lambda: len(run.script.watch_versions()) == 2, "the second watch")
    assert run.script.watch_versions() == ["10", "11"]
    assert run.backoff.delays == [0.01]
    assert "500" in str(run.errors[0])


def test_a_slow_consumer_loses_and_reorders_nothing() -> None:
    release = threading.Event()
    with Run(handler=Recorder(block=release)) as run:
        names = [f"p{i:03d}" for i in range(200)]
        run.script.lists.append(([], "10"))
        run.script.watches.append([event("ADDED", pod(n, str(11 + i))) for i, n in enumerate(names)])
        run.start()
        eventually(lambda: len(run.script.watch_versions()) == 1, "the watch")
        time.sleep(0.1)  # the handler is stuck in its first call
        assert run.handler.calls == []
        release.set()
        eventually(lambda: len(run.handler.calls) == 200, "every event")
        assert [c[1] for c in run.handler.calls] == names
        assert {c[0] for c in run.handler.calls} == {"add"}
        assert len(run.informer) == 200 and run.informer.resource_version == "210"
        assert run.script.list_count() == 1 and run.backoff.delays == []


def test_stop_leaves_the_stream_and_closes_it(run: Run) -> None:
    run.script.lists.append(([], "10"))
    run.start()
    eventually(lambda: len(run.script.responses) == 2, "the watch")
    run.stop.set()
    run.informer.join(5)
    assert not run.informer.alive()
    assert run.script.responses[1].released


def test_a_stream_closed_to_stop_is_not_a_failure(run: Run) -> None:
    """How the bench and a shutdown stop a watch: close its socket. The read then fails, but
    that is the stop, not an error to report and retry."""

    class ClosedOnStop(Response):
        def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
            run.stop.wait()
            raise urllib3.exceptions.ProtocolError("Connection broken: the socket was closed")
            yield b""  # a generator, as the real one

    run.script.lists.append(([], "10"))
    run.script.watches.append([])
    original = run.script.__call__

    def answer(**kwargs: Any) -> Response:
        resp = original(**kwargs)
        if kwargs.get("watch"):
            resp.__class__ = ClosedOnStop
        return resp

    run.informer._list_fn = answer
    run.start()
    eventually(lambda: len(run.script.responses) == 2, "the watch")
    run.stop.set()
    run.informer.join(5)
    assert not run.informer.alive()
    assert run.errors == [] and run.backoff.delays == []


def test_the_transform_decides_what_is_cached_and_handed_on() -> None:
    def gpus_only(obj: Obj) -> Obj:
        meta = obj["metadata"]
        return {
            "metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion")},
            "gpus": obj.get("status", {}).get("gpus"),
        }

    seen: list[Obj] = []

    class Keep(Recorder):
        def on_add(self, obj: Obj) -> None:
            seen.append(obj)
            super().on_add(obj)

    node = {"metadata": {"name": "n1", "uid": "u1", "resourceVersion": "5", "labels": {"x": "y"}}}
    with Run(handler=Keep(), transform=gpus_only) as run:
        run.script.lists.append(([{**node, "status": {"gpus": 4, "big": "x" * 1000}}], "10"))
        node2 = {"metadata": {"name": "n2", "uid": "u2", "resourceVersion": "11"}, "status": {"gpus": 8}}
        run.script.watches.append([event("ADDED", node2)])
        run.start()
        eventually(lambda: len(seen) == 2, "two adds")
        assert seen == [
            {"metadata": {"name": "n1", "uid": "u1", "resourceVersion": "5"}, "gpus": 4},
            {"metadata": {"name": "n2", "uid": "u2", "resourceVersion": "11"}, "gpus": 8},
        ]
        assert run.informer.get("n1") == seen[0] and run.informer.get("n2") == seen[1]


def test_by_default_managed_fields_are_dropped(run: Run) -> None:
    run.script.lists.append(([pod("a", "5", spec={"x": 1})], "10"))
    run.script.lists[0][0][0]["metadata"]["managedFields"] = [{"manager": "kubectl"}]  # type: ignore[index]
    run.start()
    eventually(run.informer.synced.is_set, "the list")
    assert run.informer.get("ns/a") == pod("a", "5", spec={"x": 1})


def test_a_paged_list_is_transformed_page_by_page() -> None:
    """``list_all`` hands each page's objects to the transform before it asks for the next page:
    a relist of 15,000 pods never holds all their managedFields at once (a restart's peak)."""
    from kube_gpu_scheduler.kube.jsonio import list_all

    pages = [[pod(f"p{i}", str(i)) for i in range(k, k + 3)] for k in (0, 3, 6)]
    for page in pages:
        for obj in page:
            obj["metadata"]["managedFields"] = [{"manager": "x" * 100}]
    transformed: list[str] = []
    seen_at_call: list[int] = []

    def list_fn(**kwargs: Any) -> Response:
        seen_at_call.append(len(transformed))
        index = int(kwargs.get("_continue") or 0)
        meta = {"resourceVersion": "42", **({"continue": str(index + 1)} if index + 1 < len(pages) else {})}
        return Response(data=json.dumps({"metadata": meta, "items": pages[index]}).encode())

    def slim(obj: Obj) -> Obj:
        transformed.append(obj["metadata"]["name"])
        obj["metadata"].pop("managedFields")
        return obj

    items, version = list_all(list_fn, page_size=3, transform=slim)
    assert version == "42" and [o["metadata"]["name"] for o in items] == [f"p{i}" for i in range(9)]
    assert all("managedFields" not in o["metadata"] for o in items)
    assert seen_at_call == [0, 3, 6]  # each page transformed before the next one is asked for
