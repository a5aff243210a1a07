"""``make bench`` keeps working: the smoke scale runs end to end inside ``make test``.

It runs ``python -m bench`` with ``BENCH_SCALE=smoke`` (its own control plane with 10
kwok nodes, 20 pods per plan, one repetition) and checks that every arm ran, that
every correctness check passed and that the report was written. Timings are never
asserted: they depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.arms import ARMS
from bench.runner import SCALES

pytestmark = pytest.mark.cluster


def test_bench_smoke_scale_runs_every_arm_and_places_every_pod_correctly(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    workdir = tmp_path / "work"
    env = {**os.environ, "BENCH_SCALE": "smoke", "BENCH_DOC": str(doc), "BENCH_WORKDIR": str(workdir)}
    res = subprocess.run(
        [sys.executable, "-m", "bench"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert res.returncode == 0, f"python -m bench failed ({res.returncode}):\n{res.stderr[-4000:]}"

    results = json.loads((workdir / "results.json").read_text())
    scale = SCALES["smoke"]
    runs = results["runs"]
    # Every run passed its read-back: each pod on its mapped node with its GPU, no GPU twice,
    # and the webhook's variables present exactly when the webhook was on.
    assert runs and all(r["correct"] and not r["problems"] for r in runs), [
        r for r in runs if not r["correct"]
    ]
    measured = [r for r in runs if r["rep"] >= 0]
    bind = {(r["arm"], r["plan"]) for r in measured if r["arm"] in ARMS}
    assert bind == {(arm, plan.key) for arm in ARMS for plan in scale.plans}
    create = {(r["arm"], r["plan"]) for r in measured if r["arm"] in ("W+", "W-")}
    assert create == {(arm, f"map{e}") for arm in ("W+", "W-") for e in scale.webhook_maps}
    for r in measured:
        want = (
            scale.webhook_pods
            if r["arm"] in ("W+", "W-")
            else next(p.pods for p in scale.plans if p.key == r["plan"])
        )
        assert r["pods"] == want and r["throughput"] > 0 and r["p99"] >= r["p50"] >= 0, r

    memory = results["memory"]
    for key in ("scheduler_idle", "scheduler_foreign", "webhook_idle", "webhook_after"):
        assert memory[key] > 0, (key, memory)
    assert any(k.startswith("scheduler_own_") for k in memory), memory

    text = doc.read_text()
    for heading in ("## Ratios", "## Bind arms", "## Webhook", "## Memory (VmRSS)", "## Where the time goes"):
        assert heading in text
    assert "Correctness failures" not in text
    png = doc.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The ratios table is printed at the end of the run.
    assert "throughput A/C" in res.stdout
