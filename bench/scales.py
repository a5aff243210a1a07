"""What a bench run measures (``SCALES``: node counts, plans, repetitions) and what it records (``Results``)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.arms import Run
from bench.workload import Plan

# The DRA phase's plan at the default scale (bench/dra.py): 100 nodes, 500 replicas, one per node.
DRA_PLAN = Plan(100, 500, 1)


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
    # The price of a feature (G/AO: gangs; T1/T0: tenancy) is the median of ratios within each
    # repetition, each pair run back to back; one pair ranged from 0.72 to 1.28 on these shared
    # cores, so those arms run more repetitions than the others (0: as many). The median of 3
    # to 5 pairs of G/A at 5 pods per node still ranged from 0.88 to 1.06 between runs, both
    # arms making the same API requests: 9 pairs since stop 38.
    paired_reps: int = 0

    @property
    def feature_reps(self) -> int:
        """Repetitions of the paired feature arms (A, AO and G; T0 and T1)."""
        return max(self.reps, self.paired_reps)

    @property
    def plans(self) -> list[Plan]:
        return [p for _, plans in self.groups for p in plans]


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
    ),
    "default": Scale("default", (_DEFAULT,), 3, 500, (3, 500, 3000), 5000, paired_reps=9),
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
