"""A count entry's ResourceClaim (kube_gpu_scheduler/domain/dracount.py): N devices, aligned on
the node's PCIe root, else its NUMA node, else nothing; never a GPU the map's named entries name;
why it cannot be allocated. tests/integration/test_dra_count.py has kube-scheduler allocate it."""

from __future__ import annotations

from kube_gpu_scheduler.domain import dra, draclaims, dracount
from kube_gpu_scheduler.domain.schedmap import parse


def device(i: int, root: str = "", numa: str = "") -> dra.Device:
    return dra.Device(
        "n",
        "n",
        f"gpu-{i}",
        f"GPU-{i:08x}-0000-4000-8000-000000000000",
        f"0000:{16 + i:02x}:00.0",
        pcie_root=root,
        numa_node=numa,
    )


EIGHT = [device(i, f"pci0000:{'00' if i < 4 else '80'}", str(i // 4)) for i in range(8)]


def test_a_count_entry_is_its_replicas_own_claim_and_shares_nothing() -> None:
    smap = parse("0=n:auto(2)\n1=n:auto(2)\n2=n:1\n3=n:1\n")
    [part] = draclaims.layout(smap, 0, "w-0")
    assert (part.ref, part.name, part.made_for) == (
        dra.POD_CLAIM,
        "w-0-gpus",
        (dra.ENTRY_ANNOTATION, "0=n:auto(2)"),
    )
    assert [p.name for p in draclaims.layout(smap, 2, "w-2")] == ["w-2-shared-1"]


def test_the_claim_asks_for_n_devices_in_one_pcie_root_and_none_the_map_names() -> None:
    smap = parse("0=n:auto(3)\n1=n:0,5\n2=n:uuid-less\n".replace("2=n:uuid-less\n", "2=m:0\n"))
    entry = smap[0]
    excluded = dracount.named_on_node(smap, entry, EIGHT)
    assert [d.name for d in excluded] == ["gpu-0", "gpu-5"]
    body = dracount.claim_body("w-0-gpus", "ns", entry, EIGHT, excluded, owner=None)
    spec = body["spec"]["devices"]
    assert spec["requests"] == [
        {
            "name": "gpus",
            "exactly": {
                "deviceClassName": dra.DEVICE_CLASS,
                "allocationMode": "ExactCount",
                "count": 3,
                "selectors": [
                    {
                        "cel": {
                            "expression": "!(device.attributes['resource.kubernetes.io'].pciBusID in "
                            "['0000:10:00.0', '0000:15:00.0'])"
                        }
                    }
                ],
            },
        }
    ]
    assert spec["constraints"] == [
        {"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    ]
    assert body["metadata"]["annotations"][dra.ENTRY_ANNOTATION] == "0=n:auto(3)"
    assert draclaims.claim_asks(body) == entry


def test_the_alignment_falls_back_to_the_numa_node_then_to_none() -> None:
    assert dracount.alignment(EIGHT) == "pcieRoot"
    numa_only = [device(i, "", str(i // 4)) for i in range(8)]
    assert dracount.alignment(numa_only) == "numaNode"
    # One device without a root: NUMA (every device has it); one without either: no constraint.
    assert dracount.alignment([*EIGHT[:7], device(7, "", "1")]) == "numaNode"
    bare = [*EIGHT[:7], device(7)]
    assert dracount.alignment(bare) == ""
    body = dracount.claim_body("c", "ns", parse("0=n:auto(2)")[0], bare, [], owner=None)
    assert (
        "constraints" not in body["spec"]["devices"]
        and "selectors" not in body["spec"]["devices"]["requests"][0]["exactly"]
    )


def test_unfit_says_never_by_capacity_and_not_now_by_holders() -> None:
    five = parse("0=n:auto(5)")[0]
    never, why = dracount.unfit(five, EIGHT, [], [], "pcieRoot")
    assert never and why.startswith(
        "no one PCIe root of node n has 5 GPUs it may use (PCIe root pci0000:00: 4 GPUs, 4 free;"
    )
    three = parse("0=n:auto(3)")[0]
    assert dracount.unfit(three, EIGHT, [], [], "pcieRoot") == (False, "")
    # Two held in each root: not now, and not never.
    never, why = dracount.unfit(three, EIGHT, [], [EIGHT[0], EIGHT[1], EIGHT[4], EIGHT[5]], "pcieRoot")
    assert not never and "one PCIe root of node n with 3 free GPUs is needed" in why and "2 free" in why
    # A root less the GPUs the map names may be too small for ever.
    never, _ = dracount.unfit(parse("0=n:auto(4)")[0], EIGHT, [EIGHT[0], EIGHT[4]], [], "pcieRoot")
    assert never


def test_a_named_entry_that_spans_pcie_roots_or_numa_nodes_is_said() -> None:
    assert (
        dracount.spans(parse("0=n:0,4")[0], EIGHT)
        == "spans PCIe roots pci0000:00 (gpu-0), pci0000:80 (gpu-4)"
    )
    assert dracount.spans(parse("0=n:1,2,3")[0], EIGHT) == ""
    numa_only = [device(i, "", str(i // 4)) for i in range(8)]
    assert dracount.spans(parse("0=n:3,5")[0], numa_only) == "spans NUMA nodes 0 (gpu-3), 1 (gpu-5)"
    # Nothing published, a count, one GPU, or a name that does not resolve: nothing to say.
    assert dracount.spans(parse("0=n:0,4")[0], [device(i) for i in range(8)]) == ""
    assert dracount.spans(parse("0=n:auto(8)")[0], EIGHT) == ""
    assert dracount.spans(parse("0=n:5")[0], EIGHT) == ""
    assert dracount.spans(parse("0=n:0,9")[0], EIGHT) == ""
