"""DRA mode's claim controller without an apiserver: caches of the test's own, fed through the
controller's own informer handlers, a writer and an event recorder that record.

What each change enqueues (and what it does not), and what one key's work does: make the
claim, open the gate, pin, replace, release, explain a wait and, through the one rollout
eviction decision, evict an outdated holder of the same StatefulSet or only name another
workload's. The work per key reads only that key's objects: the same number of cache reads
with no other claim in the cluster as with many.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, cast

import pytest
from kubernetes.client import ApiException

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.rules.catalogue import (
    ALLOCATED_GPU_GONE,
    CLAIM_CREATED,
    CLAIM_NOT_OURS,
    CLAIM_REPLACED,
    EVICTED_FOR_ROLLOUT,
    GPU_ALLOCATED_ELSEWHERE,
    GPU_NOT_PUBLISHED,
)
from kube_gpu_scheduler.domain.schedmap import parse
from kube_gpu_scheduler.kube.informer import Cache, Handler, object_key
from kube_gpu_scheduler.scheduler.dra.controller import ClaimController, Next
from kube_gpu_scheduler.scheduler.dra.index import Relation
from kube_gpu_scheduler.scheduler.dra.writer import ClaimWriter
from kube_gpu_scheduler.scheduler.placing.core import Scheduler
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.runtime.settings import Settings
from kube_gpu_scheduler.scheduler.state.binding import PodWriter
from localcluster import dra as localdra

NS = "ns"


class Informer:
    """A cache the test feeds as an informer does: store, then call the controller's handler."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.objs: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()
        self.synced.set()
        self.gets = 0
        self.lists = 0

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = object_key(obj)
        old = self.objs.get(key)
        self.objs[key] = obj
        if old is None:
            self.handler.on_add(obj)
        else:
            self.handler.on_update(old, obj)
        return obj

    def delete(self, obj: dict[str, Any]) -> None:
        self.objs.pop(object_key(obj), None)
        self.handler.on_delete(obj)

    def get(self, key: str) -> dict[str, Any] | None:
        self.gets += 1
        return self.objs.get(key)

    def items(self) -> list[dict[str, Any]]:
        self.lists += 1
        return list(self.objs.values())

    def alive(self) -> bool:
        return True

    def start(self, stop: threading.Event) -> threading.Thread:
        raise AssertionError("nothing is started in these tests")


