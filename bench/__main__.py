"""``python -m bench`` (``make bench``): see bench/runner.py for what runs, in which order.

Environment:

* ``BENCH_SCALE``: ``default`` (100 nodes, 500 pods; about 37 minutes on 2 cores),
  ``full`` (adds 1,000 nodes, 500 and 3,000 pods), ``smoke`` (10 nodes, 20 pods,
  one repetition: what ``make test`` runs), ``huge`` (5,000 nodes, 15,000 pods, arms A, B2
  and L, the gpu-scheduler's memory and start-up: bench/huge.py; by hand only) or ``dra``
  (the DRA phase alone at 1,000 nodes and 1,000 replicas, D/KT there; by hand only);
* ``BENCH_HUGE_NODES``: the huge scale's node count (default 5,000; three pods per node), e.g.
  50 for a quick run of the same code path;
* ``BENCH_DOC``: where to write the report (default docs/benchmarks.md, docs/benchmarks-huge.md
  at the huge scale, docs/benchmarks-dra.md at the dra scale; the plot beside the first);
* ``BENCH_REPS``: repetitions per arm, overriding the scale's (default 3, and 9 for the arms
  that price a feature, A, AO and G, T0 and T1; smoke 1; ``python -m bench.pairs`` runs more
  pairs of A, AO and G alone);
* ``BENCH_WORKDIR``: the control plane, logs, results.json and the profile
  (default .cluster/bench).

``python -m bench --report-only`` writes the report again from the work directory's
results.json (no measurement), e.g. after a change to bench/report.py.

Exit status 1 when a correctness check failed (a pod off its mapped node, a GPU held twice,
a webhook run without its variables); timings never change the exit status.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.report import report
from bench.runner import REPO, Bench
from bench.scales import SCALES, Results, Scale, huge, log, repetitions_of

# Settings that change what a run measures or where it writes: the report's command names them.
OVERRIDES = ("BENCH_REPS", "BENCH_DOC", "BENCH_WORKDIR", "BENCH_HUGE_NODES")
# Where each scale writes its report unless BENCH_DOC says otherwise (under docs/).
DOCS = {"huge": "benchmarks-huge.md", "dra": "benchmarks-dra.md"}


def exact_command(environ: Mapping[str, str], scale: str, args: Sequence[str]) -> str:
    """The command to type to run this again: the make target (``BENCH_COMMAND``, set by
    mk/bench.mk) or ``python -m bench``, after every override in the environment."""
    base = environ.get("BENCH_COMMAND") or shlex.join(
        [f"BENCH_SCALE={scale}", "python", "-m", "bench", *args]
    )
    set_here = [f"{key}={shlex.quote(environ[key])}" for key in OVERRIDES if environ.get(key, "").strip()]
    return " ".join([*set_here, base])


def scale_of(name: str, environ: Mapping[str, str]) -> Scale:
    """The scale named ``name``; the huge one at ``BENCH_HUGE_NODES`` nodes when that is set."""
    nodes = environ.get("BENCH_HUGE_NODES", "").strip()
    if name != "huge" or not nodes:
        return SCALES[name]
    if not nodes.isdigit() or int(nodes) < 1:
        raise ValueError(f"BENCH_HUGE_NODES={nodes!r}: a whole number >= 1")
    return huge(int(nodes))


def main() -> int:
    args = sys.argv[1:]
    if args in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if args not in ([], ["--report-only"]):
        print(
            f"python -m bench: unknown arguments {shlex.join(args)} (only --report-only; see --help)",
            file=sys.stderr,
        )
        return 2
    name = os.environ.get("BENCH_SCALE", "default").strip() or "default"
    if name not in SCALES:
        print(f"BENCH_SCALE={name!r}: choose one of {', '.join(SCALES)}", file=sys.stderr)
        return 2
    try:
        scale = scale_of(name, os.environ)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    default_doc = DOCS.get(name, "benchmarks.md")
    doc = Path(os.environ.get("BENCH_DOC") or REPO / "docs" / default_doc).resolve()
    workdir = Path(os.environ.get("BENCH_WORKDIR") or REPO / ".cluster" / "bench").resolve()
    command = exact_command(os.environ, name, sys.argv[1:])
    if sys.argv[1:] == ["--report-only"]:
        results = Results.from_json((workdir / "results.json").read_text())
        scale = scale_of(results.scale, os.environ)
        if results.scale == "huge":  # at the node count it ran at ("n<nodes>-..." plan keys)
            scale = huge(int(results.runs[0].plan.split("-")[0][1:])) if results.runs else scale
        if not os.environ.get("BENCH_DOC"):
            doc = (REPO / "docs" / DOCS.get(results.scale, "benchmarks.md")).resolve()
        scale = repetitions_of(scale, results.runs)
        report(results, scale, doc)
        return 0
    reps = os.environ.get("BENCH_REPS", "").strip()
    if reps:
        if not reps.isdigit() or int(reps) < 1:
            print(f"BENCH_REPS={reps!r}: a whole number >= 1", file=sys.stderr)
            return 2
        scale = dataclasses.replace(scale, reps=int(reps), paired_reps=int(reps), dra_reps=int(reps))
    results = Bench(scale, workdir, command).run()
    report(results, scale, doc)
    wrong = [r for r in results.runs if not r.correct]
    plotted = "startup" not in scale.phases and scale.arms
    written = f"{doc} and {doc.with_suffix('.png')}" if plotted else doc
    log(f"wrote {written}; results in {workdir / 'results.json'}")
    if wrong:
        for r in wrong:
            log(f"INCORRECT {r.arm} {r.plan} rep {r.rep}: {'; '.join(r.problems[:5])}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
