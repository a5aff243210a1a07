"""DRA mode on the real kube-apiserver, with the control plane's kube-scheduler allocating.

Each test gets two kwok GPU nodes of its own with ResourceSlices shaped like NVIDIA's DRA
driver's (4 GPUs each; node "a" has its PCI buses out of minor order, so "index = PCI bus
ID order" is really exercised), the chart's injection policy rendered in DRA mode for a
scheduler name of its own, and the gpu-scheduler (host process, the chart's DRA RBAC) with
GPU_SCHEDULER_DRA on. kube-scheduler (the control plane's, default-scheduler) allocates
every claim: the replicas' and the foreign ones.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.podinfo import entry_for
from localcluster import dra as localdra
from localcluster.cluster import REPO, Cluster, tool
from localcluster.procs import ManagedProcess
from localcluster.rbac import chart_identity, render_chart, scheduler_chart_values
from localcluster.scheduler_host import http_url, run_scheduler
from tests.integration.fixtures_scheduler import statefulset
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

GPUS = 4
# Node "a" publishes its GPUs with PCI buses out of minor order: index i is not gpu-i.
BUSES = {"a": ["0xc1", "0x3b", "0x86", "0x1a"], "b": ["0x1a", "0x3b", "0x86", "0xc1"]}


gpu_uuid = localdra.gpu_uuid


def slice_body(
    node: str,
    buses: list[str],
    generation: int = 1,
    uuids: dict[int, str] | None = None,
    first_minor: int = 0,
) -> dict[str, Any]:
    """Node ``node``'s slice (localcluster/dra.py's shape) with the GPUs on ``buses``, by minor."""
    gpus = [
        localdra.Gpu(minor, (uuids or {}).get(minor, gpu_uuid(node, minor)), f"0000:{int(bus, 16):02x}:00.0")
        for minor, bus in enumerate(buses, start=first_minor)
    ]
    return localdra.resource_slice(node, gpus, generation)


DEVICE_CLASS = localdra.device_class()


@dataclass
class Dra:
    cluster: Cluster
    namespace: str
    scheduler_name: str
    nodes: dict[str, str]  # "a" -> real node name
    start: Callable[[], ManagedProcess]
    procs: list[ManagedProcess]
    scheduler_kubeconfig: Any = None
    # The chart's map-topology policy and binding (not applied here) and (namespace, name) of the
    # ConfigMap the scheduler publishes the nodes' topology to, which the binding names.
    topology: list[dict[str, Any]] = field(default_factory=list)
    topology_configmap: tuple[str, str] = ("", "")

    def start_scheduler(self) -> None:
        self.procs.append(self.start())

    def stop_scheduler(self) -> None:
        self.procs[-1].stop()

    def cached(self, resource: str) -> float:
        """How many objects of ``resource`` the running scheduler's watch holds now (its
        ``gpu_scheduler_watch_cache_objects``): a test waits on it for the scheduler to have seen
        an object it made, where the order of two watches' events is not given."""
        import urllib.request

        with urllib.request.urlopen(http_url(self.procs[-1], "/metrics"), timeout=5) as resp:
            text = resp.read().decode()
        want = f'gpu_scheduler_watch_cache_objects{{resource="{resource}"}} '
        return next((float(line[len(want) :]) for line in text.splitlines() if line.startswith(want)), 0.0)

    def get(self, kind: str, name: str | None = None, *, all_ns: bool = False) -> Any:
        where = ["-A"] if all_ns else ["-n", self.namespace]
        return self.cluster.get_json(kind, *([name] if name else []), *where) or None

    def devices(self, short: str) -> list[dra.Device]:
        return dra.node_devices(self.get("resourceslices", all_ns=True)["items"], self.nodes[short])

    def statefulset(self, name: str, sched_map: str, replicas: int) -> dict[str, Any]:
        """The scheduler tests' StatefulSet (Parallel, kwok runs it), for this test's scheduler."""
        sts = statefulset(name, sched_map, replicas, scheduler_name=self.scheduler_name)
        sts["metadata"]["namespace"] = self.namespace
        return sts

    def foreign_pod(self, name: str, short: str) -> list[dict[str, Any]]:
        """A pod of kube-scheduler's with a claim for any GPU, pinned to node ``short``."""
        return [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]
                    }
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": self.nodes[short]},
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            },
        ]

    def claim(self, name: str) -> dict[str, Any] | None:
        found = self.get("resourceclaim", name)
        return found if isinstance(found, dict) else None

    def pod(self, name: str) -> dict[str, Any] | None:
        found = self.get("pod", name)
        return found if isinstance(found, dict) else None

    def events(self, pod: str, reason: str) -> list[str]:
        items = self.get("events")["items"]
        return [
            e.get("note") or e.get("message") or ""
            for e in items
            if e.get("reason") == reason
            and (e.get("regarding") or e.get("involvedObject") or {}).get("name") == pod
        ]

    def placed(self, pod_name: str) -> dict[str, Any] | None:
        """The pod when it runs on its entry's node with its claim allocated exactly the entry's GPUs."""
        found = self.placement(pod_name)
        return found[0] if found else None

    def placed_claim(self, pod_name: str) -> dict[str, Any] | None:
        """The claim :meth:`placed` found allocated for the pod's entry, as it read it: a condition
        on the claim must use this read, not a second one (the scheduler may replace the claim
        in between, and the second read sees the next claim, not yet allocated, or none)."""
        found = self.placement(pod_name)
        return found[1] if found else None

    def placement(self, pod_name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        pod = self.pod(pod_name)
        if not pod or not pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
            return None
        _, entry = entry_for(pod["metadata"])
        claim = self.claim(dra.pod_claim_name(pod) or "")
        if entry is None or claim is None:
            return None
        assert pod["spec"]["nodeName"] == entry.node, (
            f"{pod_name} on {pod['spec']['nodeName']}, not {entry.node}"
        )
        if not dra.matches(claim, entry, dra.resolve(entry, self.devices_of(entry.node))):
            return None
        return pod, claim

    def devices_of(self, node: str) -> list[dra.Device]:
        return dra.node_devices(self.get("resourceslices", all_ns=True)["items"], node)


def allocated_to(claims: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(pool, device) -> the claims allocated it (to find any device given twice)."""
    out: dict[tuple[str, str], list[str]] = {}
    for c in claims:
        for a in dra.allocation(c):
            out.setdefault((a.pool, a.device), []).append(
                f"{c['metadata']['namespace']}/{c['metadata']['name']}"
            )
    return out


def no_device_twice(env: Dra) -> None:
    twice = {
        k: v for k, v in allocated_to(env.get("resourceclaims", all_ns=True)["items"]).items() if len(v) > 1
    }
    assert not twice, f"devices allocated to two claims: {twice}"


@pytest.fixture
def dra_env(cluster: Cluster, namespace: str, tmp_path: Any) -> Iterator[Dra]:
    suffix = namespace.removeprefix("t-")
    name = f"gpu-dra-{suffix}"
    nodes = {short: f"dra-{suffix}-{short}" for short in ("a", "b")}
    for node in nodes.values():
        cluster.add_node(node, GPUS)
    cluster.apply(DEVICE_CLASS)
    for short, node in nodes.items():
        cluster.apply(slice_body(node, BUSES[short]))
    values = {
        **scheduler_chart_values(name),
        "injection": {"mode": "policy"},
        "dra": {"enabled": True},
        "webhook": {"enabled": False},
    }
    # The chart's injection policy in DRA mode (a release in gpu-system: the policy skips its
    # own namespace), and the pods policy of this test's scheduler identity, which lets its
    # ServiceAccount remove the scheduling gate and nothing more.
    injection = render_chart(cluster, f"dra-{suffix}", "gpu-system", values)
    guard = render_chart(cluster, f"gs-{namespace}", namespace, values)
    policies = [
        d for d in injection if d["kind"] in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    ] + [
        d
        for d in guard
        if d["kind"].startswith("ValidatingAdmissionPolicy") and d["metadata"]["name"].endswith("-pods")
    ]
    assert len(policies) == 4, [(d["kind"], d["metadata"]["name"]) for d in policies]
    topology = [
        d
        for d in guard
        if d["kind"].startswith("ValidatingAdmissionPolicy")
        and d["metadata"]["name"].endswith("-map-topology")
    ]
    ref = next(d for d in topology if d["kind"].endswith("Binding"))["spec"]["paramRef"]
    cluster.apply(policies)
    with chart_identity(cluster, namespace, "scheduler", f"gs-{namespace}", values) as ident:
        procs: list[ManagedProcess] = []

        def start() -> ManagedProcess:
            return run_scheduler(
                ident.kubeconfig,
                env={
                    "POD_NAME": "dra-a",
                    "POD_NAMESPACE": namespace,
                    "GPU_SCHEDULER_NAME": name,
                    "GPU_SCHEDULER_LOG_LEVEL": "DEBUG",
                    "GPU_SCHEDULER_DRA": "true",
                    "GPU_SCHEDULER_DRA_TOPOLOGY": f"{ref['namespace']}/{ref['name']}",
                },
                log_path=tmp_path / f"scheduler-{len(procs)}.log",
            )

        env = Dra(
            cluster,
            namespace,
            name,
            nodes,
            start,
            procs,
            ident.kubeconfig,
            topology,
            (ref["namespace"], ref["name"]),
        )
        env.start_scheduler()
        try:
            # The apiserver loads a new policy within about a second: probe with a dry run.
            probe = env.statefulset("probe", f"0={nodes['a']}:0", 1)
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "probe-0",
                    "namespace": namespace,
                    "labels": {"apps.kubernetes.io/pod-index": "0"},
                    "annotations": probe["spec"]["template"]["metadata"]["annotations"],
                },
                "spec": probe["spec"]["template"]["spec"],
            }

            def policy_loaded() -> bool:
                out = cluster.kubectl(
                    "create",
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                    input=yaml.safe_dump(pod),
                    check=False,
                )
                if out.returncode != 0:
                    print("probe:", out.stderr[-600:])
                    return False
                return bool(json.loads(out.stdout)["spec"].get("resourceClaims"))

            wait_for(policy_loaded, 30, what="the DRA injection policy to be loaded")
            yield env
        finally:
            for proc in procs:
                proc.stop()
                print(f"--- {proc.log_path} (last 80 lines) ---\n{proc.log_text(80)}")
            for d in policies:
                cluster.kubectl(
                    "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found", check=False
                )
            cluster.kubectl(
                "delete", "statefulsets,pods", "--all", "-n", namespace, "--wait=false", check=False
            )
            for node in nodes.values():
                cluster.kubectl(
                    "delete", "resourceslice", f"{node}-gpu.nvidia.com", "--ignore-not-found", check=False
                )
                cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)


def test_replicas_get_exactly_their_gpus_and_keep_them(dra_env: Dra) -> None:
    env = dra_env
    a, b = env.nodes["a"], env.nodes["b"]
    # Index 0 on node a is the GPU on the lowest bus (gpu-3, bus 0x1a), not gpu-0.
    env.cluster.apply(env.statefulset("w", f"0={a}:0\n1={a}:2,1\n2={b}:3", 3))
    for i in range(3):
        wait_for(lambda i=i: env.placed(f"w-{i}"), 90, what=f"w-{i} placed with its claim allocated")
    devs = env.devices("a")
    assert devs[0].name == "gpu-3" and devs[0].pci_bus_id == "0000:1a:00.0"
    claim0 = env.claim("w-0-gpus")
    assert claim0 is not None
    assert [x.device for x in dra.allocation(claim0)] == ["gpu-3"]
    assert [x.device for x in dra.allocation(env.claim("w-1-gpus") or {})] == ["gpu-2", "gpu-1"]
    # What the container gets: the claim, no CUDA_VISIBLE_DEVICES (the driver mounts only these GPUs).
    pod0 = env.pod("w-0") or {}
    main = pod0["spec"]["containers"][0]
    assert main["resources"]["claims"] == [{"name": dra.POD_CLAIM}]
    assert {e["name"] for e in main.get("env", [])} == {"CUDA_DEVICE_ORDER"}
    assert pod0["spec"]["schedulerName"] == "default-scheduler"
    # Pinned: the StatefulSet is a consumer too, so the allocation outlives the pod.
    wait_for(
        lambda: any(
            r.get("resource") == "statefulsets"
            for r in ((env.claim("w-0-gpus") or {}).get("status") or {}).get("reservedFor", [])
        ),
        60,
        what="w-0-gpus pinned by its StatefulSet",
    )
    assert env.events("w-0", "ClaimCreated"), "no ClaimCreated event on w-0"

    # A recreated replica, with the gpu-scheduler down the whole time: the new pod waits behind
    # its gate, and the claim stays allocated (pinned by the StatefulSet) while two foreign
    # pods ask for any GPU on node a. Only gpu-0 is free: one gets it, the other waits, and
    # neither gets w-0's gpu-3.
    uid = claim0["metadata"]["uid"]
    env.stop_scheduler()
    old_pod = (env.pod("w-0") or {})["metadata"]["uid"]
    env.cluster.kubectl("delete", "pod", "w-0", "-n", env.namespace, "--wait=true")
    wait_for(
        lambda: (env.pod("w-0") or {}).get("metadata", {}).get("uid") not in (None, old_pod),
        60,
        what="w-0 recreated by its StatefulSet",
    )
    assert dra.gated(env.pod("w-0") or {}), "the new w-0 is not behind its scheduling gate"
    env.cluster.apply(env.foreign_pod("f1", "a") + env.foreign_pod("f2", "a"))
    wait_for(
        lambda: any(dra.allocation(env.claim(f) or {}) for f in ("f1", "f2")),
        60,
        what="a foreign claim allocated",
    )
    wait_for(
        lambda: all((env.pod(f) or {}).get("status", {}).get("conditions") for f in ("f1", "f2")),
        60,
        what="f1 and f2 looked at by kube-scheduler",
    )
    got = sorted(x.device for f in ("f1", "f2") for x in dra.allocation(env.claim(f) or {}))
    assert got == ["gpu-0"], f"the foreign pods got {got}: only gpu-0 was free"
    assert [x.device for x in dra.allocation(env.claim("w-0-gpus") or {})] == ["gpu-3"], (
        "w-0's claim lost gpu-3"
    )
    env.start_scheduler()
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed again")
    again = env.claim("w-0-gpus") or {}
    assert again["metadata"]["uid"] == uid, "the replica's claim was made anew"
    assert [x.device for x in dra.allocation(again)] == ["gpu-3"]
    no_device_twice(env)

    # Scale down: w-2's claim is unpinned and deleted, and its GPU goes to whoever asks.
    env.cluster.kubectl("scale", "statefulset", "w", "--replicas=2", "-n", env.namespace)
    wait_for(lambda: env.claim("w-2-gpus") is None, 90, what="w-2-gpus deleted after the scale-down")


def test_a_replica_waits_for_a_gpu_a_foreign_claim_holds(dra_env: Dra) -> None:
    env = dra_env
    a = env.nodes["a"]
    for i in range(GPUS):
        env.cluster.apply(env.foreign_pod(f"f{i}", "a"))
    for i in range(GPUS):
        wait_for(
            lambda i=i: dra.allocation(env.claim(f"f{i}") or {}), 60, what=f"foreign claim f{i} allocated"
        )
    holder = next(
        f"f{i}"
        for i in range(GPUS)
        if [x.device for x in dra.allocation(env.claim(f"f{i}") or {})] == ["gpu-3"]
    )
    env.cluster.apply(env.statefulset("w", f"0={a}:0", 1))
    wait_for(
        lambda: any(holder in n for n in env.events("w-0", "GPUAllocatedElsewhere")),
        60,
        what=f"a GPUAllocatedElsewhere event on w-0 naming {holder}",
    )
    assert not (env.pod("w-0") or {}).get("spec", {}).get("nodeName")
    assert not dra.allocation(env.claim("w-0-gpus") or {})
    env.cluster.kubectl("delete", "pod", holder, "-n", env.namespace, "--wait=true")
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed once the foreign pod is gone")
    no_device_twice(env)


def test_an_index_that_does_not_exist_waits_with_an_event(dra_env: Dra) -> None:
    env = dra_env
    b = env.nodes["b"]
    env.cluster.apply(env.statefulset("w", f"0={b}:4", 1))
    wait_for(lambda: env.events("w-0", "GPUNotPublished"), 60, what="a GPUNotPublished event on w-0")
    note = env.events("w-0", "GPUNotPublished")[0]
    assert "GPU index 4 does not exist" in note and "4 GPUs" in note, note
    assert env.claim("w-0-gpus") is None
    # The driver publishes a fifth GPU: the claim is made and the replica placed.
    env.cluster.apply(slice_body(b, [*BUSES["b"], "0xe1"], generation=2))
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed once the slice publishes index 4")
    assert [x.device for x in dra.allocation(env.claim("w-0-gpus") or {})] == ["gpu-4"]


def test_a_map_edit_replaces_the_claim(dra_env: Dra) -> None:
    env = dra_env
    a = env.nodes["a"]
    env.cluster.apply(env.statefulset("w", f"0={a}:0", 1))
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed")
    first = (env.claim("w-0-gpus") or {})["metadata"]["uid"]
    env.cluster.apply(env.statefulset("w", f"0={a}:1", 1))
    wait_for(
        lambda: (env.placed_claim("w-0") or {"metadata": {"uid": first}})["metadata"]["uid"] != first,
        120,
        what="w-0 placed again with a new claim for index 1",
    )
    assert [x.device for x in dra.allocation(env.claim("w-0-gpus") or {})] == ["gpu-1"]
    no_device_twice(env)


def test_two_replicas_trade_gpus_in_a_rolling_update(dra_env: Dra) -> None:
    """OrderedReady, RollingUpdate: the new w-1 wants w-0's GPU, which w-0's pinned claim holds.
    The outdated w-0 is evicted (EvictedForRollout), gets its new claim, and both end on their
    new GPUs; no device is allocated twice at any moment we look."""
    env = dra_env
    a = env.nodes["a"]
    sts = env.statefulset("w", f"0={a}:0\n1={a}:1", 2)
    sts["spec"]["podManagementPolicy"] = "OrderedReady"
    env.cluster.apply(sts)
    for i in range(2):
        wait_for(lambda i=i: env.placed(f"w-{i}"), 90, what=f"w-{i} placed")
    swapped = env.statefulset("w", f"0={a}:1\n1={a}:0", 2)
    swapped["spec"]["podManagementPolicy"] = "OrderedReady"
    env.cluster.apply(swapped)

    def both_swapped() -> bool:
        no_device_twice(env)
        return all(
            (env.placed_claim(f"w-{i}") or {"metadata": {"annotations": {}}})["metadata"]["annotations"].get(
                dra.ENTRY_ANNOTATION
            )
            == f"{i}={a}:{1 - i}"
            for i in range(2)
        )

    wait_for(both_swapped, 180, what="w-0 and w-1 placed on each other's GPUs")
    devs = env.devices("a")
    assert [x.device for x in dra.allocation(env.claim("w-0-gpus") or {})] == [devs[1].name]
    assert [x.device for x in dra.allocation(env.claim("w-1-gpus") or {})] == [devs[0].name]
    assert env.events("w-0", "EvictedForRollout"), "the outdated w-0 was not evicted for the rollout"


def test_a_holder_of_another_statefulset_is_named_not_evicted(dra_env: Dra) -> None:
    """a's replica is mapped to the GPU b's replica holds (b's pinned claim): by default the one
    rollout eviction decision evicts only an outdated replica of the waiting pod's own
    StatefulSet, so b-0 stays, and a-0's GPUAllocatedElsewhere names both workloads and the way
    out. Taking it (b's map moves b-0 elsewhere) places both, with no device given twice."""
    env = dra_env
    a = env.nodes["a"]
    env.cluster.apply(env.statefulset("b", f"0={a}:0", 1))
    wait_for(lambda: env.placed("b-0"), 90, what="b-0 placed")
    b0 = (env.pod("b-0") or {})["metadata"]["uid"]
    env.cluster.apply(env.statefulset("a", f"0={a}:0", 1))
    ns = env.namespace
    wait_for(
        lambda: any(
            f"Pod {ns}/b-0: it belongs to another workload, StatefulSet {ns}/b, not to the waiting pod's "
            f"StatefulSet {ns}/a" in n
            for n in env.events("a-0", "GPUAllocatedElsewhere")
        ),
        60,
        what="a GPUAllocatedElsewhere event on a-0 naming b-0 and both workloads",
    )
    note = env.events("a-0", "GPUAllocatedElsewhere")[-1]
    assert f"ResourceClaim {ns}/b-0-gpus (pod {ns}/b-0)" in note, note
    assert "GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS=true" in note and f"delete pod {ns}/b-0" in note, note
    assert (env.pod("b-0") or {})["metadata"]["uid"] == b0, "b-0 was replaced"
    assert not env.events("b-0", "EvictedForRollout"), "b-0 was evicted"
    assert not (env.pod("a-0") or {})["spec"].get("nodeName")
    # The way out the note gives: change one of the two maps.
    env.cluster.apply(env.statefulset("b", f"0={a}:2", 1))
    for name in ("a-0", "b-0"):
        wait_for(lambda name=name: env.placed(name), 120, what=f"{name} placed")  # type: ignore[misc]
    devs = env.devices("a")
    assert [x.device for x in dra.allocation(env.claim("a-0-gpus") or {})] == [devs[0].name]
    assert [x.device for x in dra.allocation(env.claim("b-0-gpus") or {})] == [devs[2].name]
    assert not env.events("b-0", "EvictedForRollout")
    no_device_twice(env)


def test_a_gpu_that_disappears_under_an_allocated_claim(dra_env: Dra) -> None:
    """The driver stops publishing an allocated GPU (it fell off the bus): the allocation stays,
    the replica gets an AllocatedGPUGone event naming the GPU, and the GPU is given to nobody."""
    env = dra_env
    a = env.nodes["a"]
    env.cluster.apply(env.statefulset("w", f"0={a}:3", 1))
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed")
    held = [x.device for x in dra.allocation(env.claim("w-0-gpus") or {})]
    assert held == ["gpu-0"]  # bus 0xc1, the highest on node a: index 3
    env.cluster.apply(slice_body(a, BUSES["a"][1:], generation=2, first_minor=1))
    wait_for(lambda: env.events("w-0", "AllocatedGPUGone"), 60, what="an AllocatedGPUGone event on w-0")
    note = env.events("w-0", "AllocatedGPUGone")[0]
    assert "GPU index 3 does not exist" in note and "w-0-gpus" in note, note
    assert [x.device for x in dra.allocation(env.claim("w-0-gpus") or {})] == ["gpu-0"]
    for i in range(4):
        env.cluster.apply(env.foreign_pod(f"f{i}", "a"))
    wait_for(
        lambda: sum(bool(dra.allocation(env.claim(f"f{i}") or {})) for i in range(4)) == 3,
        60,
        what="three foreign claims allocated the three GPUs still published",
    )
    got = sorted(x.device for i in range(4) for x in dra.allocation(env.claim(f"f{i}") or {}))
    assert got == ["gpu-1", "gpu-2", "gpu-3"], got
    no_device_twice(env)


def test_leftover_claims_are_released_by_the_documented_commands(dra_env: Dra) -> None:
    """No gpu-scheduler in DRA mode is left (uninstalled) and the StatefulSet is deleted: its
    claims stay allocated (the pin). The commands of docs/dra.md "Leftover claims" release them."""
    env = dra_env
    a = env.nodes["a"]
    env.cluster.apply(env.statefulset("w", f"0={a}:0", 1))
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed")
    wait_for(
        lambda: any(
            r.get("resource") == "statefulsets"
            for r in ((env.claim("w-0-gpus") or {}).get("status") or {}).get("reservedFor", [])
        ),
        60,
        what="w-0-gpus pinned",
    )
    env.stop_scheduler()
    env.cluster.kubectl("delete", "statefulset", "w", "-n", env.namespace, "--wait=true")
    wait_for(lambda: env.pod("w-0") is None, 60, what="w-0 gone")
    # The garbage collector deletes the claim, which stays Terminating and allocated.
    wait_for(
        lambda: (env.claim("w-0-gpus") or {}).get("metadata", {}).get("deletionTimestamp"),
        60,
        what="w-0-gpus deleted by the garbage collector",
    )
    assert dra.allocation(env.claim("w-0-gpus") or {}), "the pinned claim lost its allocation by itself"
    text = (REPO / "docs" / "dra.md").read_text()
    script = text.split("## Leftover claims", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        check=False,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "KUBECONFIG": str(env.cluster.kubeconfig),
            "PATH": f"{tool('kubectl').parent}:{os.environ['PATH']}",
        },
        timeout=120,
    )
    assert done.returncode == 0, f"docs/dra.md's commands failed: {done.stderr}"
    wait_for(lambda: env.claim("w-0-gpus") is None, 60, what="w-0-gpus released and gone")


def test_the_schedulers_token_may_remove_the_claim_gate_and_nothing_else(dra_env: Dra) -> None:
    """DRA mode grants the scheduler's ServiceAccount pods patch (cluster-wide RBAC cannot say
    which field); the pods policy lets it remove the gate gpu-scheduler.io/claim only."""
    env = dra_env
    env.stop_scheduler()  # the pod keeps its gate
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated", "namespace": env.namespace, "labels": {"app": "x"}},
        "spec": {
            "schedulingGates": [{"name": "example.com/other"}, {"name": dra.GATE}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    env.cluster.apply(pod)

    def patch(ops: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
        return env.cluster.kubectl(
            "patch",
            "pod",
            "gated",
            "-n",
            env.namespace,
            "--type=json",
            "-p",
            json.dumps(ops),
            kubeconfig=env.scheduler_kubeconfig,
            check=False,
        )

    refused = {
        "a label": [{"op": "add", "path": "/metadata/labels/stolen", "value": "yes"}],
        "another gate": [{"op": "remove", "path": "/spec/schedulingGates/0"}],
        "a label, with the gate": [
            {"op": "add", "path": "/metadata/labels/stolen", "value": "yes"},
            {"op": "remove", "path": "/spec/schedulingGates/1"},
        ],
        "the image, with the gate": [
            {"op": "replace", "path": "/spec/containers/0/image", "value": "registry.k8s.io/pause:3.9"},
            {"op": "remove", "path": "/spec/schedulingGates/1"},
        ],
        "a toleration, with the gate": [
            {"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}},
            {"op": "remove", "path": "/spec/schedulingGates/1"},
        ],
    }
    for what, ops in refused.items():
        out = patch(ops)
        assert out.returncode != 0 and "remove the gpu-scheduler.io/claim" in out.stderr, (what, out.stderr)
    out = patch([{"op": "remove", "path": "/spec/schedulingGates/1"}])
    assert out.returncode == 0, out.stderr
    assert [g["name"] for g in (env.pod("gated") or {})["spec"]["schedulingGates"]] == ["example.com/other"]


def test_uuid_and_pci_bus_id_forms_are_allocated_exactly(dra_env: Dra) -> None:
    """The map names GPUs by UUID and by PCI bus ID (any case, NVML's 8-digit domain): each
    replica's claim is allocated exactly the named devices, pinned by UUID or by PCI bus ID."""
    env = dra_env
    a, b = env.nodes["a"], env.nodes["b"]
    uuid = gpu_uuid(a, 2).upper().replace("GPU-", "GPU-")
    env.cluster.apply(env.statefulset("w", f"0={a}:{uuid}\n1={b}:00000000:86:00.0,0000:1A:00.0", 2))
    for i in range(2):
        wait_for(lambda i=i: env.placed(f"w-{i}"), 90, what=f"w-{i} placed with its claim allocated")
    claim0, claim1 = env.claim("w-0-gpus") or {}, env.claim("w-1-gpus") or {}
    assert [x.device for x in dra.allocation(claim0)] == ["gpu-2"]
    assert [x.device for x in dra.allocation(claim1)] == ["gpu-2", "gpu-0"]
    selectors = [
        r["exactly"]["selectors"][0]["cel"]["expression"] for r in claim0["spec"]["devices"]["requests"]
    ]
    assert selectors == [f"device.attributes['gpu.nvidia.com'].uuid == '{gpu_uuid(a, 2)}'"]
    selectors = [
        r["exactly"]["selectors"][0]["cel"]["expression"] for r in claim1["spec"]["devices"]["requests"]
    ]
    assert selectors == [
        "device.attributes['resource.kubernetes.io'].pciBusID == '0000:86:00.0'",
        "device.attributes['resource.kubernetes.io'].pciBusID == '0000:1a:00.0'",
    ]


def test_a_uuid_that_changes_is_reported_and_never_given_twice(dra_env: Dra) -> None:
    """Hardware replaced: the UUID the map names is no longer published. A replica not yet
    placed waits with GPUNotPublished naming the UUID; once the map names the new UUID it is
    placed on it, and no device is allocated twice."""
    env = dra_env
    a = env.nodes["a"]
    old = gpu_uuid(a, 1)
    new = gpu_uuid(a, 101)
    env.cluster.apply(slice_body(a, BUSES["a"], generation=2, uuids={1: new}))
    env.cluster.apply(env.statefulset("w", f"0={a}:{old}", 1))
    wait_for(lambda: env.events("w-0", "GPUNotPublished"), 60, what="a GPUNotPublished event on w-0")
    note = env.events("w-0", "GPUNotPublished")[0]
    assert f"no GPU with UUID {old} on node {a}" in note, note
    assert env.claim("w-0-gpus") is None
    env.cluster.apply(env.statefulset("w", f"0={a}:{new}", 1))
    wait_for(
        lambda: (
            env.placed("w-0") and [x.device for x in dra.allocation(env.claim("w-0-gpus") or {})] == ["gpu-1"]
        ),
        120,
        what="w-0 placed on the GPU with the new UUID",
    )
    no_device_twice(env)


def test_gpus_named_by_uuid_and_pci_bus_id_get_exactly_those_devices(dra_env: Dra) -> None:
    """The map's other two forms, written as nvidia-smi prints them (upper case, NVML's 8-digit
    domain) on two lines of one `;`-separated line: each replica's claim gets exactly those GPUs."""
    env = dra_env
    a, b = env.nodes["a"], env.nodes["b"]
    devs_a, devs_b = env.devices("a"), env.devices("b")
    by_uuid = [devs_a[2], devs_a[0]]
    by_pci = devs_b[1]
    domain, rest = by_pci.pci_bus_id.split(":", 1)
    nvml_pci = f"0000{domain}:{rest}".upper()
    smap = f"0={a}:{by_uuid[0].uuid.upper()}, {by_uuid[1].uuid}; 1 = {b} : {nvml_pci}\n"
    env.cluster.apply(env.statefulset("named", smap, 2))
    for i in range(2):
        wait_for(lambda i=i: env.placed(f"named-{i}"), 90, what=f"named-{i} placed with its claim allocated")
    assert [x.device for x in dra.allocation(env.claim("named-0-gpus") or {})] == [d.name for d in by_uuid]
    assert [x.device for x in dra.allocation(env.claim("named-1-gpus") or {})] == [by_pci.name]
    assert (env.pod("named-1") or {})["spec"]["nodeName"] == b