class Writer:
    """Records each write; ``fail[name]``: what that write answers instead (False or an error)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.bodies: list[Any] = []
        self.fail: dict[str, bool | BaseException] = {}

    def _do(self, name: str, key: str, body: Any = None) -> bool:
        answer = self.fail.get(name, True)
        if isinstance(answer, BaseException):
            raise answer
        if answer:
            self.calls.append((name, key))
            self.bodies.append(body)
        return answer

    def create(self, body: Mapping[str, Any]) -> bool:
        return self._do("create", object_key(body), body)

    def open_gate(self, pod: Mapping[str, Any]) -> bool:
        return self._do("open_gate", object_key(pod))

    def put_reserved(self, claim: Mapping[str, Any], reserved: list[Mapping[str, Any]]) -> bool:
        return self._do("put_reserved", object_key(claim), reserved)

    def delete(self, claim: Mapping[str, Any]) -> bool:
        return self._do("delete", object_key(claim))

    def evict(self, pod: Mapping[str, Any]) -> None:
        answer = self.fail.get("evict")
        if isinstance(answer, BaseException):
            raise answer
        self.calls.append(("evict", object_key(pod)))


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []  # (object key, reason, note)

    def warning(self, obj: Mapping[str, Any], reason: str, note: str) -> bool:
        self.sent.append((object_key(obj), reason, note))
        return True

    def normal(self, obj: Mapping[str, Any], reason: str, note: str) -> None:
        self.sent.append((object_key(obj), reason, note))

    def reasons(self, key: str | None = None) -> list[str]:
        return [r for k, r, _ in self.sent if key is None or k == key]

    def notes(self, reason: str) -> list[str]:
        return [n for _, r, n in self.sent if r == reason]


def node_slice(node: str, count: int = 4, driver: str = dra.DRIVER) -> dict[str, Any]:
    s = localdra.resource_slice(node, localdra.node_gpus(node, count), driver=driver)
    s["metadata"]["uid"] = f"uid-slice-{node}-{driver}"
    return s


def statefulset(
    name: str = "w", smap: str = "0=n1:0\n1=n1:1", replicas: int = 2, update: str = "w-new", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {
            "replicas": replicas,
            "template": {"metadata": {"annotations": {"gpu-scheduling-map": smap}}},
            **spec,
        },
        "status": {"updateRevision": update},
    }


def replica(
    name: str,
    smap: str,
    revision: str = "w-new",
    *,
    gated: bool = True,
    node: str | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    sts = owner or name.rsplit("-", 1)[0]
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}-{revision}",
            "labels": {
                dra.POD_LABEL: "true",
                "apps.kubernetes.io/pod-index": name.rsplit("-", 1)[1],
                "controller-revision-hash": revision,
            },
            "annotations": {"gpu-scheduling-map": smap},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": sts,
                    "uid": f"uid-{sts}",
                    "controller": True,
                }
            ],
        },
        "spec": {"resourceClaims": [{"name": dra.POD_CLAIM, "resourceClaimName": dra.claim_name(name)}]},
        "status": {"phase": "Running" if node else "Pending"},
    }
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": "other.example.com/gate"}, {"name": dra.GATE}]
    if node:
        pod["spec"]["nodeName"] = node
    return pod


class World:
    def __init__(self, *, other_workloads: bool = False, nodes: tuple[str, ...] = ("n1",)) -> None:
        self.writer, self.events = Writer(), Events()
        self.leading = True
        self.ctl = ClaimController(
            cast(EventRecorder, self.events),
            cast(ClaimWriter, self.writer),
            self.writer,
            lambda: self.leading,
            evict_other_workloads=other_workloads,
        )
        on = self.ctl.handlers()
        self.pods, self.claims, self.slices, self.sets, self.rules = (Informer(h) for h in on)
        self.ctl.attach(self.pods, self.claims, self.slices, self.sets, self.rules)
        for node in nodes:
            self.slices.put(node_slice(node))
        self.drain()

    def devices(self, node: str = "n1") -> list[dra.Device]:
        return dra.node_devices(self.slices.objs.values(), node)

    def drain(self) -> list[str]:
        """The keys ready in the queue now (taken off it), sorted."""
        keys = []
        while (key := self.ctl.queue.get(timeout=0)) is not None:
            keys.append(key)
            self.ctl.queue.done(key)
        return sorted(keys)

    def retries(self) -> set[str]:
        return set(self.ctl.queue._due)

    def claim(
        self,
        pod: dict[str, Any],
        smap: str | None = None,
        *,
        allocated: bool = False,
        users: tuple[dict[str, Any], ...] = (),
        pinned: bool = False,
    ) -> dict[str, Any]:
        """The claim the controller makes for ``pod`` (entry of ``smap``, default the pod's), as stored."""
        meta = pod["metadata"]
        ordinal = int(meta["labels"]["apps.kubernetes.io/pod-index"])
        entry = parse(smap or meta["annotations"]["gpu-scheduling-map"]).get(ordinal)
        assert entry is not None
        devices = dra.resolve(entry, self.devices(entry.node))
        owner = meta["ownerReferences"][0]
        body = dra.claim_body(
            dra.claim_name(meta["name"]),
            NS,
            entry,
            devices,
            owner={k: owner[k] for k in ("apiVersion", "kind", "name", "uid")},
        )
        body["metadata"].update(uid=f"uid-claim-{meta['name']}-{entry}", resourceVersion="1")
        status: dict[str, Any] = {}
        if allocated:
            results = [
                {"request": dra.request_name(i), "driver": dra.DRIVER, "pool": d.pool, "device": d.name}
                for i, d in enumerate(devices)
            ]
            status["allocation"] = {"devices": {"results": results}}
        reserved = [
            {"resource": "pods", "name": u["metadata"]["name"], "uid": u["metadata"]["uid"]} for u in users
        ]
        if pinned:
            reserved.append(
                {"apiGroup": "apps", "resource": "statefulsets", "name": owner["name"], "uid": owner["uid"]}
            )
        if reserved:
            status["reservedFor"] = reserved
        body["status"] = status
        return body


def foreign_claim(name: str, device: dra.Device, pod: str | None = None) -> dict[str, Any]:
    result = {"request": "gpu", "driver": dra.DRIVER, "pool": device.pool, "device": device.name}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]}
        },
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": pod or name, "uid": f"uid-{pod or name}"}],
        },
    }


