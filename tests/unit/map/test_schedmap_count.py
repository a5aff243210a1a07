"""Count entries (``NODE:auto(N)``): the grammar, its errors, that a count never shares, and that
outside DRA mode every front end refuses it (GPUCountNeedsDRA)."""

from __future__ import annotations

import pytest

from kube_gpu_scheduler.domain.rules import GPU_COUNT_NEEDS_DRA, GPU_NAME_NEEDS_DRA, pci_needs_dra
from kube_gpu_scheduler.domain.schedmap import MAX_COUNT, Entry, MapError, parse, sharing_problems
from kube_gpu_scheduler.domain.sharing import warning
from tests.support.mapcorpus import TASK_MAP

UUID = "GPU-8a3c0d4e-1234-5678-9abc-def012345678"


def test_a_count_entry_parses_beside_the_tasks_map_which_still_shares_gpu_3() -> None:
    smap = parse(TASK_MAP + "5 = node4 : auto(02) # two GPUs of node4, chosen\n6=node4:auto(2)\n")
    assert smap[5] == Entry(5, "node4", (), count=2) and smap[5].line == 6
    assert smap[5].devices == "auto(2)" and str(smap[5]) == "5=node4:auto(2)" and smap[5].size == 2
    # Sharing is only by naming the same GPU: two counts on node4 share nothing, GPU 3 as before.
    assert dict(smap.shared()) == {("node4", 3): (3, 4)}
    assert smap.mates(5) == {} and smap.mates(3) == {3: frozenset({4})}
    assert "node4:3 by ordinals 3, 4" in (warning(smap) or "")
    assert sharing_problems(parse("0=n:auto(1)\n1=n:auto(1)\n"), "no") is None
    # It parses back from its canonical text; the named entries are untouched.
    assert parse(smap.format()) == smap
    assert [str(smap[o]) for o in range(5)] == TASK_MAP.strip().split("\n")


def test_a_count_is_outside_the_one_way_per_node_rule() -> None:
    smap = parse(f"0=n:{UUID}\n1=n:auto(3)\n2=n:{UUID.lower().replace('8a3c', '9a3c')}\n")
    assert smap[1].count == 3 and smap[0].kind == "uuid"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0=n:auto(0)", "line 1: GPU count 0 asks for no GPU: write auto(N), N a whole number from 1 to 32"),
        ("0=n:auto(000)", "line 1: GPU count 0 asks for no GPU"),
        (
            f"0=n:auto({MAX_COUNT + 1})",
            "line 1: GPU count 33 is larger than 32 (a ResourceClaim allocates at most 32 devices)",
        ),
        ("0=n:auto(" + "9" * 30 + ")", "line 1: GPU count 99999999999999999999... is larger than 32"),
        (
            "0=n:auto(-1)",
            "line 1: GPU count 'auto(-1)' is not auto(N): write auto(N), N a whole number from 1 to 32",
        ),
        ("0=n:auto(1.5)", "line 1: GPU count 'auto(1.5)' is not auto(N)"),
        ("0=n:auto(x)", "line 1: GPU count 'auto(x)' is not auto(N)"),
        ("0=n:auto()", "line 1: GPU count 'auto()' is not auto(N)"),
        ("0=n:auto( 2)", "line 1: GPU count 'auto( 2)' is not auto(N)"),
        ("0=n:auto", "line 1: GPU count 'auto' is not auto(N)"),
        ("0=n:Auto(2)", "line 1: GPU 'Auto(2)' is not an index, a UUID"),
        (
            "0=n:0\n1=n:auto(2),3",
            "line 2: auto(N) asks for a number of GPUs and cannot be listed with other GPUs: write either NODE:auto(N) or NODE:GPU[,GPU...]",
        ),
        ("0=n:3, auto(2)", "line 1: auto(N) asks for a number of GPUs and cannot be listed with other GPUs"),
        (
            "0=n:auto(1),auto(1)",
            "line 1: auto(N) asks for a number of GPUs and cannot be listed with other GPUs",
        ),
    ],
)
def test_what_is_not_a_count_says_line_field_and_why(text: str, message: str) -> None:
    with pytest.raises(MapError) as info:
        parse(text)
    assert len(info.value.problems) == 1, info.value.problems
    assert str(info.value.problems[0]).startswith(message), str(info.value)


def test_outside_dra_mode_a_count_is_refused_naming_the_lowest_ordinal() -> None:
    smap = parse("7=n:auto(2)\n2=m:auto(1)\n3=p:0000:3b:00.0\n")
    found = pci_needs_dra(smap.values())
    assert [f.reason for f in found] == [GPU_NAME_NEEDS_DRA, GPU_COUNT_NEEDS_DRA]
    assert found[1].message.startswith(
        "gpu-scheduling-map line 2: replica 2 asks for m:auto(1) (and 1 more entry): a count of GPUs "
        "(auto(N)) is given only in DRA mode (chart value dra.enabled=true)"
    )
    assert pci_needs_dra(smap.values(), dra=True) == []
    assert pci_needs_dra(parse(TASK_MAP).values()) == []
