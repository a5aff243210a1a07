"""The map grammar: every error kind with its line, and the accepted syntax."""

from __future__ import annotations

import pytest

from gpu_scheduling.schedmap import (
    ANNOTATION,
    MAX_GPU_INDEX,
    MAX_ORDINAL,
    Entry,
    MapError,
    Problem,
    SchedulingMap,
    excerpt,
    parse,
)


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


def test_same_node_gpu_for_two_ordinals() -> None:
    p = only_problem("0=a:0,1\n1=b:1\n2=a:1")
    assert p.line == 3
    assert "a:1 is already given to ordinal 0 on line 1" in p.message


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
        ("0=a:x", "GPU index 'x' is not a non-negative integer"),
        ("0=a:-1", "GPU index '-1' is not a non-negative integer"),
        ("0=a:0x1", "GPU index '0x1' is not a non-negative integer"),
        ("0=a:²", "GPU index '²' is not a non-negative integer"),
        ("٣=a:0", "ordinal '٣' is not a non-negative integer"),
        ("0=a:\uff11", "GPU index '\uff11' is not a non-negative integer"),
        ("0=a:0 1", "GPU index '0 1' is not a non-negative integer"),
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
            "5=node1:1",  # 6 node1:1 taken by 0
            "6=node5",  # 7 no ':'
            "x=node6:y",  # 8 two bad numbers
        ]
    )
    found = problems(text)
    assert [p.line for p in found] == [2, 3, 4, 5, 6, 7, 8, 8]
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
