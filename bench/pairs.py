"""``python -m bench.pairs [REPS] [PLAN]``: the price of gangs alone, with more pairs than
``make bench`` runs (docs/benchmarks.md).

Arms A, AO and G (bench/gang.py) back to back, ``REPS`` repetitions (default 25) of one plan of
the default scale (``1/node`` or ``5/node``, default ``5/node``), their order rotated; it prints
each repetition and the median, mean and standard deviation of the ratios within a repetition:
throughput G/AO and G/A, and CPU per pod G/AO (every process, and the gpu-scheduler alone).
On the shared 2-core machines single pairs of G/AO range from 0.7 to 1.4, so the median of
``make bench``'s 9 moves by about 0.05 between runs; 25 pairs take about 20 minutes.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

from bench.arms import PAIRED, Run
from bench.runner import REPO, Bench
from bench.scales import SCALES

RATIOS = ("throughput G/AO", "throughput G/A", "CPU per pod G/AO", "gpu-scheduler CPU per pod G/AO")


def ratios(runs: dict[str, Run]) -> tuple[float, ...]:
    """One repetition's ratios (RATIOS) from its runs of A, AO and G."""
    tp = {arm: r.throughput for arm, r in runs.items()}
    every = {arm: sum(r.cpu.values()) / r.pods for arm, r in runs.items()}
    own = {arm: r.cpu.get("gpu-scheduler", 0.0) / r.pods for arm, r in runs.items()}
    return (tp["G"] / tp["AO"], tp["G"] / tp["A"], every["G"] / every["AO"], own["G"] / own["AO"])


def summary(rows: list[tuple[float, ...]]) -> list[str]:
    out = []
    for i, name in enumerate(RATIOS):
        values = [row[i] for row in rows]
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        out.append(
            f"{name}: median {statistics.median(values):.3f}, mean {statistics.mean(values):.3f}, "
            f"sd {sd:.3f} ({len(values)} repetitions)"
        )
    return out


def main(argv: list[str]) -> int:
    reps = int(argv[0]) if argv else 25
    which = argv[1] if len(argv) > 1 else "5/node"
    scale = dataclasses.replace(SCALES["default"], reps=reps)
    plans = [p for p in scale.groups[0][1] if p.label.endswith(which)]
    if reps < 1 or not plans:
        print("usage: python -m bench.pairs [REPS >= 1] [1/node | 5/node]", file=sys.stderr)
        return 2
    bench = Bench(scale, REPO / ".cluster" / "bench-pairs", "python -m bench.pairs")
    rows = []
    try:
        bench.start()
        for rep in range(reps):
            order = PAIRED[rep % len(PAIRED) :] + PAIRED[: rep % len(PAIRED)]
            runs = {arm: bench.bind_run(arm, plans[0], rep) for arm in order}
            wrong = [f"{arm}: {r.problems[:3]}" for arm, r in runs.items() if not r.correct]
            if wrong:
                print(f"repetition {rep}: INCORRECT {wrong}", file=sys.stderr)
                return 1
            rows.append(ratios(runs))
            shown = ", ".join(f"{n} {v:.2f}" for n, v in zip(RATIOS, rows[-1], strict=True))
            print(f"repetition {rep} ({' '.join(order)}): {shown}", flush=True)
    finally:
        bench.stop()
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
