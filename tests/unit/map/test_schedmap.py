"""The map grammar: every error kind with its line, and the accepted syntax."""

from __future__ import annotations

import pytest

from kube_gpu_scheduler.domain.schedmap import (
    ANNOTATION,
    MAX_GPU_INDEX,
    MAX_ORDINAL,
    MAX_PROBLEMS_LISTED,
    Entry,
    MapError,
    Problem,
    SchedulingMap,
    excerpt,
    gpu_kind,
    gpu_name,
    gpu_sort_key,
    parse,
    parse_gpu,
    sharing_problems,
)
from tests.support.mapcorpus import TASK_MAP


def problems(text: str) -> list[Problem]:
    with pytest.raises(MapError) as info:
        parse(text)
    assert info.value.problems, "MapError without problems"
    return info.value.problems


def only_problem(text: str) -> Problem:
    found = problems(text)
    assert len(found) == 1, found
    return found[0]


def test_annotation_name() -> None:
    assert ANNOTATION == "gpu-scheduling-map"


def test_design_example() -> None:
    smap = parse("0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n")
    assert list(smap) == [0, 1, 2]
    assert smap[0] == Entry(0, "node1", (0, 1))
    assert smap[1].node == "node2" and smap[1].gpus == (2,)
    assert smap[2].devices == "0,1,2"
    assert smap.nodes() == {"node1", "node2", "node3"}
    assert [e.line for e in smap.values()] == [1, 2, 3]


def test_gpu_order_is_kept_as_written() -> None:
    assert parse("0=n:3,1,2")[0].gpus == (3, 1, 2)
    assert parse("0=n:3,1,2")[0].devices == "3,1,2"


def test_entries_iterate_in_ordinal_order_and_format_canonically() -> None:
    smap = parse("2=c:1; 0=a:0 ;1=b:0")
    assert list(smap) == [0, 1, 2]
    assert smap.format() == "0=a:0\n1=b:0\n2=c:1\n"


def test_whitespace_around_every_token() -> None:
    assert parse("  0 =  node1 :  0 , 1   ") == parse("0=node1:0,1")
    assert parse("\t1\t=\tn\t:\t2\t") == parse("1=n:2")


def test_blank_lines_and_comments() -> None:
    text = "\n# header comment\n\n0=node1:0   # trailing comment\n   \n#1=node2:0\n1=node2:1\n\n"
    smap = parse(text)
    assert list(smap) == [0, 1]
    assert smap[0].line == 4
    assert smap[1].line == 7


def test_comment_hides_semicolons_and_errors() -> None:
    assert list(parse("0=a:0 # ; 1=this is not parsed ;;; ===")) == [0]


def test_semicolons() -> None:
    smap = parse("0=a:0;1=b:0;;2=c:0;")
    assert list(smap) == [0, 1, 2]
    assert {e.line for e in smap.values()} == {1}


def test_semicolons_and_lines_mixed() -> None:
    smap = parse("0=a:0; 1=a:1\n2=b:0;3=b:1")
    assert [smap[o].line for o in smap] == [1, 1, 2, 2]


def test_crlf_line_endings() -> None:
    smap = parse("0=node1:0,1\r\n1=node2:2\r\n\r\n# c\r\n2=node3:0\r\n")
    assert smap == parse("0=node1:0,1\n1=node2:2\n2=node3:0\n")
    assert smap[2].line == 5


def test_node_names_with_dots_and_dashes() -> None:
    smap = parse("0=gpu-node-1.us-east.example.com:0")
    assert smap[0].node == "gpu-node-1.us-east.example.com"
    assert parse("0=1:0")[0].node == "1"


def test_leading_zeros_are_the_same_number() -> None:
    assert parse("007=n:0010")[7].gpus == (10,)


