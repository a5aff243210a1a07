"""The DRA phase's arm KT (bench/drakt.py): the StatefulSets and ResourceClaimTemplate a team
without gpu-scheduler writes, and the report's D/KT rows and "where D's extra CPU goes" line
(bench/drareport.py). The arm itself runs against the real control plane in
tests/integration/test_bench_smoke.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.__main__ import DOCS, main
from bench.arms import Run
from bench.drakt import DRA_KCM, TEMPLATE, claim_of, claim_template, pod_names, statefulsets
from bench.drareport import DRA_COMPONENTS, dra_ratios, dra_section, extra_cpu_line
from bench.report import report
from bench.runner import Bench
from bench.scales import SCALES, Results
from bench.workload import Plan
from kube_gpu_scheduler.domain import dra


def test_one_parallel_statefulset_per_workload_asking_for_a_gpu_through_the_template() -> None:
    plan = Plan(100, 500, 1)
    docs = [json.loads(b) for b in statefulsets(plan, "tuned-kube-scheduler")]
    assert [d["metadata"]["name"] for d in docs] == ["w0", "w1", "w2", "w3", "w4"]
    assert sum(d["spec"]["replicas"] for d in docs) == 500
    spec = docs[0]["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    assert pod["schedulerName"] == "tuned-kube-scheduler"
    ((claim,),) = [pod["resourceClaims"]]
    assert claim["resourceClaimTemplateName"] == TEMPLATE
    assert pod["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]
    # Nothing pins a replica: no affinity, no node name, no map.
    assert (
        "affinity" not in pod and "nodeName" not in pod and "annotations" not in spec["template"]["metadata"]
    )
    template = claim_template()
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": dra.DEVICE_CLASS}
    assert pod_names(plan)[:2] == ["w0-0", "w0-1"] and len(set(pod_names(plan))) == 500
    status = {
        "status": {"resourceClaimStatuses": [{"name": claim["name"], "resourceClaimName": "w0-0-gpu-x1"}]}
    }
    assert claim_of(status) == "w0-0-gpu-x1" and claim_of({}) is None


def _run(arm: str, plan: Plan, rep: int, throughput: float, cpu_ms: dict[str, float]) -> Run:
    run = Run(
        arm, plan.key, rep, plan.pods, plan.pods / throughput, throughput, 0.1, 0.2 if arm == "D" else 0.4
    )
    run.cpu = {k: v * plan.pods / 1000 for k, v in cpu_ms.items()}
    return run


def test_d_against_kt_with_its_target_and_where_the_extra_cpu_goes() -> None:
    plan = SCALES["default"].dra_plan
    d_cpu = {"kube-apiserver": 30.0, "gpu-scheduler-dra": 12.0, DRA_KCM: 1.0, "etcd": 5.0}
    kt_cpu = {"kube-apiserver": 26.0, "gpu-scheduler-dra": 1.0, DRA_KCM: 7.0, "etcd": 5.0}
    # The control plane's pace drifts between repetitions: D/KT is the median of the ratios
    # within each (0.5, 1.8, 0.8), not the ratio of the medians (18/20).
    runs = [_run("D", plan, rep, t, d_cpu) for rep, t in enumerate((10.0, 18.0, 40.0))]
    runs += [_run("KT", plan, rep, t, kt_cpu) for rep, t in enumerate((20.0, 10.0, 50.0))]
    rows = {what.split(" (")[0]: (value, target) for what, _, value, target in dra_ratios(runs, plan, 3000)}
    assert rows["throughput D/KT"] == (0.8, ">= 0.9")
    assert rows["p99 create-to-bound D/KT"][0] == 0.5
    line = extra_cpu_line([r for r in runs if r.arm == "D"], [r for r in runs if r.arm == "KT"])
    # The largest gap first; equal processes left out.
    assert line.startswith(
        "**Where D's extra CPU goes** (ms per pod, D minus KT): all processes +9.0 (48.0 against 39.0)"
    )
    assert (
        line.index("gpu-scheduler-dra +11.0")
        < line.index(f"{DRA_KCM} -6.0")
        < line.index("kube-apiserver +4.0")
    )
    assert "etcd" not in line
    assert extra_cpu_line([], runs).endswith("no D and KT runs with CPU readings.")
    section = dra_section(runs, plan, 3000)
    assert DRA_KCM in DRA_COMPONENTS and "| KT: " in section and "**Where D's extra CPU goes**" in section


def test_d_against_kt_at_1000_nodes_at_the_full_scale() -> None:
    assert SCALES["full"].dra_plan == Plan(1000, 1000, 1)
    assert SCALES["default"].dra_plan.nodes == 100


def test_the_dra_scale_runs_the_full_scales_dra_plan_alone(tmp_path: Path) -> None:
    scale = SCALES["dra"]
    assert scale.dra_plan == SCALES["full"].dra_plan
    assert scale.groups == ((1000, ()),) and scale.phases == ("dra",) and scale.arms == ()
    # As many D/KT pairs as the default scale's; K and DF as many runs as its other arms.
    assert (scale.dra_reps, scale.reps) == (SCALES["default"].dra_reps, SCALES["default"].reps)
    # No bind arm: nothing to run (each repetition used to rotate an empty tuple of arms).
    bench = Bench(scale, tmp_path / "wd", "make bench BENCH_SCALE=dra")
    bench.bind_arms()
    assert bench.results.runs == []


def _dra_results(scale_name: str) -> Results:
    results = Results(
        scale_name,
        "make bench BENCH_SCALE=dra",
        "2026-12-07 22:00 UTC",
        {"nproc": 2, "cpu": "x", "memory_gib": 8, "kernel": "k", "python": "3", "load_start": "1 1 1"},
    )
    plan = SCALES["dra"].dra_plan
    cpu = {"kube-apiserver": 20.0, "gpu-scheduler-dra": 4.0}
    # Pairs 0.95, 0.9, 1.0, 0.8, 0.85: D/KT 0.9 (the ratio of medians would be 47.5/50 = 0.95).
    for rep, (d, kt) in enumerate(((47.5, 50.0), (45.0, 50.0), (50.0, 50.0), (40.0, 50.0), (51.0, 60.0))):
        results.runs += [_run("D", plan, rep, d, cpu), _run("KT", plan, rep, kt, cpu)]
    results.runs += [_run("K", plan, rep, 60.0, cpu) for rep in range(3)]
    return results


def test_the_dra_scale_writes_its_own_report_against_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _dra_results("dra")
    doc = tmp_path / "benchmarks-dra.md"
    rows = report(results, SCALES["dra"], doc)
    assert ("throughput D/KT" in rows[2][0]) and rows[2][1:] == (
        "1000 nodes, 1000 pods, 1/node, DRA",
        0.9,
        ">= 0.9",
    )
    text = doc.read_text()
    assert text.startswith("# Benchmarks: DRA mode at 1,000 nodes") and "BENCH_SCALE=dra" in text
    assert "| 0.90 | >= 0.9 | met |" in text and "| KT: " in text and "Every run passed" in text
    # Only the DRA phase: no bind arm's table, no plot.
    assert "## Bind arms" not in text and not doc.with_suffix(".png").exists()
    assert "throughput D/KT" in capsys.readouterr().out

    # --report-only writes it again from results.json, whatever BENCH_SCALE says now.
    (tmp_path / "results.json").write_text(results.to_json())
    again = tmp_path / "again.md"
    monkeypatch.setattr(sys, "argv", ["bench", "--report-only"])
    for key, value in {
        "BENCH_SCALE": "default",
        "BENCH_WORKDIR": str(tmp_path),
        "BENCH_DOC": str(again),
    }.items():
        monkeypatch.setenv(key, value)
    assert main() == 0
    assert again.read_text() == text
    assert DOCS["dra"] == "benchmarks-dra.md" and DOCS["huge"] == "benchmarks-huge.md"
