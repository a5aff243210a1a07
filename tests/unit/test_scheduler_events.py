"""Event deduplication: one Event per distinct reason, repeats folded into a series."""

from __future__ import annotations

from typing import Any

from scheduler.events import NOTE_LIMIT, EventRecorder, truncate


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
    assert body.type == "Warning"
    assert body.reason == "FailedScheduling"
    assert body.action == "Scheduling"
    assert body.reporting_controller == "gpu-scheduler"
    assert body.regarding.kind == "Pod"
    assert (body.regarding.namespace, body.regarding.name, body.regarding.uid) == ("ns", "w-0", "u1")
    assert body.note == "NodeNotFound: node 'x' does not exist"
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
    assert [w.body.type for w in writes] == ["Normal", "Normal"]


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
    assert first is not None and first.body.reason == "FailedScheduling"  # queued later, sent first
    # Busy and not yet waited long: the sender waits (here: the clock moves on instead).
    waited = []

    def tick(_: float | None = None) -> bool:
        waited.append(clock.now)
        clock.now += 10
        return True

    rec._cond.wait = tick  # type: ignore[method-assign]
    second = rec._next()
    assert second is not None and second.body.reason == "Scheduled"
    assert waited == [0.0, 10.0, 20.0]  # released by defer_max (30 s), although still busy
    rec.normal(pod("c", "c-0"), "Scheduled", "bound c")
    busy[0] = False
    waited.clear()
    third = rec._next()
    assert third is not None and waited == []  # not busy: at once