# -- one replica's life ---------------------------------------------------------------------------


def test_a_new_replica_gets_its_claim_its_gate_opened_and_its_claim_pinned() -> None:
    w = World()
    w.sets.put(statefulset())
    pod = w.pods.put(replica("w-0", "0=n1:0\n1=n1:1"))
    assert w.drain() == ["pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("create", "ns/w-0-gpus")]
    body = w.writer.bodies[0]
    assert body["spec"] == w.claim(pod)["spec"]
    assert body["metadata"]["annotations"][dra.ENTRY_ANNOTATION] == "0=n1:0"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "w", "uid": "uid-w"}
    ]
    [(key, reason, note)] = w.events.sent
    assert (key, reason) == ("ns/w-0", CLAIM_CREATED)
    device = w.devices()[0]
    assert note == (
        f"{CLAIM_CREATED}: ResourceClaim ns/w-0-gpus asks for n1/{device.describe()} (entry '0=n1:0'); "
        "kube-scheduler allocates it."
    )

    # The claim arrives: the replica (and the claim, ours) is queued; the gate is opened.
    claim = w.claims.put(w.claim(pod))
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls[-1] == ("open_gate", "ns/w-0")
    assert w.ctl.process("claim:ns/w-0-gpus") is Next.DONE  # nothing to release

    # The gate is gone: kube-scheduler's turn; nothing held elsewhere, nothing to say.
    ungated = replica("w-0", "0=n1:0\n1=n1:1", gated=False)
    w.pods.put(ungated)
    assert w.drain() == ["pod:ns/w-0"]
    calls = len(w.writer.calls)
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert len(w.writer.calls) == calls and len(w.events.sent) == 1

    # kube-scheduler allocates and reserves it for the pod: the StatefulSet is pinned beside it.
    bound = w.pods.put(replica("w-0", "0=n1:0\n1=n1:1", gated=False, node="n1"))
    w.drain()
    w.claims.put(w.claim(bound, allocated=True, users=(bound,)))
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls[-1] == ("put_reserved", "ns/w-0-gpus")
    assert w.writer.bodies[-1] == [
        {"resource": "pods", "name": "w-0", "uid": "uid-w-0-w-new"},
        {"apiGroup": "apps", "resource": "statefulsets", "name": "w", "uid": "uid-w"},
    ]
    # Pinned already: nothing more.
    w.claims.put(w.claim(bound, allocated=True, users=(bound,), pinned=True))
    w.drain()
    calls = len(w.writer.calls)
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert len(w.writer.calls) == calls
    assert claim["metadata"]["uid"]


