"""The huge scale (``make bench BENCH_SCALE=huge``, by hand): what the gpu-scheduler costs at
kube-scheduler's own envelope of 5,000 nodes, and its ratios against their targets (issue 43).

Besides the bind arms A, B2 and L on the huge plan (15,000 replicas, three per node, workloads
of 300: bench/scales.py), once arm A's first run has placed every pod and before they go:

* the placing gpu-scheduler's peak resident set (``VmHWM``) and its resident set now
  (``VmRSS``), from ``/proc``;
* its start-up: the process is stopped (SIGTERM: it gives its Lease back) and a new one started
  with the same settings while the 5,000 nodes and 15,000 pods are there; from the new process's
  start to its ``/readyz`` answering 200 (every watch listed and synced, its Lease held:
  kube_gpu_scheduler/scheduler/runtime/health.py), and that process's memory then. The new
  process serves the arms that follow.

CPU per pod is arm A's: the gpu-scheduler process's utime + stime during the timed part of the
run (``Run.cpu``), over the pods placed, every correctness read-back kept.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from bench.arms import Run
from bench.measure import peak_rss_mib, rss_mib
from bench.scales import Results, Scale, log
from bench.stats import median
from localcluster.procs import ManagedProcess

SCHEDULER = "gpu-scheduler"
# What bench/huge.py's section prints, each against its target (issue 43; "" for none).
TARGETS = {"A/B2": ">= 1.0", "A/L": ">= 0.9", "cpu_ms": "<= 1.0"}
MEMORY_KEYS = {
    "huge_peak": "peak over start-up and placement (VmHWM)",
    "huge_after": "after placing every pod (VmRSS)",
    "huge_restart_ready": "restarted with every node and pod present, at ready (VmRSS)",
    "huge_restart_peak": "restarted, its peak until ready (VmHWM)",
}


def after_placement(results: Results, pid: int, restart: Callable[[], ManagedProcess]) -> ManagedProcess:
    """The placing process's memory, then its start-up against every object present (the module
    doc); returns the new process. ``restart`` stops the old one and starts the new one, returning
    once its /readyz answers 200."""
    mem = results.memory
    mem["huge_after"] = rss_mib(pid)
    mem["huge_peak"] = peak_rss_mib(pid)  # after: the peak is never under the reading before it
    started = time.monotonic()
    proc = restart()
    results.startup["ready_s"] = round(time.monotonic() - started, 2)
    mem["huge_restart_ready"], mem["huge_restart_peak"] = rss_mib(proc.pid), peak_rss_mib(proc.pid)
    log(
        f"gpu-scheduler: RSS peak {mem['huge_peak']} MiB, after placement {mem['huge_after']} MiB; "
        f"restarted: ready in {results.startup['ready_s']} s, RSS {mem['huge_restart_ready']} MiB"
    )
    return proc


def _runs(results: Results, arm: str, plan: str) -> list[Run]:
    return [r for r in results.runs if r.arm == arm and r.plan == plan and r.rep >= 0]


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def cpu_ms_per_pod(runs: list[Run], process: str = SCHEDULER) -> float:
    """The median over ``runs`` of ``process``'s CPU milliseconds per pod."""
    return median([1000 * r.cpu.get(process, 0.0) / r.pods for r in runs if r.cpu])


def huge_ratios(results: Results, scale: Scale) -> list[tuple[str, str, float, str]]:
    """The huge scale's rows (medians of the repetitions): A/B2, A/L, the gpu-scheduler's CPU
    per pod, its memory and its start-up, each with its target where issue 43 set one."""
    rows: list[tuple[str, str, float, str]] = []
    for plan in scale.plans:
        tp = {arm: median([r.throughput for r in _runs(results, arm, plan.key)]) for arm in scale.arms}
        p99 = {arm: median([r.p99 for r in _runs(results, arm, plan.key)]) for arm in scale.arms}
        where = plan.label
        rows += [
            (
                "throughput A/B2 (gpu-scheduler / kube-scheduler with its client limits raised)",
                where,
                _ratio(tp.get("A", math.nan), tp.get("B2", math.nan)),
                TARGETS["A/B2"],
            ),
            (
                "throughput A/L (gpu-scheduler / raw Binding, both while created)",
                where,
                _ratio(tp.get("A", math.nan), tp.get("L", math.nan)),
                TARGETS["A/L"],
            ),
            (
                "p99 create-to-bound A/B2 (lower is better)",
                where,
                _ratio(p99.get("A", math.nan), p99.get("B2", math.nan)),
                "",
            ),
            (
                "the gpu-scheduler's CPU per pod, A, ms (its process, /proc; not a ratio)",
                where,
                cpu_ms_per_pod(_runs(results, "A", plan.key)),
                TARGETS["cpu_ms"],
            ),
            (
                "kube-scheduler's (B2's) CPU per pod, ms (not a ratio)",
                where,
                cpu_ms_per_pod(_runs(results, "B2", plan.key), "kube-scheduler-tuned"),
                "",
            ),
        ]
    nodes, plans = scale.groups[0]
    pods = max(p.pods for p in plans)
    mem = results.memory
    for key, what in MEMORY_KEYS.items():
        if key in mem:
            rows.append(
                (
                    f"the gpu-scheduler's RSS, {what}, MiB (not a ratio)",
                    f"{nodes} nodes, {pods} pods",
                    mem[key],
                    "",
                )
            )
    if "ready_s" in results.startup:
        rows.append(
            (
                "the gpu-scheduler's start-up to ready (process start to /readyz 200: every watch "
                "listed and synced), s (not a ratio)",
                f"{nodes} nodes, {pods} pods present",
                results.startup["ready_s"],
                "",
            )
        )
    return rows
