"""``make bench BENCH_SCALE=huge``: the plan (5,000 nodes, three replicas per node in workloads of
300), the node-count override, the kwok heartbeat settings, what is measured after placement, and
the report's rows against their targets (bench/huge.py, bench/scales.py, bench/report.py)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bench.__main__ import exact_command, main, scale_of
from bench.arms import Run
from bench.huge import after_placement, huge_ratios
from bench.measure import rss_mib
from bench.ratios import ratio_table
from bench.report import report
from bench.scales import SCALES, Results, huge
from bench.workload import Plan
from kube_gpu_scheduler.domain.schedmap import parse
from localcluster.components import controller_manager_client_flags, node_monitor_flags
from localcluster.procs import ManagedProcess


def test_the_huge_plan_is_5000_nodes_three_replicas_each_in_workloads_of_300() -> None:
    scale = SCALES["huge"]
    ((nodes, (plan,)),) = scale.groups
    assert (nodes, plan.nodes, plan.pods, plan.per_node, plan.workload) == (5000, 5000, 15000, 3, 300)
    assert scale.arms == ("A", "B2", "L") and scale.phases == ("startup",)
    placements = plan.placements()
    # Every node takes three replicas, on GPUs 0, 1 and 2; no node:GPU twice.
    per_node = Counter(node for *_, node, _ in placements)
    assert len(per_node) == 5000 and set(per_node.values()) == {3}
    assert len({(node, gpu) for *_, node, gpu in placements}) == 15000
    assert {gpu for *_, gpu in placements} == {0, 1, 2}
    maps = plan.maps()
    assert len(maps) == 50
    for workload, text in maps.items():
        entries = parse(text).entries
        assert sorted(entries) == list(range(300)), workload
        # The task's style: consecutive replicas share a node, each its own GPU.
        assert entries[0].node == entries[1].node == entries[2].node != entries[3].node
        assert len(text) < 8 * 1024  # not the 200 KB one map of 15,000 entries would be
    assert plan.key == "n5000-p15000-r3-w300" and plan.label.endswith("workloads of 300")


def test_the_default_workload_keeps_the_plans_of_every_other_scale() -> None:
    # Replica k of workload w on node k//R+1 with GPU w*R + k%R (bench/workload.py's doc).
    plan = Plan(100, 500, 5)
    assert plan.key == "n100-p500-r5" and plan.size == 500
    for i, (w, k, node, gpu) in enumerate(plan.placements()):
        assert (w, k, node, gpu) == ("w0", i, f"node{i // 5 + 1}", i % 5)
    plan = Plan(100, 500, 1)
    assert plan.placements()[250] == ("w2", 50, "node51", 2)


def test_the_node_count_override_scales_the_whole_plan() -> None:
    scale = scale_of("huge", {"BENCH_HUGE_NODES": "50"})
    ((nodes, (plan,)),) = scale.groups
    assert (nodes, plan.pods, plan.workload) == (50, 150, 150)
    assert scale.timeout >= 600 and huge(5000).timeout >= 1500
    assert scale_of("default", {"BENCH_HUGE_NODES": "50"}) is SCALES["default"]
    for bad in ("0", "many", "-3"):
        with pytest.raises(ValueError, match="BENCH_HUGE_NODES"):
            scale_of("huge", {"BENCH_HUGE_NODES": bad})
    # The report's command names the override.
    env = {"BENCH_COMMAND": "make bench BENCH_SCALE=huge", "BENCH_HUGE_NODES": "50"}
    assert exact_command(env, "huge", []) == "BENCH_HUGE_NODES=50 make bench BENCH_SCALE=huge"


def test_long_leases_come_with_as_long_a_node_grace_period() -> None:
    assert node_monitor_flags(40) == []  # the default: kube-controller-manager's own 50 s
    assert node_monitor_flags(SCALES["huge"].node_lease_s) == ["--node-monitor-grace-period=800s"]
    assert all(SCALES[name].node_lease_s == 40 for name in ("smoke", "default", "full"))
    # kube-controller-manager's client: its defaults, but at the huge scale.
    assert all(SCALES[name].kcm_qps == 0 for name in ("smoke", "default", "full"))
    assert controller_manager_client_flags(0) == []
    assert controller_manager_client_flags(SCALES["huge"].kcm_qps) == [
        "--kube-api-qps=200",
        "--kube-api-burst=400",
    ]


def test_after_placement_reads_the_memory_and_times_a_real_restart(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; b = b'x' * (40 << 20); time.sleep(60)"]
    old = ManagedProcess("old", sleeper, log_path=tmp_path / "old.log").start()
    new: list[ManagedProcess] = []
    try:
        # Let the old one touch its 40 MiB (a poll: the interpreter starts first).
        deadline = time.monotonic() + 20
        while rss_mib(old.pid) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)

        def restart() -> ManagedProcess:
            old.stop()
            proc = ManagedProcess(
                "new", [sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "new.log"
            )
            new.append(proc.start())
            time.sleep(0.3)  # what a real start-up takes, at least
            return proc

        results = Results("huge", "cmd", "now", {})
        assert after_placement(results, old.pid, restart) is new[0]
        mem = results.memory
        assert mem["huge_peak"] >= mem["huge_after"] >= 40
        assert 0 < mem["huge_restart_ready"] < 40 and mem["huge_restart_peak"] >= mem["huge_restart_ready"]
        assert results.startup["ready_s"] >= 0.3
    finally:
        old.stop()
        for proc in new:
            proc.stop()


def _run(arm: str, plan: Plan, throughput: float, p99: float, cpu: dict[str, float]) -> Run:
    run = Run(arm, plan.key, 0, plan.pods, plan.pods / throughput, throughput, p99 / 2, p99)
    run.cpu = cpu
    return run


def test_the_report_prints_each_number_against_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scale = huge(50)
    plan = scale.plans[0]
    results = Results(
        "huge",
        "make bench BENCH_SCALE=huge",
        "2026-11-29 13:00 UTC",
        {"nproc": 2, "cpu": "x", "memory_gib": 8, "kernel": "k", "python": "3", "load_start": "0.5 0.5 0.5"},
    )
    results.runs = [
        _run("A", plan, 100.0, 0.2, {"gpu-scheduler": 0.12, "kube-apiserver": 1.0}),  # 0.8 ms per pod
        _run("B2", plan, 80.0, 0.4, {"kube-scheduler-tuned": 0.3}),
        _run("L", plan, 125.0, 0.1, {}),
    ]
    results.memory.update(
        huge_peak=300.0, huge_after=250.0, huge_restart_ready=240.0, huge_restart_peak=260.0
    )
    results.startup["ready_s"] = 12.5
    rows = {what.split(" (")[0]: (value, target) for what, _, value, target in huge_ratios(results, scale)}
    assert rows["throughput A/B2"] == (1.25, ">= 1.0")
    assert rows["throughput A/L"] == (0.8, ">= 0.9")
    assert rows["p99 create-to-bound A/B2"][0] == 0.5
    assert rows["the gpu-scheduler's CPU per pod, A, ms"] == (pytest.approx(0.8), "<= 1.0")
    assert rows["kube-scheduler's"][0] == pytest.approx(2.0)
    assert rows["the gpu-scheduler's start-up to ready"] == (12.5, "")
    table = ratio_table(huge_ratios(results, scale))
    assert "| 1.25 | >= 1.0 | met |" in table and "| 0.80 | >= 0.9 | NOT met |" in table
    assert "| 0.80 | <= 1.0 | met |" in table and "| 300.00 |  |  |" in table

    doc = tmp_path / "benchmarks-huge.md"
    report(results, scale, doc)
    text = doc.read_text()
    assert text.startswith("# Benchmarks at 50 nodes") and "## Ratios, memory and start-up" in text
    assert "Leases 800 s" in text and "arms A, B2, L" in text and "Every run passed" in text
    # Only the huge scale's arms in the tables, and the ratios printed at the end.
    assert "| B2: kube-scheduler, client QPS 5000" in text and "| E: " not in text
    assert "throughput A/B2" in capsys.readouterr().out


def test_report_only_writes_a_huge_run_again_at_the_node_count_it_ran_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scale = huge(50)
    plan = scale.plans[0]
    results = Results(
        "huge",
        "cmd",
        "2026-11-29 13:00 UTC",
        {"nproc": 2, "cpu": "x", "memory_gib": 8, "kernel": "k", "python": "3", "load_start": "1 1 1"},
    )
    results.runs = [_run("A", plan, 100.0, 0.2, {"gpu-scheduler": 0.3}), _run("B2", plan, 50.0, 0.4, {})]
    (tmp_path / "results.json").write_text(results.to_json())
    doc = tmp_path / "again.md"
    monkeypatch.setattr(sys, "argv", ["bench", "--report-only"])
    for key, value in {
        "BENCH_SCALE": "default",
        "BENCH_WORKDIR": str(tmp_path),
        "BENCH_DOC": str(doc),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("BENCH_HUGE_NODES", raising=False)
    assert main() == 0
    text = doc.read_text()
    assert (
        text.startswith("# Benchmarks at 50 nodes")
        and "| throughput A/B2" in text
        and "| 2.00 | >= 1.0 | met |" in text
    )
