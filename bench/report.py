"""docs/benchmarks.md and its plot, from one run's results (the ratios: bench/ratios.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.apiserver import apiserver_section
from bench.arms import ARM_NAMES, INJECTION_NAMES, INJECTIONS, Run
from bench.drareport import dra_ratios, dra_section
from bench.huge import huge_ratios
from bench.ratios import print_ratios, ratio_table, ratios, runs_of
from bench.scales import Results, Scale
from bench.stats import median, ms_spread, spread
from bench.tenancy import tenancy_section
from localcluster.toolcache import versions


def bind_table(results: Results, scale: Scale) -> str:
    lines = [
        "| plan | arm | pods/s (min / median / max) | p50 ms (min / median / max) | p99 ms (min / median / max) | correct | last create → all bound, s |",
        "|---|---|---|---|---|---|---|",
    ]
    for plan in scale.plans:
        for arm in scale.arms:
            runs = runs_of(results, arm, plan.key)
            lag = spread([r.end_lag for r in runs], "{:.2f}") if arm not in ("C", "E") else "—"
            lines.append(_runs_row(f"{plan.label} | {arm}: {ARM_NAMES[arm]}", runs) + f" {lag} |")
    return "\n".join(lines)


def _runs_row(first: str, runs: list[Run]) -> str:
    """A table row: ``first`` cells, then rate spread, p50, p99 and whether every run was correct."""
    ok = "yes" if runs and all(r.correct for r in runs) else "NO"
    return (
        f"| {first} | {spread([r.throughput for r in runs])} | {ms_spread([r.p50 for r in runs])} | "
        f"{ms_spread([r.p99 for r in runs])} | {ok} |"
    )


def webhook_table(results: Results, scale: Scale) -> str:
    lines = [
        "| map entries | injection | creates/s (min / median / max) | POST p50 ms | POST p99 ms | correct |",
        "|---|---|---|---|---|---|",
    ]
    for entries in scale.webhook_maps:
        for arm, label in CREATE_ARMS:
            lines.append(_runs_row(f"{entries} | {label}", runs_of(results, arm, f"map{entries}")))
    return "\n".join(lines)


def memory_table(results: Results, scale: Scale) -> str:
    mem = results.memory
    own = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in mem.items() if k.startswith("scheduler_own_"))
    lines = ["| process | state | RSS MiB |", "|---|---|---|"]
    lines.append(
        f"| gpu-scheduler | idle ({scale.groups[0][0]} nodes) | {mem.get('scheduler_idle', 0):.1f} |"
    )
    lines.append(
        f"| gpu-scheduler | {results.memory_notes.get('foreign', 'foreign pods')} | {mem.get('scheduler_foreign', 0):.1f} |"
    )
    for pods, value in own:
        lines.append(f"| gpu-scheduler | {pods} of its own pods bound (peak over the A runs) | {value:.1f} |")
    lines.append(
        f"| gpu-scheduler-webhook (gunicorn master + worker) | idle | {mem.get('webhook_idle', 0):.1f} |"
    )
    lines.append(
        f"| gpu-scheduler-webhook (gunicorn master + worker) | after the create arms | {mem.get('webhook_after', 0):.1f} |"
    )
    text = "\n".join(lines)
    if own and mem.get("scheduler_idle"):
        pods, value = own[-1]
        per_pod = (value - mem["scheduler_idle"]) * 1024 / pods
        text += (
            f"\n\nPer own pod: ({value:.1f} - {mem['scheduler_idle']:.1f}) MiB / {pods} = **{per_pod:.1f} KiB**"
            " (the watch cache holds each pod's object, managedFields dropped; the map text is one copy shared by every pod that carries it)."
        )
    if scale.name != "full":
        text += f"\n\nAt this scale the largest own-pod count is {own[-1][0] if own else 0}, not 3,000 (`BENCH_SCALE=full`)."
    return text


# The hand-written part of docs/benchmarks.md: before and after, and what limits it now.
STORY = Path(__file__).with_name("story.md")
# The create arms as the report labels them: (arm, what injects).
CREATE_ARMS = tuple((arm, INJECTION_NAMES[arm]) for arm in INJECTIONS.values())

COMPONENTS = (
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-scheduler-tuned",
    "kwok",
    "gpu-scheduler",
    "gpu-scheduler-webhook",
    "bench client",
)


def cpu_table(results: Results, scale: Scale) -> str:
    """CPU milliseconds per pod of every component during the timed part, medians over repetitions."""
    head = "| plan | arm | " + " | ".join(COMPONENTS) + " | total |"
    lines = [head, "|---" * (len(COMPONENTS) + 3) + "|"]
    rows: list[tuple[str, str, list[Run]]] = [
        (plan.label, f"{arm}: {ARM_NAMES[arm]}", runs_of(results, arm, plan.key))
        for plan in scale.plans
        for arm in scale.arms
    ]
    rows += [
        (f"{scale.webhook_pods} creates, map of {e}", label, runs_of(results, arm, f"map{e}"))
        for e in scale.webhook_maps
        for arm, label in CREATE_ARMS
    ]
    for where, arm_label, runs in rows:
        if not runs or not runs[0].cpu:
            continue
        per = [median([1000 * r.cpu.get(c, 0.0) / r.pods for r in runs]) for c in COMPONENTS]
        total = median([1000 * sum(r.cpu.values()) / r.pods for r in runs])
        lines.append(
            f"| {where} | {arm_label} | " + " | ".join(f"{v:.1f}" for v in per) + f" | {total:.1f} |"
        )
    return "\n".join(lines)


def profile_section(results: Results) -> str:
    prof = results.profile
    if not prof:
        return "No profile was taken."
    if prof.get("error") and not prof.get("samples"):
        return f"py-spy could not profile the scheduler: `{prof['error']}`"
    run = prof.get("run") or {}
    total = prof["samples"] or 1
    out = [
        f"One extra gpu-scheduler run ({prof['plan']}: {run.get('throughput', 0):.1f} pods/s under the sampler) "
        f"was sampled with `{prof['tool']}` on the scheduler's PID: {prof['samples']} samples of running "
        f"threads (100 samples = 1 s of one thread; {prof.get('waiting', 0)} samples of threads blocked in a "
        "lock, a TLS read or a poll are left out: a blocked thread costs no CPU). Raw stacks: "
        f"`{Path(prof.get('raw_file', '')).name}` in the run's work directory.",
        "",
        "Self samples by area (the leaf frame's package; `scheduler/…` and `kube_gpu_scheduler/kube/…` are the project's own code):",
        "",
        "| area | samples | share |",
        "|---|---|---|",
    ]
    out += [f"| {area} | {n} | {100 * n / total:.0f}% |" for area, n in prof["areas"]]
    out += ["", "Top functions by self samples:", "", "| function | samples | share |", "|---|---|---|"]
    out += [f"| `{fn}` | {n} | {100 * n / total:.0f}% |" for fn, n in prof["self"]]
    out += [
        "",
        "Top functions by inclusive samples (the function and what it calls):",
        "",
        "| function | samples | share |",
        "|---|---|---|",
    ]
    out += [f"| `{fn}` | {n} | {100 * n / total:.0f}% |" for fn, n in prof["inclusive"]]
    return "\n".join(out)


def plot(results: Results, scale: Scale, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plans = scale.plans
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    width = 0.8 / len(scale.arms)
    for i, arm in enumerate(scale.arms):
        xs = [j + (i - (len(scale.arms) - 1) / 2) * width for j in range(len(plans))]
        for ax, metric in ((axes[0], "throughput"), (axes[1], "p99")):
            meds, lows, highs = [], [], []
            for plan in plans:
                vals = [
                    getattr(r, metric) * (1000 if metric == "p99" else 1)
                    for r in runs_of(results, arm, plan.key)
                ]
                m = median(vals)
                meds.append(m)
                lows.append(m - min(vals) if vals else 0)
                highs.append(max(vals) - m if vals else 0)
            ax.bar(xs, meds, width, yerr=[lows, highs], capsize=2, label=f"{arm}: {ARM_NAMES[arm]}")
    labels = [p.label.replace(", ", "\n") for p in plans]
    for ax, title, ylabel in (
        (axes[0], "bind throughput (median, min-max)", "pods/s"),
        (axes[1], "p99 create-to-bound (C: Binding-to-bound)", "ms"),
    ):
        ax.set_xticks(range(len(plans)), labels, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
    axes[0].legend(fontsize=7)
    maps = scale.webhook_maps
    for i, (arm, label) in enumerate(CREATE_ARMS):
        meds = [median([r.throughput for r in runs_of(results, arm, f"map{e}")]) for e in maps]
        axes[2].bar([j + (i - 1) * 0.28 for j in range(len(maps))], meds, 0.28, label=label)
    axes[2].set_xticks(range(len(maps)), [f"map of {e}" for e in maps])
    axes[2].set_title(f"pod creates ({scale.webhook_pods} pods, median)")
    axes[2].set_ylabel("pods/s")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"make bench, BENCH_SCALE={scale.name}, {results.started}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_doc(results: Results, scale: Scale, doc: Path, png: Path) -> None:
    m = results.machine
    v = versions()
    rows = ratios(results, scale)
    wrong = [r for r in results.runs if not r.correct]
    correctness = (
        "Every run passed its correctness check."
        if not wrong
        else "**Correctness failures:** "
        + "; ".join(f"{r.arm} {r.plan} rep {r.rep}: {r.problems[0]}" for r in wrong)
    )
    resumed = sum(r.watch_resumed for r in results.runs)
    if resumed:
        correctness += (
            f" The apiserver ended the harness's pod watch {resumed} time(s) during the runs"
            ' ("Forcing pods watcher close due to unresponsiveness": a consumer too slow for its'
            " buffer on these saturated cores); each time it was resumed from the last"
            " resourceVersion, so no event was missed."
        )
    text = f"""# Benchmarks

