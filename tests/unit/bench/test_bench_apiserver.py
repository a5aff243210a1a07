"""The apiserver phase's pure parts (bench/apiserver.py): the CPU per object with the idle rate
taken out, the ratios within each repetition against issue 43's targets, the report's table, and
the largest map."""

from __future__ import annotations

import dataclasses
import json
import math

from bench.apiserver import (
    ANNOTATIONS_LIMIT,
    apiserver_ratios,
    apiserver_section,
    cpu_ms,
    largest_map,
    paired_cpu_ratio,
    plan_key,
)
from bench.arms import Run
from bench.ratios import ratio_table
from bench.scales import ApiserverPlan
from bench.workload import statefulset_body
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, parse


def run(
    arm: str,
    plan: str,
    rep: int,
    apiserver_s: float,
    *,
    pods: int = 100,
    seconds: float = 2.0,
    idle: float = 0.0,
) -> Run:
    r = Run(arm, plan, rep, pods, seconds, pods / seconds, 0.01, 0.02)
    r.cpu = {"kube-apiserver": apiserver_s, "etcd": 1.0}
    r.apiserver_idle = idle
    return r


def test_cpu_per_object_takes_the_idle_rate_over_the_runs_seconds_out() -> None:
    # 0.5 s of CPU for 100 pods in 2 s, 0.05 s/s of it the apiserver's own idle work: 4 ms a pod.
    assert math.isclose(cpu_ms(run("PC", "k", 0, 0.5, idle=0.05)), 4.0)
    assert math.isclose(cpu_ms(run("PC", "k", 0, 0.5, idle=float("nan"))), 5.0)  # not measured
    assert cpu_ms(run("PC", "k", 0, 0.05, idle=0.1)) == 0.0  # never below 0
    empty = run("PC", "k", 0, 0.5)
    empty.cpu = {}
    assert math.isnan(cpu_ms(empty))


def test_the_ratio_is_the_median_of_the_ratios_within_each_repetition() -> None:
    key = plan_key(1, 3)
    runs = [
        # A slow repetition for both arms (the pace drifts): its ratio still counts as 1.2.
        run("UC", key, 0, 1.0), run("PC", key, 0, 1.2),
        run("UC", key, 1, 0.2), run("PC", key, 1, 0.3),
        run("UC", key, 2, 0.2), run("PC", key, 2, 0.22),
        run("PC", key, -1, 9.0),  # not a repetition (a warm-up or a profile)
        run("PC", plan_key(3, 3), 0, 9.0),  # another release count
    ]  # fmt: skip
    assert math.isclose(paired_cpu_ratio(runs, key, "PC", "UC"), 1.2)
    # A repetition whose baseline is missing is left out, not divided by zero.
    assert math.isclose(paired_cpu_ratio([*runs, run("PC", key, 3, 5.0)], key, "PC", "UC"), 1.2)


def test_rows_carry_issue_43s_targets_and_say_whether_each_is_met() -> None:
    plan = ApiserverPlan()
    runs: list[Run] = []
    for releases in (1, 3):
        for entries in plan.maps:
            key = plan_key(releases, entries)
            for rep in range(plan.reps_of(entries)):
                # At 3 entries policy mode costs 1.25x unmutated, at 3,000 2.5x; applies 3x.
                factor = {3: 1.25, 500: 1.5, 3000: 2.5}[entries]
                runs += [run("UC", key, rep, 0.4), run("PC", key, rep, 0.4 * factor)]
                runs += [run("US", key, rep, 0.1, pods=10), run("PS", key, rep, 0.3, pods=10)]
    big = plan_key(3, "256KiB")
    runs += [run("US", big, 0, 0.4, pods=1, seconds=1), run("PS", big, 0, 1.8, pods=1, seconds=1)]
    runs[-1].gateway_timeouts = 1
    rows = apiserver_ratios(runs, plan)
    table = ratio_table(rows)
    creates = [r for r in rows if r[0].startswith("kube-apiserver CPU per mapped pod create")]
    assert [(at, round(v, 2), target) for _, at, v, target in creates] == [
        ("map of 3", 1.25, "<= 1.3"),
        ("map of 500", 1.5, ""),
        ("map of 3000", 2.5, "<= 2.0"),
    ] * 2
    assert "| map of 3 | 1.25 | <= 1.3 | met |" in table
    assert "| map of 3000 | 2.50 | <= 2.0 | NOT met |" in table
    # The 3,000-entry rows say they ran fewer repetitions.
    assert (
        f"{plan.big_reps} repetitions" in creates[2][0]
        and "repetitions" not in creates[0][0].split("within")[1]
    )
    applies = [r for r in rows if r[0].startswith("kube-apiserver CPU per StatefulSet apply")]
    assert len(applies) == 6 and all(math.isclose(v, 3.0) and t == "" for _, _, v, t in applies)
    seconds, unserved, timeouts = rows[-3:]
    assert seconds[1:] == ("256 KiB map", 1.8, "<= 2.0") and "3 releases" in seconds[0]
    assert math.isclose(unserved[2], 0.4)
    assert timeouts[2] == 1.0 and timeouts[3] == "<= 0"
    assert "| 256 KiB map | 1.80 | <= 2.0 | met |" in table
    assert "| 256 KiB map | 1.00 | <= 0 | NOT met |" in table
    # The 2 s target is the 256 KiB map's: a smaller largest map (smoke's) gets none.
    small = [dataclasses.replace(r, plan=plan_key(3, "16KiB")) if r.plan == big else r for r in runs]
    assert apiserver_ratios(small, dataclasses.replace(plan, largest_kib=16))[-3][3] == ""
    section = apiserver_section(runs, plan)
    assert "| 3 | 256KiB | PS: " in section and "| 1 | 3 entries | UC: " in section


def test_no_rows_and_no_table_when_the_phase_did_not_run() -> None:
    assert apiserver_ratios([], ApiserverPlan()) == []
    assert apiserver_section([], ApiserverPlan()) == "The apiserver phase did not run."


def test_the_largest_map_is_valid_and_fits_the_apiservers_limit_on_annotations() -> None:
    text = largest_map(256)
    assert len(text.encode()) + len(ANNOTATION.encode()) <= ANNOTATIONS_LIMIT
    assert len(text.encode()) > ANNOTATIONS_LIMIT - 100  # as close to it as lines allow
    entries = parse(text)
    assert len(entries) > 6000
    sts = json.loads(statefulset_body("s-0", text, scheduler_name="bench-api-1"))
    assert sts["spec"]["replicas"] == len(entries)
    template = sts["spec"]["template"]
    assert template["metadata"]["annotations"] == {ANNOTATION: text}
    assert template["spec"]["schedulerName"] == "bench-api-1"
    assert len(parse(largest_map(16))) < len(entries)
