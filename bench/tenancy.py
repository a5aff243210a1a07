"""Tenancy measured: arm A with tenancy on beside tenancy off, in the same run.

The tenancy phase of ``make bench`` (after the bind arms, on the same control plane and nodes):

1. the chart's GPUPinningPolicy CRD and grants ConfigMap (``tenancy.enabled``) are applied, and
   ``BACKGROUND`` policies that select nothing here (other teams' namespaces and pools: every
   (namespace, node) is resolved against them all);
2. a second gpu-scheduler starts with tenancy on (``GPU_SCHEDULER_TENANCY``, the chart's RBAC for
   it, its own scheduler name, ServiceAccount and Lease; it writes the policies' status and
   publishes the grants, as in production) beside the first, which has it off;
3. per repetition, per plan of the first node count, interleaved:

   * ``T0``: arm A on the gpu-scheduler with tenancy off;
   * ``T1``: arm A on the gpu-scheduler with tenancy on, a policy per workload: one policy that
     grants the run's namespace every node with ``maxGPUs`` exactly what its pods take, so every
     Binding is counted and checked under the ledger's lock and the last one reaches the limit.
     The policy is written before the pods are created and deleted after.

Both schedulers run the whole phase, so each watches the other's bound pods (the fit checks'
watch): the same load in both arms. Throughput, latency and the read-back as arm A's
(bench/arms.py). The ratio T1/T0 is reported with the target >= 0.95 (bench/ratios.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from bench.arms import Run, delete_pods, run_bind_arm
from bench.raw import ApiError
from bench.stats import median, paired_ratio
from bench.workload import Plan, bind_pods
from localcluster.rbac import render_chart, render_rbac, scheduler_chart_values
from localcluster.scheduler_host import run_scheduler

if TYPE_CHECKING:
    from bench.harness import Harness

TENANCY_ARMS = ("T0", "T1")
TENANCY_ARM_NAMES = {
    "T0": "gpu-scheduler, tenancy off (arm A)",
    "T1": "gpu-scheduler, tenancy on: a GPUPinningPolicy per workload (arm A)",
}
TENANCY_SCHEDULER = "gpu-scheduler-tenancy"
RELEASE = "gpu-scheduler-bench-tenancy"
POLICIES = "/apis/gpu-scheduler.io/v1alpha1/gpupinningpolicies"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
BACKGROUND = 20


def established(crd: dict[str, Any]) -> bool:
    """Whether a CustomResourceDefinition read from the apiserver is Established.

    A CRD just created has ``status.conditions: null`` until the apiserver's establishing
    controller has run (the field has no omitempty), so a missing or null list means "not yet".
    """
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def policy(name: str, namespaces: dict[str, Any], nodes: dict[str, Any], most: int) -> dict[str, Any]:
    return {
        "apiVersion": "gpu-scheduler.io/v1alpha1",
        "kind": "GPUPinningPolicy",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": namespaces, "nodeSelector": nodes, "maxGPUs": most},
    }


class TenancyBench:
    def __init__(self, bench: Harness, scheduler: str, system_ns: str) -> None:
        assert bench.raw is not None
        self.bench, self.raw = bench, bench.raw
        self.scale = bench.scale
        self.scheduler, self.system_ns = scheduler, system_ns  # the first gpu-scheduler's
        self.grants = f"{RELEASE}-grants"

    def start(self) -> None:
        cluster = self.bench.cluster
        assert cluster is not None
        values = {
            **scheduler_chart_values(TENANCY_SCHEDULER),
            "serviceAccount": {"name": TENANCY_SCHEDULER},
            "scheduler": {"name": TENANCY_SCHEDULER, "leaderElection": {"leaseName": TENANCY_SCHEDULER}},
            "tenancy": {"enabled": True},
        }
        docs = render_chart(cluster, RELEASE, self.system_ns, values)
        crd = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        grants = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == self.grants]
        cluster.apply([*crd, *grants])
        self._wait(
            lambda: established(self.raw.get(f"{CRDS}/{crd[0]['metadata']['name']}")),
            "the GPUPinningPolicy CRD established",
        )
        for i in range(BACKGROUND):
            body = policy(
                f"bench-team-{i}",
                {"matchLabels": {"bench.gpu-scheduler.io/team": f"t{i}"}},
                {"matchLabels": {"bench.gpu-scheduler.io/pool": f"p{i}"}},
                8,
            )
            self.raw.post(POLICIES, body, ok=(201, 409))
        objects = render_rbac(cluster, RELEASE, self.system_ns, "scheduler", values)
        cluster.apply(objects)
        proc = run_scheduler(
            cluster.service_account_kubeconfig(self.system_ns, TENANCY_SCHEDULER),
            env={
                "POD_NAME": "bench-tenancy",
                "POD_NAMESPACE": self.system_ns,
                "GPU_SCHEDULER_NAME": TENANCY_SCHEDULER,
                "GPU_SCHEDULER_LEASE_NAME": TENANCY_SCHEDULER,
                "GPU_SCHEDULER_TENANCY": "true",
                "GPU_SCHEDULER_TENANCY_GRANTS": f"{self.system_ns}/{self.grants}",
            },
            log_path=self.bench.workdir / "logs" / "gpu-scheduler-tenancy.log",
        )
        cluster.adopt(TENANCY_SCHEDULER, proc)

    def stop(self) -> None:
        cluster = self.bench.cluster
        assert cluster is not None
        proc = cluster.procs.pop(TENANCY_SCHEDULER, None)
        if proc is not None:
            proc.stop()
        for i in range(BACKGROUND):
            self.raw.delete(f"{POLICIES}/bench-team-{i}")

    def _wait(self, cond: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise ApiError(f"tenancy phase: {what} not seen within {timeout:.0f} s")
            time.sleep(0.1)

    def _granted(self, namespace: str) -> bool:
        data = self.raw.get(f"/api/v1/namespaces/{self.system_ns}/configmaps/{self.grants}").get("data") or {}
        return f"ns.{namespace}" in data

    def run_arm(self, arm: str, plan: Plan, rep: int) -> Run:
        on = arm == "T1"
        name = TENANCY_SCHEDULER if on else self.scheduler
        pods = bind_pods(plan, scheduler_name=name, pin=False)
        ns = self.bench.namespace(f"{arm}-{plan.key}")
        try:
            if on:  # its workload's policy, seen by the scheduler before its pods come
                self.raw.post(
                    POLICIES, policy(ns, {"matchLabels": {"kubernetes.io/metadata.name": ns}}, {}, len(pods))
                )
                self._wait(lambda: self._granted(ns), f"the grants of {ns}")
            run = run_bind_arm(
                self.raw,
                "A",
                plan.key,
                rep,
                pods,
                ns,
                create_threads=self.scale.create_threads,
                bind_threads=self.scale.bind_threads,
                timeout=self.scale.timeout,
                cpu=self.bench.cpu,
            )
        finally:
            delete_pods(self.raw, ns)
            if on:
                self.raw.delete(f"{POLICIES}/{ns}")
        run.arm = arm
        return run

    def run(self) -> None:
        self.start()
        try:
            plans = self.scale.groups[0][1]
            for rep in range(self.scale.feature_reps):
                for plan in plans:
                    for arm in TENANCY_ARMS if rep % 2 == 0 else tuple(reversed(TENANCY_ARMS)):
                        self.bench.record(
                            self.run_arm(arm, plan, rep), f"{plan.label} {arm} ({TENANCY_ARM_NAMES[arm]})"
                        )
        finally:
            self.stop()


def tenancy_ratios(runs: list[Run], plans: list[Plan]) -> list[tuple[str, str, float, str]]:
    """T1/T0 per plan: throughput (target >= 0.95), p99 (lower is better), the scheduler's CPU per pod."""

    def med(arm: str, plan: Plan, attr: str) -> float:
        return median([getattr(r, attr) for r in runs if r.arm == arm and r.plan == plan.key and r.rep >= 0])

    def cpu(arm: str, plan: Plan, process: str) -> float:
        return median(
            [
                r.cpu.get(process, 0.0) / r.pods
                for r in runs
                if r.arm == arm and r.plan == plan.key and r.rep >= 0 and r.cpu
            ]
        )

    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    rows = []
    for plan in plans:
        if not any(r.arm == "T1" and r.plan == plan.key for r in runs):
            continue
        rows += [
            (
                "throughput T1/T0 (gpu-scheduler with tenancy on, a policy per workload / off; the "
                "median of the ratios within each repetition)",
                plan.label,
                paired_ratio(runs, plan.key, "T1", "T0"),
                ">= 0.95",
            ),
            ("p99 create-to-bound T1/T0 (lower is better)", plan.label, ratio(med("T1", plan, "p99"), med("T0", plan, "p99")), ""),
            (
                "the placing gpu-scheduler's CPU per pod, T1/T0 (lower is better)",
                plan.label,
                ratio(cpu("T1", plan, TENANCY_SCHEDULER), cpu("T0", plan, "gpu-scheduler")),
                "",
            ),
        ]  # fmt: skip
    return rows


def tenancy_section(runs: list[Run], plans: list[Plan]) -> str:
    """The phase's runs for docs/benchmarks.md."""
    lines = [
        "| plan | arm | runs | pods/s (median) | p50 ms | p99 ms | the placing scheduler's CPU ms/pod |",
        "|---|---|---|---|---|---|---|",
    ]
    for plan in plans:
        for arm in TENANCY_ARMS:
            rs = [r for r in runs if r.arm == arm and r.plan == plan.key and r.rep >= 0]
            if not rs:
                continue
            process = TENANCY_SCHEDULER if arm == "T1" else "gpu-scheduler"
            cpu = median([1000 * r.cpu.get(process, 0.0) / r.pods for r in rs if r.cpu])
            lines.append(
                f"| {plan.label} | {arm}: {TENANCY_ARM_NAMES[arm]} | {len(rs)} | "
                f"{median([r.throughput for r in rs]):.1f} | {1000 * median([r.p50 for r in rs]):.0f} | "
                f"{1000 * median([r.p99 for r in rs]):.0f} | {cpu:.2f} |"
            )
    return "\n".join(lines) if len(lines) > 2 else "The tenancy phase did not run."
