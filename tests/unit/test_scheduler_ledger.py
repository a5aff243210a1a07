"""The GPU ledger: who holds which node:GPU, from the pods as the API shows them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from scheduler.ledger import Claim, Ledger, claim_of, format_assignment, is_active, parse_assignment

ASSIGNED = "gpu-scheduler/assigned"


def pod(
    name: str = "w-0",
    uid: str | None = None,
    assigned: str | None = None,
    node: str | None = None,
    phase: str = "Pending",
    smap: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    annotations = {}
    if assigned is not None:
        annotations[ASSIGNED] = assigned
    if smap is not None:
        annotations["gpu-scheduling-map"] = smap
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": uid or f"uid-{name}",
        "annotations": annotations,
    }
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    spec = {"nodeName": node} if node else {}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


# -- the annotation -----------------------------------------------------------------------


def test_assignment_round_trip() -> None:
    assert format_assignment("node1", [0, 1]) == "node1:0,1"
    assert parse_assignment("node1:0,1") == Claim("node1", (0, 1))
    assert parse_assignment(" node1 : 3 ") == Claim("node1", (3,))


def test_malformed_assignments_are_ignored() -> None:
    for bad in (
        None,
        "",
        "node1",
        "node1:",
        "Node1:0",
        "node1:x",
        "node1:0\n1=node2:1",
        "a:1;b:2",
        "n:1 # c",
    ):
        assert parse_assignment(bad) is None, bad


@given(
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True),
    st.lists(st.integers(0, 1023), min_size=1, max_size=8, unique=True),
)
def test_any_claim_round_trips(node: str, gpus: list[int]) -> None:
    assert parse_assignment(format_assignment(node, gpus)) == Claim(node, tuple(gpus))


# -- what a pod holds ------------------------------------------------------------------------


def test_annotation_is_the_claim_even_before_binding() -> None:
    assert claim_of(pod(assigned="node1:0,1")) == Claim("node1", (0, 1))


def test_bound_pod_without_annotation_holds_its_map_entry_on_that_node() -> None:
    smap = "0=node1:0,1\n1=node2:2"
    assert claim_of(pod(node="node1", phase="Running", smap=smap)) == Claim("node1", (0, 1))
    assert claim_of(pod(node="node9", phase="Running", smap=smap)) is None  # bound elsewhere
    assert claim_of(pod(node="node1", phase="Running", smap="0=node1:x")) is None  # bad map
    assert claim_of(pod(phase="Pending", smap=smap)) is None  # neither bound nor claimed


def test_annotation_naming_another_node_than_the_binding_holds_nothing() -> None:
    assert claim_of(pod(assigned="node1:0", node="node2", phase="Running")) is None


def test_finished_pods_hold_nothing_terminating_pods_still_hold() -> None:
    for phase in ("Succeeded", "Failed"):
        assert not is_active(pod(phase=phase))
        assert claim_of(pod(assigned="node1:0", node="node1", phase=phase)) is None
    terminating = pod(assigned="node1:0", node="node1", phase="Running", deleting=True)
    assert is_active(terminating)
    assert claim_of(terminating) == Claim("node1", (0,))


# -- the index ---------------------------------------------------------------------------------


def test_holders_and_release() -> None:
    ledger = Ledger()
    a = pod("a-0", assigned="node1:0,1", node="node1", phase="Running")
    assert ledger.observe(a) == set()
    assert ledger.holders("node1", [1, 2]) == [(1, "ns/a-0")]
    assert ledger.holders("node1", [0, 1], exclude_uid="uid-a-0") == []
    assert ledger.snapshot() == {"node1:0": ["ns/a-0"], "node1:1": ["ns/a-0"]}
    assert len(ledger) == 1

    finished = pod("a-0", assigned="node1:0,1", node="node1", phase="Succeeded")
    assert ledger.observe(finished) == {"node1"}
    assert ledger.holders("node1", [0, 1]) == []
    assert len(ledger) == 0


def test_forget_releases_and_is_idempotent() -> None:
    ledger = Ledger()
    a = pod("a-0", assigned="node2:2")
    ledger.observe(a)
    assert ledger.forget(a) == {"node2"}
    assert ledger.forget(a) == set()
    assert ledger.snapshot() == {}


def test_moving_a_claim_releases_the_old_node_only() -> None:
    ledger = Ledger()
    ledger.observe(pod("a-0", assigned="node1:0,1"))
    assert ledger.observe(pod("a-0", assigned="node1:0")) == {"node1"}
    assert ledger.observe(pod("a-0", assigned="node2:0")) == {"node1"}
    assert ledger.observe(pod("a-0", assigned="node2:0,1")) == set()
    assert ledger.holders("node1", [0, 1]) == []
    assert ledger.claim("uid-a-0") == Claim("node2", (0, 1))


def test_same_name_new_uid_is_another_pod() -> None:
    ledger = Ledger()
    old = pod("w-0", uid="old", assigned="node1:0", node="node1", phase="Running", deleting=True)
    new = pod("w-0", uid="new", assigned="node1:0")
    ledger.observe(old)
    ledger.observe(new)
    assert sorted(ledger.holders("node1", [0])) == [(0, "ns/w-0"), (0, "ns/w-0")]
    assert ledger.forget(old) == {"node1"}
    assert ledger.holders("node1", [0], exclude_uid="new") == []
    assert ledger.holders("node1", [0]) == [(0, "ns/w-0")]


def test_reserve_is_exclusive() -> None:
    ledger = Ledger()
    a, b = pod("a-0"), pod("b-0")
    assert ledger.reserve(a, Claim("node1", (0, 1))) == []
    assert ledger.reserve(b, Claim("node1", (1, 2))) == [(1, "ns/a-0")]
    assert ledger.holders("node1", [2]) == []  # the refused reservation took nothing
    assert ledger.reserve(a, Claim("node1", (0, 1))) == []  # reserving again is fine


def test_reservation_survives_an_older_copy_until_the_write_is_seen() -> None:
    ledger = Ledger()
    before = pod("a-0")  # the watch still shows the pod without our annotation
    ledger.reserve(before, Claim("node1", (0,)))
    ledger.observe(before)
    assert ledger.holders("node1", [0]) == [(0, "ns/a-0")]
    ledger.observe(pod("a-0", assigned="node1:0"))  # our write arrives
    ledger.observe(pod("a-0", assigned="node1:0", node="node1", phase="Running"))
    assert ledger.claim("uid-a-0") == Claim("node1", (0,))
    # From now on the watch rules: a finished pod releases.
    assert ledger.observe(pod("a-0", assigned="node1:0", node="node1", phase="Failed")) == {"node1"}


def test_reservation_is_dropped_when_the_pod_finishes_or_goes() -> None:
    ledger = Ledger()
    a = pod("a-0")
    ledger.reserve(a, Claim("node1", (0,)))
    assert ledger.observe(pod("a-0", phase="Failed")) == {"node1"}
    ledger.reserve(a, Claim("node1", (0,)))
    assert ledger.forget(a) == {"node1"}


def test_cancel_falls_back_to_the_api_object() -> None:
    ledger = Ledger()
    a = pod("a-0")
    ledger.reserve(a, Claim("node1", (0,)))
    assert ledger.cancel(a) == {"node1"}
    assert ledger.holders("node1", [0]) == []
    claimed = pod("a-0", assigned="node3:1")
    ledger.reserve(claimed, Claim("node1", (0,)))
    ledger.cancel(claimed)
    assert ledger.claim("uid-a-0") == Claim("node3", (1,))
