"""DRA device taints on the real kube-apiserver (resource.k8s.io/v1, GA in 1.37), with the control
plane's kube-scheduler allocating and its kube-controller-manager's device-taint-eviction-controller
evicting (it runs in localcluster's control plane as in any 1.37 cluster: the feature is on by
default and ``--controllers=*`` starts it).

The environment is tests/integration/test_dra.py's (``dra_env``: two kwok nodes with slices shaped
like NVIDIA's driver's, the chart's DRA injection policy, the gpu-scheduler in DRA mode with the
chart's RBAC, DeviceTaintRules included). On node "a" the GPU of index 0 is gpu-3 (bus 0x1a).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kube_gpu_scheduler.domain import dra
from tests.integration.test_dra import BUSES, Dra, dra_env, no_device_twice, slice_body
from tests.support.waiting import wait_for

__all__ = ["dra_env"]  # the fixture, imported from test_dra.py

pytestmark = pytest.mark.cluster


def tainted_slice(env: Dra, short: str, minor: int, effect: str) -> dict[str, Any]:
    """Node ``short``'s slice with gpu-<minor> tainted by the driver."""
    body = slice_body(env.nodes[short], BUSES[short])
    device = next(d for d in body["spec"]["devices"] if d["name"] == f"gpu-{minor}")
    device["taints"] = [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": effect}]
    return body


@pytest.fixture
def rules(dra_env: Dra) -> Iterator[list[str]]:
    """DeviceTaintRules a test makes (cluster-scoped): deleted after it."""
    names: list[str] = []
    yield names
    for name in names:
        dra_env.cluster.kubectl("delete", "devicetaintrule", name, "--ignore-not-found", check=False)


def taint_rule(name: str, pool: str, device: str, effect: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": dra.DRIVER, "pool": pool, "device": device},
            "taint": {"key": "example.com/maintenance", "value": "planned", "effect": effect},
        },
    }


def uid(obj: dict[str, Any] | None) -> str | None:
    return (obj or {}).get("metadata", {}).get("uid")


def allocated(env: Dra, claim: str) -> list[str]:
    return [x.device for x in dra.allocation(env.claim(claim) or {})]


def pinned(env: Dra, claim: str) -> bool:
    reserved = ((env.claim(claim) or {}).get("status") or {}).get("reservedFor") or []
    return any(r.get("resource") == "statefulsets" for r in reserved)


def test_a_noschedule_taint_on_a_pinned_gpu_keeps_the_next_pod_waiting_until_it_goes(dra_env: Dra) -> None:
    """The driver taints the GPU a running replica holds, NoSchedule: the replica keeps running and
    its pin. Its next pod waits behind the gate (kube-scheduler would reuse the allocated claim
    without looking at taints) with GPUTainted naming the taint and the device, and is placed on
    the same claim once the slice no longer carries the taint."""
    env = dra_env
    a = env.nodes["a"]
    env.cluster.apply(env.statefulset("w", f"0={a}:0", 1))
    wait_for(lambda: env.placed("w-0") and pinned(env, "w-0-gpus"), 90, what="w-0 placed and pinned")
    claim_uid, first = uid(env.claim("w-0-gpus")), uid(env.pod("w-0"))
    assert allocated(env, "w-0-gpus") == ["gpu-3"]
    gpu = env.devices("a")[0]

    env.cluster.apply(tainted_slice(env, "a", 3, "NoSchedule"))
    wait_for(
        lambda: any(
            "It keeps running (NoSchedule evicts nothing)" in n for n in env.events("w-0", "GPUTainted")
        ),
        60,
        what="a GPUTainted event on the running w-0",
    )
    assert uid(env.pod("w-0")) == first, "NoSchedule evicted the running replica"

    env.cluster.kubectl("delete", "pod", "w-0", "-n", env.namespace, "--wait=true")
    wait_for(
        lambda: (
            uid(env.pod("w-0")) not in (None, first)
            and any(" waits: " in n for n in env.events("w-0", "GPUTainted"))
        ),
        60,
        what="the new w-0 waiting with a GPUTainted event",
    )
    note = next(n for n in env.events("w-0", "GPUTainted") if " waits: " in n)
    assert (
        f"{a}/gpu-3 ({gpu.pci_bus_id}, {gpu.uuid}) is tainted gpu.nvidia.com/unhealthy=xid-79:NoSchedule"
        in note
    )
    assert "its ResourceSlice, set by the DRA driver" in note and "keeps the GPU pinned" in note, note
    pod = env.pod("w-0") or {}
    assert dra.gated(pod) and not pod["spec"].get("nodeName")
    assert uid(env.claim("w-0-gpus")) == claim_uid and allocated(env, "w-0-gpus") == ["gpu-3"]

    env.cluster.apply(slice_body(a, BUSES["a"]))  # the driver clears the taint
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed again once the taint is gone")
    assert uid(env.claim("w-0-gpus")) == claim_uid, "the pinned claim was not reused"
    assert allocated(env, "w-0-gpus") == ["gpu-3"]
    no_device_twice(env)


