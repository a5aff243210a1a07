"""DRA mode's claim controller with replicas that share a GPU (kube_gpu_scheduler/domain/draclaims.py),
without an apiserver (the caches and writer of test_scheduler_dra.py): the shared claim is made
once, each sharer's gate opens on it, it is pinned, its arrival and changes enqueue every sharer,
and it is released once no pod uses it and the map no longer shares that GPU.
tests/integration/test_dra_sharing.py shows the same on the real apiserver and kube-scheduler."""

from __future__ import annotations

from typing import Any

from kube_gpu_scheduler.domain import dra, draclaims
from kube_gpu_scheduler.domain.rules.catalogue import CLAIM_CREATED, GPU_ALLOCATED_ELSEWHERE
from kube_gpu_scheduler.domain.schedmap import parse
from kube_gpu_scheduler.scheduler.dra.controller import Next
from tests.unit.dra.test_scheduler_dra import NS, World, foreign_claim, replica, statefulset

SHARED = "3=n1:1\n4=n1:1\n"


def sharer(name: str, smap: str = SHARED, **kw: Any) -> dict[str, Any]:
    """A replica as the injection policy admits it: the claims of draclaims.layout."""
    pod = replica(name, smap, **kw)
    ordinal = int(name.rsplit("-", 1)[1])
    parts = draclaims.layout(parse(smap), ordinal, name)
    pod["spec"]["resourceClaims"] = [{"name": p.ref, "resourceClaimName": p.name} for p in parts]
    return pod


def made(
    w: World, body: dict[str, Any], *, users: tuple[dict[str, Any], ...] = (), pinned: bool = False
) -> dict[str, Any]:
    """``body`` (as the controller wrote it) stored, allocated its devices when ``users``."""
    claim = {
        **body,
        "metadata": {**body["metadata"], "uid": f"uid-{body['metadata']['name']}", "resourceVersion": "1"},
    }
    status: dict[str, Any] = {}
    if users or pinned:
        devices = [
            d for d in w.devices() if d.name in body["metadata"]["annotations"][dra.DEVICES_ANNOTATION]
        ]
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": dra.request_name(i), "driver": dra.DRIVER, "pool": d.pool, "device": d.name}
                    for i, d in enumerate(devices)
                ]
            }
        }
        reserved = [
            {"resource": "pods", "name": u["metadata"]["name"], "uid": u["metadata"]["uid"]} for u in users
        ]
        if pinned:
            reserved.append({"apiGroup": "apps", "resource": "statefulsets", "name": "w", "uid": "uid-w"})
        status["reservedFor"] = reserved
    claim["status"] = status
    return w.claims.put(claim)


def test_two_sharers_make_one_claim_open_both_gates_and_pin_it() -> None:
    w = World()
    w.sets.put(statefulset(smap=SHARED, replicas=5))
    p3, p4 = w.pods.put(sharer("w-3")), w.pods.put(sharer("w-4"))
    assert w.drain() == ["pod:ns/w-3", "pod:ns/w-4"]
    assert w.ctl.process("pod:ns/w-3") is Next.DONE
    assert w.writer.calls == [("create", "ns/w-3-shared-1")]
    body = w.writer.bodies[0]
    assert body["metadata"]["annotations"][draclaims.SHARED_ANNOTATION] == "n1:1"
    assert dra.ENTRY_ANNOTATION not in body["metadata"]["annotations"]
    assert body["metadata"]["ownerReferences"][0]["name"] == "w"
    [note] = w.events.notes(CLAIM_CREATED)
    assert "ResourceClaim ns/w-3-shared-1 asks for n1/gpu-1" in note and "shared by replicas 3, 4" in note
    # Its arrival enqueues both sharers; each opens its gate on it.
    claim = made(w, body)
    assert w.drain() == ["claim:ns/w-3-shared-1", "pod:ns/w-3", "pod:ns/w-4"]
    for pod in ("w-3", "w-4"):
        assert w.ctl.process(f"pod:ns/{pod}") is Next.DONE
    assert w.writer.calls[1:] == [("open_gate", "ns/w-3"), ("open_gate", "ns/w-4")]
    # kube-scheduler allocates it for w-3 and reserves it for both: pinned once.
    w.pods.put(sharer("w-3", gated=False, node="n1"))
    w.pods.put(sharer("w-4", gated=False, node="n1"))
    claim = made(w, body, users=(p3, p4))
    w.drain()
    assert w.ctl.process("pod:ns/w-3") is Next.DONE
    assert w.writer.calls[-1] == ("put_reserved", "ns/w-3-shared-1")
    assert [r["resource"] for r in w.writer.bodies[-1]] == ["pods", "pods", "statefulsets"]
    assert claim["metadata"]["name"] == "w-3-shared-1"


