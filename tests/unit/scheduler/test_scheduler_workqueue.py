"""Backoff and the work queue: dedup, one worker per key, delayed retries."""

from __future__ import annotations

import threading

import pytest

from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.scheduler.runtime.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_up_to_the_cap_per_key() -> None:
    b = Backoff(1.0, 60.0)
    assert [b.next("a") for _ in range(9)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert b.next("b") == 1
    assert b.failures("a") == 9
    b.forget("a")
    assert b.failures("a") == 0
    assert b.next("a") == 1


def test_backoff_never_overflows() -> None:
    b = Backoff(0.5, 30.0)
    for _ in range(2000):
        delay = b.next("k")
    assert delay == 30.0


def test_add_deduplicates() -> None:
    q = WorkQueue()
    for key in ("a", "b", "a", "a"):
        q.add(key)
    assert len(q) == 2
    assert q.get(0) == "a"
    assert q.get(0) == "b"
    assert q.get(0) is None


def test_key_added_while_processing_comes_back_after_done() -> None:
    q = WorkQueue()
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")
    assert q.get(0) is None  # not handed to a second worker while the first holds it
    q.done("a")
    assert q.get(0) == "a"
    q.done("a")
    assert q.get(0) is None


def test_add_after_waits_and_keeps_the_earliest_retry() -> None:
    clock = Clock()
    q = WorkQueue(clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 30)  # later: ignored, the earlier retry stands
    assert len(q) == 1
    assert q.get(0) is None
    clock.now += 9.9
    assert q.get(0) is None
    clock.now += 0.2
    assert q.get(0) == "a"
    q.done("a")
    clock.now += 30
    assert q.get(0) is None  # the ignored later retry was not queued


def test_add_makes_a_delayed_key_ready_now() -> None:
    clock = Clock()
    q = WorkQueue(clock=clock)
    q.add_after("a", 60)
    q.add("a")
    assert q.get(0) == "a"


def test_non_positive_delay_is_immediate() -> None:
    q = WorkQueue()
    q.add_after("a", 0)
    assert q.get(0) == "a"


def test_get_blocks_until_a_retry_is_due() -> None:
    q = WorkQueue()
    q.add_after("a", 0.05)
    assert q.get(timeout=2) == "a"


def test_get_wakes_up_on_add_from_another_thread() -> None:
    q = WorkQueue()
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get(timeout=5)))
    t.start()
    q.add("x")
    t.join(5)
    assert got == ["x"]


def test_shutdown_releases_waiting_workers_and_refuses_work() -> None:
    q = WorkQueue()
    got: list[str | None] = ["unset"]
    t = threading.Thread(target=lambda: got.__setitem__(0, q.get()))
    t.start()
    q.shutdown()
    t.join(5)
    assert got == [None]
    q.add("a")
    q.add_after("b", 1)
    assert q.get(0) is None


@pytest.mark.parametrize("workers", [4])
def test_each_key_processed_by_one_worker_at_a_time(workers: int) -> None:
    q = WorkQueue()
    active: set[str] = set()
    overlaps: list[str] = []
    lock = threading.Lock()
    processed = []

    def work() -> None:
        while True:
            key = q.get(timeout=0.3)
            if key is None:
                return
            with lock:
                if key in active:
                    overlaps.append(key)
                active.add(key)
            if len(processed) < 200:  # re-add while holding the key, a few times
                for _ in range(3):
                    q.add(key)
            with lock:
                active.discard(key)
                processed.append(key)
            q.done(key)

    for i in range(10):
        q.add(f"k{i}")
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert overlaps == []
    assert len(processed) >= 10
