"""The DRA phase in the report (bench/dra.py measures it): its ratio rows and its section of
docs/benchmarks.md."""

from __future__ import annotations

from bench.arms import Run
from bench.dra import DRA_ARM_NAMES, DRA_ARMS, DRA_SCHEDULER
from bench.drakt import DRA_KCM
from bench.stats import median, ms_spread, paired_ratio, spread
from bench.workload import Plan


def dra_ratios(runs: list[Run], plan: Plan, foreign: int) -> list[tuple[str, str, float, str]]:
    """The DRA phase's ratio rows: D/K and D/KT the median of the ratios within each repetition
    (the arms run back to back in each: bench.stats.paired_ratio), the others ratios of medians
    (DF runs after the other claims are made, not beside D)."""

    def med(arm: str, attr: str) -> float:
        values = [getattr(r, attr) for r in runs if r.arm == arm and r.plan == plan.key and r.rep >= 0]
        return median(values)

    def cpu(arm: str) -> float:
        """The DRA gpu-scheduler's CPU seconds per replica (its whole process)."""
        values = [
            r.cpu.get(DRA_SCHEDULER, 0.0) / r.pods
            for r in runs
            if r.arm == arm and r.plan == plan.key and r.rep >= 0 and r.cpu
        ]
        return median(values)

    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    where = f"{plan.label}, DRA"
    others = f"{foreign} other claims / none; lower is better"
    return [
        (
            "throughput D/K (DRA mode: claim controller, gate, kube-scheduler's allocation / "
            "kube-scheduler on the same claims made beforehand)",
            where,
            paired_ratio(runs, plan.key, "D", "K"),
            "",
        ),
        (
            "p99 create-to-bound D/K (lower is better)",
            where,
            paired_ratio(runs, plan.key, "D", "K", "p99"),
            "",
        ),
        (
            "throughput D/KT (DRA mode / a StatefulSet with a ResourceClaimTemplate: the resourceclaim "
            "controller makes the claims, kube-scheduler allocates, nothing pinned)",
            where,
            paired_ratio(runs, plan.key, "D", "KT"),
            ">= 0.9",
        ),
        (
            "p99 create-to-bound D/KT (lower is better)",
            where,
            paired_ratio(runs, plan.key, "D", "KT", "p99"),
            "",
        ),
        (
            f"throughput DF/D (DRA mode with {foreign} other allocated claims / without)",
            where,
            ratio(med("DF", "throughput"), med("D", "throughput")),
            "",
        ),
        (
            f"claim controller's CPU per replica key (its workers' thread time), DF/D ({others})",
            where,
            ratio(med("DF", "dra_key_cpu_ms"), med("D", "dra_key_cpu_ms")),
            "<= 1.2",
        ),
        (
            f"the DRA gpu-scheduler process's CPU per replica, DF/D ({others})",
            where,
            ratio(cpu("DF"), cpu("D")),
            "<= 1.2",
        ),
        (
            f"claim controller's wall time per replica key (its API writes' answers included), DF/D ({others})",
            where,
            ratio(med("DF", "dra_key_ms"), med("D", "dra_key_ms")),
            "",
        ),
        (
            "claim controller's keys per replica, D (not a ratio)",
            where,
            ratio(med("D", "dra_keys"), plan.pods),
            "",
        ),
        (
            "claim controller's CPU per replica key, D, ms (not a ratio)",
            where,
            med("D", "dra_key_cpu_ms"),
            "",
        ),
    ]


DRA_COMPONENTS = (
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    DRA_KCM,
    "kube-scheduler-tuned",
    "kwok",
    DRA_SCHEDULER,
    "bench client",
)


def cpu_per_pod(runs: list[Run]) -> dict[str, float]:
    """Each DRA process's CPU ms per pod, and the total, medians over ``runs`` ({} without CPU)."""
    rs = [r for r in runs if r.cpu]
    if not rs:
        return {}
    out = {c: median([1000 * r.cpu.get(c, 0.0) / r.pods for r in rs]) for c in DRA_COMPONENTS}
    out["total"] = median([1000 * sum(r.cpu.values()) / r.pods for r in rs])
    return out