def test_bounds() -> None:
    assert parse(f"{MAX_ORDINAL}=n:{MAX_GPU_INDEX}")[MAX_ORDINAL].gpus == (MAX_GPU_INDEX,)
    p = only_problem(f"{MAX_ORDINAL + 1}=n:0")
    assert "larger than" in p.message and p.line == 1
    p = only_problem(f"0=n:{MAX_GPU_INDEX + 1}")
    assert "larger than" in p.message


def test_same_gpu_on_different_nodes_is_fine() -> None:
    assert len(parse("0=a:0\n1=b:0")) == 2


def test_same_node_different_gpus_is_fine() -> None:
    assert len(parse("0=a:0,1\n1=a:2,3")) == 2


# --- errors: each kind, with its line and text -------------------------------------------------


def test_duplicate_ordinal() -> None:
    p = only_problem("0=a:0\n1=b:0\n\n0=c:1")
    assert p.line == 4
    assert p.text == "0=c:1"
    assert "ordinal 0 is already mapped on line 1" in p.message


def test_duplicate_ordinal_on_same_line_via_semicolon() -> None:
    p = only_problem("# c\n0=a:0; 0=a:1")
    assert p.line == 2
    assert "ordinal 0 is already mapped on line 2" in p.message


def test_duplicate_gpu_in_entry() -> None:
    p = only_problem("0=a:0\n1=b:1,2,1")
    assert p.line == 2
    assert "GPU 1 is listed twice" in p.message
    assert p.text == "1=b:1,2,1"


def test_the_tasks_map_shares_gpu_3_between_replicas_3_and_4() -> None:
    m = parse(TASK_MAP)
    assert [str(m[o]) for o in m] == ["0=node1:0,1", "1=node2:2", "2=node3:0,1,2", "3=node4:3", "4=node4:3"]
    assert m.shared() == {("node4", 3): (3, 4)}
    assert m.mates(3) == {3: frozenset({4})} and m.mates(4) == {3: frozenset({3})}
    assert m.mates(0) == {} and m.mates(2) == {} and m.mates(9) == {}
    assert m.sharing_lines() == ["node4:3 by ordinals 3, 4 (lines 4, 5)"]


def test_partial_overlaps_share_only_the_common_gpu() -> None:
    m = parse("0=node2:4,5\n1=node2:5,6\n2=node3:5")
    assert m.shared() == {("node2", 5): (0, 1)}
    assert m.mates(0) == {5: frozenset({1})} and m.mates(1) == {5: frozenset({0})}
    # The same index on another node is another GPU.
    assert m.mates(2) == {}


def test_three_sharers_and_a_map_that_shares_nothing() -> None:
    m = parse("0=a:0,1; 1=a:1; 2=a:1,0")
    assert m.shared() == {("a", 0): (0, 2), ("a", 1): (0, 1, 2)}
    assert m.mates(1) == {1: frozenset({0, 2})}
    assert parse("0=a:0\n1=a:1").shared() == {}
    assert sharing_problems(parse("0=a:0\n1=a:1"), "no") is None


def test_sharing_problems_name_the_line_the_gpu_and_the_earlier_ordinal() -> None:
    err = sharing_problems(parse(TASK_MAP), "this release forbids GPU sharing")
    assert err is not None and err.count == 1
    assert str(err) == (
        "line 5: node4:3 is also given to ordinal 3 on line 4: this release forbids GPU sharing (in '4=node4:3')"
    )
    err = sharing_problems(parse("0=a:0,1\n1=b:1\n2=a:1"), "why")
    assert err is not None and [(p.line, p.message) for p in err.problems] == [
        (3, "a:1 is also given to ordinal 0 on line 1: why")
    ]


def test_many_shared_gpus_are_listed_up_to_a_bound() -> None:
    text = "".join(f"{o}=n:{o // 2}\n" for o in range(40))
    m = parse(text)
    assert len(m.shared()) == 20
    lines = m.sharing_lines()
    assert len(lines) == MAX_PROBLEMS_LISTED + 1 and lines[-1] == "and 10 more shared GPUs"
    err = sharing_problems(m, "why")
    assert err is not None and err.count == 20 and "and 10 more problems" in str(err)


