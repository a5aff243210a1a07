"""DRA device taints: the domain's reading of them (a slice's, a DeviceTaintRule's), what their
changes enqueue, what the claim controller does of them, and its metrics.

The controller is driven as in tests/unit/dra/test_scheduler_dra.py (its World: caches of the
test's own fed through the controller's handlers, a writer and events that record).
"""

from __future__ import annotations

from typing import Any

import pytest

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.devicetaints import ANY, Taint, blocking, rule_pools, rule_taint, slice_taints
from kube_gpu_scheduler.domain.rules.catalogue import (
    CLAIM_CREATED,
    GPU_TAINTED,
    TAINTED_CLAIM_RELEASED,
)
from kube_gpu_scheduler.scheduler.dra.controller import Next
from kube_gpu_scheduler.scheduler.dra.metrics import ClaimMetrics
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from tests.unit.dra.test_scheduler_dra import World, node_slice, replica, statefulset

# -- the domain ----------------------------------------------------------------------------------


def rule(
    name: str, effect: str = "NoSchedule", *, key: str = "example.com/maint", value: str = "", **selector: str
) -> dict[str, Any]:
    taint = {"key": key, "effect": effect, **({"value": value} if value else {})}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"deviceSelector": selector, "taint": taint},
    }


def test_a_rule_selects_by_driver_pool_and_device_each_optional() -> None:
    def hits(r: dict[str, Any]) -> list[str]:
        return [
            f"{p}/{d}"
            for p in ("n1", "n2")
            for d in ("gpu-0", "gpu-1")
            if rule_taint(r, dra.DRIVER, p, d) is not None
        ]

    assert hits(rule("all")) == [
        "n1/gpu-0",
        "n1/gpu-1",
        "n2/gpu-0",
        "n2/gpu-1",
    ]  # empty selector: every device
    assert hits(rule("pool", pool="n1")) == ["n1/gpu-0", "n1/gpu-1"]
    assert hits(rule("dev", device="gpu-1")) == ["n1/gpu-1", "n2/gpu-1"]
    assert hits(rule("one", driver=dra.DRIVER, pool="n2", device="gpu-0")) == ["n2/gpu-0"]
    assert hits(rule("other", driver="other.example.com")) == []
    no_selector = rule("none")
    del no_selector["spec"]["deviceSelector"]
    assert hits(no_selector) == []  # no selector matches no device
    # The pools the index files a rule under (ANY: it names none).
    assert rule_pools(rule("pool", pool="n1"), dra.DRIVER) == {"n1"}
    assert rule_pools(rule("dev", device="gpu-1"), dra.DRIVER) == {ANY}
    assert rule_pools(rule("other", driver="other.example.com"), dra.DRIVER) == set()
    assert rule_pools(no_selector, dra.DRIVER) == set()
    assert rule_taint(rule("r", "NoExecute", key="k", value="v"), dra.DRIVER, "n1", "gpu-0") == Taint(
        "k", "v", "NoExecute", "r"
    )


