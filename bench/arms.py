"""One timed run of one arm, its correctness check and its clean-up.

Bind arms (same pods, same creator, same watch):

* ``A`` gpu-scheduler: pods with ``schedulerName: gpu-scheduler``;
* ``B`` kube-scheduler: the same pods for ``default-scheduler``, pinned by a required node
  affinity on ``metadata.name``;
* ``C`` raw Binding POSTs on existing pods: pods for a scheduler nobody serves are created
  first, then a bare client binds them (``bind_threads``) as fast as the apiserver lets it;
* ``L`` raw Binding POSTs while the pods are created: the same binder reacts to the watch
  as the creator goes (the ceiling for a scheduler that competes with creation, as A and B do).

Throughput is pods / (first create sent .. last pod seen bound on the watch); for C it
starts at the first Binding. Latency is, per pod, watch arrival of "bound" minus watch
arrival of "created" (C: minus the moment its Binding was sent).
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3

from bench.raw import ApiError, PodWatch, Raw, run_parallel
from bench.workload import BENCH, NOBODY, PART_OF, PodSpec
from kube_gpu_scheduler.domain.injection import held_devices, plain_env, pod_containers
from kube_gpu_scheduler.domain.schedmap import GPU

ARMS = ("A", "AO", "E", "B", "B2", "C", "L", "G", "GR")
# The arms that price gang placement, run more often than the others (Scale.paired_reps).
PAIRED = ("A", "AO", "G")
ARM_NAMES = {
    "A": "gpu-scheduler",
    "AO": "gpu-scheduler, the pods owned by StatefulSets (G's pods, not gangs)",
    "E": "gpu-scheduler, existing pods",
    "B": "kube-scheduler at its client's default QPS (node affinity)",
    "B2": "kube-scheduler, client QPS 5000 / burst 10000 (node affinity)",
    "C": "raw Binding, existing pods",
    "L": "raw Binding, while created",
    "G": "gpu-scheduler, gangs (all or none), nothing blocking",
    "GR": "gpu-scheduler, one gang released (from the blocker's deletion)",
}
WEBHOOK_LABEL = "bench.gpu-scheduler.io/webhook"
# The create arms: how the pods get their GPU variables (the value of WEBHOOK_LABEL on their
# namespace selects the webhook's or the policies' namespaceSelector).
INJECTIONS = {"none": "W-", "webhook": "W+", "policy": "P"}
INJECTION_NAMES = {
    "W-": "no mutation",
    "W+": "the webhook",
    "P": "the admission policies (injection.mode policy)",
}
# The create arms post their pods as the StatefulSet controller does (its ServiceAccount,
# impersonated): the map ValidatingAdmissionPolicy leaves the full map to the StatefulSet's own
# admission for pods that controller creates, as it does for a real rollout.
STATEFULSET_CONTROLLER = "system:serviceaccount:kube-system:statefulset-controller"


@dataclass
class Run:
    arm: str
    plan: str
    rep: int
    pods: int
    seconds: float
    throughput: float
    p50: float
    p99: float
    problems: list[str] = field(default_factory=list)
    # CPU seconds each process spent during the timed part (component -> s).
    cpu: dict[str, float] = field(default_factory=dict)
    # Times the apiserver ended the harness's pod watch during the run (resumed each time).
    watch_resumed: int = 0
    # Seconds from the last pod seen created to the last seen bound (0 for the create arms): how
    # far the scheduler ends behind the creator (for E and C: behind the start, meaningless).
    end_lag: float = 0.0
    # Arm A: p99 of the time each pod spent inside the gpu-scheduler (from its watch event to
    # its Binding, the Binding's round trip left out: its "bound" log line), and p99 of the
    # latencies less that time: what a scheduler taking no time at all would have measured on
    # the same control plane in the same run (the p99 bound, bench/report.py).
    own_p99: float = float("nan")
    p99_without_own: float = float("nan")
    # DRA arms D and DF (bench/dra.py): the claim controller's replica keys processed during the
    # run, their mean processing time and the mean CPU time its workers spent on one (its
    # gpu_scheduler_dra_key_processing_seconds and gpu_scheduler_dra_key_cpu_seconds metrics).
    dra_keys: int = 0
    dra_key_ms: float = float("nan")
    dra_key_cpu_ms: float = float("nan")
    # The apiserver phase (bench/apiserver.py): kube-apiserver's CPU seconds per second while
    # nothing of the run's own was sent, measured just before the run (taken out of its CPU
    # per object), and the requests the apiserver answered 504 (its 34 s create deadline).
    apiserver_idle: float = float("nan")
    gateway_timeouts: int = 0

    @property
    def correct(self) -> bool:
        return not self.problems


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def create_namespace(raw: Raw, name: str, labels: dict[str, str] | None = None) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {PART_OF: BENCH, **(labels or {})}},
    }
    raw.post("/api/v1/namespaces", doc, ok=(201, 409))
    # Pods are refused until the controller-manager has made the default ServiceAccount.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiError):
            raw.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
            return
        time.sleep(0.2)
    raise ApiError(f"namespace {name}: no default ServiceAccount after 60 s")


def delete_pods(raw: Raw, namespace: str, timeout: float = 300) -> None:
    """Delete every pod of ``namespace`` at once (grace 0), wait until none is left, drop the namespace.

    Deleting 3,000 pods of 60 KB each can outlast the apiserver's request timeout (60 s), and
    the apiserver then drops the connection: the delete is sent again (it is idempotent) until
    no pod is left.
    """
    collection = f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0"
    deadline = time.monotonic() + timeout
    sent = float("-inf")
    while True:
        if time.monotonic() - sent > 30:
            sent = time.monotonic()
            try:
                raw.delete(collection)
            except (ApiError, urllib3.exceptions.HTTPError, OSError) as err:
                print(
                    f"[bench] deleting the pods of {namespace}: {err}; trying again",
                    file=sys.stderr,
                    flush=True,
                )
        if not raw.list_items(f"/api/v1/namespaces/{namespace}/pods?limit=1"):
            break
        if time.monotonic() > deadline:
            raise ApiError(f"pods of {namespace} still there after {timeout:.0f} s")
        time.sleep(0.5)
    raw.delete(f"/api/v1/namespaces/{namespace}")


def creator(
    raw: Raw, namespace: str, sent: dict[str, float] | None = None, as_user: str | None = None
) -> Any:
    path = f"/api/v1/namespaces/{namespace}/pods"

    def create(pod: PodSpec) -> None:
        start = time.monotonic()
        raw.request("POST", path, pod.body, ok=(201,), as_user=as_user)
        if sent is not None:
            sent[pod.name] = time.monotonic() - start

    return create


def binder(raw: Raw, namespace: str, sent: dict[str, float] | None = None) -> Any:
    def bind(pod: tuple[str, str]) -> None:
        name, node = pod
        doc = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if sent is not None:
            sent[name] = time.monotonic()
        raw.post(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", doc, ok=(201,))

    return bind


def run_bind_arm(
    raw: Raw,
    arm: str,
    plan_key: str,
    rep: int,
    pods: list[PodSpec],
    namespace: str,
    *,
    create_threads: int,
    bind_threads: int,
    timeout: float,
    cpu: Callable[[], dict[str, float]] | None = None,
    hold: Callable[[], None] | None = None,
    go: Callable[[], float] | None = None,
    own: Callable[[str, int], dict[str, float]] | None = None,
) -> Run:
    """Create ``pods`` in ``namespace`` (fresh, empty) and wait until all are bound.

    ``own(namespace, count)``: each pod's seconds inside the scheduler (arm A), for the
    ``own_p99`` and ``p99_without_own`` of the run.

    Arm E (the gpu-scheduler on existing pods, C's counterpart): ``hold()`` keeps the
    scheduler from placing anything (its Lease is held by someone else) while the pods are
    created; once all are seen, ``go()`` gives the Lease back and returns the last moment
    known to come before the scheduler took it (bench/lease.py, HeldLease.go): the clock starts there,
    as C's starts at its first Binding. Arm GR
    (bench/gang.py) the same way: ``hold()`` blocks the gang, ``go()`` releases it.
    """
    nodes = {p.name: p.node for p in pods}
    bind_sent: dict[str, float] = {}
    pending: queue.Queue[tuple[str, str] | None] = queue.Queue()
    live_binders: list[threading.Thread] = []

    def on_added(name: str, obj: dict[str, Any]) -> None:
        if arm == "L" and name in nodes:
            pending.put((name, nodes[name]))

    watch = PodWatch(raw, namespace, on_added=on_added).start()
    cpu_before = cpu() if cpu else {}
    cpu_used: dict[str, float] = {}
    try:
        if arm == "L":
            bind = binder(raw, namespace)

            def drain() -> None:
                while (item := pending.get()) is not None:
                    bind(item)

            live_binders = [threading.Thread(target=drain, daemon=True) for _ in range(bind_threads)]
            for t in live_binders:
                t.start()
        if arm in ("E", "GR"):
            assert hold is not None and go is not None
            hold()
        start, _ = run_parallel(create_threads, creator(raw, namespace), pods)
        if arm in ("E", "GR"):
            assert go is not None
            if not watch.wait_seen(len(pods), timeout):
                raise ApiError(f"{namespace}: only {len(watch.seen)} of {len(pods)} pods seen on the watch")
            start = go()
        if arm == "C":
            if not watch.wait_seen(len(pods), timeout):
                raise ApiError(f"{namespace}: only {len(watch.seen)} of {len(pods)} pods seen on the watch")
            start, _ = run_parallel(
                bind_threads, binder(raw, namespace, bind_sent), [(p.name, p.node) for p in pods]
            )
        if not watch.wait_bound(len(pods), timeout):
            raise ApiError(
                f"{ARM_NAMES[arm]}: only {len(watch.bound)} of {len(pods)} pods bound within {timeout:.0f} s"
            )
        if cpu:
            cpu_used = {k: round(v - cpu_before.get(k, 0.0), 3) for k, v in cpu().items()}
        last = max(watch.bound.values())
        if arm in ("E", "GR"):  # from the scheduler's start (the gang's release): every pod was waiting
            latencies = [watch.bound[n] - start for n in nodes]
        else:
            origin = bind_sent if arm == "C" else watch.seen
            latencies = [watch.bound[n] - origin[n] for n in nodes]
    finally:
        for _ in live_binders:
            pending.put(None)
        watch.stop()
    seconds = last - start
    run = Run(
        arm,
        plan_key,
        rep,
        len(pods),
        seconds,
        len(pods) / seconds,
        percentile(latencies, 50),
        percentile(latencies, 99),
    )
    run.cpu = cpu_used
    run.watch_resumed = watch.resumed
    run.end_lag = max(0.0, last - max(watch.seen.values()))
    if own is not None and arm != "E":
        spent = own(namespace, len(pods))
        by_pod = dict(zip(nodes, latencies, strict=True))
        if spent:
            run.own_p99 = percentile(list(spent.values()), 99)
            run.p99_without_own = percentile([lat - spent.get(n, 0.0) for n, lat in by_pod.items()], 99)
    run.problems = check_placement(raw, namespace, pods)
    return run


def _read_back(
    raw: Raw, namespace: str, pods: list[PodSpec]
) -> tuple[list[str], dict[str, PodSpec], list[dict[str, Any]]]:
    """The namespace's pods as the API has them, the planned ones by name, and a problem when
    the counts differ."""
    items = raw.list_items(f"/api/v1/namespaces/{namespace}/pods")
    problems = [f"{namespace}: {len(items)} pods, expected {len(pods)}"] if len(items) != len(pods) else []
    return problems, {p.name: p for p in pods}, items


def check_placement(raw: Raw, namespace: str, pods: list[PodSpec]) -> list[str]:
    """Every pod on its mapped node holding its mapped GPU; no node:GPU held twice cluster-wide."""
    problems, want, items = _read_back(raw, namespace, pods)
    for pod in items:
        name = pod["metadata"]["name"]
        spec = pod.get("spec") or {}
        expected = want.get(name)
        if expected is None:
            problems.append(f"{namespace}/{name}: not created by the benchmark")
            continue
        if spec.get("nodeName") != expected.node:
            problems.append(f"{namespace}/{name}: on {spec.get('nodeName')!r}, mapped to {expected.node}")
        if held_devices(spec) != (expected.gpu,):
            problems.append(f"{namespace}/{name}: holds GPUs {held_devices(spec)}, mapped {expected.gpu}")
    problems.extend(double_holders(raw))
    return problems[:20]


def double_holders(raw: Raw) -> list[str]:
    """node:GPU pairs held by more than one active bound pod of the benchmark, read back through the API."""
    held: Counter[tuple[str, GPU]] = Counter()
    for pod in raw.list_items(f"/api/v1/pods?labelSelector={PART_OF}%3D{BENCH}"):
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        for gpu in held_devices(spec):
            held[(spec["nodeName"], gpu)] += 1
    return [f"GPU {node}:{gpu} held by {n} pods" for (node, gpu), n in held.items() if n > 1]


def run_create_arm(
    raw: Raw,
    injection: str,
    entries: int,
    rep: int,
    pods: list[PodSpec],
    namespace: str,
    *,
    create_threads: int,
    cpu: Callable[[], dict[str, float]] | None = None,
) -> Run:
    """Pod-create throughput into a namespace where ``injection`` (a key of INJECTIONS) gives the
    pods their variables, or nothing does."""
    sent: dict[str, float] = {}
    cpu_before = cpu() if cpu else {}
    create = creator(raw, namespace, sent, as_user=STATEFULSET_CONTROLLER)
    start, end = run_parallel(create_threads, create, pods)
    cpu_used = {k: round(v - cpu_before.get(k, 0.0), 3) for k, v in cpu().items()} if cpu else {}
    durations = list(sent.values())
    arm = INJECTIONS[injection]
    run = Run(
        arm,
        f"map{entries}",
        rep,
        len(pods),
        end - start,
        len(pods) / (end - start),
        percentile(durations, 50),
        percentile(durations, 99),
    )
    run.cpu = cpu_used
    run.problems = check_injection(raw, namespace, pods, injection != "none")
    return run


def check_injection(raw: Raw, namespace: str, pods: list[PodSpec], injected: bool) -> list[str]:
    problems, want, items = _read_back(raw, namespace, pods)
    for pod in items:
        name = pod["metadata"]["name"]
        envs = [plain_env(c) for c in pod_containers(pod.get("spec"))]
        expected = want[name]
        if injected:
            good = all(
                e.get("CUDA_VISIBLE_DEVICES") == str(expected.gpu)
                and e.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
                for e in envs
            )
        else:
            good = all("CUDA_VISIBLE_DEVICES" not in e for e in envs)
        if not good:
            problems.append(
                f"{namespace}/{name}: env {envs} (injection {'on' if injected else 'off'}, GPU {expected.gpu})"
            )
    return problems[:20]


__all__ = [
    "ARMS",
    "ARM_NAMES",
    "INJECTIONS",
    "INJECTION_NAMES",
    "NOBODY",
    "PAIRED",
    "WEBHOOK_LABEL",
    "Run",
    "check_placement",
    "create_namespace",
    "delete_pods",
    "percentile",
    "run_bind_arm",
    "run_create_arm",
]
