"""DRA mode's claim layout when replicas share GPUs (kube_gpu_scheduler/domain/draclaims.py).

The injection policy computes the same layout in CEL; tests/integration/test_dra_sharing.py holds
the two to each other on the real apiserver."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kube_gpu_scheduler.domain import dra, draclaims
from kube_gpu_scheduler.domain.schedmap import GPU, parse

TASK = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:3\n"


def names(text: str, ordinal: int, pod: str | None = None) -> list[tuple[str, str, str]]:
    return [
        (p.ref, p.name, p.made_for[1]) for p in draclaims.layout(parse(text), ordinal, pod or f"w-{ordinal}")
    ]


def test_a_map_that_shares_nothing_gives_each_replica_its_one_claim_as_before() -> None:
    for ordinal in range(3):
        [part] = draclaims.layout(parse(TASK), ordinal, f"w-{ordinal}")
        assert (part.ref, part.name) == (dra.POD_CLAIM, dra.claim_name(f"w-{ordinal}"))
        assert part.entry == parse(TASK)[ordinal] and part.made_for == (dra.ENTRY_ANNOTATION, str(part.entry))
        assert not part.shared


def test_the_tasks_replicas_3_and_4_reference_one_claim_and_none_of_their_own() -> None:
    assert names(TASK, 3) == [("gpu-scheduler-shared-0", "w-3-shared-3", "node4:3")]
    assert names(TASK, 4) == [("gpu-scheduler-shared-0", "w-3-shared-3", "node4:3")]
    [part] = draclaims.layout(parse(TASK), 4, "w-4")
    assert part.sharers == (3, 4) and part.shared


def test_a_partial_overlap_gives_each_its_own_claim_and_the_shared_one() -> None:
    text = "0=node2:4,5\n1=node2:5,6"
    assert names(text, 0) == [
        ("gpu-scheduler", "w-0-gpus", "0=node2:4"),
        ("gpu-scheduler-shared-0", "w-0-shared-5", "node2:5"),
    ]
    assert names(text, 1) == [
        ("gpu-scheduler", "w-1-gpus", "1=node2:6"),
        ("gpu-scheduler-shared-0", "w-0-shared-5", "node2:5"),
    ]


def test_gpus_with_the_same_sharers_are_one_claim_in_index_order_whatever_each_entry_says() -> None:
    # 7 and 10 are shared by 2 and 5; 3 by 2, 5 and 9 (another group); 1 is 5's alone.
    text = "5=n:10,1,7,3\n2=n:3,7,10\n9=n:3"
    assert names(text, 2) == [
        ("gpu-scheduler-shared-0", "w-2-shared-3", "n:3"),
        ("gpu-scheduler-shared-1", "w-2-shared-7", "n:7,10"),
    ]
    assert names(text, 5) == [
        ("gpu-scheduler", "w-5-gpus", "5=n:1"),
        ("gpu-scheduler-shared-0", "w-2-shared-7", "n:7,10"),
        ("gpu-scheduler-shared-1", "w-2-shared-3", "n:3"),
    ]
    assert names(text, 9) == [("gpu-scheduler-shared-0", "w-2-shared-3", "n:3")]


def test_names_and_pci_bus_ids_are_written_as_a_claim_name_may_be() -> None:
    uuid = "GPU-8A3C0000-0000-0000-0000-000000000001"
    text = f"0=n:{uuid}\n1=n:{uuid.lower()}\n2=m:0000:3B:00.0\n3=m:00000000:3b:00.0"
    assert names(text, 1, "web-1") == [
        (
            "gpu-scheduler-shared-0",
            "web-0-shared-gpu-8a3c0000-0000-0000-0000-000000000001",
            f"n:GPU-{uuid[4:].lower()}",
        )
    ]
    assert names(text, 2, "web-2")[0][1] == "web-2-shared-0000-3b-00.0"


def test_the_same_gpu_on_two_nodes_is_not_shared() -> None:
    assert names("0=a:1\n1=b:1", 1) == [("gpu-scheduler", "w-1-gpus", "1=b:1")]


def test_shared_part_finds_the_claim_of_a_gpu_and_claim_asks_reads_it_back() -> None:
    smap = parse("0=node2:4,5\n1=node2:5,6")
    part = draclaims.shared_part(smap, "w", "node2", 5)
    assert part is not None and part.name == "w-0-shared-5" and part.sharers == (0, 1)
    assert draclaims.shared_part(smap, "w", "node2", 4) is None
    device = dra.Device("node2", "node2", "gpu-5", "GPU-x", "0000:5e:00.0")
    claim = dra.claim_body(part.name, "ns", part.entry, [device], owner=None, made_for=part.made_for)
    assert claim["metadata"]["annotations"] == {
        draclaims.SHARED_ANNOTATION: "node2:5",
        dra.DEVICES_ANNOTATION: "node2/gpu-5 (0000:5e:00.0, GPU-x)",
    }
    asks = draclaims.claim_asks(claim)
    assert asks is not None and (asks.node, asks.gpus) == ("node2", (5,)) and draclaims.is_shared(claim)
    own = {"metadata": {"annotations": {dra.ENTRY_ANNOTATION: "1=node2:6"}}}
    assert draclaims.claim_asks(own) == smap[1].__class__(1, "node2", (6,)) and not draclaims.is_shared(own)


@given(
    st.dictionaries(
        st.integers(0, 12),
        st.tuples(st.sampled_from(["a", "b"]), st.sets(st.integers(0, 5), min_size=1, max_size=4)),
        min_size=1,
        max_size=10,
    )
)
def test_every_gpu_is_in_exactly_one_claim_and_every_sharer_references_the_same_one(
    entries: dict[int, tuple[str, set[int]]],
) -> None:
    text = "\n".join(f"{o}={n}:{','.join(map(str, sorted(g)))}" for o, (n, g) in entries.items())
    smap = parse(text)
    by_gpu: dict[tuple[str, GPU], set[tuple[str, tuple[GPU, ...]]]] = {}
    for ordinal, entry in smap.items():
        parts = draclaims.layout(smap, ordinal, f"w-{ordinal}")
        assert sorted(g for p in parts for g in p.entry.gpus) == sorted(entry.gpus)  # each GPU once
        assert len({p.name for p in parts}) == len(parts) and len({p.ref for p in parts}) == len(parts)
        for p in parts:
            for g in p.entry.gpus:
                by_gpu.setdefault((entry.node, g), set()).add((p.name, p.entry.gpus))
    for (node, gpu), claims in by_gpu.items():
        assert len(claims) == 1, (node, gpu, claims)  # the sharers of a GPU name one claim, alike
    # Two GPUs in different claims never share a claim name.
    every = {name: gpus for claims in by_gpu.values() for name, gpus in claims}
    assert len(every) == len({(n, g) for claims in by_gpu.values() for n, g in claims})


def test_pod_claims_reads_the_own_and_the_shared_references_only() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "gpu-scheduler", "resourceClaimName": "w-0-gpus"},
                {"name": "gpu-scheduler-shared-0", "resourceClaimName": "w-0-shared-5"},
                {"name": "users-own", "resourceClaimName": "theirs"},
                {"name": "gpu-scheduler-shared-1", "resourceClaimTemplateName": "a-template"},
            ]
        }
    }
    assert dra.pod_claims(pod) == {"gpu-scheduler": "w-0-gpus", "gpu-scheduler-shared-0": "w-0-shared-5"}
    assert dra.pod_claims({"spec": {}}) == {}
