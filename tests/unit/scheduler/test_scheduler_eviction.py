"""The one rollout eviction decision (kube_gpu_scheduler/scheduler/rollout/eviction.py), branch by branch,
and what ``Evictions`` does with it: evict once, name a PodDisruptionBudget, a holder gone.

Both paths ask it: the standalone scheduler (tests/unit/scheduler/test_scheduler_rollout.py, the holder
from the ledger) and DRA mode (tests/unit/dra/test_scheduler_dra.py, the holder from the claim).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from kubernetes.client import ApiException

from kube_gpu_scheduler.domain.rules import EVICTED_FOR_ROLLOUT
from kube_gpu_scheduler.domain.schedmap import Entry
from kube_gpu_scheduler.scheduler.rollout import eviction
from kube_gpu_scheduler.scheduler.rollout.eviction import Evictions, Verdict, decide

NEW_MAP = "0=node2:3\n1=node1:3\n"  # replica 1 (waiting) wants node1:3, which replica 0 holds


def sts(
    name: str = "w",
    uid: str = "w-uid",
    update: str | None = "w-new",
    text: str | None = NEW_MAP,
    strategy: dict[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    template: dict[str, Any] = {"metadata": {"annotations": {"gpu-scheduling-map": text} if text else {}}}
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"template": template},
        "status": {"updateRevision": update} if update else {},
    }
    if strategy is not None:
        obj["spec"]["updateStrategy"] = strategy
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return obj


def pod(
    name: str,
    revision: str,
    *,
    owner: str = "w",
    uid: str = "w-uid",
    kind: str = "StatefulSet",
    namespace: str = "ns",
    index: bool = True,
    deleting: bool = False,
    bare: bool = False,
) -> dict[str, Any]:
    labels = {"controller-revision-hash": revision}
    if index and name[-1].isdigit():
        labels["apps.kubernetes.io/pod-index"] = name.rsplit("-", 1)[1]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}-{revision}",
        "labels": labels,
    }
    if not bare:
        meta["ownerReferences"] = [{"kind": kind, "name": owner, "uid": uid, "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {}, "status": {}}


WAITING = pod("w-1", "w-new")


def lookup(*found: dict[str, Any]) -> Callable[[Mapping[str, Any]], Mapping[str, Any]]:
    """The StatefulSets lookup: by name and UID ({}: gone or replaced)."""
    by = {(s["metadata"]["name"], s["metadata"]["uid"]): s for s in found}
    return lambda ref: by.get((str(ref.get("name")), str(ref.get("uid"))), {})


def moves(entry: Entry) -> bool:
    """``keeps`` of these tests: an entry keeps node1:3 when it names it."""
    return entry.node == "node1" and 3 in entry.gpus


B_MAP = "0=node2:1\n1=node2:2\n"  # b's replica 0 moves off node1:3
B_KEEPS = "0=node1:3\n1=node2:2\n"

CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, list[dict[str, Any]], bool, bool, str]] = [
    # (id, waiting, holder, statefulsets, other_workloads, evicted, in the note)
    ("waiting-not-a-replica", pod("w-1", "w-new", bare=True), pod("w-0", "w-old"), [sts()], False, False, ""),
    (
        "waiting-of-a-replicaset",
        pod("w-1", "w-new", kind="ReplicaSet"),
        pod("w-0", "w-old"),
        [sts()],
        False,
        False,
        "",
    ),
    (
        "holder-not-ours",
        WAITING,
        None,
        [sts()],
        False,
        False,
        "the holder is not one of this scheduler's pods",
    ),
    ("own-statefulset-gone", WAITING, pod("w-0", "w-old"), [], False, False, ""),
    (
        "waiting-outdated",
        pod("w-1", "w-old"),
        pod("w-0", "w-old"),
        [sts()],
        False,
        False,
        "the waiting pod is not of StatefulSet w's update revision (w-new): nothing is evicted for it",
    ),
    (
        "no-update-revision",
        WAITING,
        pod("w-0", "w-old"),
        [sts(update=None)],
        False,
        False,
        "update revision (None)",
    ),
    (
        "holder-updated",
        WAITING,
        pod("w-0", "w-new"),
        [sts()],
        False,
        False,
        "it is a replica of StatefulSet w at its update revision (w-new): the maps give that GPU twice",
    ),
    (
        "holder-terminating",
        WAITING,
        pod("w-0", "w-old", deleting=True),
        [sts()],
        False,
        False,
        "is an outdated replica of StatefulSet w (revision w-old) and is terminating",
    ),
    (
        "on-delete",
        WAITING,
        pod("w-0", "w-old"),
        [sts(strategy={"type": "OnDelete"})],
        False,
        False,
        "which updates OnDelete: delete pod ns/w-0 to let it move",
    ),
    (
        "below-partition",
        WAITING,
        pod("w-0", "w-old"),
        [sts(strategy={"type": "RollingUpdate", "rollingUpdate": {"partition": 1}})],
        False,
        False,
        "below its partition (1): it stays at revision w-old until the partition is lowered",
    ),
    (
        "at-partition",
        WAITING,
        pod("w-0", "w-old"),
        [sts(strategy={"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})],
        False,
        True,
        "a replica of the update revision w-new",
    ),
    (
        "keeps-the-gpu",
        WAITING,
        pod("w-0", "w-old"),
        [sts(text="0=node1:3\n1=node1:3\n")],
        False,
        False,
        "but the new map gives it the same GPU",
    ),
    ("no-map-on-template", WAITING, pod("w-0", "w-old"), [sts(text=None)], False, False, "the same GPU"),
    (
        "map-does-not-parse",
        WAITING,
        pod("w-0", "w-old"),
        [sts(text="0=node1:x")],
        False,
        False,
        "the same GPU",
    ),
    (
        "holder-without-ordinal",
        WAITING,
        pod("w-x", "w-old", index=False),
        [sts()],
        False,
        False,
        "the same GPU",
    ),
    (
        "ordinal-scaled-out-of-the-map",
        WAITING,
        pod("w-5", "w-old"),
        [sts()],
        False,
        True,
        "update revision w-new",
    ),
    (
        "outdated-and-moving",
        WAITING,
        pod("w-0", "w-old"),
        [sts()],
        False,
        True,
        "a replica of the update revision w-new",
    ),
    (
        "another-statefulset",
        WAITING,
        pod("b-0", "b-old", owner="b", uid="b-uid"),
        [sts(), sts("b", "b-uid", "b-new", B_MAP)],
        False,
        False,
        "it belongs to another workload, StatefulSet ns/b, not to the waiting pod's StatefulSet ns/w: "
        "gpu-scheduler evicts only an outdated replica of the waiting pod's own StatefulSet, or set "
        "GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS=true to let it evict an outdated replica of another "
        "StatefulSet of the namespace; change one of the two maps, or delete pod ns/b-0",
    ),
    (
        "another-kind",
        WAITING,
        pod("r-0", "x", owner="r", uid="r-uid", kind="ReplicaSet"),
        [sts()],
        True,
        False,
        "own StatefulSet; change one of the two maps",
    ),
    (
        "another-namespace",
        WAITING,
        pod("w-0", "w-old", namespace="elsewhere"),
        [sts()],
        True,
        False,
        "StatefulSet elsewhere/w, not to the waiting pod's StatefulSet ns/w: gpu-scheduler evicts only an outdated replica of the waiting pod's own StatefulSet; change",
    ),
    (
        "a-bare-pod",
        WAITING,
        pod("x-0", "x", bare=True),
        [sts()],
        True,
        False,
        "it belongs to another workload, no controller (bare pod ns/x-0)",
    ),
    (
        "recreated-statefulset",
        WAITING,
        pod("w-0", "w-old", uid="deleted-uid", deleting=True),
        [sts()],
        True,
        False,
        "it belongs to an earlier StatefulSet ns/w (deleted and created again since), not to the waiting "
        "pod's StatefulSet ns/w, and is terminating: the GPU is free once it is gone",
    ),
    (
        "other-allowed-but-gone",
        WAITING,
        pod("b-0", "b-old", owner="b", uid="b-uid"),
        [sts()],
        True,
        False,
        "it belongs to another workload, StatefulSet ns/b, not to the waiting pod's StatefulSet ns/w: StatefulSet ns/b is gone",
    ),
    (
        "other-allowed-keeps",
        WAITING,
        pod("b-0", "b-old", owner="b", uid="b-uid"),
        [sts(), sts("b", "b-uid", "b-new", B_KEEPS)],
        True,
        False,
        "StatefulSet ns/w: it is an outdated replica of StatefulSet b, but the new map gives it the same GPU",
    ),
    (
        "other-allowed-updated",
        WAITING,
        pod("b-0", "b-new", owner="b", uid="b-uid"),
        [sts(), sts("b", "b-uid", "b-new", B_MAP)],
        True,
        False,
        "at its update revision (b-new)",
    ),
    (
        "other-allowed-moves",
        WAITING,
        pod("b-0", "b-old", owner="b", uid="b-uid"),
        [sts(), sts("b", "b-uid", "b-new", B_MAP)],
        True,
        True,
        "a replica of StatefulSet ns/w, another workload (GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS)",
    ),
]


@pytest.mark.parametrize(
    ("waiting", "holder", "found", "other_workloads", "evicted", "note"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_decision(
    waiting: dict[str, Any],
    holder: dict[str, Any] | None,
    found: list[dict[str, Any]],
    other_workloads: bool,
    evicted: bool,
    note: str,
) -> None:
    key = f"ns/{holder['metadata']['name']}" if holder else "ns/w-0"
    verdict = decide(waiting, holder, key, lookup(*found), moves, other_workloads=other_workloads)
    assert verdict.evict is evicted, verdict
    if note:
        assert note in verdict.note, verdict.note
    else:
        assert verdict.note == ""
    if evicted:
        owner = (holder or {})["metadata"]["ownerReferences"][0]
        assert verdict.statefulset["metadata"]["uid"] == owner["uid"]


def test_keeps_is_asked_about_the_holders_entry_in_its_new_map() -> None:
    seen: list[Entry] = []
    decide(WAITING, pod("w-0", "w-old"), "ns/w-0", lookup(sts()), lambda e: seen.append(e) or False)
    assert seen == [Entry(0, "node2", (3,))]


# -- Evictions: the decision acted on ----------------------------------------------------------


class Writer:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.evicted: list[str] = []

    def evict(self, pod: Mapping[str, Any]) -> None:
        if self.fail is not None:
            raise self.fail
        self.evicted.append(pod["metadata"]["name"])


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    def warning(self, pod: Mapping[str, Any], reason: str, note: str) -> bool:
        self.sent.append((pod["metadata"]["name"], reason, note))
        return True


def evict(
    fail: BaseException | None = None, holder: dict[str, Any] | None = None
) -> tuple[str, Writer, Events]:
    writer, events = Writer(fail), Events()
    ev = Evictions(writer, events)
    note = ev.note(WAITING, holder or pod("w-0", "w-old"), "ns/w-0", lookup(sts()), moves)
    return note, writer, events


def test_an_evicted_holder_gets_its_event_and_is_evicted_once() -> None:
    writer, events = Writer(), Events()
    ev = Evictions(writer, events)
    holder = pod("w-0", "w-old")
    first = ev.note(WAITING, holder, "ns/w-0", lookup(sts()), moves)
    again = ev.note(WAITING, holder, "ns/w-0", lookup(sts()), moves)
    assert first == (
        "evicted it (an outdated replica of StatefulSet w, revision w-old, for a replica of the update revision w-new)"
    )
    assert again == "evicted it (an outdated replica of StatefulSet w, revision w-old); waiting for it to go"
    assert writer.evicted == ["w-0"]
    [(name, reason, note)] = events.sent
    assert (name, reason) == ("w-0", EVICTED_FOR_ROLLOUT)
    assert note == (
        "EvictedForRollout: an outdated replica (revision w-old) of StatefulSet w held a GPU that a replica "
        "of the update revision w-new is mapped to, and its own new entry (revision w-new) moves it "
        "elsewhere; evicted so that the rollout goes on"
    )


def test_a_holder_that_stays_is_not_evicted() -> None:
    note, writer, events = evict(holder=pod("w-0", "w-new"))
    assert writer.evicted == [] and events.sent == [] and "at its update revision" in note


def _err(status: int, body: str | None = None) -> ApiException:
    err = ApiException(status=status, reason="x")
    err.body = body
    return err


@pytest.mark.parametrize(
    ("fail", "note"),
    [
        (
            _err(429),
            "it is an outdated replica of StatefulSet w; its eviction waits for a PodDisruptionBudget",
        ),
        (
            _err(
                429,
                '{"kind":"Status","code":429,"message":"Cannot evict pod as it would violate the pod\'s disruption budget."}',
            ),
            "(Cannot evict pod as it would violate the pod's disruption budget.)",
        ),
        (_err(404), "it is gone"),
        (_err(409), "it is gone (replaced by a new pod of that name)"),
        (_err(500), "evicting it failed"),
    ],
    ids=["pdb", "pdb-message", "not-found", "replaced", "other"],
)
def test_a_refused_eviction_is_named_and_asked_again_next_time(fail: BaseException, note: str) -> None:
    said, writer, events = evict(fail)
    assert note in said, said
    assert writer.evicted == [] and events.sent == []


def test_a_pdb_refusal_is_not_remembered_as_an_eviction() -> None:
    writer, events = Writer(_err(429)), Events()
    ev = Evictions(writer, events)
    holder = pod("w-0", "w-old")
    ev.note(WAITING, holder, "ns/w-0", lookup(sts()), moves)
    writer.fail = None
    assert ev.note(WAITING, holder, "ns/w-0", lookup(sts()), moves).startswith("evicted it (")
    assert writer.evicted == ["w-0"]


def test_the_evicted_holders_are_remembered_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eviction, "MAX_REMEMBERED", 2)
    writer, events = Writer(), Events()
    ev = Evictions(writer, events)
    for i in range(3):
        holder = pod("w-0", f"w-old{i}")
        ev.note(WAITING, holder, "ns/w-0", lookup(sts()), moves)
    assert len(ev._evicted) == 2 and "uid-w-0-w-old0" not in ev._evicted


def test_a_verdict_is_a_value() -> None:
    assert Verdict(False, "x") == Verdict(False, "x")


def test_two_waiting_replicas_asking_at_once_evict_the_holder_once() -> None:
    """Workers run in parallel: a second ask while the first eviction is in flight sends none."""
    events = Events()
    inside = threading.Event()
    release = threading.Event()

    class Slow(Writer):
        def evict(self, pod: Mapping[str, Any]) -> None:
            inside.set()
            release.wait(5)
            super().evict(pod)

    writer = Slow()
    ev = Evictions(writer, events)
    holder = pod("w-0", "w-old")
    first: list[str] = []
    thread = threading.Thread(
        target=lambda: first.append(ev.note(WAITING, holder, "ns/w-0", lookup(sts()), moves))
    )
    thread.start()
    assert inside.wait(5)
    assert ev.note(pod("w-2", "w-new"), holder, "ns/w-0", lookup(sts()), moves).endswith(
        "waiting for it to go"
    )
    release.set()
    thread.join(5)
    assert first[0].startswith("evicted it (") and writer.evicted == ["w-0"] and len(events.sent) == 1