Written by `make bench` ({results.started}); do not edit by hand, run it again.
How the harness works and what each ratio means: README, "Tests and benchmarks", and the
docstrings of `bench/`. At 5,000 nodes and 15,000 pods (`make bench BENCH_SCALE=huge`, by hand
only): docs/benchmarks-huge.md.

- Command: `{results.command}`
- Scale: `BENCH_SCALE={scale.name}`; {scale.reps} repetition(s) ({scale.feature_reps} of the arms that price a feature, A, AO and G, T0 and T1, and of B2 beside them for A/B2 paired within each; {max(scale.reps, scale.dra_reps)} of D and KT for D/KT paired within each), arms interleaved, each bind and DRA arm starting once the control plane's CPU has settled after the last (at most {scale.settle_cap:.0f} s); creator {scale.create_threads} threads, raw binder {scale.bind_threads} threads; the whole run took {results.duration_s / 60:.1f} min.
- Machine: {m["nproc"]} CPUs ({m["cpu"]}), {m["memory_gib"]} GiB memory, Linux {m["kernel"]}, Python {m["python"]}.
- Load average (1, 5, 15 min) at the start: {m["load_start"]}; at the end: {results.load_end}. Everything (etcd,
  kube-apiserver, controller-manager, kube-scheduler, kwok, the gpu-scheduler, the webhook and the harness) shares these CPUs.