def test_a_slices_taints_ride_on_its_devices_and_only_blocking_ones_count() -> None:
    s = node_slice("n1", 2)
    s["spec"]["devices"][1]["taints"] = [
        {"key": "health", "value": "xid-79", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"},
        {"key": "info", "effect": "None"},
        {"key": "later", "effect": "SomeFutureEffect"},
    ]
    devs = {d.name: d for d in dra.node_devices([s], "n1")}
    assert devs["gpu-0"].taints == ()
    taints = devs["gpu-1"].taints
    assert taints == slice_taints(s["spec"]["devices"][1])
    assert [t.text() for t in taints] == ["health=xid-79:NoExecute", "info:None", "later:SomeFutureEffect"]
    # None and unknown effects are informational; NoExecute first.
    ns = Taint("a", "", "NoSchedule", "r")
    assert blocking([*taints, ns]) == [taints[0], ns]
    assert taints[0].describe() == "health=xid-79:NoExecute (its ResourceSlice, set by the DRA driver)"
    assert ns.describe() == "a:NoSchedule (DeviceTaintRule r)"
    # A device's taints do not make it another device.
    assert devs["gpu-1"] == dra.node_devices([node_slice("n1", 2)], "n1")[1]


# -- what a change enqueues -------------------------------------------------------------------------


def two_nodes() -> World:
    w = World(nodes=("n1", "n2"))
    w.sets.put(statefulset(smap="0=n1:0\n1=n2:0"))
    p0 = w.pods.put(replica("w-0", "0=n1:0\n1=n2:0", gated=False, node="n1"))
    w.pods.put(replica("w-1", "0=n1:0\n1=n2:0"))
    w.claims.put(w.claim(p0, allocated=True, users=(p0,), pinned=True))
    w.drain()
    return w


def test_a_rule_enqueues_the_replicas_and_our_claims_of_the_pools_it_selects() -> None:
    w = two_nodes()
    r = w.rules.put(rule("r", pool="n1"))
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    # Its status (the eviction's progress) changes nothing it selects.
    status = rule("r", pool="n1")
    status["status"] = {"conditions": [{"type": "EvictionInProgress", "status": "False"}]}
    w.rules.put(status)
    assert w.drain() == []
    # Moved to n2: the replicas of both pools (the taint left n1, came to n2).
    w.rules.put(rule("r", pool="n2"))
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0", "pod:ns/w-1"]
    w.rules.delete(r)
    assert w.drain() == ["pod:ns/w-1"]
    w.rules.put(rule("any", device="gpu-3"))  # names no pool: every node of ours
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0", "pod:ns/w-1"]
    w.rules.put(rule("theirs", driver="other.example.com"))
    assert w.drain() == []


def test_a_slice_taint_enqueues_the_replicas_of_its_node_and_our_claims_in_its_pool() -> None:
    w = two_nodes()
    s = node_slice("n2")
    s["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    w.slices.put(s)
    assert w.drain() == ["pod:ns/w-1"]
    s = node_slice("n1")
    s["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoExecute"}]
    w.slices.put(s)
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]


# -- what the controller does ---------------------------------------------------------------------------


def tainted_slice(w: World, index: int, effect: str = "NoSchedule") -> dict[str, Any]:
    """n1's slice with its ``index``-th GPU (PCI bus order) tainted by the driver."""
    s = node_slice("n1")
    name = w.devices()[index].name
    device = next(d for d in s["spec"]["devices"] if d["name"] == name)
    device["taints"] = [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-48", "effect": effect}]
    return s


def test_a_gated_replica_on_a_slice_tainted_gpu_keeps_its_gate_until_the_taint_goes() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:1", replicas=1))
    pod = w.pods.put(replica("w-0", "0=n1:1"))
    w.claims.put(w.claim(pod))
    w.slices.put(tainted_slice(w, 1))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == []  # the gate stays closed
    [note] = w.events.notes(GPU_TAINTED)
    device = w.devices()[1]
    assert note == (
        f"{GPU_TAINTED}: replica 0 (entry '0=n1:1') waits: n1/{device.describe()} is tainted "
        "gpu.nvidia.com/unhealthy=xid-48:NoSchedule (its ResourceSlice, set by the DRA driver). kube-scheduler "
        "allocates a tainted device to no claim that does not tolerate the taint, so gpu-scheduler keeps the "
        "pod's scheduling gate closed. It is placed as soon as the taint is gone: the DRA driver removes the "
        "taint from its ResourceSlice (it taints a device it finds unhealthy); or map the replica to another GPU."
    )
    assert device.uuid in note
    # Another GPU of the node tainted: not this replica's business.
    w.slices.put(tainted_slice(w, 2))
    assert w.drain() == ["pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("open_gate", "ns/w-0")]


def test_a_pinned_claim_on_a_noschedule_gpu_stays_and_the_new_pod_waits_for_the_rule_to_go() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:0", replicas=1))
    old = replica("w-0", "0=n1:0", gated=False, node="n1")
    new = w.pods.put(replica("w-0", "0=n1:0", "w-new"))
    new["metadata"]["uid"] = "uid-w-0-second"
    w.claims.put(w.claim(old, allocated=True, pinned=True))  # the old pod is gone from reservedFor
    r = w.rules.put(rule("gpu-maint", pool="n1", device=w.devices()[0].name, value="now"))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == []  # no gate opened, nothing released: NoSchedule evicts nothing
    [note] = w.events.notes(GPU_TAINTED)
    assert "is tainted example.com/maint=now:NoSchedule (DeviceTaintRule gpu-maint)" in note, note
    assert "its ResourceClaim ns/w-0-gpus keeps the GPU pinned (NoSchedule evicts nothing)" in note
    assert "kubectl delete devicetaintrule gpu-maint" in note
    w.rules.delete(r)
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("open_gate", "ns/w-0")]  # kube-scheduler reuses the pinned claim


def test_a_running_replica_on_a_gpu_tainted_noschedule_keeps_running_and_its_pin() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:0", replicas=1))
    pod = w.pods.put(replica("w-0", "0=n1:0", gated=False, node="n1"))
    w.claims.put(w.claim(pod, allocated=True, users=(pod,)))
    w.rules.put(rule("r", pool="n1"))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("put_reserved", "ns/w-0-gpus")]  # pinned as usual
    [note] = w.events.notes(GPU_TAINTED)
    assert "runs with n1/gpu-" in note and "It keeps running (NoSchedule evicts nothing)" in note, note