def test_an_update_that_changes_nothing_the_controller_reads_enqueues_nothing() -> None:
    w = World()
    w.sets.put(statefulset())
    pod = w.pods.put(replica("w-0", "0=n1:0", gated=False))
    w.claims.put(w.claim(pod))
    w.drain()
    conditions = replica("w-0", "0=n1:0", gated=False)
    conditions["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    conditions["metadata"]["resourceVersion"] = "2"
    w.pods.put(conditions)
    counted = statefulset()
    counted["status"]["readyReplicas"] = 1
    w.sets.put(counted)
    # kube-scheduler's finalizer on the claim (before it allocates), kwok's Running: nothing to decide.
    claim = w.claim(pod)
    claim["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    claim["metadata"]["resourceVersion"] = "2"
    w.claims.put(claim)
    assert w.drain() == []
    bound = replica("w-0", "0=n1:0", gated=False, node="n1")
    bound["status"]["phase"] = "Pending"
    w.pods.put(bound)
    assert w.drain() == ["pod:ns/w-0"]  # bound: its claim may be pinned now
    w.pods.put(replica("w-0", "0=n1:0", gated=False, node="n1"))  # Running
    assert w.drain() == []
    # A new update revision: its replicas and its claims.
    w.sets.put(statefulset(update="w-newer"))
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]


def test_a_slice_change_enqueues_only_the_replicas_mapped_to_its_node() -> None:
    w = World(nodes=("n1", "n2"))
    w.sets.put(statefulset(smap="0=n1:0\n1=n2:0"))
    w.pods.put(replica("w-0", "0=n1:0\n1=n2:0"))
    w.pods.put(replica("w-1", "0=n1:0\n1=n2:0"))
    w.drain()
    w.slices.put(node_slice("n2", 5))
    assert w.drain() == ["pod:ns/w-1"]
    w.slices.put(node_slice("n1", 4, driver="other.example.com"))
    assert w.drain() == []
    w.slices.delete(node_slice("n1"))
    assert w.drain() == ["pod:ns/w-0"]


def test_an_unpublished_gpu_waits_with_an_event_and_the_slice_that_publishes_it_makes_the_claim() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:4", replicas=1))
    w.pods.put(replica("w-0", "0=n1:4"))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == []
    [note] = w.events.notes(GPU_NOT_PUBLISHED)
    assert "GPU index 4 does not exist on node n1" in note and "is made as soon as" in note
    w.slices.put(node_slice("n1", 5))
    assert w.drain() == ["pod:ns/w-0"]
    w.ctl.process("pod:ns/w-0")
    assert w.writer.calls == [("create", "ns/w-0-gpus")]


def test_a_claim_made_before_its_gpu_left_the_slices_is_deleted_and_made_again_once_published() -> None:
    """The replica's pod came before the slices' change did (watches of two resources are not
    ordered): its claim asks for index 3, which the node no longer publishes. kube-scheduler can
    never allocate it, so it is deleted, the gate stays closed, and the wait is explained."""
    w = World()
    w.sets.put(statefulset(smap="0=n1:3", replicas=1))
    pod = w.pods.put(replica("w-0", "0=n1:3"))
    w.claims.put(w.claim(pod))
    w.drain()
    w.slices.put(node_slice("n1", 3))
    assert w.drain() == ["pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("delete", "ns/w-0-gpus")]
    [note] = w.events.notes(GPU_NOT_PUBLISHED)
    assert "GPU index 3 does not exist on node n1" in note and "is deleted and made again" in note
    # Deleting fails (a conflict): retried, nothing else done, no event yet.
    w.writer.calls.clear()
    w.writer.fail["delete"] = False
    assert w.ctl.process("pod:ns/w-0") is Next.AGAIN
    assert w.writer.calls == [] and len(w.events.notes(GPU_NOT_PUBLISHED)) == 1
    # An allocated claim is left alone (AllocatedGPUGone says why), and so is a bound replica's.
    w.writer.fail.clear()
    w.slices.put(node_slice("n1", 4))
    w.claims.put(w.claim(pod, allocated=True))
    w.slices.put(node_slice("n1", 3))
    w.drain()
    w.ctl.process("pod:ns/w-0")
    assert ("delete", "ns/w-0-gpus") not in w.writer.calls


def test_a_claim_that_is_not_ours_is_named() -> None:
    w = World()
    pod = w.pods.put(replica("w-0", "0=n1:0"))
    tenant = w.claim(pod)
    del tenant["metadata"]["labels"]
    w.claims.put(tenant)
    assert w.drain() == ["pod:ns/w-0"]  # the replica, not the claim: it is not ours
    w.ctl.process("pod:ns/w-0")
    assert w.events.reasons() == [CLAIM_NOT_OURS] and w.writer.calls == []


def test_a_claim_made_for_another_entry_is_replaced_once_its_old_pod_is_gone() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:1", replicas=1))
    old = replica("w-0", "0=n1:0", "w-old", gated=False, node="n1")
    new = w.pods.put(replica("w-0", "0=n1:1"))
    w.claims.put(w.claim(new, "0=n1:0", allocated=True, users=(old,), pinned=True))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE  # the old pod still uses it: wait
    assert w.writer.calls == []
    # The old pod is gone from reservedFor: unpinned, deleted, made again.
    w.claims.put(w.claim(new, "0=n1:0", allocated=True, pinned=True))
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("put_reserved", "ns/w-0-gpus"), ("delete", "ns/w-0-gpus")]
    assert w.writer.bodies[0] == []
    [note] = w.events.notes(CLAIM_REPLACED)
    assert note == (
        f"{CLAIM_REPLACED}: ResourceClaim ns/w-0-gpus is deleted and made again for entry '0=n1:1': "
        "it was made for entry '0=n1:0'."
    )
    w.claims.delete(w.claim(new, "0=n1:0"))
    assert w.drain() == ["pod:ns/w-0"]
    w.ctl.process("pod:ns/w-0")
    assert w.writer.calls[-1] == ("create", "ns/w-0-gpus")


def test_an_allocated_gpu_its_node_stops_publishing_is_reported() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:3", replicas=1))
    pod = w.pods.put(replica("w-0", "0=n1:3", gated=False, node="n1"))
    w.claims.put(w.claim(pod, allocated=True, users=(pod,), pinned=True))
    w.slices.put(node_slice("n1", 3))
    assert "pod:ns/w-0" in w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    [note] = w.events.notes(ALLOCATED_GPU_GONE)
    assert "ResourceClaim ns/w-0-gpus is allocated, but GPU index 3 does not exist" in note


# -- waits, and the rollout eviction decision ---------------------------------------------------------


def test_a_replica_waiting_for_a_foreign_claims_gpu_is_told_retried_and_queued_when_it_is_released() -> None:
    w = World()
    w.sets.put(statefulset(smap="0=n1:0", replicas=1))
    pod = w.pods.put(replica("w-0", "0=n1:0", gated=False))
    w.claims.put(w.claim(pod))
    foreign = w.claims.put(foreign_claim("f1", w.devices()[0]))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.WAITING
    [note] = w.events.notes(GPU_ALLOCATED_ELSEWHERE)
    assert note == (
        f"{GPU_ALLOCATED_ELSEWHERE}: replica 0 (entry '0=n1:0') waits for n1/{w.devices()[0].describe()}, "
        "which is allocated to ResourceClaim ns/f1 (pod ns/f1). It is placed as soon as that claim releases it."
    )
    assert w.writer.calls == [] and w.retries() == {"pod:ns/w-0"}
    assert w.ctl.index.waiting() == 1
    # Another claim changing (not freeing that device) queues nobody waiting.
    w.claims.put(foreign_claim("f2", w.devices()[1]))
    assert w.drain() == []
    w.claims.delete(foreign)
    assert w.drain() == ["pod:ns/w-0"]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE and w.ctl.index.waiting() == 0


SWAP_OLD, SWAP_NEW = "0=n1:0\n1=n1:1", "0=n1:1\n1=n1:0"


def rollout(w: World, holder_map: str = SWAP_NEW, **sts_spec: Any) -> None:
    """w's new map swaps GPUs: the new w-1 waits for device 0, which the outdated w-0 holds."""
    w.sets.put(statefulset(smap=holder_map, **sts_spec))
    w0 = w.pods.put(replica("w-0", SWAP_OLD, "w-old", gated=False, node="n1"))
    w1 = w.pods.put(replica("w-1", SWAP_NEW, gated=False))
    w.claims.put(w.claim(w0, allocated=True, users=(w0,), pinned=True))
    w.claims.put(w.claim(w1))
    w.drain()


def test_an_outdated_replica_of_the_same_statefulset_holding_the_gpu_is_evicted_once() -> None:
    w = World()
    rollout(w)
    assert w.ctl.process("pod:ns/w-1") is Next.WAITING
    assert w.writer.calls == [("evict", "ns/w-0")]
    [note] = w.events.notes(GPU_ALLOCATED_ELSEWHERE)
    assert note.endswith(
        "(pod ns/w-0). It is placed as soon as that claim releases it. Pod ns/w-0: evicted it (an outdated "
        "replica of StatefulSet w, revision w-old, for a replica of the update revision w-new)."
    )
    [(key, _, evicted)] = [e for e in w.events.sent if e[1] == EVICTED_FOR_ROLLOUT]
    assert key == "ns/w-0" and "of StatefulSet w held a GPU" in evicted
    w.ctl.process("pod:ns/w-1")
    assert w.writer.calls == [("evict", "ns/w-0")]
    assert "waiting for it to go" in w.events.notes(GPU_ALLOCATED_ELSEWHERE)[-1]


@pytest.mark.parametrize(
    ("holder_map", "spec", "why"),
    [
        # Index 1 on n1 and the UUID of that device name the same GPU: resolved on the node, it stays.
        ("UUID", {}, "but the new map gives it the same GPU"),
        ("0=n1:7\n1=n1:0", {}, "but the new map gives it the same GPU"),  # not published: never moved blindly
        (SWAP_NEW, {"updateStrategy": {"type": "OnDelete"}}, "updates OnDelete: delete pod ns/w-0"),
        (
            SWAP_NEW,
            {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}},
            "below its partition (1)",
        ),
    ],
    ids=["same-device-by-uuid", "unpublished", "on-delete", "partition"],
)
def test_a_holder_whose_statefulset_does_not_let_it_move_is_named_not_evicted(
    holder_map: str, spec: dict[str, Any], why: str
) -> None:
    w = World()
    if holder_map == "UUID":
        holder_map = f"0=n1:{w.devices()[0].uuid}\n1=n1:0"
    rollout(w, holder_map, **spec)
    assert w.ctl.process("pod:ns/w-1") is Next.WAITING
    assert w.writer.calls == []
    assert why in w.events.notes(GPU_ALLOCATED_ELSEWHERE)[0]