def extra_cpu_line(d_runs: list[Run], kt_runs: list[Run]) -> str:
    """Where D's extra CPU goes: CPU ms per pod of each process, D against KT, largest gap first."""
    d, kt = cpu_per_pod(d_runs), cpu_per_pod(kt_runs)
    if not d or not kt:
        return "Where D's extra CPU goes: no D and KT runs with CPU readings."
    gaps = sorted(DRA_COMPONENTS, key=lambda c: -abs(d[c] - kt[c]))
    parts = [
        f"{c} {d[c] - kt[c]:+.1f} ({d[c]:.1f} against {kt[c]:.1f})" for c in gaps if abs(d[c] - kt[c]) >= 0.05
    ]
    return (
        f"**Where D's extra CPU goes** (ms per pod, D minus KT): all processes {d['total'] - kt['total']:+.1f} "
        f"({d['total']:.1f} against {kt['total']:.1f}); " + ", ".join(parts or ["no process differs"]) + "."
    )


def dra_section(runs: list[Run], plan: Plan, foreign: int, note: str = "") -> str:
    """The report's "DRA mode" section: the runs, and the CPU per pod of each process."""
    mine = {arm: [r for r in runs if r.arm == arm and r.plan == plan.key and r.rep >= 0] for arm in DRA_ARMS}
    if not any(mine.values()):
        return "No DRA runs in these results."
    lines = [
        "| arm | pods/s (min / median / max) | p50 ms | p99 ms | correct | controller keys per replica | "
        "controller ms per replica key, wall (mean; min / median / max) | controller CPU ms per replica key |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in DRA_ARMS:
        rs = mine[arm]
        ok = "yes" if rs and all(r.correct for r in rs) else "NO"
        mine_keys = arm in ("D", "DF")
        keys = spread([r.dra_keys / r.pods for r in rs], "{:.1f}") if mine_keys else "—"
        key_ms = spread([r.dra_key_ms for r in rs], "{:.2f}") if mine_keys else "—"
        key_cpu = spread([r.dra_key_cpu_ms for r in rs], "{:.2f}") if mine_keys else "—"
        lines.append(
            f"| {arm}: {DRA_ARM_NAMES[arm]} | {spread([r.throughput for r in rs])} | "
            f"{ms_spread([r.p50 for r in rs])} | {ms_spread([r.p99 for r in rs])} | {ok} | {keys} | "
            f"{key_ms} | {key_cpu} |"
        )
    cpu = ["| arm | " + " | ".join(DRA_COMPONENTS) + " | total |", "|---" * (len(DRA_COMPONENTS) + 2) + "|"]
    for arm in DRA_ARMS:
        per_arm = cpu_per_pod(mine[arm])
        if per_arm:
            cpu.append(
                f"| {arm} | " + " | ".join(f"{per_arm[c]:.1f}" for c in (*DRA_COMPONENTS, "total")) + " |"
            )
    return f"""{plan.label}, bare pods as the injection policy makes a mapped replica in DRA mode (the label
`gpu-scheduler.io/dra`, the scheduling gate, the claim `<pod>-gpus` in the pod and its container,
the required node affinity on the entry's node), every node publishing 8 GPUs in a ResourceSlice
as NVIDIA's driver would (localcluster/dra.py). kube-scheduler is arm B2's (client QPS 5000) for
every arm. D = a gpu-scheduler in DRA mode (its own process, started for this phase) makes each
claim and opens the gate, kube-scheduler allocates and binds; K = the same claims made
beforehand (untimed, no controller label), the same pods without the gate; DF = D with {foreign}
other claims allocated in the cluster ({note or "on other nodes' slices"}). Throughput and
latency as for the bind arms; after every run each pod is on its entry's node, its claim
allocated exactly the entry's devices, and no device allocated twice in the cluster. The
controller's keys, their time and the CPU its workers spent on them come from its own metrics
(`gpu_scheduler_dra_key_processing_seconds`, `gpu_scheduler_dra_key_cpu_seconds_total`), read
before and after each run: per replica it makes the claim, opens the gate, and looks again as
the claim and the pod change; the wall time includes its writes' round trips to a loaded
apiserver, the CPU time is its own work.

{chr(10).join(lines)}

KT = a StatefulSet per workload whose pod template asks for one GPU through a
ResourceClaimTemplate, as a team without gpu-scheduler asks: the StatefulSet and resourceclaim
controllers (a kube-controller-manager of their own for this phase, client QPS 5000 as B2's;
the control plane's own runs neither) make the replicas and their claims, kube-scheduler
allocates any free GPU and binds; the clock starts at the first StatefulSet's POST
(bench/drakt.py).

CPU per pod by process (ms, median over the repetitions):

{chr(10).join(cpu)}

{extra_cpu_line(mine["D"], mine["KT"])}"""
