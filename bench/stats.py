"""The statistics of the repetitions every report section reads (bench/ratios.py, the phases'
sections in bench/tenancy.py and bench/drareport.py, bench/report.py): medians, the
min / median / max spreads of the tables, the ratio within each repetition."""

from __future__ import annotations

import statistics

from bench.arms import Run


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "—"
    return f"{fmt.format(min(values))} / {fmt.format(median(values))} / {fmt.format(max(values))}"


def ms_spread(values: list[float]) -> str:
    return spread([v * 1000 for v in values], "{:.0f}")


def paired_ratio(runs: list[Run], plan: str, x: str, y: str, attr: str = "throughput") -> float:
    """The median over the repetitions of x/y within each: the price of a feature, where both
    arms run back to back in every repetition. The control plane's pace drifts between
    repetitions (arm A alone went from 61 to 45 pods/s between two of them in one run), and a
    ratio of the arms' own medians can pair a fast repetition with a slow one; the ratio within
    each repetition cancels the drift."""
    of = {
        arm: {r.rep: float(getattr(r, attr)) for r in runs if r.arm == arm and r.plan == plan and r.rep >= 0}
        for arm in (x, y)
    }
    return median([of[x][rep] / of[y][rep] for rep in sorted(of[x]) if of[y].get(rep)])