def test_a_waiting_replica_of_an_older_revision_evicts_nobody() -> None:
    w = World()
    rollout(w)
    w.pods.put(replica("w-1", SWAP_NEW, "w-older", gated=False))
    w.drain()
    w.ctl.process("pod:ns/w-1")
    assert w.writer.calls == []
    assert "is not of StatefulSet w's update revision" in w.events.notes(GPU_ALLOCATED_ELSEWHERE)[0]


@pytest.mark.parametrize("allowed", [False, True], ids=["default", "evict-other-workloads"])
def test_a_holder_of_another_statefulset_is_named_and_evicted_only_when_allowed(allowed: bool) -> None:
    w = World(other_workloads=allowed)
    w.sets.put(statefulset("a", "0=n1:0", replicas=1, update="a-new"))
    w.sets.put(statefulset("b", "0=n1:1", replicas=1, update="b-new"))
    b0 = w.pods.put(replica("b-0", "0=n1:0", "b-old", gated=False, node="n1"))
    a0 = w.pods.put(replica("a-0", "0=n1:0", "a-new", gated=False))
    w.claims.put(w.claim(b0, allocated=True, users=(b0,), pinned=True))
    w.claims.put(w.claim(a0))
    w.drain()
    assert w.ctl.process("pod:ns/a-0") is Next.WAITING
    [note] = w.events.notes(GPU_ALLOCATED_ELSEWHERE)
    if allowed:
        assert w.writer.calls == [("evict", "ns/b-0")]
        assert "Pod ns/b-0: evicted it (an outdated replica of StatefulSet b, revision b-old" in note
    else:
        assert w.writer.calls == []
        assert (
            "Pod ns/b-0: it belongs to another workload, StatefulSet ns/b, not to the waiting pod's "
            "StatefulSet ns/a" in note
        )
        assert "GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS=true" in note and "delete pod ns/b-0" in note