@pytest.mark.parametrize(
    "node",
    ["Node1", "node_1", "-node", "node-", "node..x", "nöde", "node 1", ".a", "a." + "b" * 300, "a/b"],
)
def test_invalid_node_name(node: str) -> None:
    p = only_problem(f"0=a:0\n\n1={node}:0")
    assert p.line == 3
    assert "not a valid Kubernetes node name" in p.message
    # The name is quoted, cut to its first EXCERPT_CHARS characters when longer.
    assert repr(excerpt(node.strip())) in p.message


def test_node_name_length_limit() -> None:
    label = "a" * 63
    name = ".".join([label] * 4)[:253]
    assert parse(f"0={name.rstrip('.')}:0")
    p = only_problem(f"0={name}x:0")
    assert "not a valid Kubernetes node name" in p.message


def test_empty_node_name() -> None:
    p = only_problem("0= :0")
    assert p.message == "node name is empty"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("x=a:0", "ordinal 'x' is not a non-negative integer"),
        ("-1=a:0", "ordinal '-1' is not a non-negative integer"),
        ("1.5=a:0", "ordinal '1.5' is not a non-negative integer"),
        ("=a:0", "ordinal '' is not a non-negative integer"),
        ("0=a:x", "GPU 'x' is not an index, a UUID"),
        ("0=a:-1", "GPU '-1' is not an index, a UUID"),
        ("0=a:0x1", "GPU '0x1' is not an index, a UUID"),
        ("0=a:²", "GPU '²' is not an index, a UUID"),
        ("٣=a:0", "ordinal '٣' is not a non-negative integer"),
        ("0=a:\uff11", "GPU '\uff11' is not an index, a UUID"),
        ("0=a:0 1", "GPU '0 1' is not an index, a UUID"),
        ("+1=a:0", "ordinal '+1' is not a non-negative integer"),
        ("1_0=a:0", "ordinal '1_0' is not a non-negative integer"),
    ],
)
def test_bad_number(text: str, fragment: str) -> None:
    p = only_problem("# first line\n" + text)
    assert p.line == 2
    assert fragment in p.message


def test_huge_numbers_are_errors_not_crashes() -> None:
    # More digits than int() accepts by default (4300): must still be a MapError.
    p = only_problem("1" * 5000 + "=a:0")
    assert "larger than" in p.message
    p = only_problem("0=a:" + "9" * 10_000)
    assert "larger than" in p.message
    # Leading zeros do not count as size.
    assert parse("0" * 5000 + "1=a:" + "0" * 5000 + "2")[1].gpus == (2,)


def test_missing_equals() -> None:
    p = only_problem("0=a:0\nnode1:0")
    assert p.line == 2
    assert "no '='" in p.message
    assert p.text == "node1:0"


def test_missing_colon() -> None:
    p = only_problem("0=a:0\n1=node1")
    assert p.line == 2
    assert "no ':'" in p.message


def test_no_gpu_given() -> None:
    p = only_problem("0=a:")
    assert "no GPU index given for node 'a'" in p.message


def test_stray_comma() -> None:
    assert "empty GPU index (stray ',')" in only_problem("0=a:0,").message
    p = only_problem("0=a:0,,1")
    assert "empty GPU index (stray ',')" in p.message


@pytest.mark.parametrize("text", ["", "   ", "\n\n", "# only a comment\n", " ; ; ", "#0=a:0"])
def test_empty_map(text: str) -> None:
    p = only_problem(text)
    assert p.message == "the map has no entries"
    assert p.line == 1


def test_not_a_string() -> None:
    for value in (None, 5, b"0=a:0", ["0=a:0"]):
        p = only_problem(value)  # type: ignore[arg-type]
        assert "must be a string" in p.message


