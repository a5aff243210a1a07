"""Replicas that share a GPU in DRA mode, on the real kube-apiserver with the control plane's
kube-scheduler allocating (the fixture of test_dra.py: two kwok GPU nodes with NVIDIA-shaped
ResourceSlices, the chart's injection policy, the gpu-scheduler in DRA mode).

A device is allocated to one claim, so the replicas that share it reference one ResourceClaim
(kube_gpu_scheduler/domain/draclaims.py, docs/dra.md "Shared GPUs"): the injection policy
gives each pod the claims of the layout (checked here against the Python layout), the
gpu-scheduler makes them, kube-scheduler allocates the shared claim once and reserves it for
every sharer (``status.reservedFor``), a foreign claim never gets that GPU while a sharer holds
it, and the claim is released once no sharer's entry needs it."""

from __future__ import annotations

import json
from typing import Any

from kube_gpu_scheduler.domain import dra, draclaims
from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION
from kube_gpu_scheduler.domain.podinfo import entry_for, pod_map
from kube_gpu_scheduler.domain.rules import GANG_WAITING
from kube_gpu_scheduler.domain.rules.catalogue import EVICTED_FOR_ROLLOUT
from kube_gpu_scheduler.domain.schedmap import parse
from tests.integration.test_dra import Dra, dra_env, no_device_twice  # noqa: F401  (the fixture)
from tests.support.mapcorpus import large_map
from tests.support.waiting import wait_for


def placed_all(env: Dra, pod_name: str) -> dict[str, dict[str, Any]] | None:
    """``{claim name: claim}`` when the pod runs on its entry's node, references exactly the claims
    of its layout, and each is allocated exactly its part's devices and reserved for the pod."""
    pod = env.pod(pod_name)
    if not pod or not pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
        return None
    ordinal, entry = entry_for(pod["metadata"])
    smap = pod_map(pod["metadata"])
    assert entry is not None and ordinal is not None and smap is not None
    assert pod["spec"]["nodeName"] == entry.node
    parts = draclaims.layout(smap, ordinal, pod_name)
    assert dra.pod_claims(pod) == {p.ref: p.name for p in parts}, (pod["spec"]["resourceClaims"], parts)
    devices = env.devices_of(entry.node)
    out = {}
    for part in parts:
        claim = env.claim(part.name)
        if claim is None or not dra.matches(claim, part.entry, dra.resolve(part.entry, devices)):
            return None
        if pod["metadata"]["uid"] not in {r.get("uid") for r in dra.pod_refs(claim)}:
            return None
        out[part.name] = claim
    return out


def reserved_pods(claim: dict[str, Any] | None) -> set[str]:
    return {str(r.get("name")) for r in dra.pod_refs(claim or {})}


def pinned(claim: dict[str, Any] | None) -> bool:
    return any(dra.is_pin(r) for r in ((claim or {}).get("status") or {}).get("reservedFor") or [])


