"""What every phase of ``make bench`` shares: the run (bench/runner.py's ``Bench``) and the
phases it hands itself to (bench/tenancy.py, bench/dra.py) read the scale, the work folder, the
results record, the control plane and its raw client, and measure, name and record through it."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from bench.arms import Run, create_namespace
from bench.measure import cpu_seconds, settle
from bench.raw import Raw
from bench.scales import Results, Scale, log, machine
from localcluster.cluster import Cluster


class Harness:
    def __init__(self, scale: Scale, workdir: Path, command: str) -> None:
        self.scale = scale
        self.workdir = workdir
        self.results = Results(
            scale.name, command, datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), machine()
        )
        self.cluster: Cluster | None = None
        self.raw: Raw | None = None
        self._seq = 0

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of every component, and of this harness ("bench client")."""
        assert self.cluster is not None
        out = {name: cpu_seconds(proc.pid) for name, proc in self.cluster.procs.items()}
        times = os.times()
        out["bench client"] = times.user + times.system
        return out

    def settle(self) -> None:
        """Wait for the previous arm's tail (its deletions' watch events, Events, garbage
        collection) to die down: it is not the next arm's to pay for (bench.measure.settle)."""

        def control_plane() -> float:
            return sum(v for k, v in self.cpu().items() if k != "bench client")

        cap = self.scale.settle_cap
        waited, rate = settle(control_plane, window=min(1.0, cap), cap=cap)
        if waited >= cap > 1.0 and rate > 0.3:
            log(
                f"the control plane was still busy after {waited:.0f} s ({rate:.2f} cores): the arm starts anyway"
            )

    def namespace(self, prefix: str, labels: dict[str, str] | None = None) -> str:
        assert self.raw is not None
        self._seq += 1
        name = f"b-{prefix}-{self._seq}".lower()
        create_namespace(self.raw, name, labels)
        return name

    def record(self, run: Run, label: str) -> None:
        self.results.runs.append(run)
        status = "ok" if run.correct else "WRONG: " + "; ".join(run.problems[:3])
        log(
            f"{label} rep {run.rep}: {run.pods} pods in {run.seconds:.1f} s = {run.throughput:.1f}/s, "
            f"p50 {run.p50 * 1000:.0f} ms, p99 {run.p99 * 1000:.0f} ms, {status}"
        )
