"""Gang placement in DRA mode on the real apiserver, kube-scheduler allocating: no replica's gate
opens until every replica's claim can be allocated; the release of the blocking device opens
them all (kube_gpu_scheduler/scheduler/dra/gang.py)."""

from __future__ import annotations

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION
from kube_gpu_scheduler.domain.rules import GANG_WAITING
from tests.integration.test_dra import Dra, dra_env, no_device_twice  # noqa: F401  (the fixture)
from tests.support.waiting import wait_for


def test_a_dra_gang_opens_no_gate_until_every_claim_can_be_allocated(dra_env: Dra) -> None:  # noqa: F811
    env = dra_env
    a = env.nodes["a"]
    for i in range(3):  # another workload takes three of node a's four GPUs, index 3's among them
        env.cluster.apply(env.foreign_pod(f"f{i}", "a"))
    wait_for(
        lambda: all(dra.allocation(env.claim(f"f{i}") or {}) for i in range(3)), 60, what="f0-f2 allocated"
    )
    free = {x.name for x in env.devices("a")} - {
        x.device for i in range(3) for x in dra.allocation(env.claim(f"f{i}") or {})
    }
    (left,) = free
    devices = env.devices("a")
    free_index = next(i for i, d in enumerate(devices) if d.name == left)
    taken_index = next(i for i, d in enumerate(devices) if d.name != left)
    sts = env.statefulset("g", f"0={a}:{free_index}\n1={a}:{taken_index}", 2)
    sts["spec"]["template"]["metadata"]["annotations"][GANG_ANNOTATION] = "true"
    env.cluster.apply(sts)
    blocked = f"replica 1 (1={a}:{taken_index})"

    def note(name: str) -> str | None:
        said = [n for n in env.events(name, "FailedScheduling") if n.startswith(GANG_WAITING)]
        return next((n for n in said if blocked in n and "is allocated to ResourceClaim" in n), None)

    for name in ("g-0", "g-1"):  # at first replica 1's claim may not be made yet: then its holder
        wait_for(lambda name=name: note(name), 60, what=f"{GANG_WAITING} on {name} naming replica 1's holder")
    assert all(dra.gated(env.pod(n) or {}) for n in ("g-0", "g-1")), (
        "a gate opened while the gang could not be placed"
    )
    holder = next(
        i
        for i in range(3)
        if any(x.device == devices[taken_index].name for x in dra.allocation(env.claim(f"f{i}") or {}))
    )
    env.cluster.kubectl("delete", "pod", f"f{holder}", "-n", env.namespace, "--wait=true")
    env.cluster.kubectl("delete", "resourceclaim", f"f{holder}", "-n", env.namespace, "--wait=true")
    wait_for(
        lambda: env.placed("g-0") and env.placed("g-1"),
        90,
        what="both replicas placed once the device is free",
    )
    no_device_twice(env)