def test_the_tasks_sharers_reference_one_claim_that_no_foreign_claim_gets(dra_env: Dra) -> None:  # noqa: F811
    env = dra_env
    a, b = env.nodes["a"], env.nodes["b"]
    # The task's map on two nodes: replicas 3 and 4 share node a's GPU 3.
    smap = f"0={a}:0,1\n1={b}:2\n2={b}:0,1\n3={a}:3\n4={a}:3\n"
    env.cluster.apply(env.statefulset("w", smap, 5))
    for i in range(5):
        wait_for(lambda i=i: placed_all(env, f"w-{i}"), 120, what=f"w-{i} placed with its claims allocated")
    shared = "w-3-shared-3"
    for name in ("w-3", "w-4"):
        pod = env.pod(name) or {}
        assert dra.pod_claims(pod) == {"gpu-scheduler-shared-0": shared}, pod["spec"]["resourceClaims"]
        main = pod["spec"]["containers"][0]
        assert main["resources"]["claims"] == [{"name": "gpu-scheduler-shared-0"}]
        assert env.claim(dra.claim_name(name)) is None, f"{name} has a claim of its own"
    claim = env.claim(shared) or {}
    index3 = env.devices("a")[3]
    assert [x.device for x in dra.allocation(claim)] == [index3.name]
    assert reserved_pods(claim) == {"w-3", "w-4"}, claim["status"]
    assert claim["metadata"]["annotations"][draclaims.SHARED_ANNOTATION] == f"{a}:3"
    wait_for(lambda: pinned(env.claim(shared)), 60, what=f"{shared} pinned by its StatefulSet")
    assert [dra.pod_claims(env.pod("w-0") or {})] == [{"gpu-scheduler": "w-0-gpus"}]
    no_device_twice(env)

    # Node a's other workload asks for any GPU, four times: w-0 holds indices 0 and 1, the
    # sharers index 3, so one foreign claim gets index 2 and the others wait.
    for i in range(4):
        env.cluster.apply(env.foreign_pod(f"f{i}", "a"))
    wait_for(
        lambda: sum(bool(dra.allocation(env.claim(f"f{i}") or {})) for i in range(4)) == 1,
        60,
        what="one foreign claim allocated",
    )
    wait_for(
        lambda: all((env.pod(f"f{i}") or {}).get("status", {}).get("conditions") for i in range(4)),
        60,
        what="the foreign pods looked at by kube-scheduler",
    )
    got = sorted(x.device for i in range(4) for x in dra.allocation(env.claim(f"f{i}") or {}))
    assert got == [env.devices("a")[2].name], got
    # One sharer goes (its pod deleted, the StatefulSet makes it again): the other holds the GPU,
    # and it comes back onto the same claim.
    uid = claim["metadata"]["uid"]
    old = (env.pod("w-4") or {})["metadata"]["uid"]
    env.cluster.kubectl("delete", "pod", "w-4", "-n", env.namespace, "--wait=true")
    wait_for(
        lambda: (
            (env.pod("w-4") or {}).get("metadata", {}).get("uid") not in (None, old)
            and placed_all(env, "w-4")
        ),
        120,
        what="w-4 recreated and placed on the shared claim again",
    )
    again = env.claim(shared) or {}
    assert again["metadata"]["uid"] == uid, "the shared claim was made anew"
    got = sorted(x.device for i in range(4) for x in dra.allocation(env.claim(f"f{i}") or {}))
    assert got == [env.devices("a")[2].name], f"a foreign claim got a sharer's GPU: {got}"
    no_device_twice(env)

    # The map moves replica 3 to node b's free GPU and drops replica 4 (scaled down to 4): once
    # both old pods are gone no entry needs the shared claim; it is unpinned and deleted, and
    # the GPU goes to a foreign pod that waited for it.
    env.cluster.apply(env.statefulset("w", f"0={a}:0,1\n1={b}:2\n2={b}:0,1\n3={b}:3\n", 4))
    wait_for(lambda: env.claim(shared) is None, 180, what=f"{shared} released once no sharer needs it")
    wait_for(lambda: placed_all(env, "w-3"), 120, what="w-3 placed on node b")
    wait_for(
        lambda: index3.name in {x.device for i in range(4) for x in dra.allocation(env.claim(f"f{i}") or {})},
        90,
        what="a foreign claim allocated the GPU the sharers left",
    )
    no_device_twice(env)


def test_a_partial_overlap_is_placed_with_one_shared_claim(dra_env: Dra) -> None:  # noqa: F811
    env = dra_env
    a = env.nodes["a"]
    env.cluster.apply(env.statefulset("p", f"0={a}:0,1\n1={a}:1,2", 2))
    for i in range(2):
        wait_for(lambda i=i: placed_all(env, f"p-{i}"), 120, what=f"p-{i} placed with its claims allocated")
    devs = env.devices("a")
    assert dra.pod_claims(env.pod("p-0") or {}) == {
        "gpu-scheduler": "p-0-gpus",
        "gpu-scheduler-shared-0": "p-0-shared-1",
    }
    assert dra.pod_claims(env.pod("p-1") or {}) == {
        "gpu-scheduler": "p-1-gpus",
        "gpu-scheduler-shared-0": "p-0-shared-1",
    }
    assert [x.device for x in dra.allocation(env.claim("p-0-gpus") or {})] == [devs[0].name]
    assert [x.device for x in dra.allocation(env.claim("p-1-gpus") or {})] == [devs[2].name]
    assert [x.device for x in dra.allocation(env.claim("p-0-shared-1") or {})] == [devs[1].name]
    assert reserved_pods(env.claim("p-0-shared-1")) == {"p-0", "p-1"}
    no_device_twice(env)


