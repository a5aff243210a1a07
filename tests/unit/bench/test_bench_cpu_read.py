"""``bench.measure``: a process's CPU time read from its ``/proc/<pid>/stat`` (kube-apiserver's,
for the apiserver phase), and the CPU each process spent between two readings."""

from __future__ import annotations

from pathlib import Path

from bench.measure import cpu_delta, process_cpu_seconds, stat_cpu_seconds


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