def test_a_partial_overlap_makes_the_own_claim_and_the_shared_one() -> None:
    smap = "0=n1:0,1\n1=n1:1,2\n"
    w = World()
    w.sets.put(statefulset(smap=smap, replicas=2))
    w.pods.put(sharer("w-0", smap))
    w.drain()
    assert w.ctl.process("pod:ns/w-0") is Next.DONE
    assert w.writer.calls == [("create", "ns/w-0-gpus"), ("create", "ns/w-0-shared-1")]
    own, shared = w.writer.bodies
    assert own["metadata"]["annotations"][dra.ENTRY_ANNOTATION] == "0=n1:0"
    assert shared["metadata"]["annotations"][draclaims.SHARED_ANNOTATION] == "n1:1"
    assert [len(b["spec"]["devices"]["requests"]) for b in (own, shared)] == [1, 1]


def test_a_sharer_waits_for_a_gpu_a_foreign_claim_holds_and_the_release_wakes_both() -> None:
    w = World()
    w.sets.put(statefulset(smap=SHARED, replicas=5))
    w.pods.put(sharer("w-3", gated=False))
    w.pods.put(sharer("w-4", gated=False))
    foreign = w.claims.put(foreign_claim("f", w.devices()[1]))
    w.drain()
    assert w.ctl.process("pod:ns/w-3") is Next.DONE  # makes the shared claim
    made(w, w.writer.bodies[0])
    w.drain()
    assert w.ctl.process("pod:ns/w-3") is Next.WAITING
    assert any("allocated to ResourceClaim ns/f" in n for n in w.events.notes(GPU_ALLOCATED_ELSEWHERE))
    assert w.ctl.process("pod:ns/w-4") is Next.WAITING
    w.claims.delete(foreign)
    assert {"pod:ns/w-3", "pod:ns/w-4"} <= set(w.drain())


def test_the_shared_claim_is_released_once_no_pod_uses_it_and_the_map_shares_it_no_more() -> None:
    w = World()
    w.sets.put(statefulset(smap=SHARED, replicas=5))
    w.pods.put(sharer("w-3"))
    w.drain()
    w.ctl.process("pod:ns/w-3")
    body = w.writer.bodies[0]
    p3, p4 = (
        w.pods.put(sharer("w-3", gated=False, node="n1")),
        w.pods.put(sharer("w-4", gated=False, node="n1")),
    )
    claim = made(w, body, users=(p3, p4), pinned=True)
    w.drain()
    calls = len(w.writer.calls)
    # The map unshares GPU 1 (4 moves to GPU 2); w-4's pod goes: w-3 still uses the claim.
    w.sets.put(statefulset(smap="3=n1:1\n4=n1:2\n", replicas=5))
    w.pods.delete(p4)
    claim = made(w, body, users=(p3,), pinned=True)
    w.drain()
    assert w.ctl.process(f"claim:{NS}/w-3-shared-1") is Next.DONE
    assert len(w.writer.calls) == calls, w.writer.calls[calls:]
    # w-3's old pod goes too: no pod uses it, no entry shares GPU 1: unpinned and deleted.
    w.pods.delete(p3)
    made(w, body, pinned=True)
    w.drain()
    assert w.ctl.process(f"claim:{NS}/w-3-shared-1") is Next.DONE
    assert w.writer.calls[calls:] == [("put_reserved", "ns/w-3-shared-1"), ("delete", "ns/w-3-shared-1")]
    assert claim["metadata"]["name"] == "w-3-shared-1"