def test_noexecute_evicts_then_the_claim_is_released_and_the_next_pod_waits_until_it_goes() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:0", replicas=1))
    pod = w.pods.put(replica("w-0", "0=n1:0", gated=False, node="n1"))
    w.claims.put(w.claim(pod, allocated=True, users=(pod,), pinned=True))
    w.drain()
    r = w.rules.put(rule("evict", "NoExecute", pool="n1"))
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.ctl.process("claim:ns/w-0-gpus") is Next.DONE
    assert w.writer.calls == []  # a pod still uses it: Kubernetes' device taint eviction deletes that pod
    [note] = w.events.notes(GPU_TAINTED)
    assert "example.com/maint:NoExecute (DeviceTaintRule evict)" in note
    assert "kube-controller-manager's device-taint-eviction-controller) evicts the pod" in note
    assert "delete pod ns/w-0" in note

    # Evicted: the new pod comes gated while the old one is still in reservedFor: it waits, named.
    w.pods.delete(pod)
    new = replica("w-0", "0=n1:0")
    new["metadata"]["uid"] = "uid-w-0-second"
    w.pods.put(new)
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == []
    assert "is released (unpinned and deleted) once pod ns/w-0 is gone" in w.events.notes(GPU_TAINTED)[-1]

    # The resourceclaim controller drops the old pod: the claim (or the pod) releases it.
    w.claims.put(w.claim(pod, allocated=True, pinned=True))
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    assert w.ctl.process("claim:ns/w-0-gpus") is Next.DONE
    assert w.writer.calls == [("put_reserved", "ns/w-0-gpus"), ("delete", "ns/w-0-gpus")]
    assert w.writer.bodies[0] == []
    [released] = w.events.notes(TAINTED_CLAIM_RELEASED)
    assert released.startswith(
        f"{TAINTED_CLAIM_RELEASED}: ResourceClaim ns/w-0-gpus is unpinned and deleted:"
    )

    # Gone: made again (nothing to hold yet), and the pod waits behind its gate.
    w.claims.delete(w.claim(pod))
    assert w.drain() == ["pod:ns/w-0"]
    w.ctl.process("pod:ns/w-0")
    assert w.writer.calls[-1] == ("create", "ns/w-0-gpus") and CLAIM_CREATED in w.events.reasons()
    w.claims.put(w.claim(new))
    w.drain()
    calls = len(w.writer.calls)
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert len(w.writer.calls) == calls
    assert "so gpu-scheduler keeps the pod's scheduling gate closed" in w.events.notes(GPU_TAINTED)[-1]
    w.rules.delete(r)
    assert w.drain() == ["pod:ns/w-0"]
    w.ctl.process("pod:ns/w-0")
    assert w.writer.calls[-1] == ("open_gate", "ns/w-0")


def test_the_replica_path_releases_too_when_the_claim_key_has_not_run() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:0", replicas=1))
    old = replica("w-0", "0=n1:0", gated=False, node="n1")
    w.pods.put(replica("w-0", "0=n1:0", "w-new"))
    w.claims.put(w.claim(old, allocated=True, pinned=True))
    w.slices.put(tainted_slice(w, 0, "NoExecute"))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("put_reserved", "ns/w-0-gpus"), ("delete", "ns/w-0-gpus")]
    assert w.events.reasons("ns/w-0") == [TAINTED_CLAIM_RELEASED]