- Control plane: kube-apiserver {v.get("KUBERNETES_VERSION")}, etcd {v.get("ETCD_VERSION")}, kwok {v.get("KWOK_VERSION")}; kwok nodes with 8 GPUs each.

## Ratios

{ratio_table(rows)}

A = gpu-scheduler placing pods while they are created, E = the gpu-scheduler on pods created
beforehand (its Lease is held by the harness during the creation, then given back; the clock
starts when it leads again), B = the control plane's kube-scheduler on the same pods pinned by a
required node affinity (`matchFields metadata.name In [node]`), its client at the default 50
QPS / burst 100, B2 = a second kube-scheduler (profile `tuned-kube-scheduler`) on the same
pinned pods with its client's QPS 5000 and burst 10000, as a team that tunes for scheduling
speed runs it, C = a bare client POSTing
Bindings for pods created beforehand (the apiserver's ceiling), L = the same binder reacting to
the watch while the pods are created (the ceiling for anything that, like A and B, competes with
the creator). Like is compared with like: E with C (existing pods), A with L (while created).
A/C is shown too, but A's clock includes the creation of its pods and C's does not.

{correctness}

![throughput and latency per arm and scale]({png.name})

## Bind arms

Bare pods (no StatefulSet: the controller's own pace stays out of the numbers), each carrying its
workload's whole map and the variables the webhook would inject, created by {scale.create_threads}
threads for every arm. A plan of P pods on N nodes with R per node is cut into workloads of at
most N*R replicas (replica k of workload w on node k//R+1 with GPU w*R + k%R), so every pod's map
has min(P, N*R) entries (at 100 nodes and 500 pods: 100 entries at 1/node, 500 at 5/node). Throughput: pods / (first create sent .. last pod seen bound on a pod
watch). Latency: per pod, the watch's arrival time of "bound" minus that of "created" (C: minus
the time its Binding was sent). After every run the pods are read back: each on its mapped node
with its mapped GPU, and no node:GPU held twice among all the benchmark's pods.

{bind_table(results, scale)}

## Tenancy: on against off

Arm A twice, interleaved: on the gpu-scheduler with tenancy off (T0) and on a second one with
tenancy on (T1: a GPUPinningPolicy per workload granting its namespace every node with
`maxGPUs` exactly what its pods take, beside other teams' policies that match nothing here; it
writes the policies' status and publishes the grants as in production). Both run the whole
phase. bench/tenancy.py.

{tenancy_section(results.runs, list(scale.groups[0][1]))}

## Injection: the webhook, the admission policies, nothing

{scale.webhook_pods} pods with one map per row (ordinals cycling over the map), created by
{scale.create_threads} threads into a namespace that the MutatingWebhookConfiguration matches
(the webhook), that the chart's own MutatingAdmissionPolicy and map ValidatingAdmissionPolicies
match (`injection.mode: policy`, as helm renders gpu-scheduler-chart), or that nothing
matches (no mutation). The pods are posted as the StatefulSet controller posts them (its
ServiceAccount, impersonated, for every arm): the map policy leaves the full check of the map to
the StatefulSet's own admission for the pods that controller creates. The pods name a scheduler
nobody serves, so nothing binds them. Creates/s: pods / (first POST sent .. last answer). After
each run every pod is read back: injected (webhook or policies) each carries
`CUDA_VISIBLE_DEVICES` of its entry, without injection none.

{webhook_table(results, scale)}

## What the apiserver spends

kube-apiserver's CPU time (utime + stime from `/proc/PID/stat`) per mapped pod create and per
StatefulSet apply, with one release of gpu-scheduler-chart installed in policy mode (its
admission policies as helm renders them, default namespace selector), then with three side by
side (three scheduler names). The unmutated arms send the same objects for a scheduler no release
serves (every release's matchConditions still run, and its trust policy, which looks at every pod
carrying the map); the policy arms for the first release's. Pods are posted by
{scale.create_threads} threads as the StatefulSet controller posts them; StatefulSets are applied
one at a time (server-side apply; no StatefulSet controller runs, so no pod follows). Before each
map size's arms the apiserver's idle rate is measured for 1.5 s and that rate times a run's seconds
is taken out of its CPU. Maps of {", ".join(str(e) for e in scale.apiserver.maps)} entries
({", ".join(str(n) for n in scale.apiserver.pods)} pods and {", ".join(str(n) for n in scale.apiserver.applies)}
StatefulSets per run; {scale.apiserver.reps} repetitions, {scale.apiserver.big_reps} of the largest), and with
three releases a StatefulSet with a {scale.apiserver.largest_kib} KiB map ({scale.apiserver.largest_applies}
apply per run, {scale.apiserver.big_reps} repetition(s)): a 504 is the apiserver's fixed 34 s
create deadline, counted and never retried. bench/apiserver.py.

{apiserver_section(results.runs, scale.apiserver)}

## DRA mode

{dra_section(results.runs, scale.dra_plan, scale.dra_foreign, results.memory_notes.get("dra_foreign", ""))}

## Memory (VmRSS)

{memory_table(results, scale)}

## Where the time goes

### CPU per pod, by process

CPU time (utime + stime from `/proc/PID/stat`, children included) each process spent during the
timed part of a run, divided by the pods of the run, in milliseconds (median over the repetitions).
On 2 cores, the sum is what bounds the throughput: 2,000 ms of CPU per second are to be shared.

{cpu_table(results, scale)}

### The scheduler's own profile

{profile_section(results)}

{STORY.read_text().strip()}
"""
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    plot(results, scale, png)


def write_huge_doc(results: Results, scale: Scale, doc: Path) -> None:
    """docs/benchmarks-huge.md: the huge scale's ratios, bind arms, memory, start-up and CPU."""
    m = results.machine
    v = versions()
    wrong = [r for r in results.runs if not r.correct]
    correctness = (
        "Every run passed its correctness check (each pod on its mapped node with its GPU, no "
        "node:GPU held twice)."
        if not wrong
        else "**Correctness failures:** "
        + "; ".join(f"{r.arm} {r.plan} rep {r.rep}: {r.problems[0]}" for r in wrong)
    )
    nodes = scale.groups[0][0]
    text = f"""# Benchmarks at {nodes:,} nodes

Written by `make bench BENCH_SCALE=huge` ({results.started}); do not edit by hand, run it again.
What the arms are: [benchmarks.md](benchmarks.md); this scale: `bench/huge.py`.

- Command: `{results.command}`
- Scale: `BENCH_SCALE=huge`, {nodes} kwok nodes with 8 GPUs each, their Leases {scale.node_lease_s} s
  (renewed every {scale.node_lease_s // 4} s; the node lifecycle controller's grace period as long);
  {scale.reps} repetition(s), arms {", ".join(scale.arms)} interleaved; creator {scale.create_threads} threads,
  raw binder {scale.bind_threads} threads; the whole run took {results.duration_s / 60:.1f} min.
- Machine: {m["nproc"]} CPUs ({m["cpu"]}), {m["memory_gib"]} GiB memory, Linux {m["kernel"]}, Python {m["python"]}.
- Load average (1, 5, 15 min) at the start: {m["load_start"]}; at the end: {results.load_end}.
- Control plane: kube-apiserver {v.get("KUBERNETES_VERSION")}, etcd {v.get("ETCD_VERSION")}, kwok {v.get("KWOK_VERSION")}.

## Ratios, memory and start-up

{ratio_table(huge_ratios(results, scale))}

{correctness}

## Bind arms

{bind_table(results, scale)}

## CPU per pod, by process

{cpu_table(results, scale)}
"""
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def write_dra_doc(results: Results, scale: Scale, doc: Path) -> list[tuple[str, str, float, str]]:
    """docs/benchmarks-dra.md (``BENCH_SCALE=dra``): the DRA phase alone at its plan's nodes."""
    m = results.machine
    v = versions()
    plan = scale.dra_plan
    rows = dra_ratios(results.runs, plan, scale.dra_foreign)
    wrong = [r for r in results.runs if not r.correct]
    correctness = (
        "Every run passed its correctness check."
        if not wrong
        else "**Correctness failures:** "
        + "; ".join(f"{r.arm} {r.plan} rep {r.rep}: {r.problems[0]}" for r in wrong)
    )
    text = f"""# Benchmarks: DRA mode at {plan.nodes:,} nodes

Written by `make bench BENCH_SCALE=dra` ({results.started}); do not edit by hand, run it again.
The same DRA phase as [benchmarks.md](benchmarks.md)'s (its arms are explained there and below;
`bench/dra.py`, `bench/drakt.py`), alone: no bind arm or other phase runs before it.

- Command: `{results.command}`
- Scale: `BENCH_SCALE=dra`, {plan.nodes} kwok nodes with 8 GPUs each; {max(scale.reps, scale.dra_reps)}
  repetitions of D and KT (D/KT paired within each), {scale.reps} of K and DF, arms interleaved, each
  starting once the control plane's CPU has settled after the last (at most {scale.settle_cap:.0f} s);
  the whole run took {results.duration_s / 60:.1f} min.
- Machine: {m["nproc"]} CPUs ({m["cpu"]}), {m["memory_gib"]} GiB memory, Linux {m["kernel"]}, Python {m["python"]}.
- Load average (1, 5, 15 min) at the start: {m["load_start"]}; at the end: {results.load_end}.
- Control plane: kube-apiserver {v.get("KUBERNETES_VERSION")}, etcd {v.get("ETCD_VERSION")}, kwok {v.get("KWOK_VERSION")}.

## Ratios

{ratio_table(rows)}

{correctness}

## DRA mode

{dra_section(results.runs, plan, scale.dra_foreign, results.memory_notes.get("dra_foreign", ""))}
"""
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return rows


def report(results: Results, scale: Scale, doc: Path) -> list[tuple[str, str, float, str]]:
    if scale.phases == ("dra",) and not scale.arms:
        rows = write_dra_doc(results, scale, doc)
        print_ratios(rows)
        return rows
    if "startup" in scale.phases:
        rows = huge_ratios(results, scale)
        write_huge_doc(results, scale, doc)
        print_ratios(rows)
        return rows
    rows = ratios(results, scale)
    write_doc(results, scale, doc, doc.with_suffix(".png"))
    print_ratios(rows)
    return rows


__all__: list[Any] = ["report"]