def test_a_noexecute_rule_evicts_the_replica_releases_its_claim_and_it_is_placed_again(
    dra_env: Dra, rules: list[str]
) -> None:
    """A DeviceTaintRule NoExecute on the GPU a running, pinned replica holds: Kubernetes' device
    taint eviction deletes the pod; gpu-scheduler then unpins and deletes the claim (the pin must
    not keep the tainted allocation), the next pod waits with GPUTainted naming the rule, and is
    placed on that GPU again once the rule is deleted. Whether the running pod got its own
    GPUTainted note first is a race with the eviction controller, so it is not required."""
    env = dra_env
    a = env.nodes["a"]
    env.cluster.apply(env.statefulset("w", f"0={a}:0", 1))
    wait_for(lambda: env.placed("w-0") and pinned(env, "w-0-gpus"), 90, what="w-0 placed and pinned")
    claim_uid, first = uid(env.claim("w-0-gpus")), uid(env.pod("w-0"))
    name = f"maint-{env.namespace}"
    rules.append(name)
    env.cluster.apply(taint_rule(name, a, "gpu-3", "NoExecute"))

    wait_for(
        lambda: any(e for e in env.events("w-0", "DeviceTaintManagerEviction")),
        60,
        what="kube-controller-manager's device taint eviction of w-0",
    )
    wait_for(lambda: uid(env.pod("w-0")) not in (None, first), 60, what="w-0 evicted and recreated")
    wait_for(
        lambda: uid(env.claim("w-0-gpus")) != claim_uid, 60, what="w-0-gpus released (a new claim or none)"
    )
    wait_for(
        lambda: any(
            " waits: " in n and f"DeviceTaintRule {name}" in n for n in env.events("w-0", "GPUTainted")
        ),
        60,
        what="the new w-0 waiting with a GPUTainted event naming the rule",
    )
    notes = env.events("w-0", "GPUTainted")
    # The note on the running pod comes only when gpu-scheduler reads the rule before the eviction
    # controller has deleted the pod; in CI the eviction once came 0.7 s after the pin and the
    # scheduler saw the rule and the deletion together. Its text is unit-tested
    # (tests/unit/dra/test_scheduler_dra_taints.py); here it is checked where it was sent.
    running = [n for n in notes if " runs with " in n]
    assert all("device-taint-eviction-controller) evicts the pod" in n for n in running), notes
    waits = next(n for n in notes if " waits: " in n)
    assert (
        f"{a}/gpu-3 (" in waits
        and f"example.com/maintenance=planned:NoExecute (DeviceTaintRule {name})" in waits
    )
    assert f"kubectl delete devicetaintrule {name}" in waits, waits
    released = env.events("w-0", "TaintedClaimReleased")
    print("TaintedClaimReleased:", released)  # sent when the new pod already existed at the release
    pod = env.pod("w-0") or {}
    assert dra.gated(pod) and not pod["spec"].get("nodeName")
    assert not allocated(env, "w-0-gpus"), "the tainted GPU is still allocated"

    env.cluster.kubectl("delete", "devicetaintrule", name)
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed again once the rule is gone")
    assert allocated(env, "w-0-gpus") == ["gpu-3"]
    no_device_twice(env)


def test_a_noschedule_rule_keeps_a_new_replica_off_its_gpu_and_its_removal_places_it(
    dra_env: Dra, rules: list[str]
) -> None:
    """A rule tainting the GPU of a replica not placed yet: the claim is made, kube-scheduler never
    sees the pod (its gate stays closed) and GPUTainted says why; another replica on an untainted
    GPU of the same node is placed meanwhile."""
    env = dra_env
    a = env.nodes["a"]
    gpu = env.devices("a")[1]  # index 1: gpu-1 (bus 0x3b)
    name = f"hold-{env.namespace}"
    rules.append(name)
    env.cluster.apply(taint_rule(name, a, gpu.name, "NoSchedule"))
    # The rule's watch and the pods' are two streams: the pods come once the rule is seen.
    wait_for(lambda: env.cached("devicetaintrules") >= 1, 30, what="the scheduler to see the rule")
    env.cluster.apply(env.statefulset("w", f"0={a}:1\n1={a}:2", 2))
    wait_for(lambda: env.placed("w-1"), 90, what="w-1 placed on its untainted GPU")
    wait_for(lambda: env.events("w-0", "GPUTainted"), 60, what="a GPUTainted event on w-0")
    note = env.events("w-0", "GPUTainted")[-1]
    assert (
        f"{a}/{gpu.describe()} is tainted example.com/maintenance=planned:NoSchedule (DeviceTaintRule {name})"
        in note
    )
    assert "keeps the pod's scheduling gate closed" in note, note
    assert env.claim("w-0-gpus") is not None and not allocated(env, "w-0-gpus")
    assert dra.gated(env.pod("w-0") or {})
    env.cluster.kubectl("delete", "devicetaintrule", name)
    wait_for(lambda: env.placed("w-0"), 90, what="w-0 placed once the rule is gone")
    assert allocated(env, "w-0-gpus") == [gpu.name]
    no_device_twice(env)