def test_a_disruption_budget_is_named_and_the_wait_retried() -> None:
    w = World()
    rollout(w)
    w.writer.fail["evict"] = ApiException(status=429, reason="Too Many Requests")
    assert w.ctl.process("pod:ns/w-1") is Next.WAITING
    assert "its eviction waits for a PodDisruptionBudget" in w.events.notes(GPU_ALLOCATED_ELSEWHERE)[0]
    assert w.retries() == {"pod:ns/w-1"}


# -- claims of ours that no longer apply ---------------------------------------------------------------


def test_a_claim_scaled_away_is_released_once_its_pod_is_gone() -> None:
    w = World()
    w.sets.put(statefulset(replicas=2))
    pod = w.pods.put(replica("w-1", "0=n1:0\n1=n1:1", gated=False, node="n1"))
    w.claims.put(w.claim(pod, allocated=True, pinned=True))
    w.drain()
    w.sets.put(statefulset(replicas=1))
    assert w.drain() == ["claim:ns/w-1-gpus", "pod:ns/w-1"]
    assert w.ctl.process("claim:ns/w-1-gpus") is Next.DONE
    assert w.writer.calls == []  # its pod is still there
    w.pods.delete(pod)
    assert w.drain() == ["claim:ns/w-1-gpus"]
    w.ctl.process("claim:ns/w-1-gpus")
    assert w.writer.calls == [("put_reserved", "ns/w-1-gpus"), ("delete", "ns/w-1-gpus")]


