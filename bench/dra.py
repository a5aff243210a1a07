"""DRA mode measured: the gpu-scheduler's claim controller, the scheduling gate and kube-scheduler's
allocation, against kube-scheduler allocating the same claims made beforehand, and against the
way a team without gpu-scheduler asks for GPUs (a StatefulSet with a ResourceClaimTemplate).

The DRA phase of ``make bench`` (after the bind and create arms, on the same control plane):

1. every kwok node publishes its 8 GPUs as NVIDIA's DRA driver would (localcluster/dra.py: the
   DeviceClass ``gpu.nvidia.com`` and one ResourceSlice per node);
2. a second gpu-scheduler, in DRA mode (``GPU_SCHEDULER_DRA``, the chart's DRA RBAC, its own
   namespace and Lease), starts, and so does a kube-controller-manager running only the
   StatefulSet and resourceclaim controllers (bench/drakt.py); both run only during this phase;
3. per repetition, interleaved, on the DRA plan's pods (bare pods, as the injection policy makes
   a mapped replica in DRA mode: the label ``gpu-scheduler.io/dra``, the scheduling gate, the
   claim reference ``<pod>-gpus`` in the pod and in its container, ``CUDA_DEVICE_ORDER``, the
   required node affinity on the entry's node; ``schedulerName`` the tuned kube-scheduler of
   arm B2, so that kube-scheduler's client limits hold neither arm back):

   * ``D``: the pods are created; the claim controller makes each claim and opens the gate,
     kube-scheduler allocates and binds;
   * ``K``: the same claims (the controller's own bodies, without its label, so no controller
     touches them) are created first, untimed; then the same pods without the gate and the
     label; kube-scheduler allocates and binds;
   * ``KT``: a StatefulSet per workload whose pod template uses a ResourceClaimTemplate; the
     controllers make the replicas and their claims, kube-scheduler allocates any free GPU and
     binds (bench/drakt.py: its clock and its read-back);

   each arm starts once the control plane's CPU has settled after the last (``Harness.settle``:
   the previous arm's drain is not its to pay for); D and KT run ``Scale.dra_reps`` repetitions
   (K ``reps``), and D/K and D/KT are the median of the ratios within each (bench/drareport.py);

4. ``foreign`` other claims are made (allocated, through their status, to the GPUs of
   ResourceSlices of nodes that do not run pods here: the cluster's other workloads), and ``DF``
   (arm D again) runs with them present; then they go.

Throughput: pods / (first create sent .. last pod seen bound on a pod watch), as for the bind
arms. After each run every pod is read back: on its entry's node, its claim allocated exactly
the devices the entry resolves to (``kube_gpu_scheduler.domain.dra.matches``), and no device
allocated to two claims in the whole cluster. For D and DF the controller's own time per key
is read from its metrics (``gpu_scheduler_dra_key_processing_seconds``), before and after.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any

from bench.arms import Run, create_namespace, creator, percentile
from bench.drakt import (
    DRA_CONTROLLERS,
    DRA_KCM,
    DRA_KCM_BURST,
    DRA_KCM_QPS,
    KT_NAME,
    STATEFULSETS,
    TEMPLATES,
    check_kt,
    claim_template,
    pod_names,
    shared_devices,
    statefulsets,
)
from bench.raw import ApiError, PodWatch, Raw, run_parallel
from bench.workload import BENCH, IMAGE, PART_OF, WORKLOAD_LABEL, Plan, PodSpec, node_name
from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, Entry
from localcluster import dra as localdra
from localcluster.rbac import render_rbac, scheduler_chart_values
from localcluster.scheduler_host import http_url, run_scheduler

if TYPE_CHECKING:
    from bench.harness import Harness

DRA_ARMS = ("D", "K", "KT", "DF")
DRA_ARM_NAMES = {
    "D": "DRA mode: the claim controller makes the claim and opens the gate, kube-scheduler (B2's) allocates",
    "K": "kube-scheduler (B2's) allocating the same claims made beforehand, no controller",
    "KT": KT_NAME,
    "DF": "DRA mode (D) with the cluster's other allocated claims present",
}
DRA_SCHEDULER = "gpu-scheduler-dra"
DRA_SYSTEM_NS = "bench-dra-system"
FOREIGN_NS = "b-dra-foreign"
GPUS = 8  # per kwok node (bench.workload.GPUS_PER_NODE)
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PART_OF_BENCH = f"{PART_OF}%3D{BENCH}"


def dra_pods(plan: Plan, *, scheduler_name: str, gated: bool) -> list[PodSpec]:
    """The plan's pods as the injection policy makes them in DRA mode (``gated``: with the gate
    and the label the claim controller watches; without: arm K's, which no controller sees)."""
    maps = plan.maps()
    out = []
    for w, k, node, gpu in plan.placements():
        name = f"{w}-{k}"
        labels = {PART_OF: BENCH, WORKLOAD_LABEL: w, POD_INDEX_LABEL: str(k)}
        if gated:
            labels[dra.POD_LABEL] = "true"
        spec: dict[str, Any] = {
            "schedulerName": scheduler_name,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": dra.POD_CLAIM, "resourceClaimName": dra.claim_name(name)}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "env": [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}],
                    "resources": {"claims": [{"name": dra.POD_CLAIM}]},
                }
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                        ]
                    }
                }
            },
        }
        if gated:
            spec["schedulingGates"] = [{"name": dra.GATE}]
        meta = {"name": name, "labels": labels, "annotations": {ANNOTATION: maps[w]}}
        body = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}).encode()
        out.append(PodSpec(name, node, gpu, body))
    return out


