"""``bench.measure``: a process's CPU time read from its ``/proc/<pid>/stat`` (kube-apiserver's,
for the apiserver phase), the CPU each process spent between two readings, and the wait for
the control plane to settle between two arms."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.measure import cpu_delta, process_cpu_seconds, settle, stat_cpu_seconds


def stat_line(pid: int, comm: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 {utime} {stime} 7 8 20 0 12 0 99\n"


def test_utime_and_stime_are_read_after_the_last_parenthesis_of_the_name() -> None:
    # A command name with spaces and a ")" of its own must not shift the fields.
    text = stat_line(42, "kube (api) server) x", 250, 150)
    assert stat_cpu_seconds(text, 100) == 4.0
    assert stat_cpu_seconds(text, 1000) == 0.4


def test_the_cpu_of_a_process_from_a_fake_proc_and_its_delta(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    stat = tmp_path / "7" / "stat"
    stat.write_text(stat_line(7, "kube-apiserver", 1000, 500))
    before = {"kube-apiserver": process_cpu_seconds(7, tmp_path, ticks=100), "etcd": 3.0}
    stat.write_text(stat_line(7, "kube-apiserver", 1123, 530))
    after = {"kube-apiserver": process_cpu_seconds(7, tmp_path, ticks=100), "etcd": 3.25, "kwok": 0.5}
    assert before["kube-apiserver"] == 15.0 and after["kube-apiserver"] == 16.53
    assert cpu_delta(before, after) == {"kube-apiserver": 1.53, "etcd": 0.25, "kwok": 0.5}
    # A process that is gone (or a stat that cannot be read) costs nothing, it does not fail.
    assert process_cpu_seconds(8, tmp_path, ticks=100) == 0.0
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "stat").write_text("9 (truncated")
    assert process_cpu_seconds(9, tmp_path, ticks=100) == 0.0


def settle_on(rates: list[float], **kw: float) -> tuple[tuple[float, float], list[float]]:
    """``settle`` against a control plane spending ``rates`` cores in each successive second."""
    total, readings = [0.0], iter(rates)
    slept: list[float] = []

    def busy() -> float:
        return total[0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        total[0] += next(readings) * seconds

    return settle(busy, sleep=sleep, **kw), slept


def test_settle_waits_while_the_previous_arm_s_tail_dies_down() -> None:
    # Falling: 1.8, 1.2, 0.6 cores; then 0.25, under the quiet level: four seconds.
    (waited, rate), slept = settle_on([1.8, 1.2, 0.6, 0.25, 0.2, 0.2])
    assert waited == 4.0 and rate == pytest.approx(0.25) and slept == [1.0] * 4


def test_settle_stops_at_the_machine_s_floor_and_at_its_cap() -> None:
    # A shared machine's floor above the quiet level: the rate stops falling (0.72 after 0.75).
    (waited, rate), _ = settle_on([1.5, 0.75, 0.72, 0.7])
    assert waited == 3.0 and rate == pytest.approx(0.72)
    # Still falling at the cap: it gives up there.
    (waited, rate), _ = settle_on([4.0, 3.0, 2.0, 1.0, 0.5], cap=3.0)
    assert waited == 3.0 and rate == pytest.approx(2.0)
    # Already quiet: one window.
    (waited, _), _ = settle_on([0.1])
    assert waited == 1.0
