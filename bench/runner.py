"""The whole benchmark: start the control plane, run every arm interleaved, measure memory, profile.

Order (each step on the same control plane, so the ratios compare like with like):

1. the control plane with the first node count (kwok nodes, 8 GPUs each, created in bulk);
2. the gpu-scheduler (host process, least-privilege ServiceAccount, the production
   settings) and its RSS idle, then with ``foreign`` pods of another scheduler;
3. the webhook (``gpu-scheduler-webhook`` on 127.0.0.1, TLS) and its RSS idle;
4. per node count, per repetition, per plan: the bind arms in a rotating order
   (A B C L, then B C L A, ...); after each run the placement is read back and checked,
   then its pods are deleted;
5. the webhook create arms (without / with, maps of several sizes), interleaved likewise;
   then what kube-apiserver spends per mapped pod create and per StatefulSet apply, with 1 and
   3 releases of the chart installed in policy mode (bench/apiserver.py);
6. DRA mode against kube-scheduler on claims made beforehand and against StatefulSets with a
   ResourceClaimTemplate (bench/dra.py, bench/drakt.py: its own gpu-scheduler in DRA mode and a
   kube-controller-manager with the StatefulSet and resourceclaim controllers, started for that
   phase only); tenancy on against off, arm A each (bench/tenancy.py: a second gpu-scheduler with
   tenancy on, started for that phase only);
7. one more scheduler run of the largest plan under py-spy (the profile);
8. the report (bench.report).

A scale names its bind arms and the phases it runs after them (``Scale.arms``, ``Scale.phases``):
the huge one (bench/huge.py) runs A, B2 and L on 5,000 nodes, then only the gpu-scheduler's
memory and start-up, measured after A's first run while its pods are still there.

The scales and the results record are bench/scales.py; memory, CPU time and the
profile's summary are bench/measure.py; what the run shares with its phases (the control plane,
the results, a namespace, a run recorded) is bench/harness.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import arms, huge
from bench.apiserver import ApiserverBench
from bench.arms import (
    INJECTIONS,
    PAIRED,
    STATEFULSET_CONTROLLER,
    WEBHOOK_LABEL,
    Run,
    create_namespace,
    delete_pods,
)
from bench.dra import DraBench
from bench.gang import CONTROLLERS_OFF, GANG_ARMS, OWNED_ARMS, Release, owned, owners, released
from bench.harness import Harness
from bench.lease import HeldLease
from bench.measure import own_times, rss_mib, summarise_profile
from bench.raw import Raw, run_parallel
from bench.scales import Results, Scale, log
from bench.tenancy import TenancyBench
from bench.workload import NOBODY, Plan, bind_pods, foreign_pods, node_name, webhook_pods
from localcluster.admission import POD_CREATE_RULE
from localcluster.cluster import Cluster, free_port
from localcluster.procs import ManagedProcess
from localcluster.rbac import render_chart, render_rbac, scheduler_chart_values
from localcluster.scheduler_host import http_url, run_scheduler
from localcluster.webhook_host import ca_bundle, make_certs, run_webhook

REPO = Path(__file__).resolve().parent.parent
SCHEDULER = "gpu-scheduler"
TUNED = "tuned-kube-scheduler"  # arm B2's profile
SYSTEM_NS = "bench-system"


def scheduler_kubeconfig(cluster: Cluster, namespace: str) -> Path:
    """A token of the scheduler's least-privilege ServiceAccount: the chart's own rendered RBAC,
    as the integration tests make it (localcluster/rbac.py)."""
    objects = render_rbac(cluster, "gpu-scheduler-bench", namespace, "scheduler", scheduler_chart_values())
    cluster.apply(objects)
    (sa,) = [d["metadata"]["name"] for d in objects if d["kind"] == "ServiceAccount"]
    return cluster.service_account_kubeconfig(namespace, sa)


class Bench(Harness):
    """The whole run (the module doc); what its phases share is bench/harness.py's."""

    def __init__(self, scale: Scale, workdir: Path, command: str) -> None:
        super().__init__(scale, workdir, command)
        self.scheduler: ManagedProcess | None = None
        self.webhook: ManagedProcess | None = None
        self.webhook_certs: Path | None = None
        self.scheduler_kubeconfig: Path | None = None

    # -- set-up ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        log(f"starting the control plane in {self.workdir}")
        self.cluster = Cluster.start(
            self.workdir / "cluster",
            gpu_nodes=0,
            controllers_off=CONTROLLERS_OFF,
            node_lease_seconds=self.scale.node_lease_s,
            controller_manager_qps=self.scale.kcm_qps,
        )
        # Connections for the creator, the raw binder and the pod watch at once.
        self.raw = Raw(
            self.cluster.kubeconfig, maxsize=self.scale.create_threads + self.scale.bind_threads + 4
        )
        self.add_nodes(self.scale.groups[0][0])
        self.start_scheduler()
        if "webhook" in self.scale.phases:
            self.start_webhook()
            self.start_policy()

    def add_nodes(self, count: int) -> None:
        assert self.cluster is not None
        t0 = time.monotonic()
        # The node lifecycle controller lifts each new node's not-ready taint: at its client's
        # default 20 QPS about 5 nodes a second (Scale.kcm_qps raises it for 5,000 nodes).
        timeout = max(600.0, 0.5 * count)
        self.cluster.add_nodes([node_name(i) for i in range(count)], gpus=8, threads=8, timeout=timeout)
        log(f"{count} nodes Ready ({time.monotonic() - t0:.1f} s)")

    def start_scheduler(self) -> None:
        assert self.cluster is not None and self.raw is not None
        create_namespace(self.raw, SYSTEM_NS)
        self.scheduler_kubeconfig = scheduler_kubeconfig(self.cluster, SYSTEM_NS)
        self.scheduler = self.launch_scheduler()
        # Arm B2: kube-scheduler as a team that cares about scheduling speed runs it, its client
        # limits raised so that they never hold it back (arm B keeps the defaults, 50 QPS).
        self.cluster.start_kube_scheduler("kube-scheduler-tuned", TUNED, qps=5000, burst=10000)
        time.sleep(2)
        self.results.memory["scheduler_idle"] = rss_mib(self.scheduler.pid)
        log(f"gpu-scheduler ready, RSS idle {self.results.memory['scheduler_idle']} MiB")
        if self.scale.foreign:
            self.foreign_memory()

    def launch_scheduler(self) -> ManagedProcess:
        """The gpu-scheduler with the production settings (INFO logs, leader election, 16 workers,
        injection required), once its /readyz answers; stopped with the control plane."""
        assert self.cluster is not None and self.scheduler_kubeconfig is not None
        proc = run_scheduler(
            self.scheduler_kubeconfig,
            env={"POD_NAME": "bench", "POD_NAMESPACE": SYSTEM_NS, "GPU_SCHEDULER_NAME": SCHEDULER},
            log_path=self.workdir / "logs" / "gpu-scheduler.log",
            timeout=self.scale.timeout,
        )
        self.cluster.adopt("gpu-scheduler", proc)
        return proc

    def restart_scheduler(self) -> ManagedProcess:
        """Stop the gpu-scheduler (it gives its Lease back) and start a new one (the huge scale's
        start-up: bench/huge.py)."""
        assert self.cluster is not None
        self.cluster.procs.pop("gpu-scheduler").stop()
        self.scheduler = self.launch_scheduler()
        return self.scheduler

    def foreign_memory(self) -> None:
        """Scheduler RSS with many pods that are not its own (another schedulerName, bound to the
        nodes: the fit checks watch every bound pod, keeping a small footprint of each)."""
        assert self.raw is not None and self.scheduler is not None
        raw, ns = self.raw, "b-foreign"
        create_namespace(raw, ns)
        path = f"/api/v1/namespaces/{ns}/pods"
        nodes = self.scale.groups[0][0]
        bodies = foreign_pods(self.scale.foreign, nodes)
        start, end = run_parallel(
            self.scale.create_threads, lambda b: raw.request("POST", path, b, ok=(201,)), bodies
        )
        time.sleep(3)
        self.results.memory["scheduler_foreign"] = rss_mib(self.scheduler.pid)
        self.results.memory_notes["foreign"] = (
            f"{self.scale.foreign} pods of another scheduler, bound to the {nodes} nodes"
        )
        log(
            f"{self.scale.foreign} foreign pods created in {end - start:.1f} s; "
            f"scheduler RSS {self.results.memory['scheduler_foreign']} MiB"
        )
        delete_pods(self.raw, ns)

    def start_webhook(self) -> None:
        assert self.cluster is not None and self.raw is not None
        self.webhook_certs = make_certs(self.workdir / "webhook-certs")
        port = free_port()
        # No kubeconfig: /mutate needs no API access (node look-ups belong to /validate). The
        # webhook injects only into pods of its scheduler's name: here one that nobody runs, so
        # the create arms' pods stay pending and the gpu-scheduler never sees them.
        self.webhook = run_webhook(
            self.webhook_certs,
            port,
            env={"KUBECONFIG": "", "WEBHOOK_SCHEDULER_NAME": NOBODY},
            log_path=self.workdir / "logs" / "webhook.log",
        )
        self.cluster.adopt("gpu-scheduler-webhook", self.webhook)
        time.sleep(1)
        self.results.memory["webhook_idle"] = rss_mib(self.webhook.pid)
        condition = "has(object.metadata.annotations) && 'gpu-scheduling-map' in object.metadata.annotations"
        config = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "gpu-scheduler-bench"},
            "webhooks": [
                {
                    "name": "mutate-pods.gpu-scheduler.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "reinvocationPolicy": "IfNeeded",
                    "namespaceSelector": {"matchLabels": {WEBHOOK_LABEL: "on"}},
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/mutate",
                        "caBundle": ca_bundle(self.webhook_certs),
                    },
                    "rules": [POD_CREATE_RULE],
                    "matchConditions": [{"name": "has-gpu-scheduling-map", "expression": condition}],
                }
            ],
        }
        self.raw.post("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", config)
        self._probe("on", "the webhook")
        log(f"webhook ready on 127.0.0.1:{port}, RSS idle {self.results.memory['webhook_idle']} MiB")

    def start_policy(self) -> None:
        """injection.mode policy: the chart's own MutatingAdmissionPolicy and map
        ValidatingAdmissionPolicies (rendered by helm, nothing else of the chart), for the pods
        of the scheduler nobody runs in namespaces labelled ``WEBHOOK_LABEL=policy``."""
        assert self.cluster is not None and self.raw is not None
        values = {
            "injection": {"mode": "policy", "namespaceSelector": {"matchLabels": {WEBHOOK_LABEL: "policy"}}},
            "webhook": {"enabled": False},
            "scheduler": {"name": NOBODY},
        }
        kinds = {
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }
        docs = render_chart(self.cluster, "gpu-scheduler-bench", SYSTEM_NS, values)
        # The injection's own policies; not the trust policy (<fullname>-pods), which both modes have.
        ours = {f"gpu-scheduler-bench-{suffix}" for suffix in ("inject", "map", "map-warnings")}
        policies = [d for d in docs if d["kind"] in kinds and d["metadata"]["name"] in ours]
        if len(policies) != 2 * len(ours):
            raise RuntimeError(
                f"the chart rendered {[d['metadata']['name'] for d in policies]}, not {sorted(ours)}"
            )
        self.cluster.apply(policies)
        self._probe("policy", "the admission policies")
        log(f"admission policies active: {sorted({d['metadata']['name'] for d in policies})}")

    def _probe(self, label: str, what: str) -> None:
        """Waits until a dry-run create in a namespace labelled ``label`` comes back injected."""
        assert self.raw is not None
        probe_ns = f"b-{label}-probe"
        create_namespace(self.raw, probe_ns, {WEBHOOK_LABEL: label})
        probe = webhook_pods(1, 1)[0]
        deadline = time.monotonic() + 60
        while True:
            pod = self.raw.request(
                "POST",
                f"/api/v1/namespaces/{probe_ns}/pods?dryRun=All",
                probe.body,
                ok=(201,),
                as_user=STATEFULSET_CONTROLLER,
            )
            env = pod["spec"]["containers"][0].get("env") or []
            if {"name": "CUDA_VISIBLE_DEVICES", "value": "0"} in env:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not inject within 60 s")
            time.sleep(0.5)
        self.raw.delete(f"/api/v1/namespaces/{probe_ns}")

    def stop(self) -> None:
        if self.raw is not None:
            self.raw.close()
        if self.cluster is not None:
            self.cluster.stop()

    # -- arms -------------------------------------------------------------------------------

    def bind_run(self, arm: str, plan: Plan, rep: int, measure_memory: bool = False) -> Run:
        assert self.raw is not None and self.scheduler is not None
        scheduler_name = {"B": "default-scheduler", "B2": TUNED}.get(
            arm, SCHEDULER if arm in ("A", "E", *OWNED_ARMS) else NOBODY
        )
        pods = bind_pods(plan, scheduler_name=scheduler_name, pin=arm in ("B", "B2"))
        ns = self.namespace(f"{arm}-{plan.key}")
        if arm == "GR":
            pods = released(pods)
        if arm in OWNED_ARMS:  # their StatefulSets first, as in a user's cluster
            gang = arm in GANG_ARMS
            pods = owned(pods, owners(self.raw, ns, pods, gang), gang)
        lease = HeldLease(self.raw, self.LEASE, http_url(self.scheduler, "/health"))
        hold, go = lease.hold, lease.go
        if arm == "GR":
            release = Release(self.raw, http_url(self.scheduler, "/metrics"), pods[0], SCHEDULER)
            hold, go = release.hold, release.go
        # The previous arm's tail (its deletions' watch events, Events, garbage collection) is
        # not this arm's to pay for.
        self.settle()
        try:
            run = arms.run_bind_arm(
                self.raw,
                arm,
                plan.key,
                rep,
                pods,
                ns,
                create_threads=self.scale.create_threads,
                bind_threads=self.scale.bind_threads,
                timeout=self.scale.timeout,
                cpu=self.cpu,
                hold=hold,
                go=go,
                own=self.own_times if arm == "A" else None,
            )
            if measure_memory:
                time.sleep(2)
                key = f"scheduler_own_{plan.pods}"
                self.results.memory[key] = max(self.results.memory.get(key, 0.0), rss_mib(self.scheduler.pid))
            if arm == "A" and rep == 0 and "startup" in self.scale.phases:
                huge.after_placement(self.results, self.scheduler.pid, self.restart_scheduler)
        finally:
            delete_pods(self.raw, ns, timeout=self.scale.timeout)
            if arm == "GR":
                release.clean()
        return run

    def own_times(self, namespace: str, count: int) -> dict[str, float]:
        """The scheduler's own time per pod of ``namespace``, from its log (waits up to 10 s
        for the last "bound" lines: the watch may show a Binding before the line is written)."""
        path = self.workdir / "logs" / "gpu-scheduler.log"
        spent: dict[str, float] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            spent = own_times(path.read_text(errors="replace").splitlines(), namespace)
            if len(spent) >= count:
                break
            time.sleep(0.2)
        return spent

    # Arm E: the scheduler kept from leading while its pods are created (bench/lease.py).
    LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NS}/leases/{SCHEDULER}"

    def bind_arms(self) -> None:
        if not self.scale.arms:  # BENCH_SCALE=dra: its phase alone
            return
        for index, (nodes, plans) in enumerate(self.scale.groups):
            if index > 0:
                self.add_nodes(nodes)
            for rep in range(self.scale.reps):
                for plan in plans:
                    arms_ = self.scale.arms
                    order = arms_[rep % len(arms_) :] + arms_[: rep % len(arms_)]
                    for arm in order:
                        run = self.bind_run(arm, plan, rep, measure_memory=arm in ("A", "E"))
                        self.record(run, f"{plan.label} {arm} ({arms.ARM_NAMES[arm]})")
            # More repetitions of A, AO and G than of the others, for G/AO (Scale.paired_reps),
            # and of B2, for A/B2 as the median of the ratios within each repetition.
            for rep in range(self.scale.reps, self.scale.feature_reps):
                for plan in plans:
                    paired = tuple(a for a in (*PAIRED, "B2") if a in self.scale.arms)
                    order = paired[rep % len(paired) :] + paired[: rep % len(paired)]
                    for arm in order:
                        run = self.bind_run(arm, plan, rep)
                        self.record(run, f"{plan.label} {arm} ({arms.ARM_NAMES[arm]})")

    def webhook_arms(self) -> None:
        assert self.raw is not None and self.webhook is not None
        for rep in range(self.scale.reps):
            for entries in self.scale.webhook_maps:
                pods = webhook_pods(self.scale.webhook_pods, entries)
                modes = list(INJECTIONS)
                for injection in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
                    label = {"none": "off", "webhook": "on", "policy": "policy"}[injection]
                    ns = self.namespace(f"wh{entries}", {WEBHOOK_LABEL: label})
                    try:
                        run = arms.run_create_arm(
                            self.raw,
                            injection,
                            entries,
                            rep,
                            pods,
                            ns,
                            create_threads=self.scale.create_threads,
                            cpu=self.cpu,
                        )
                    finally:
                        delete_pods(self.raw, ns)
                    self.record(run, f"create, map of {entries}, {arms.INJECTION_NAMES[run.arm]}")
        self.results.memory["webhook_after"] = rss_mib(self.webhook.pid)

    # -- profile ----------------------------------------------------------------------------

    def profile(self) -> None:
        """One more scheduler run of the largest plan, sampled by py-spy (raw collapsed stacks)."""
        assert self.scheduler is not None
        plan = max(self.scale.plans, key=lambda p: (p.pods, p.nodes, p.per_node))
        out = self.workdir / "profile.txt"
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        info: dict[str, Any] = {"plan": plan.label, "tool": "py-spy record --format raw --rate 100"}
        proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(self.scheduler.pid),
                "--format",
                "raw",
                "--rate",
                "100",
                "-o",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            time.sleep(1.5)
            if proc.poll() is not None:
                info["error"] = (proc.stdout.read().decode(errors="replace") if proc.stdout else "").strip()[
                    -400:
                ]
            run = self.bind_run("A", plan, -1)
            self.record(run, f"{plan.label} A under py-spy")
            info["run"] = asdict(run)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        if out.exists():
            info["raw_file"] = str(out)
            info.update(summarise_profile(out.read_text()))
        elif "error" not in info:
            info["error"] = "py-spy wrote no profile"
        self.results.profile = info
        log(f"profile: {info.get('error') or str(info.get('samples')) + ' samples'}")

    def run(self) -> Results:
        t0 = time.monotonic()
        try:
            self.start()
            self.bind_arms()
            phases = self.scale.phases
            if "tenancy" in phases:
                TenancyBench(self, SCHEDULER, SYSTEM_NS).run()
            if "webhook" in phases:
                self.webhook_arms()
            if "apiserver" in phases:
                ApiserverBench(self).run()
            if "dra" in phases:
                DraBench(self, TUNED).run()
            if "profile" in phases:
                self.profile()
        finally:
            self.results.duration_s = round(time.monotonic() - t0, 1)
            self.results.load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
            (self.workdir / "results.json").write_text(self.results.to_json())
            self.stop()
        return self.results
