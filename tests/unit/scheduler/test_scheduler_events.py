"""Event deduplication: one Event per distinct reason, repeats folded into a series."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.scheduler.report import events as events_module
from kube_gpu_scheduler.scheduler.report.events import NOTE_LIMIT, EventRecorder, truncate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pod(uid: str = "u1", name: str = "w-0") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "9"}}


def drain(rec: EventRecorder) -> list[Any]:
    """Everything queued, in the order the sender would take it (not busy: nothing waits)."""
    out = []
    while rec.pending():
        out.append(rec._next())
    return out


def recorder(clock: Clock) -> EventRecorder:
    # Never started: these tests look at what would be written, not at the API.
    return EventRecorder(events_api=None, controller="gpu-scheduler", instance="i", refresh=300, clock=clock)  # type: ignore[arg-type]


def test_repeats_are_folded_and_a_new_message_makes_a_new_event() -> None:
    clock = Clock()
    rec = recorder(clock)
    assert rec.warning(pod(), "FailedScheduling", "NodeNotFound: node 'x' does not exist")
    for _ in range(5):
        clock.now += 10
        assert not rec.warning(pod(), "FailedScheduling", "NodeNotFound: node 'x' does not exist")
    [created] = drain(rec)
    assert created.kind == "create"
    body = created.body
    # The API's JSON (events.k8s.io/v1), camelCase.
    assert (body["apiVersion"], body["kind"]) == ("events.k8s.io/v1", "Event")
    assert body["type"] == "Warning"
    assert body["reason"] == "FailedScheduling"
    assert body["action"] == "Scheduling"
    assert body["reportingController"] == "gpu-scheduler"
    assert body["regarding"]["kind"] == "Pod"
    regarding = body["regarding"]
    assert (regarding["namespace"], regarding["name"], regarding["uid"]) == ("ns", "w-0", "u1")
    assert body["note"] == "NodeNotFound: node 'x' does not exist"
    assert body["eventTime"].endswith("Z") and len(body["eventTime"]) == len("2026-01-01T00:00:00.000000Z")
    assert created.name.startswith("w-0.")

    assert rec.warning(pod(), "FailedScheduling", "NodeNotReady: node 'x' is not Ready")
    [second] = drain(rec)
    assert second.kind == "create"
    assert second.name != created.name


def test_a_long_standing_reason_updates_the_series() -> None:
    clock = Clock()
    rec = recorder(clock)
    rec.warning(pod(), "FailedScheduling", "GPUInUse: held")
    [created] = drain(rec)
    for _ in range(3):
        clock.now += 100
        rec.warning(pod(), "FailedScheduling", "GPUInUse: held")
    [series] = drain(rec)
    assert series.kind == "series"
    assert series.name == created.name
    assert series.body["series"]["count"] == 4
    assert series.body["series"]["lastObservedTime"].endswith("Z")


def test_pods_are_tracked_apart_and_forget_resets() -> None:
    clock = Clock()
    rec = recorder(clock)
    assert rec.warning(pod("u1"), "FailedScheduling", "same")
    assert rec.warning(pod("u2", "w-1"), "FailedScheduling", "same")
    rec.forget("u1")
    assert rec.warning(pod("u1"), "FailedScheduling", "same")
    assert len(drain(rec)) == 3


def test_normal_events_are_always_written() -> None:
    rec = recorder(Clock())
    rec.normal(pod(), "Scheduled", "Successfully assigned ns/w-0 to node1")
    rec.normal(pod(), "Scheduled", "Successfully assigned ns/w-0 to node1")
    writes = drain(rec)
    assert [w.body["type"] for w in writes] == ["Normal", "Normal"]


def test_notes_are_cut_to_the_api_limit() -> None:
    assert truncate("x" * 10) == "x" * 10
    long = truncate("y" * 5000)
    assert len(long) == NOTE_LIMIT
    assert long.endswith("...")


def test_full_queue_drops_instead_of_blocking() -> None:
    rec = EventRecorder(None, "c", "i", capacity=1)  # type: ignore[arg-type]
    rec.normal(pod(), "Scheduled", "a")
    rec.normal(pod(), "Scheduled", "b")
    assert rec.dropped == 1
    assert rec.pending() == 1


def test_warnings_go_first_and_normal_events_wait_while_busy_up_to_the_limit() -> None:
    clock = Clock()
    busy = [True]
    rec = EventRecorder(None, "c", "i", clock=clock, busy=lambda: busy[0], defer_max=30)  # type: ignore[arg-type]
    rec.normal(pod("a", "a-0"), "Scheduled", "bound a")
    rec.warning(pod("b", "b-0"), "FailedScheduling", "GPUInUse: ...")
    first = rec._next()
    assert first is not None and first.body["reason"] == "FailedScheduling"  # queued later, sent first
    # Busy and not yet waited long: the sender waits (here: the clock moves on instead).
    waited = []

    def tick(_: float | None = None) -> bool:
        waited.append(clock.now)
        clock.now += 10
        return True

    rec._cond.wait = tick  # type: ignore[method-assign]
    second = rec._next()
    assert second is not None and second.body["reason"] == "Scheduled"
    assert waited == [0.0, 10.0, 20.0]  # released by defer_max (30 s), although still busy
    rec.normal(pod("c", "c-0"), "Scheduled", "bound c")
    busy[0] = False
    waited.clear()
    third = rec._next()
    assert third is not None and waited == []  # not busy: at once


def test_the_sender_is_woken_for_warnings_and_after_a_lull_not_for_every_normal_event() -> None:
    """A burst of Scheduled Events wakes the sender once (it looks again every 50 ms while they
    wait); every Warning wakes it; so does the first Event after the queue emptied."""
    rec = recorder(Clock())
    woken: list[int] = []
    real = rec._cond.notify
    rec._cond.notify = lambda n=1: (woken.append(n), real(n))  # type: ignore[method-assign]
    for i in range(5):
        rec.normal(pod(f"u{i}", f"w-{i}"), "Scheduled", f"bound w-{i}")
    assert len(woken) == 1 and rec.pending() == 5
    rec.warning(pod("x", "w-9"), "FailedScheduling", "GPUInUse: ...")
    assert len(woken) == 2
    assert [w.body["reason"] for w in drain(rec)] == ["FailedScheduling"] + ["Scheduled"] * 5
    rec.normal(pod("u7", "w-7"), "Scheduled", "bound w-7")  # after the lull: woken again
    assert len(woken) == 3


def test_a_started_sender_writes_a_burst_of_normal_events_once_not_busy() -> None:
    """The sender thread, started: Normal Events queued while busy (no wake-up after the first)
    are written once the scheduler is idle, within its 50 ms look."""
    import threading

    sent: list[str] = []
    done = threading.Event()
    busy = [True]
    rec = EventRecorder(None, "c", "i", busy=lambda: busy[0], defer_max=30)  # type: ignore[arg-type]

    def send(write: Any) -> None:
        sent.append(write.name)
        if len(sent) == 4:
            done.set()

    rec._send = send  # type: ignore[method-assign]
    rec.start()
    try:
        for i in range(4):
            rec.normal(pod(f"u{i}", f"w-{i}"), "Scheduled", f"bound w-{i}")
        assert not done.wait(0.2) and sent == []  # busy: held
        busy[0] = False
        assert done.wait(5), sent
    finally:
        rec.stop()
    assert len(sent) == 4


def test_a_burst_of_pods_arriving_one_by_one_counts_as_placing(monkeypatch: Any) -> None:
    """The Scheduler's ``placing`` (what defers Scheduled Events): true while keys wait, and for
    BURST_GAP_S after a Binding, so pods that arrive one at a time (the queue empty between
    them) still put their Bindings before the Events."""
    from kubernetes import client

    from kube_gpu_scheduler.domain.rules import Decision
    from kube_gpu_scheduler.domain.schedmap import Entry
    from kube_gpu_scheduler.scheduler.main import build
    from kube_gpu_scheduler.scheduler.placing import core
    from kube_gpu_scheduler.scheduler.runtime.settings import Settings

    clock = Clock()
    clock.now = 500.0
    # Only kube_gpu_scheduler.scheduler.placing.core's clock: the process-wide time.monotonic stays untouched.
    monkeypatch.setattr(core, "time", SimpleNamespace(monotonic=clock))
    sched = build(Settings(identity="me", leader_elect=False).validate(), client.ApiClient())
    assert sched.events.busy is not None and not sched.events.busy()
    sched.queue.add("ns/w-1")
    assert sched.placing()
    assert sched.queue.get(timeout=0) == "ns/w-1"
    sched.queue.done("ns/w-1")
    assert not sched.placing()

    sched._bound(pod(), Decision(0, Entry(0, "node1", (0,))), first_seen=499.0, already=False)
    assert sched.events.busy()  # the recorder asks the same question
    clock.now += core.BURST_GAP_S * 0.9
    assert sched.placing()
    clock.now += core.BURST_GAP_S * 0.2
    assert not sched.placing()
    # A pod found already bound (a restart, a relist) is not a burst.
    sched._bound(pod("u2", "w-1"), Decision(1, Entry(1, "node1", (1,))), first_seen=None, already=True)
    assert not sched.placing()


def test_a_create_answered_already_exists_is_done_and_another_409_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = EventRecorder(
        events_api=SimpleNamespace(api_client=None),  # type: ignore[arg-type]
        controller="gpu-scheduler",
        instance="i",
        refresh=300,
        clock=Clock(),
    )
    assert rec.warning(pod(), "FailedScheduling", "NodeNotFound: node 'x' does not exist")
    [created] = drain(rec)

    def refuse(reason: str) -> Any:
        def send_json(*_args: Any, **_kwargs: Any) -> None:
            err = ApiException(status=409, reason="Conflict")
            err.body = json.dumps({"kind": "Status", "status": "Failure", "reason": reason, "code": 409})
            raise err

        return send_json

    monkeypatch.setattr(events_module, "send_json", refuse("AlreadyExists"))
    rec._send(created)  # the same name already written: nothing to add
    monkeypatch.setattr(events_module, "send_json", refuse("Conflict"))
    with pytest.raises(ApiException):
        rec._send(created)