def test_a_rollout_that_makes_two_replicas_share_finishes(dra_env: Dra) -> None:  # noqa: F811
    """OrderedReady, RollingUpdate: 3 and 4 had GPUs 3 and 2; the new map gives 4 replica 3's
    GPU 3 too. The new w-4's shared claim waits for GPU 3, which the outdated w-3's own claim
    holds (pinned); w-3's new entry holds it through the shared claim, not that one, so the
    rollout evicts w-3 (EvictedForRollout); its own claim is released, and both end on the
    shared claim."""
    env = dra_env
    a = env.nodes["a"]
    sts = env.statefulset("w", f"3={a}:3\n4={a}:2", 5)
    sts["spec"]["podManagementPolicy"] = "OrderedReady"
    sts["spec"]["ordinals"] = {"start": 3}
    sts["spec"]["replicas"] = 2
    env.cluster.apply(sts)
    for i in (3, 4):
        wait_for(lambda i=i: placed_all(env, f"w-{i}"), 120, what=f"w-{i} placed")
    shared = env.statefulset("w", f"3={a}:3\n4={a}:3", 5)
    shared["spec"]["podManagementPolicy"] = "OrderedReady"
    shared["spec"]["ordinals"] = {"start": 3}
    shared["spec"]["replicas"] = 2
    env.cluster.apply(shared)

    def both_share() -> bool:
        no_device_twice(env)
        return all((placed_all(env, f"w-{i}") or {}).keys() == {"w-3-shared-3"} for i in (3, 4))

    wait_for(both_share, 240, what="w-3 and w-4 placed on the one shared claim")
    assert reserved_pods(env.claim("w-3-shared-3")) == {"w-3", "w-4"}
    assert env.events("w-3", EVICTED_FOR_ROLLOUT), "the outdated w-3 was not evicted for the rollout"
    wait_for(lambda: env.claim("w-3-gpus") is None, 90, what="w-3's own claim released")
    wait_for(lambda: env.claim("w-4-gpus") is None, 90, what="w-4's own claim released")


def test_the_policy_gives_each_pod_the_claims_of_the_python_layout(dra_env: Dra) -> None:  # noqa: F811
    """The injection policy (CEL, at admission) and kube_gpu_scheduler.domain.draclaims agree on
    every pod's claims: sharing, partial overlaps, several groups, names by UUID and PCI bus ID,
    `;`-separated entries, comments, whitespace and leading zeros, a node whose name is another's
    prefix, count entries beside named ones. Each map's pods are dry-run through the real apiserver in one request per map."""
    env = dra_env
    a = env.nodes["a"]
    uuid = "GPU-8A3C0000-0000-0000-0000-0000000000AB"
    maps = [
        f"0={a}:0,1\n1={a}:2\n3={a}:3\n4={a}:3\n",
        f"0={a}:4,5\n1={a}:5,6\n",
        f"5={a}:10,1,7,3\n2={a}:3,7,10\n9={a}:3\n",
        f"0={a}:{uuid}\n1={a}:{uuid.lower()}\n2={a}:GPU-8a3c0000-0000-0000-0000-0000000000ac\n",
        f"0={a}:0000:3B:00.0, 00000000:86:00.0\n1={a}:00000000:3b:00.0\n",
        f" 0 = {a} : 1 ; 1={a}:1,2 # 2={a}:2\n002={a}:2 ;3={a}x:1\n# 4={a}:1\n",
        f"0={a}:1\n1={a}0:1\n2={a}:1,3\n",
        f"0={a}:7\n1={env.nodes['b']}:7\n",
        # Count entries (auto(N)) share nothing: not with each other, nor with index N or 0 (what
        # their digits would read as), while the task's GPU 3 is still shared beside them.
        f"0={a}:auto(2)\n1={a}:auto(02)\n2={a}:2\n3={a}:3\n4={a}:3\n5 = {a} : auto(3) # c\n6={a}:0\n",
    ]
    for text in maps:
        smap = parse(text)
        pods = []
        for ordinal in smap:
            pod = probe_pod(env, f"sh-{ordinal}", ordinal, text)
            pods.append(pod)
        out = env.cluster.kubectl(
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}),
        )
        items, at, decoder = [], 0, json.JSONDecoder()
        while out.stdout[at:].strip():  # kubectl prints one JSON document per pod
            doc, end = decoder.raw_decode(out.stdout[at:].lstrip())
            at = len(out.stdout) - len(out.stdout[at:].lstrip()) + end
            items.extend(doc["items"] if doc.get("kind") == "List" else [doc])
        assert len(items) == len(smap), (text, len(items))
        for item in items:
            name = item["metadata"]["name"]
            ordinal = int(item["metadata"]["labels"]["apps.kubernetes.io/pod-index"])
            want = [
                {"name": p.ref, "resourceClaimName": p.name} for p in draclaims.layout(smap, ordinal, name)
            ]
            assert item["spec"].get("resourceClaims") == want, (text, name)
            for container in item["spec"]["containers"]:
                assert container["resources"]["claims"] == [{"name": p["name"]} for p in want], (text, name)


