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
6. one more scheduler run of the largest plan under py-spy (the profile);
7. the report (bench.report).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import arms
from bench.arms import ARMS, WEBHOOK_LABEL, Run, create_namespace, delete_pods
from bench.raw import ApiError, Raw, run_parallel
from bench.workload import NOBODY, Plan, bind_pods, foreign_pods, node_name, webhook_pods
from gpu_scheduling.kube.timefmt import micro_time
from localcluster.cluster import Cluster, free_port
from localcluster.procs import ManagedProcess
from localcluster.scheduler_host import http_url, run_scheduler
from localcluster.webhook_host import ca_bundle, make_certs, run_webhook

REPO = Path(__file__).resolve().parent.parent
SCHEDULER = "gpu-scheduler"
SYSTEM_NS = "bench-system"


@dataclass(frozen=True)
class Scale:
    name: str
    groups: tuple[tuple[int, tuple[Plan, ...]], ...]  # (node count, plans run at that count)
    reps: int
    webhook_pods: int
    webhook_maps: tuple[int, ...]
    foreign: int
    create_threads: int = 4
    bind_threads: int = 4
    timeout: float = 600

    @property
    def plans(self) -> list[Plan]:
        return [p for _, plans in self.groups for p in plans]


_DEFAULT = (100, (Plan(100, 500, 1), Plan(100, 500, 5)))
SCALES = {
    "smoke": Scale("smoke", ((10, (Plan(10, 20, 1), Plan(10, 20, 2))),), 1, 20, (3, 20), 50, timeout=120),
    "default": Scale("default", (_DEFAULT,), 3, 500, (3, 500, 3000), 5000),
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


def rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` and every descendant (gunicorn's master and workers), in MiB."""
    total_kib = 0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
    return round(total_kib / 1024, 1)


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants that are alive now (gunicorn workers), in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def scheduler_kubeconfig(cluster: Cluster, namespace: str) -> Path:
    """A token of the scheduler's least-privilege ServiceAccount: the chart's own rendered RBAC,
    as the integration tests make it (tests/support/rbac.py)."""
    from tests.integration.fixtures_scheduler import scheduler_chart_values
    from tests.support.rbac import render_rbac

    objects = render_rbac(cluster, "gpu-scheduler-bench", namespace, "scheduler", scheduler_chart_values())
    cluster.apply(objects)
    (sa,) = [d["metadata"]["name"] for d in objects if d["kind"] == "ServiceAccount"]
    return cluster.service_account_kubeconfig(namespace, sa)


class Bench:
    def __init__(self, scale: Scale, workdir: Path, command: str) -> None:
        self.scale = scale
        self.workdir = workdir
        self.results = Results(
            scale.name, command, datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), machine()
        )
        self.cluster: Cluster | None = None
        self.raw: Raw | None = None
        self.scheduler: ManagedProcess | None = None
        self.webhook: ManagedProcess | None = None
        self.webhook_certs: Path | None = None
        self._seq = 0

    # -- set-up ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        log(f"starting the control plane in {self.workdir}")
        self.cluster = Cluster.start(self.workdir / "cluster", gpu_nodes=0)
        self.raw = Raw(self.cluster.kubeconfig)
        self.add_nodes(self.scale.groups[0][0])
        self.start_scheduler()
        self.start_webhook()

    def add_nodes(self, count: int) -> None:
        assert self.cluster is not None
        t0 = time.monotonic()
        self.cluster.add_nodes([node_name(i) for i in range(count)], gpus=8, threads=8, timeout=600)
        log(f"{count} nodes Ready ({time.monotonic() - t0:.1f} s)")

    def start_scheduler(self) -> None:
        assert self.cluster is not None and self.raw is not None
        create_namespace(self.raw, SYSTEM_NS)
        kubeconfig = scheduler_kubeconfig(self.cluster, SYSTEM_NS)
        # The production settings (INFO logs, leader election, 4 workers, injection required).
        self.scheduler = run_scheduler(
            kubeconfig,
            env={"POD_NAME": "bench", "POD_NAMESPACE": SYSTEM_NS, "GPU_SCHEDULER_NAME": SCHEDULER},
            log_path=self.workdir / "logs" / "gpu-scheduler.log",
        )
        self.cluster.adopt("gpu-scheduler", self.scheduler)
        time.sleep(2)
        self.results.memory["scheduler_idle"] = rss_mib(self.scheduler.pid)
        log(f"gpu-scheduler ready, RSS idle {self.results.memory['scheduler_idle']} MiB")
        self.foreign_memory()

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
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                    "matchConditions": [{"name": "has-gpu-scheduling-map", "expression": condition}],
                }
            ],
        }
        self.raw.post("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", config)
        probe_ns = "b-webhook-probe"
        create_namespace(self.raw, probe_ns, {WEBHOOK_LABEL: "on"})
        probe = webhook_pods(1, 1)[0]
        deadline = time.monotonic() + 60
        while True:
            pod = self.raw.request(
                "POST", f"/api/v1/namespaces/{probe_ns}/pods?dryRun=All", probe.body, ok=(201,)
            )
            env = pod["spec"]["containers"][0].get("env") or []
            if {"name": "CUDA_VISIBLE_DEVICES", "value": "0"} in env:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the apiserver did not call the webhook within 60 s")
            time.sleep(0.5)
        self.raw.delete(f"/api/v1/namespaces/{probe_ns}")
        log(f"webhook ready on 127.0.0.1:{port}, RSS idle {self.results.memory['webhook_idle']} MiB")

    def stop(self) -> None:
        if self.raw is not None:
            self.raw.close()
        if self.cluster is not None:
            self.cluster.stop()

    # -- arms -------------------------------------------------------------------------------

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of every component, and of this harness ("bench client")."""
        assert self.cluster is not None
        out = {name: cpu_seconds(proc.pid) for name, proc in self.cluster.procs.items()}
        times = os.times()
        out["bench client"] = times.user + times.system
        return out

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

    def bind_run(self, arm: str, plan: Plan, rep: int, measure_memory: bool = False) -> Run:
        assert self.raw is not None and self.scheduler is not None
        scheduler_name = {"A": SCHEDULER, "E": SCHEDULER, "B": "default-scheduler"}.get(arm, NOBODY)
        pods = bind_pods(plan, scheduler_name=scheduler_name, pin=arm == "B")
        ns = self.namespace(f"{arm}-{plan.key}")
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
                hold=self.hold_lease,
                go=self.release_lease,
            )
            if measure_memory:
                time.sleep(2)
                key = f"scheduler_own_{plan.pods}"
                self.results.memory[key] = max(self.results.memory.get(key, 0.0), rss_mib(self.scheduler.pid))
        finally:
            delete_pods(self.raw, ns)
        return run

    # -- arm E: the scheduler kept from leading while its pods are created ------------------

    LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NS}/leases/{SCHEDULER}"
    HOLDER = "bench-holds-the-lease"

    def _write_lease(self, holder: str | None) -> None:
        assert self.raw is not None
        for _ in range(50):
            lease = self.raw.get(self.LEASE)
            spec = lease.setdefault("spec", {})
            spec["holderIdentity"] = holder
            spec["leaseDurationSeconds"] = 100  # under 10x the scheduler's 15 s: not "absurd"
            spec["renewTime"] = spec["acquireTime"] = micro_time()
            try:
                self.raw.request("PUT", self.LEASE, json.dumps(lease).encode(), ok=(200,), tries=1)
                return
            except ApiError as err:
                if "HTTP 409" not in str(err):
                    raise
        raise ApiError("could not write the scheduler's Lease (409 fifty times)")

    def _scheduler_leads(self) -> bool:
        assert self.scheduler is not None
        with urllib.request.urlopen(http_url(self.scheduler, "/health"), timeout=5) as resp:  # noqa: S310 (http://127.0.0.1)
            return bool(json.loads(resp.read()).get("leader"))

    def hold_lease(self) -> None:
        """Take the scheduler's Lease, and wait until it has stopped leading."""
        self._write_lease(self.HOLDER)
        deadline = time.monotonic() + 60
        while self._scheduler_leads():
            if time.monotonic() > deadline:
                raise ApiError("the scheduler still leads 60 s after its Lease was taken")
            time.sleep(0.05)

    def release_lease(self) -> float:
        """Give the Lease back; the moment the scheduler leads again (it polls every 2 s)."""
        self._write_lease(None)
        deadline = time.monotonic() + 60
        while not self._scheduler_leads():
            if time.monotonic() > deadline:
                raise ApiError("the scheduler did not take its Lease back within 60 s")
            time.sleep(0.01)
        return time.monotonic()

    def bind_arms(self) -> None:
        for index, (nodes, plans) in enumerate(self.scale.groups):
            if index > 0:
                self.add_nodes(nodes)
            for rep in range(self.scale.reps):
                for plan in plans:
                    order = ARMS[rep % len(ARMS) :] + ARMS[: rep % len(ARMS)]
                    for arm in order:
                        run = self.bind_run(arm, plan, rep, measure_memory=arm in ("A", "E"))
                        self.record(run, f"{plan.label} {arm} ({arms.ARM_NAMES[arm]})")

    def webhook_arms(self) -> None:
        assert self.raw is not None and self.webhook is not None
        for rep in range(self.scale.reps):
            for entries in self.scale.webhook_maps:
                pods = webhook_pods(self.scale.webhook_pods, entries)
                for on in (False, True) if rep % 2 == 0 else (True, False):
                    ns = self.namespace(f"wh{entries}", {WEBHOOK_LABEL: "on" if on else "off"})
                    try:
                        run = arms.run_create_arm(
                            self.raw,
                            on,
                            entries,
                            rep,
                            pods,
                            ns,
                            create_threads=self.scale.create_threads,
                            cpu=self.cpu,
                        )
                    finally:
                        delete_pods(self.raw, ns)
                    self.record(run, f"create, map of {entries}, webhook {'on' if on else 'off'}")
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
            self.webhook_arms()
            self.profile()
        finally:
            self.results.duration_s = round(time.monotonic() - t0, 1)
            self.results.load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
            (self.workdir / "results.json").write_text(self.results.to_json())
            self.stop()
        return self.results


def summarise_profile(text: str, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample counts per function, and self samples per area (package)."""
    self_counts: dict[str, int] = {}
    incl_counts: dict[str, int] = {}
    areas: dict[str, int] = {}
    total = waiting = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        leaf = frames[-1]
        if leaf.startswith(_WAITING):
            waiting += count
            continue
        self_counts[leaf] = self_counts.get(leaf, 0) + count
        for frame in set(frames):
            incl_counts[frame] = incl_counts.get(frame, 0) + count
        areas[area_of(frames)] = areas.get(area_of(frames), 0) + count

    def ranked(counts: dict[str, int]) -> list[tuple[str, int]]:
        return sorted(counts.items(), key=lambda kv: -kv[1])[:top]

    return {
        "samples": total - waiting,
        "waiting": waiting,
        "self": ranked(self_counts),
        "inclusive": ranked({k: v for k, v in incl_counts.items() if not k.startswith(_THREAD_FRAMES)}),
        "areas": ranked(areas),
    }


# Leaf frames of a thread that is blocked, not running: left out of the counts (py-spy's own
# idle detection misses waits on locks and TLS reads).
_WAITING = (
    "Condition.wait ",
    "Event.wait ",
    "SSLSocket.read ",
    "SSLSocket.recv",
    "_PollLikeSelector.select ",
    "poll_wait_for_socket.",
    "Lock.acquire",
    "sleep ",
    "socket.accept",
)
_THREAD_FRAMES = ("Thread._bootstrap", "Thread.run ", "Thread._bootstrap_inner")
_AREAS = (
    ("json/", "json (de)serialisation"),
    # orjson is C: its time shows in the Python frame that calls it.
    ("decode (gpu_scheduling/kube/jsonio.py", "json (de)serialisation"),
    ("kubernetes/client/api_client", "kubernetes client: models and (de)serialisation"),
    ("kubernetes/client/models", "kubernetes client: models and (de)serialisation"),
    ("kubernetes/", "kubernetes client: other"),
    ("urllib3/", "urllib3 (HTTP)"),
    ("ssl.py", "TLS (ssl)"),
    ("socket.py", "sockets"),
    ("http/client", "http.client"),
    ("logging/", "logging"),
    ("gpu_scheduling/", "gpu_scheduling (map, injection)"),
    ("prometheus_client/", "prometheus_client"),
    ("threading.py", "threading (locks, conditions)"),
    ("queue.py", "threading (locks, conditions)"),
)


# The project's own code, named by module: the scheduler's, and the kube layer it runs on.
_OWN_CODE = ("gpu_scheduling/kube/", "scheduler/")


def _own_module(frame: str) -> str | None:
    for root in _OWN_CODE:
        if root in frame:
            module = frame.split(root, 1)[1].split(".py", 1)[0]
            return f"{root}{module}.py (own code)"
    return None


def area_of(frames: list[str]) -> str:
    """What the leaf frame belongs to; the project's own code names its module."""
    leaf = frames[-1]
    for needle, area in _AREAS:
        if needle in leaf:
            return (_own_module(leaf) or area) if needle == "gpu_scheduling/" else area
    for frame in reversed(frames):
        if own := _own_module(frame):
            return own
    return "other"
