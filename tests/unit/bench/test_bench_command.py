"""The benchmark report names the exact command that produced it, overrides included."""

from __future__ import annotations

from bench.__main__ import exact_command
from bench.arms import Run
from bench.scales import SCALES, repetitions_of


def test_the_make_target_alone() -> None:
    env = {"BENCH_COMMAND": "make bench BENCH_SCALE=default", "BENCH_SCALE": "default"}
    assert exact_command(env, "default", []) == "make bench BENCH_SCALE=default"


def test_overrides_that_change_the_run_are_named_before_the_command() -> None:
    env = {
        "BENCH_COMMAND": "make bench BENCH_SCALE=full",
        "BENCH_REPS": "2",
        "BENCH_DOC": "docs/benchmarks full.md",
        "BENCH_WORKDIR": " ",  # blank: not set
    }
    assert exact_command(env, "full", []) == (
        "BENCH_REPS=2 BENCH_DOC='docs/benchmarks full.md' make bench BENCH_SCALE=full"
    )


def test_python_m_bench_without_make() -> None:
    env = {"BENCH_WORKDIR": ".cluster/bench-full"}
    assert exact_command(env, "full", ["--report-only"]) == (
        "BENCH_WORKDIR=.cluster/bench-full BENCH_SCALE=full python -m bench --report-only"
    )


def test_a_reports_repetitions_are_read_back_from_its_runs() -> None:
    """--report-only says how many repetitions each kind of arm ran: B2 runs beside A in the
    paired repetitions, D and KT more than K (they once read as 9 plain repetitions)."""
    plan = "n100-p500-r1"
    runs = [
        Run(arm, plan, rep, 500, 10.0, 50.0, 0.1, 0.2) for arm in ("B1", "C", "K", "DF") for rep in range(3)
    ]
    runs += [Run(arm, plan, rep, 500, 10.0, 50.0, 0.1, 0.2) for arm in ("A", "B2", "G") for rep in range(9)]
    runs += [Run(arm, plan, rep, 500, 10.0, 50.0, 0.1, 0.2) for arm in ("D", "KT") for rep in range(5)]
    scale = repetitions_of(SCALES["smoke"], runs)
    assert (scale.reps, scale.paired_reps, scale.dra_reps) == (3, 9, 5)
    assert repetitions_of(SCALES["smoke"], []) == SCALES["smoke"]