def test_every_problem_is_reported_with_its_line() -> None:
    text = "\n".join(
        [
            "0=node1:0,1",  # 1 ok
            "1=Node2:0",  # 2 bad node
            "2=node3:0,0",  # 3 duplicate gpu
            "garbage",  # 4 no '='
            "0=node4:0",  # 5 duplicate ordinal
            "5=node1:1",  # 6 ok: shares node1:1 with ordinal 0
            "6=node5",  # 7 no ':'
            "x=node6:y",  # 8 two bad numbers
        ]
    )
    found = problems(text)
    assert [p.line for p in found] == [2, 3, 4, 5, 7, 8, 8]
    rendered = str(MapError(found))
    assert "line 2:" in rendered and "line 8:" in rendered
    # str(Problem) names the line, the reason and the text.
    assert str(found[0]).startswith("line 2: node name 'Node2' is not a valid Kubernetes node name")
    assert str(found[0]).endswith("(in '1=Node2:0')")


def test_errors_in_several_chunks_of_one_line() -> None:
    found = problems("0=a:0; x=b:0; 2=c")
    assert [p.line for p in found] == [1, 1]
    assert [p.text for p in found] == ["x=b:0", "2=c"]


def test_map_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="line 1"):
        parse("nope")


def test_entry_equality_ignores_line() -> None:
    assert Entry(0, "a", (1,), line=3) == Entry(0, "a", (1,), line=9)
    assert str(Entry(3, "a", (1, 2))) == "3=a:1,2"


def test_scheduling_map_is_a_mapping() -> None:
    smap = parse("1=b:0\n0=a:0")
    assert isinstance(smap, SchedulingMap)
    assert 0 in smap and 5 not in smap
    assert smap.get(5) is None
    assert dict(smap) == {0: Entry(0, "a", (0,)), 1: Entry(1, "b", (0,))}


# --- GPUs named by UUID or by PCI bus ID ---------------------------------------------------------

UUID = "GPU-8a3c0d4e-1234-5678-9abc-def012345678"
UUID2 = "GPU-8a3c0d4e-1234-5678-9abc-def012345679"


def test_an_index_stays_an_int() -> None:
    entry = parse("0=n:3,01")[0]
    assert entry.gpus == (3, 1) and all(type(g) is int for g in entry.gpus)
    assert entry.kind == "index" and gpu_kind(3) == "index"


def test_a_uuid_is_kept_in_nvidia_form_lower_case() -> None:
    entry = parse(f"0=n: {UUID.upper().replace('GPU-', 'gpu-')} ,{UUID2}")[0]
    assert entry.gpus == (UUID, UUID2)
    assert entry.kind == "uuid" and gpu_kind(UUID) == "uuid"
    # As CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES take them.
    assert entry.devices == f"{UUID},{UUID2}"
    assert str(entry) == f"0=n:{UUID},{UUID2}"


@pytest.mark.parametrize(
    ("written", "normal"),
    [
        ("0000:3b:00.0", "0000:3b:00.0"),  # sysfs, DRA's resource.kubernetes.io/pciBusID
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML, nvidia-smi
        ("0000:AF:1f.7", "0000:af:1f.7"),
        ("10000000:3b:00.1", "10000000:3b:00.1"),  # a domain past 16 bits keeps its 8 digits
        ("0001:3b:00.0", "0001:3b:00.0"),
    ],
)
def test_a_pci_bus_id_is_kept_lower_case_with_a_4_digit_domain(written: str, normal: str) -> None:
    entry = parse(f"0=node1:{written}")[0]
    assert entry.node == "node1", "split at the first ':'"
    assert entry.gpus == (normal,) and entry.kind == "pci" and gpu_kind(normal) == "pci"
    assert parse_gpu(written) == normal and gpu_name(written) == normal


def test_names_round_trip_through_format() -> None:
    smap = parse(f"1=b:00000000:3B:00.0, 0000:3c:00.0\n0=a:{UUID.upper().replace('GPU-', 'GPU-')}\n2=c:0")
    assert smap.format() == f"0=a:{UUID}\n1=b:0000:3b:00.0,0000:3c:00.0\n2=c:0\n"
    assert parse(smap.format()) == smap