def probe_pod(env: Dra, name: str, ordinal: int, text: str) -> dict[str, Any]:
    sts = env.statefulset("sh", text, 1)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": env.namespace,
            "labels": {"apps.kubernetes.io/pod-index": str(ordinal)},
            "annotations": {"gpu-scheduling-map": text},
        },
        "spec": sts["spec"]["template"]["spec"],
    }


def test_a_gang_whose_replicas_share_is_placed_all_or_none(dra_env: Dra) -> None:  # noqa: F811
    """Replicas 0 and 1 of a gang share a GPU, replica 2 wants the GPU a foreign claim holds: no
    gate opens (the shared claim is made but never allocated); the foreign claim's release
    places all three, the shared claim reserved for both sharers."""
    env = dra_env
    a = env.nodes["a"]
    env.cluster.apply(env.foreign_pod("f0", "a"))
    wait_for(lambda: dra.allocation(env.claim("f0") or {}), 60, what="f0 allocated")
    devices = env.devices("a")
    held = next(x.device for x in dra.allocation(env.claim("f0") or {}))
    held_index = next(i for i, d in enumerate(devices) if d.name == held)
    free_index = next(i for i, d in enumerate(devices) if d.name != held)
    sts = env.statefulset("g", f"0={a}:{free_index}\n1={a}:{free_index}\n2={a}:{held_index}", 3)
    sts["spec"]["template"]["metadata"]["annotations"][GANG_ANNOTATION] = "true"
    env.cluster.apply(sts)
    shared = f"g-0-shared-{free_index}"

    def waiting(name: str) -> bool:
        return any(
            n.startswith(GANG_WAITING) and f"replica 2 (2={a}:{held_index})" in n and "is allocated to" in n
            for n in env.events(name, "FailedScheduling")
        )

    for name in ("g-0", "g-1", "g-2"):
        wait_for(lambda name=name: waiting(name), 60, what=f"{GANG_WAITING} on {name} naming replica 2")
    assert env.claim(shared) is not None, "the sharers' claim was not made"
    assert all(dra.gated(env.pod(f"g-{i}") or {}) for i in range(3)), (
        "a gate opened while the gang could not be placed"
    )
    assert not dra.allocation(env.claim(shared) or {})
    env.cluster.kubectl("delete", "pod", "f0", "-n", env.namespace, "--wait=true")
    env.cluster.kubectl("delete", "resourceclaim", "f0", "-n", env.namespace, "--wait=true")
    for i in range(3):
        wait_for(lambda i=i: placed_all(env, f"g-{i}"), 90, what=f"g-{i} placed once the GPU is free")
    assert reserved_pods(env.claim(shared)) == {"g-0", "g-1"}
    no_device_twice(env)


