"""``QuietCollector``: full garbage collections wait while pods are being placed.

The decisions with a recording stand-in for the ``gc`` module (when a pass is due, quiet,
overdue), then the real thing in a fresh interpreter: CPython's own full passes are off,
cyclic garbage that reached the old generation stays while the scheduler is busy and is
freed by the next quiet check.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from kube_gpu_scheduler.scheduler.runtime.collector import QuietCollector

ROOT = Path(__file__).resolve().parents[3]


class FakeGC:
    def __init__(self, threshold: tuple[int, int, int] = (700, 10, 10)) -> None:
        self.threshold = threshold
        self.count = [0, 0, 0]
        self.calls: list[str] = []

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect({generation})")
        self.count = [0, 0, 0]
        return 0

    def freeze(self) -> None:
        self.calls.append("freeze")

    def get_freeze_count(self) -> int:
        return 1234

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def set_threshold(self, *t: int) -> None:
        self.threshold = (t[0], t[1], t[2])

    def get_count(self) -> tuple[int, int, int]:
        return (self.count[0], self.count[1], self.count[2])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def collector(
    busy: list[bool], fake: FakeGC, clock: Clock, ran: list[str], max_defer: float = 300.0
) -> QuietCollector:
    return QuietCollector(
        lambda: busy[0], max_defer, on_collected=lambda w, _s: ran.append(w), gc_module=fake, clock=clock
    )


def test_take_over_freezes_the_start_up_state_and_turns_cpythons_full_passes_off() -> None:
    fake, ran = FakeGC((700, 10, 7)), []
    c = collector([False], fake, Clock(), ran)
    c.take_over()
    assert fake.calls == ["collect(2)", "freeze"]
    assert fake.threshold[:2] == (700, 10) and fake.threshold[2] > 10**6
    fake.count[2] = 6
    assert c.tick() is None  # CPython's own threshold2 (7) is what makes a pass due
    fake.count[2] = 7
    assert c.tick() == "quiet" and ran == ["quiet"]


def test_a_due_pass_waits_while_busy_and_runs_at_the_first_quiet_check() -> None:
    fake, clock, busy, ran = FakeGC(), Clock(), [True], []
    c = collector(busy, fake, clock, ran)
    c.take_over()
    fake.calls.clear()
    assert c.tick() is None  # nothing due yet
    fake.count[2] = 10
    for _ in range(5):
        clock.now += 30
        assert c.tick() is None
    assert fake.calls == [] and ran == []
    busy[0] = False
    assert c.tick() == "quiet"
    assert fake.calls == ["collect(2)"] and ran == ["quiet"]
    assert c.tick() is None  # the count starts again


def test_an_overdue_pass_runs_even_while_busy() -> None:
    fake, clock, ran = FakeGC(), Clock(), []
    c = collector([True], fake, clock, ran, max_defer=60)
    c.take_over()
    fake.count[2] = 10
    assert c.tick() is None  # due from now
    clock.now += 59.9
    assert c.tick() is None
    clock.now += 0.1
    assert c.tick() == "deadline" and ran == ["deadline"]
    fake.count[2] = 10
    clock.now += 1
    assert c.tick() is None  # a new wait starts at the next due pass, not at the old one


def test_max_defer_0_leaves_the_collector_alone() -> None:
    fake = FakeGC()
    c = collector([False], fake, Clock(), [], max_defer=0)
    assert c.start(threading.Event()) is None
    assert fake.calls == [] and fake.threshold == (700, 10, 10)


def test_the_thread_takes_over_only_once_the_caches_are_synced() -> None:
    fake, stop, ready = FakeGC(), threading.Event(), threading.Event()
    c = QuietCollector(lambda: False, gc_module=fake, check_every=0.01)
    thread = c.start(stop, ready=ready.is_set)
    assert thread is not None
    thread.join(0.1)
    assert fake.calls == [] and not c.started
    ready.set()
    for _ in range(200):
        if c.started:
            break
        thread.join(0.01)
    stop.set()
    thread.join(2)
    assert c.started and fake.calls[:2] == ["collect(2)", "freeze"] and not thread.is_alive()


REAL = textwrap.dedent(
    """
    import gc, json, sys, weakref
    from kube_gpu_scheduler.scheduler.runtime.collector import QuietCollector

    busy = [True]
    ran = []
    c = QuietCollector(lambda: busy[0], on_collected=lambda w, s: ran.append(w))
    if sys.argv[1] == "take-over":
        c.take_over()

    class Node:
        pass

    holder = Node()
    holder.self = holder  # a reference cycle
    old = weakref.ref(holder)
    gc.collect(0)
    gc.collect(1)  # still referenced: promoted to the old generation
    del holder  # now garbage that only a full pass can find
    for _ in range(40):
        gc.collect(1)  # young passes, as a burst's allocations trigger them
    alive_while_busy = old() is not None
    # Half a million objects that stay: CPython runs its own full passes by now.
    keep = [[Node() for _ in range(100000)] for _ in range(5)]
    alive_after_allocations = old() is not None
    busy[0] = False
    when = c.tick()
    print(json.dumps({
        "threshold2": gc.get_threshold()[2],
        "frozen": gc.get_freeze_count(),
        "alive_while_busy": alive_while_busy,
        "alive_after_allocations": alive_after_allocations,
        "when": when,
        "freed": old() is None,
        "ran": ran,
    }))
    """
)


def real(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", REAL, mode], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_the_real_collector_keeps_old_garbage_while_busy_and_frees_it_when_quiet() -> None:
    got = real("take-over")
    assert isinstance(got["threshold2"], int) and got["threshold2"] > 10**6
    assert isinstance(got["frozen"], int) and got["frozen"] > 1000
    assert got["alive_while_busy"] and got["alive_after_allocations"], got
    assert got["when"] == "quiet" and got["freed"] and got["ran"] == ["quiet"], got


@pytest.mark.parametrize("mode", ["cpython"])
def test_without_it_cpython_runs_the_full_pass_in_the_middle_of_the_allocations(mode: str) -> None:
    """The control: the same script without take_over, so the test above can tell."""
    got = real(mode)
    assert got["alive_while_busy"] and not got["alive_after_allocations"], got