def node_devices(node: str) -> list[dra.Device]:
    """What the node publishes (the slice this phase creates), in PCI bus ID order."""
    return dra.node_devices([localdra.resource_slice(node, localdra.node_gpus(node, GPUS))], node)


def claim_bodies(plan: Plan, namespace: str) -> list[bytes]:
    """Arm K's claims: the controller's own bodies for the plan's entries, without its label and
    annotations (no controller takes them for its own)."""
    out = []
    for w, k, node, gpu in plan.placements():
        entry = Entry(k, node, (gpu,))
        body = dra.claim_body(
            dra.claim_name(f"{w}-{k}"), namespace, entry, dra.resolve(entry, node_devices(node)), owner=None
        )
        body["metadata"] = {"name": body["metadata"]["name"], "labels": {PART_OF: BENCH}}
        out.append(json.dumps(body).encode())
    return out


def check_dra(raw: Raw, namespace: str, plan: Plan) -> list[str]:
    """Every pod on its entry's node, its claim allocated exactly its entry's devices; no device
    allocated to two claims in the cluster."""
    pods = {p["metadata"]["name"]: p for p in raw.list_items(f"/api/v1/namespaces/{namespace}/pods")}
    claims = {c["metadata"]["name"]: c for c in raw.list_items(CLAIMS.format(ns=namespace))}
    problems = []
    for w, k, node, gpu in plan.placements():
        name = f"{w}-{k}"
        pod, claim = pods.get(name), claims.get(dra.claim_name(name))
        entry = Entry(k, node, (gpu,))
        if pod is None or (pod.get("spec") or {}).get("nodeName") != node:
            problems.append(
                f"{namespace}/{name}: on {(pod or {}).get('spec', {}).get('nodeName')!r}, mapped to {node}"
            )
        elif claim is None or not dra.matches(claim, entry, dra.resolve(entry, node_devices(node))):
            got = [f"{a.pool}/{a.device}" for a in dra.allocation(claim or {})]
            problems.append(f"{namespace}/{name}: claim allocated {got}, entry {entry}")
    return (problems + shared_devices(raw))[:20]


KEY_METRICS = {
    "seconds": 'gpu_scheduler_dra_key_processing_seconds_sum{kind="pod"}',
    "count": 'gpu_scheduler_dra_key_processing_seconds_count{kind="pod"}',
    "cpu": 'gpu_scheduler_dra_key_cpu_seconds_total{kind="pod"}',
}


def key_metrics(proc_url: str) -> dict[str, float]:
    """The claim controller's replica keys so far, from its /metrics: their count, their
    processing seconds and the CPU seconds its workers spent on them."""
    with urllib.request.urlopen(proc_url, timeout=10) as resp:  # noqa: S310 (http://127.0.0.1)
        text = resp.read().decode()
    found = dict.fromkeys(KEY_METRICS, 0.0)
    for line in text.splitlines():
        for what, name in KEY_METRICS.items():
            if line.startswith(name + " "):
                found[what] = float(line.split()[-1])
    return found