def test_a_deleted_statefulset_unpins_and_deletes_its_claims() -> None:
    w = World()
    sts = w.sets.put(statefulset(replicas=1))
    pod = w.pods.put(replica("w-0", "0=n1:0", gated=False, node="n1"))
    w.claims.put(w.claim(pod, allocated=True, users=(pod,), pinned=True))
    w.drain()
    deleting = statefulset(replicas=1)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    w.sets.put(deleting)
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    w.ctl.process("claim:ns/w-0-gpus")
    assert w.writer.calls == [("put_reserved", "ns/w-0-gpus")]  # unpinned; the garbage collector deletes it
    w.sets.delete(sts)
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]
    w.ctl.process("claim:ns/w-0-gpus")
    assert w.writer.calls[1:] == [("put_reserved", "ns/w-0-gpus"), ("delete", "ns/w-0-gpus")]


def test_a_claim_no_statefulset_owns_is_deleted_with_its_pod() -> None:
    w = World()
    pod = w.pods.put(replica("x-0", "0=n1:0"))
    claim = w.claim(pod)
    del claim["metadata"]["ownerReferences"]
    w.claims.put(claim)
    w.drain()
    w.ctl.process("claim:ns/x-0-gpus")
    assert w.writer.calls == []
    w.pods.delete(pod)
    assert w.drain() == ["claim:ns/x-0-gpus"]
    w.ctl.process("claim:ns/x-0-gpus")
    assert w.writer.calls == [("delete", "ns/x-0-gpus")]


# -- leadership, failures, cost --------------------------------------------------------------------------


def test_only_the_leader_writes_and_a_new_leader_looks_at_every_replica_and_claim_of_ours() -> None:
    w = World()
    w.leading = False
    w.sets.put(statefulset())
    pod = w.pods.put(replica("w-0", "0=n1:0"))
    w.claims.put(foreign_claim("f1", w.devices()[3]))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [] and w.events.sent == []
    w.claims.put(w.claim(pod))
    w.drain()
    w.leading = True
    w.ctl.started_leading()
    assert w.drain() == ["claim:ns/w-0-gpus", "pod:ns/w-0"]