@pytest.mark.parametrize(
    "token",
    [
        "GPU-12",
        "GPU-8a3c0d4e-1234-5678-9abc-def01234567",  # 11 digits in the last group
        "GPU-8a3c0d4e-1234-5678-9abc-def0123456789",
        "GPU-8a3c0d4e-123-45678-9abc-def012345678",  # wrong group lengths
        "GPU-8a3c0d4g-1234-5678-9abc-def012345678",  # not hex
        "GPU8a3c0d4e-1234-5678-9abc-def012345678",
        "MIG-8a3c0d4e-1234-5678-9abc-def012345678",
        "8a3c0d4e-1234-5678-9abc-def012345678",
        "0000:3b:00.8",  # function 0-7
        "000:3b:00.0",  # a 3-digit domain
        "00000:3b:00.0",
        "0000:3b:0.0",
        "0000:3bb:00.0",
        "0000:3b:00",
        "0000:3g:00.0",
        "3b:00.0",  # no domain
        "0000:3b:00.0.0",
    ],
)
def test_a_token_that_names_no_gpu_says_what_a_gpu_is(token: str) -> None:
    p = only_problem(f"# c\n0=n:{token}")
    assert p.line == 2
    assert p.message == (
        f"GPU {token!r} is not an index, a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) "
        "or a PCI bus ID (0000:3b:00.0)"
    )
    assert parse_gpu(token) is None


def test_duplicates_compare_normalized_names() -> None:
    p = only_problem(f"0=n:{UUID},{UUID.upper().replace('GPU-', 'gpu-')}")
    assert p.message == f"GPU {UUID} is listed twice in this entry"
    p = only_problem("0=n:0000:3b:00.0,00000000:3B:00.0")
    assert p.message == "GPU 0000:3b:00.0 is listed twice in this entry"
    # Two entries naming one GPU in two spellings share it (one GPU, not two).
    assert parse("0=n:0000:3b:00.0\n1=n:00000000:3B:00.0").shared() == {("n", "0000:3b:00.0"): (0, 1)}
    assert parse(f"0=n:{UUID}\n1=n:{UUID.upper()}").shared() == {("n", UUID): (0, 1)}


def test_the_same_name_on_two_nodes_is_refused_by_no_grammar_rule() -> None:
    # A UUID is unique across nodes in reality, but that is for the cluster to tell.
    assert len(parse(f"0=a:{UUID}\n1=b:{UUID}")) == 2


def test_one_entry_names_its_gpus_one_way() -> None:
    p = only_problem(f"0=n:0,{UUID}")
    assert p.message == (
        "the GPUs of node 'n' are named both by index and by UUID in this entry: the same GPU could "
        "then be given twice; name all of a node's GPUs one way (all indices, all UUIDs or all PCI bus IDs)"
    )
    p = only_problem(f"0=n:{UUID},0000:3b:00.0")
    assert "named both by UUID and by PCI bus ID in this entry" in p.message


def test_one_node_is_named_one_way_in_the_whole_map() -> None:
    p = only_problem(f"0=n:0\n1=other:{UUID}\n2=n:{UUID}")
    assert p.line == 3
    assert p.message == (
        "node 'n' has its GPUs named by UUID here and by index on line 1 (0=n:0): the same GPU could "
        "then be given twice; name all of a node's GPUs one way (all indices, all UUIDs or all PCI bus IDs)"
    )
    p = only_problem("0=n:0000:3b:00.0 ; 1=n:1")
    assert p.line == 1 and "named by index here and by PCI bus ID on line 1" in p.message
    # Other nodes may each choose their own way.
    assert len(parse(f"0=a:0\n1=b:{UUID}\n2=c:0000:3b:00.0\n3=a:1\n4=b:{UUID2}")) == 5


def test_gpus_of_all_kinds_sort_together() -> None:
    assert sorted([UUID, 3, "0000:3b:00.0", 1], key=gpu_sort_key) == [1, 3, "0000:3b:00.0", UUID]