@pytest.mark.parametrize("effect", ["None", "SomeFutureEffect"])
def test_an_informational_taint_changes_nothing(effect: str) -> None:
    w = World()
    pod = w.pods.put(replica("w-0", "0=n1:0"))
    w.claims.put(w.claim(pod))
    w.rules.put(rule("info", effect, pool="n1"))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("open_gate", "ns/w-0")] and w.events.sent == []


# -- metrics ------------------------------------------------------------------------------------------


def test_the_controllers_metrics_count_keys_outcomes_time_and_events() -> None:
    metrics = Metrics()
    w = World()
    w.ctl.metrics = ClaimMetrics(metrics)  # (World built its own; a fresh registry here)
    w.ctl.metrics.track(lambda: len(w.ctl.queue))
    w.ctl._events = w.ctl.metrics.counting(w.ctl._events)
    w.sets.put(statefulset(smap="0=n1:4", replicas=1))
    w.pods.put(replica("w-0", "0=n1:4"))  # index 4 is not published: GPUNotPublished
    w.ctl.process("pod:ns/w-0")
    w.ctl.process("claim:ns/nothing-gpus")
    w.pods.put(replica("w-1", "0=n1:4\n1=n1:1"))
    text = metrics.render().decode()
    assert 'gpu_scheduler_dra_keys_processed_total{kind="pod",outcome="done"} 1.0' in text
    assert 'gpu_scheduler_dra_keys_processed_total{kind="claim",outcome="done"} 1.0' in text
    assert 'gpu_scheduler_dra_keys_processed_total{kind="pod",outcome="again"} 0.0' in text
    assert 'gpu_scheduler_dra_key_processing_seconds_count{kind="pod"} 1.0' in text
    assert 'gpu_scheduler_dra_key_cpu_seconds_total{kind="pod"} ' in text
    assert 'gpu_scheduler_dra_events_total{reason="GPUNotPublished"} 1.0' in text
    assert 'gpu_scheduler_dra_events_total{reason="GPUTainted"} 0.0' in text
    assert "gpu_scheduler_dra_queue_depth 2.0" in text  # w-0 (still queued from its add) and w-1


def test_an_unexpected_error_is_counted_and_raised() -> None:
    metrics = Metrics()
    w = World()
    w.ctl.metrics = ClaimMetrics(metrics)
    w.pods.put(replica("w-0", "0=n1:0"))
    w.writer.fail["create"] = RuntimeError("boom")
    with pytest.raises(RuntimeError):
        w.ctl.process("pod:ns/w-0")
    assert (
        'gpu_scheduler_dra_keys_processed_total{kind="pod",outcome="error"} 1.0' in metrics.render().decode()
    )


def test_main_build_gives_the_controller_a_devicetaintrule_informer_and_the_schedulers_registry() -> None:
    """DRA mode's wiring (nothing is started: the client points nowhere)."""
    from kubernetes import client

    from kube_gpu_scheduler.kube.informer import Informer
    from kube_gpu_scheduler.scheduler.main import build
    from kube_gpu_scheduler.scheduler.runtime.settings import Settings

    sched = build(Settings(identity="t", leader_elect=False, dra=True).validate(), client.ApiClient())
    caches = sched.caches()
    assert list(caches)[-5:] == [
        "dra-pods",
        "resourceclaims",
        "resourceslices",
        "statefulsets",
        "devicetaintrules",
    ]
    rules = caches["devicetaintrules"]
    assert isinstance(rules, Informer) and rules._list_fn.__name__ == "list_device_taint_rule"
    text = sched.metrics.render().decode()
    assert "gpu_scheduler_dra_queue_depth 0.0" in text and "gpu_scheduler_pods_bound_total" in text


def test_a_taint_after_the_gate_opened_is_told_as_it_is() -> None:
    """A gate cannot be closed again: a pending replica whose GPU is tainted after its gate
    opened stays pending in kube-scheduler (its claim unallocated), and the note says so."""
    w = World()
    pod = w.pods.put(replica("w-0", "0=n1:0", gated=False))
    w.claims.put(w.claim(pod))
    w.rules.put(rule("late", pool="n1"))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == []
    [note] = w.events.notes(GPU_TAINTED)
    assert "so the pod stays pending (its gate was opened before the taint came)" in note, note