def test_a_rotation_involving_a_shared_gpu_finishes(dra_env: Dra) -> None:  # noqa: F811
    """OrderedReady, RollingUpdate: replica 0 had index 0, replicas 1 and 2 shared index 1; the
    new map gives 0 index 1 and makes 1 and 2 share index 0. Each waiting replica of the new
    revision has the outdated holder of its GPU evicted, the old claims are released, and all
    three end on their new claims; no device is ever allocated twice."""
    env = dra_env
    a = env.nodes["a"]

    def sts(text: str) -> dict[str, Any]:
        s = env.statefulset("w", text, 3)
        s["spec"]["podManagementPolicy"] = "OrderedReady"
        return s

    env.cluster.apply(sts(f"0={a}:0\n1={a}:1\n2={a}:1"))
    for i in range(3):
        wait_for(lambda i=i: placed_all(env, f"w-{i}"), 120, what=f"w-{i} placed")
    assert reserved_pods(env.claim("w-1-shared-1")) == {"w-1", "w-2"}
    new = f"0={a}:1\n1={a}:0\n2={a}:0"
    env.cluster.apply(sts(new))

    def rotated() -> bool:
        no_device_twice(env)
        want = {0: {"w-0-gpus"}, 1: {"w-1-shared-0"}, 2: {"w-1-shared-0"}}
        return all(
            (env.pod(f"w-{i}") or {}).get("metadata", {}).get("annotations", {}).get("gpu-scheduling-map")
            == new
            and (placed_all(env, f"w-{i}") or {}).keys() == names
            for i, names in want.items()
        )

    wait_for(rotated, 240, what="the three replicas placed on their new claims")
    devs = env.devices("a")
    assert [x.device for x in dra.allocation(env.claim("w-0-gpus") or {})] == [devs[1].name]
    assert [x.device for x in dra.allocation(env.claim("w-1-shared-0") or {})] == [devs[0].name]
    wait_for(lambda: env.claim("w-1-shared-1") is None, 90, what="the old shared claim released")


def test_the_largest_maps_are_admitted_in_dra_mode_within_the_cost_limits(dra_env: Dra) -> None:  # noqa: F811
    """The claims' CEL reads the lines that name the replica's node: the largest map the
    apiserver stores (256 KiB, 2 entries per node), a 3,000-entry map whose 10 nodes' GPUs are
    each shared by ~37 replicas, and 6,000 entries on one node sharing its 8 GPUs, are admitted
    (dry run) with the claims of the Python layout, for their first and their last ordinal.
    Past that (256 KiB of entries all on one node, ~11,000 replicas on 8 GPUs) the policy's
    CEL cost limit is reached and the pod is refused: never admitted without its claims."""
    env = dra_env
    a = env.nodes["a"]
    limit = 256 * 1024 - len("gpu-scheduling-map")
    crowded = "".join(f"{o}={a}:{o % 8}\n" for o in range(30000))
    crowded = crowded[: crowded.rfind("\n", 0, limit) + 1]
    maps = {
        "256 KiB": large_map(limit),
        "3,000 entries, 10 nodes": "".join(f"{o}=node-{o % 10}:{(o // 10) % 8}\n" for o in range(3000)),
        "6,000 entries on one node": "".join(f"{o}={a}:{o % 8}\n" for o in range(6000)),
        "256 KiB on one node": crowded,
    }
    for label, text in maps.items():
        smap = parse(text)
        for ordinal in (min(smap), max(smap)):
            name = f"big-{ordinal}"
            out = env.cluster.kubectl(
                "create",
                "--dry-run=server",
                "-o",
                "json",
                "-f",
                "-",
                input=json.dumps(probe_pod(env, name, ordinal, text)),
                check=False,
            )
            if label == "256 KiB on one node":
                assert out.returncode != 0 and "-inject" in out.stderr, (label, ordinal, out.stdout[:200])
                continue
            assert out.returncode == 0, (label, ordinal, out.stderr[-500:])
            got = json.loads(out.stdout)["spec"].get("resourceClaims")
            want = [
                {"name": p.ref, "resourceClaimName": p.name} for p in draclaims.layout(smap, ordinal, name)
            ]
            assert got == want, (label, ordinal)
