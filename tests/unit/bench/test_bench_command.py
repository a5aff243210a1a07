"""The benchmark report names the exact command that produced it, overrides included."""

from __future__ import annotations

from bench.__main__ import exact_command


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