def test_a_shared_claim_the_map_still_shares_stays_pinned_between_pods() -> None:
    w = World()
    w.sets.put(statefulset(smap=SHARED, replicas=5))
    w.pods.put(sharer("w-3"))
    w.drain()
    w.ctl.process("pod:ns/w-3")
    body = w.writer.bodies[0]
    made(w, body, pinned=True)  # both pods gone for a restart; the pin keeps the allocation
    w.pods.delete(w.pods.objs["ns/w-3"])
    w.drain()
    calls = len(w.writer.calls)
    assert w.ctl.process(f"claim:{NS}/w-3-shared-1") is Next.DONE
    assert w.writer.calls[calls:] == []
    # Scaled down to 4: replica 3 is still a sharer, so it stays; to 3, it goes.
    w.sets.put(statefulset(smap=SHARED, replicas=4))
    w.drain()
    assert w.ctl.process(f"claim:{NS}/w-3-shared-1") is Next.DONE
    assert w.writer.calls[calls:] == []
    w.sets.put(statefulset(smap=SHARED, replicas=3))
    w.drain()
    assert w.ctl.process(f"claim:{NS}/w-3-shared-1") is Next.DONE
    assert w.writer.calls[calls:] == [("put_reserved", "ns/w-3-shared-1"), ("delete", "ns/w-3-shared-1")]


def test_a_shared_claim_made_for_an_earlier_map_evicts_its_outdated_sharer() -> None:
    """The map adds GPU 2 to the group 3 and 4 share (its name stays w-3-shared-1): the new w-4
    finds the claim made for n1:1 and used by the outdated w-3, whose own new entry wants it
    otherwise; the rollout evicts w-3, and once no pod uses the claim it is made again."""
    old, new = SHARED, "3=n1:1,2\n4=n1:1,2\n"
    w = World()
    w.sets.put(statefulset(smap=old, replicas=5))
    w.pods.put(sharer("w-3", old))
    w.drain()
    w.ctl.process("pod:ns/w-3")
    body = w.writer.bodies[0]
    p3 = w.pods.put(sharer("w-3", old, revision="w-old", gated=False, node="n1"))
    made(w, body, users=(p3,), pinned=True)
    w.sets.put(statefulset(smap=new, replicas=5))
    w.pods.put(sharer("w-4", new))
    w.drain()
    calls = len(w.writer.calls)
    assert w.ctl.process("pod:ns/w-4") is Next.DONE
    assert w.writer.calls[calls:] == [("evict", "ns/w-3")]
    [note] = w.events.notes(GPU_ALLOCATED_ELSEWHERE)
    assert (
        "ResourceClaim ns/w-3-shared-1, which its map shares with other replicas, was made for an earlier map"
        in note
    )
    assert "used by pod ns/w-3" in note and "evicted it" in note, note
    # w-3 is gone: the claim is unpinned, deleted, and made again for n1:1,2.
    w.pods.delete(p3)
    made(w, body, pinned=True)
    w.drain()
    assert w.ctl.process("pod:ns/w-4") is Next.DONE
    assert w.writer.calls[calls + 1 :] == [("put_reserved", "ns/w-3-shared-1"), ("delete", "ns/w-3-shared-1")]
    # A sharer of the update revision is never evicted: the maps then give that claim twice.
    w2 = World()
    w2.sets.put(statefulset(smap=new, replicas=5))
    w2.pods.put(sharer("w-3", old))
    w2.drain()
    w2.ctl.process("pod:ns/w-3")
    p3 = w2.pods.put(sharer("w-3", old, gated=False, node="n1"))  # revision w-new, an old map
    made(w2, w2.writer.bodies[0], users=(p3,), pinned=True)
    w2.pods.put(sharer("w-4", new))
    w2.drain()
    calls = len(w2.writer.calls)
    assert w2.ctl.process("pod:ns/w-4") is Next.DONE
    assert ("evict", "ns/w-3") not in w2.writer.calls[calls:]