@pytest.mark.parametrize(
    ("write", "answer"),
    [("open_gate", False), ("open_gate", ApiException(status=500, reason="boom"))],
    ids=["changed-under-us", "api-error"],
)
def test_a_write_that_fails_is_retried_with_the_keys_backoff(
    write: str, answer: bool | BaseException
) -> None:
    w = World()
    pod = w.pods.put(replica("w-0", "0=n1:0"))
    w.claims.put(w.claim(pod))
    w.drain()
    w.writer.fail[write] = answer
    assert w.ctl.process("pod:ns/w-0") is Next.AGAIN
    assert w.retries() == {"pod:ns/w-0"} and w.ctl.backoff.failures("pod:ns/w-0") == 1
    del w.writer.fail[write]
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.ctl.backoff.failures("pod:ns/w-0") == 0


@pytest.mark.parametrize("others", [0, 300])
def test_the_work_for_one_replica_does_not_grow_with_the_clusters_other_claims(others: int) -> None:
    """Many other claims allocated on other nodes (and slices there): one replica's work reads the
    same objects, and nothing is listed."""
    nodes = tuple(f"o{i}" for i in range(others // 4))
    w = World(nodes=("n1", *nodes))
    for i in range(others):
        node = nodes[i // 4]
        w.claims.put(foreign_claim(f"f{i}", w.devices(node)[i % 4]))
    rollout(w)
    for cache in (w.pods, w.claims, w.slices, w.sets):
        cache.gets = cache.lists = 0
    w.ctl.process("pod:ns/w-1")
    reads = (w.pods.gets, w.claims.gets, w.slices.gets, w.sets.gets)
    # The replica and its holder; its claim and the holder's; n1's slice twice (the replica's
    # entry, then the holder's new one, resolved); the StatefulSet w.
    assert reads == (2, 2, 2, 1), reads
    assert (w.pods.lists, w.claims.lists, w.slices.lists, w.sets.lists) == (0, 0, 0, 0)


def test_the_relation_index() -> None:
    r: Relation[str] = Relation()
    assert r.put("a", ["x", "y"]) == frozenset()
    r.put("b", ["y"])
    assert r.keys("y") == {"a", "b"} and r.keys("x", "z") == {"a"}
    assert r.put("a", ["z"]) == {"x", "y"}
    assert r.keys("y") == {"b"} and r.keys("x") == set()
    assert r.drop("a") == {"z"} and len(r) == 1 and r.values("b") == {"y"}


def test_the_scheduler_starts_reports_and_leads_with_the_claim_controller() -> None:
    """main.build hands the controller to the Scheduler: its caches are started, waited for and
    reported with the scheduler's, and it learns when this process starts leading."""
    w = World()
    w.pods.put(replica("w-0", "0=n1:0"))
    w.drain()
    settings = Settings(identity="t", leader_elect=False, dra=True).validate()
    sched = Scheduler(settings, cast(PodWriter, w.writer), cast(EventRecorder, w.events))
    mine = [cast(Cache, Informer(cast(Handler, None))) for _ in range(3)]
    sched.attach(*mine, None, w.ctl)
    assert list(sched.caches()) == [
        "pods",
        "assigned-pods",
        "nodes",
        "dra-pods",
        "resourceclaims",
        "resourceslices",
        "statefulsets",
        "devicetaintrules",
    ]
    assert sched.health.ready()["resourceclaims-synced"]
    sched.started_leading()
    # Keys in the controller's hands are a burst: the Normal Events (ClaimCreated) and the full
    # garbage collections wait, as while pods are bound.
    assert sched.placing()
    assert w.drain() == ["pod:ns/w-0"]
    assert not sched.placing()
    stop = threading.Event()
    threads = w.ctl.start_workers(stop)
    assert [t.name for t in threads] == ["dra-worker-0"]
    stop.set()
    w.ctl.shutdown()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads)
