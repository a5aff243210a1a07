"""What a bench run measures (``SCALES``: node counts, plans, repetitions) and what it records (``Results``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.arms import ARMS, Run
from bench.workload import Plan

# The DRA phase's plan at the default scale (bench/dra.py): 100 nodes, 500 replicas, one per node.
DRA_PLAN = Plan(100, 500, 1)
# What a run does after the bind arms (bench/runner.py), in this order; ``startup`` (the huge
# scale's): the gpu-scheduler's memory after placing, and its start-up with every object present.
PHASES = ("tenancy", "webhook", "apiserver", "dra", "profile")
# The huge scale (``make bench BENCH_SCALE=huge``, by hand): kube-scheduler's own envelope of
# 5,000 nodes, three replicas per node in workloads of 300 (bench/workload.py), arms A, B2, L.
HUGE_NODES = 5000
HUGE_WORKLOAD = 300


@dataclass(frozen=True)
class ApiserverPlan:
    """The apiserver phase (bench/apiserver.py): what kube-apiserver's CPU is measured on.

    Per map size (entries): ``pods`` mapped pods created, ``applies`` StatefulSets applied one at
    a time, in each arm of each repetition; the largest maps run ``big_reps`` repetitions (the
    others ``reps``), and one more map of ``largest_kib`` KiB (the apiserver's limit on an
    object's annotations is 256) is applied ``largest_applies`` times per repetition of the
    3-release step."""

    maps: tuple[int, ...] = (3, 500, 3000)
    pods: tuple[int, ...] = (300, 150, 50)
    applies: tuple[int, ...] = (10, 6, 3)
    # Single pairs of PC/UC at 3 entries ranged from 1.1 to 2.0 in a probe on the shared cores:
    # 5 pairs for the median; 3 of the largest maps, whose runs cost the most (with 2, a median
    # is their mean: PC/UC at 3,000 entries and 3 releases read 1.25 in one run, 2.03 in the next).
    reps: int = 5
    big_reps: int = 3
    largest_kib: int = 256
    largest_applies: int = 1

    def reps_of(self, entries: int) -> int:
        return self.big_reps if entries == max(self.maps) else self.reps


@dataclass(frozen=True)
class Scale:
    name: str
    groups: tuple[tuple[int, tuple[Plan, ...]], ...]  # (node count, plans run at that count)
    reps: int
    webhook_pods: int
    webhook_maps: tuple[int, ...]
    foreign: int
    create_threads: int = 4
    # The raw binder's Bindings in flight (arms C and L): as many as the gpu-scheduler's default
    # workers, so that neither is held back by a smaller client than the other's.
    bind_threads: int = 16
    timeout: float = 600
    # The DRA phase (bench/dra.py): its plan, and how many other allocated claims arm DF runs beside.
    dra_plan: Plan = DRA_PLAN
    dra_foreign: int = 3000
    # Repetitions of D and KT (K runs ``reps``; 0: as many), D/KT paired within each: three
    # single runs of D read from 36 to 50 pods/s on these shared cores, and D/KT from 0.72 to
    # 1.07 between runs of the phase.
    dra_reps: int = 0
    # The price of a feature (G/AO: gangs; T1/T0: tenancy) is the median of ratios within each
    # repetition, each pair run back to back; one pair ranged from 0.72 to 1.28 on these shared
    # cores, so those arms run more repetitions than the others (0: as many). The median of 3
    # to 5 pairs of G/A at 5 pods per node still ranged from 0.88 to 1.06 between runs, both
    # arms making the same API requests: 9 pairs since stop 38.
    paired_reps: int = 0
    # The apiserver's CPU per mapped pod create and per StatefulSet apply, 1 and 3 releases.
    apiserver: ApiserverPlan = ApiserverPlan()
    # The bind arms run (bench/arms.py), the phases after them (PHASES, or ("startup",)) and the
    # kwok nodes' Lease duration in seconds (localcluster: renewed at a quarter of it).
    arms: tuple[str, ...] = ARMS
    phases: tuple[str, ...] = PHASES
    node_lease_s: int = 40
    # kube-controller-manager's client QPS (0: its defaults, 20/30).
    kcm_qps: int = 0
    # The most seconds a bind or DRA arm waits for the previous arm's tail to die down (Harness.settle).
    settle_cap: float = 10.0

    @property
    def feature_reps(self) -> int:
        """Repetitions of the paired feature arms (A, AO and G; T0 and T1)."""
        return max(self.reps, self.paired_reps)

    @property
    def plans(self) -> list[Plan]:
        return [p for _, plans in self.groups for p in plans]


def huge(nodes: int = HUGE_NODES) -> Scale:
    """``BENCH_SCALE=huge`` at ``nodes`` kwok nodes (``BENCH_HUGE_NODES``; 5,000 by default):
    3 replicas per node in workloads of at most 300, arms A, B2 and L, then the gpu-scheduler's
    start-up with every node and pod present; no other phase. Each kwok node's Lease lasts 800 s
    (renewed every 200 s: 25 writes a second for 5,000 nodes, 500 at the default 40 s);
    kube-controller-manager's client QPS is 200 (its default 20 held the node lifecycle
    controller to about 5 new nodes a second: 18 minutes before the 5,000 were schedulable);
    every node carries 8 GPUs."""
    if nodes < 1:
        raise ValueError(f"BENCH_HUGE_NODES={nodes}: at least 1")
    plan = Plan(nodes, 3 * nodes, 3, min(HUGE_WORKLOAD, 3 * nodes))
    return Scale(
        "huge",
        ((nodes, (plan,)),),
        1,
        0,
        (),
        0,
        timeout=max(600.0, 0.1 * plan.pods),
        arms=("A", "B2", "L"),
        phases=("startup",),
        node_lease_s=800,
        kcm_qps=200,
    )


_DEFAULT = (100, (Plan(100, 500, 1), Plan(100, 500, 5)))
SCALES = {
    "smoke": Scale(
        "smoke",
        ((10, (Plan(10, 20, 1), Plan(10, 20, 2))),),
        1,
        20,
        (3, 20),
        50,
        timeout=120,
        dra_plan=Plan(10, 20, 1),
        dra_foreign=40,
        apiserver=ApiserverPlan((3, 20), (20, 20), (3, 3), 1, 1, 16, 1),
        settle_cap=0.5,  # one half-second look: the smoke test pays for every second
    ),
    "default": Scale("default", (_DEFAULT,), 3, 500, (3, 500, 3000), 5000, paired_reps=9, dra_reps=5),
    "full": Scale(
        "full",
        (
            _DEFAULT,
            (
                1000,
                (Plan(1000, 500, 1), Plan(1000, 500, 5), Plan(1000, 3000, 1), Plan(1000, 3000, 5)),
            ),
        ),
        3,
        500,
        (3, 500, 3000),
        5000,
        # D/KT at 1,000 nodes: one workload of 1,000 replicas, one per node.
        dra_plan=Plan(1000, 1000, 1),
    ),
    "huge": huge(),
    # D/KT at 1,000 nodes alone (docs/benchmarks-dra.md): the full scale's DRA plan, one workload
    # of 1,000 replicas, one per node, with the default scale's repetitions of D and KT and no
    # bind arm or other phase before it (the full scale's run takes over an hour).
    "dra": Scale(
        "dra",
        ((1000, ()),),
        3,
        0,
        (),
        0,
        dra_plan=Plan(1000, 1000, 1),
        dra_reps=5,
        arms=(),
        phases=("dra",),
    ),
}


@dataclass
class Results:
    scale: str
    command: str
    started: str
    machine: dict[str, Any]
    runs: list[Run] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)  # what -> MiB
    memory_notes: dict[str, str] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    # The huge scale's start-up (bench/huge.py): what -> seconds.
    startup: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    load_end: str = ""

    @classmethod
    def from_json(cls, text: str) -> Results:
        doc = json.loads(text)
        runs = [Run(**{k: v for k, v in r.items() if k != "correct"}) for r in doc.pop("runs")]
        return cls(**doc, runs=runs)

    def to_json(self) -> str:
        doc = asdict(self)
        for run, item in zip(self.runs, doc["runs"], strict=True):
            item["correct"] = run.correct
        return json.dumps(doc, indent=2)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "cpu": cpu or platform.processor() or "unknown",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_start": load,
    }


# The arms that run more repetitions than the others: Scale.paired_reps (B2 beside A in them),
# Scale.dra_reps.
PAIRED_ARMS = frozenset({"A", "AO", "G", "T0", "T1", "B2"})
DRA_PAIRED_ARMS = frozenset({"D", "KT"})


def repetitions_of(scale: Scale, runs: list[Run]) -> Scale:
    """``scale`` with the repetitions ``runs`` (a results file's) were made with: what the
    report of ``--report-only`` says."""
    if not runs:
        return scale

    def count(arms: Callable[[str], bool]) -> int:
        return 1 + max((r.rep for r in runs if arms(r.arm)), default=0)

    return dataclasses.replace(
        scale,
        reps=count(lambda a: a not in PAIRED_ARMS | DRA_PAIRED_ARMS),
        paired_reps=count(lambda a: a in PAIRED_ARMS),
        dra_reps=count(lambda a: a in DRA_PAIRED_ARMS),
    )