class DraBench:
    """The DRA phase of one bench run (see the module doc), on the runner's control plane."""

    def __init__(self, bench: Harness, kube_scheduler: str) -> None:
        """``kube_scheduler``: the profile that allocates and binds (arm B2's)."""
        assert bench.cluster is not None and bench.raw is not None
        self.bench, self.raw, self.scale = bench, bench.raw, bench.scale
        self.kube_scheduler = kube_scheduler
        self.plan = self.scale.dra_plan
        self.metrics_url = ""

    def publish(self) -> None:
        """The DeviceClass and one ResourceSlice per kwok node (8 GPUs each)."""
        self.raw.post("/apis/resource.k8s.io/v1/deviceclasses", localdra.device_class(), ok=(201, 409))
        nodes = [node_name(i) for i in range(self.plan.nodes)]
        bodies = [json.dumps(localdra.resource_slice(n, localdra.node_gpus(n, GPUS))).encode() for n in nodes]
        run_parallel(
            self.scale.create_threads, lambda b: self.raw.request("POST", SLICES, b, ok=(201, 409)), bodies
        )

    def start_scheduler(self) -> None:
        cluster = self.bench.cluster
        assert cluster is not None
        create_namespace(self.raw, DRA_SYSTEM_NS)
        values = {
            **scheduler_chart_values(DRA_SCHEDULER),
            "injection": {"mode": "policy"},
            "webhook": {"enabled": False},
            "dra": {"enabled": True},
        }
        objects = render_rbac(cluster, "gpu-scheduler-bench-dra", DRA_SYSTEM_NS, "scheduler", values)
        cluster.apply(objects)
        (sa,) = [d["metadata"]["name"] for d in objects if d["kind"] == "ServiceAccount"]
        proc = run_scheduler(
            cluster.service_account_kubeconfig(DRA_SYSTEM_NS, sa),
            env={
                "POD_NAME": "bench-dra",
                "POD_NAMESPACE": DRA_SYSTEM_NS,
                "GPU_SCHEDULER_NAME": DRA_SCHEDULER,
                "GPU_SCHEDULER_DRA": "true",
            },
            log_path=self.bench.workdir / "logs" / "gpu-scheduler-dra.log",
        )
        cluster.adopt(DRA_SCHEDULER, proc)
        self.metrics_url = http_url(proc, "/metrics")

    def stop_scheduler(self) -> None:
        cluster = self.bench.cluster
        assert cluster is not None
        for name in (DRA_SCHEDULER, DRA_KCM):
            proc = cluster.procs.pop(name, None)
            if proc is not None:
                proc.stop()

    def start_controllers(self) -> None:
        """The StatefulSet and resourceclaim controllers, tuned, for the whole phase (bench/drakt.py)."""
        cluster = self.bench.cluster
        assert cluster is not None
        cluster.start_controller_manager(DRA_KCM, DRA_CONTROLLERS, DRA_KCM_QPS, DRA_KCM_BURST)

    # -- the cluster's other claims -----------------------------------------------------------

    def foreign(self, count: int) -> None:
        """``count`` claims allocated to GPUs of slices of nodes where nothing runs here (8 per
        node), as other workloads' claims: what the controller's work must not grow with."""
        nodes = [f"other-{i}" for i in range((count + GPUS - 1) // GPUS)]
        slices = []
        for n in nodes:
            body = localdra.resource_slice(n, localdra.node_gpus(n, GPUS))
            body["metadata"]["labels"] = {PART_OF: BENCH}
            slices.append(json.dumps(body).encode())
        run_parallel(
            self.scale.create_threads, lambda b: self.raw.request("POST", SLICES, b, ok=(201, 409)), slices
        )
        create_namespace(self.raw, FOREIGN_NS)
        path = CLAIMS.format(ns=FOREIGN_NS)

        def make(i: int) -> None:
            node, minor = nodes[i // GPUS], i % GPUS
            claim = self.raw.post(
                path,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": f"other-{i}", "labels": {PART_OF: BENCH}},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]
                        }
                    },
                },
            )
            result = {"request": "gpu", "driver": dra.DRIVER, "pool": node, "device": f"gpu-{minor}"}
            claim["status"] = {"allocation": {"devices": {"results": [result]}}}
            self.raw.request("PUT", f"{path}/other-{i}/status", json.dumps(claim).encode(), ok=(200,))

        start, end = run_parallel(self.scale.create_threads, make, range(count))
        self.bench.results.memory_notes["dra_foreign"] = (
            f"{count} other claims allocated on {len(nodes)} other nodes' slices (made in {end - start:.0f} s)"
        )

    def drop_foreign(self) -> None:
        self.raw.delete(f"{CLAIMS.format(ns=FOREIGN_NS)}?labelSelector={PART_OF_BENCH}")
        self.raw.delete(f"{SLICES}?labelSelector={PART_OF_BENCH}")
        self.drain(FOREIGN_NS)

    def drain(self, namespace: str, timeout: float = 300) -> None:
        """Delete the namespace's pods, then its claims, and wait until none is left (the next
        run's claims want the same devices), then the namespace.

        The claims' finalizers are taken off by the harness: the resourceclaim controller would
        deallocate them and take them off itself, two writes per claim under
        kube-controller-manager's client limit (20 QPS), a minute per run at 500 claims.
        """
        deadline = time.monotonic() + timeout
        self.raw.delete(f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
        while self.raw.list_items(f"/api/v1/namespaces/{namespace}/pods?limit=1"):
            if time.monotonic() > deadline:
                raise ApiError(f"pods of {namespace} still there after {timeout:.0f} s")
            time.sleep(0.5)
        path = CLAIMS.format(ns=namespace)

        def release(name: str) -> None:
            self.raw.request(
                "PATCH",
                f"{path}/{name}",
                b'{"metadata":{"finalizers":null}}',
                ok=(200, 404),
                content_type="application/merge-patch+json",
            )

        names = [c["metadata"]["name"] for c in self.raw.list_items(path)]
        self.raw.delete(path)
        run_parallel(self.scale.create_threads, release, names)
        while self.raw.list_items(path + "?limit=1"):
            if time.monotonic() > deadline:
                raise ApiError(f"claims of {namespace} still there after {timeout:.0f} s")
            time.sleep(0.5)
        self.raw.delete(f"/api/v1/namespaces/{namespace}")

    # -- one run ----------------------------------------------------------------------------

    def run_arm(self, arm: str, rep: int) -> Run:
        plan, raw = self.plan, self.raw
        ns = self.bench.namespace(f"{arm}-{plan.key}")
        pods = dra_pods(plan, scheduler_name=self.kube_scheduler, gated=arm != "K")
        names = [p.name for p in pods]
        controller = arm in ("D", "DF")
        create: Any = creator(raw, ns)
        items: list[Any] = pods
        try:
            if arm == "K":
                run_parallel(
                    self.scale.create_threads,
                    lambda b: raw.request("POST", CLAIMS.format(ns=ns), b, ok=(201,)),
                    claim_bodies(plan, ns),
                )
            if arm == "KT":  # the team's template exists beforehand; the clock starts at the StatefulSets
                raw.post(TEMPLATES.format(ns=ns), claim_template(), ok=(201,))
                names, items = pod_names(plan), statefulsets(plan, self.kube_scheduler)

                def create(body: bytes) -> None:
                    raw.request("POST", STATEFULSETS.format(ns=ns), body, ok=(201,))

            self.bench.settle()  # the previous arm's drain is not this arm's to pay for
            watch = PodWatch(raw, ns).start()
            keys_before = key_metrics(self.metrics_url) if controller else {}
            cpu_before = self.bench.cpu()
            try:
                start, _ = run_parallel(self.scale.create_threads, create, items)
                if not watch.wait_bound(len(names), self.scale.timeout):
                    raise ApiError(
                        f"{arm}: only {len(watch.bound)} of {len(names)} pods bound in {self.scale.timeout:.0f} s"
                    )
                cpu_used = {k: round(v - cpu_before.get(k, 0.0), 3) for k, v in self.bench.cpu().items()}
                last = max(watch.bound.values())
                latencies = [watch.bound[n] - watch.seen[n] for n in names]
            finally:
                watch.stop()
            seconds = last - start
            run = Run(
                arm,
                plan.key,
                rep,
                len(names),
                seconds,
                len(names) / seconds,
                percentile(latencies, 50),
                percentile(latencies, 99),
            )
            run.cpu, run.watch_resumed = cpu_used, watch.resumed
            run.end_lag = max(0.0, last - max(watch.seen.values()))
            if controller:
                time.sleep(1)  # the last keys (the pin checks after binding) finish
                after = key_metrics(self.metrics_url)
                keys = after["count"] - keys_before["count"]
                run.dra_keys = int(keys)
                run.dra_key_ms = 1000 * (after["seconds"] - keys_before["seconds"]) / max(1.0, keys)
                run.dra_key_cpu_ms = 1000 * (after["cpu"] - keys_before["cpu"]) / max(1.0, keys)
            run.problems = check_kt(raw, ns, plan) if arm == "KT" else check_dra(raw, ns, plan)
        finally:
            if arm == "KT":  # first the StatefulSets, or their controller makes the replicas again
                raw.delete(STATEFULSETS.format(ns=ns))
            self.drain(ns)
        return run

    def run(self) -> None:
        self.publish()
        self.start_scheduler()
        try:
            self.start_controllers()
            # D and KT run more repetitions than K (Scale.dra_reps): D/KT is the median of the
            # ratios within each, as A/B2's.
            for rep in range(max(self.scale.reps, self.scale.dra_reps)):
                arms = ("D", "K", "KT") if rep < self.scale.reps else ("D", "KT")
                for arm in arms[rep % len(arms) :] + arms[: rep % len(arms)]:
                    self.bench.record(
                        self.run_arm(arm, rep), f"{self.plan.label} {arm} ({DRA_ARM_NAMES[arm]})"
                    )
            self.foreign(self.scale.dra_foreign)
            try:
                for rep in range(self.scale.reps):
                    self.bench.record(
                        self.run_arm("DF", rep), f"{self.plan.label} DF ({DRA_ARM_NAMES['DF']})"
                    )
            finally:
                self.drop_foreign()
        finally:
            self.stop_scheduler()
