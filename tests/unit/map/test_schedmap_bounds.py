"""The map's sizes: bounded messages, the size limit, linear cost, and parse_cached.

Timing and memory bounds are the issue's (tests/unit/map/bounds.py says why they are safe).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube_gpu_scheduler.domain import mapcache
from kube_gpu_scheduler.domain.mapcache import parse_cache_clear, parse_cache_size, parse_cached
from kube_gpu_scheduler.domain.schedmap import (
    ANNOTATION,
    EXCERPT_CHARS,
    MAX_ERROR_CHARS,
    MAX_MAP_BYTES,
    MAX_MESSAGE_CHARS,
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS_LISTED,
    MapError,
    Problem,
    excerpt,
    parse,
    sharing_problems,
    utf8_size,
)
from tests.unit.map.bounds import ISSUE_BYTES, ISSUE_SECONDS, MIB, UNDER_CAP, malformed, measure


def refusal(text: Any) -> MapError:
    with pytest.raises(MapError) as info:
        parse(text)
    return info.value


def assert_bounded(err: MapError) -> None:
    assert 1 <= len(err.problems) <= MAX_PROBLEMS_LISTED
    assert err.count == len(err.problems) + err.more
    for p in err.problems:
        assert len(p.text) <= EXCERPT_CHARS
        assert len(p.message) <= MAX_MESSAGE_CHARS
        assert len(str(p)) <= MAX_PROBLEM_CHARS
    assert len(str(err)) <= MAX_ERROR_CHARS


def test_one_gpu_shared_by_every_ordinal_of_a_large_map_is_told_in_bounded_words() -> None:
    text = "".join(f"{i}=a:0\n" for i in range(MIB // 12))[:MAX_MAP_BYTES]
    smap = parse(text[: text.rindex("\n") + 1])
    assert list(smap.shared()) == [("a", 0)] and len(smap.shared()[("a", 0)]) == len(smap)
    lines = smap.sharing_lines()
    assert len(lines) == 1 and len(lines[0]) < 200 and lines[0].startswith("a:0 by ordinals 0, 1, 2")
    err = sharing_problems(smap, "forbidden")
    assert err is not None
    assert_bounded(err)
    assert err.count == len(smap) - 1


# --- messages are bounded, whatever the text ----------------------------------------------------

SOUP = list("0123456789=:,;# \t\r\nab-.Z_²٣\uff11\u00a0\x00é\U0010ffff\ud800")
pieces = st.text(alphabet=st.sampled_from(SOUP), min_size=1, max_size=16)


@settings(max_examples=200, deadline=None)
@given(unit=pieces, count=st.integers(1, 5000), tail=st.text(max_size=40))
def test_any_repeated_text_gives_a_bounded_error(unit: str, count: int, tail: str) -> None:
    text = unit * count + tail
    try:
        parse(text)
    except MapError as err:
        assert_bounded(err)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=30).map("\n".join))
def test_any_lines_give_a_bounded_error(text: str) -> None:
    try:
        parse(text)
    except MapError as err:
        assert_bounded(err)


@pytest.mark.parametrize("shape", sorted(malformed(1000)))
@pytest.mark.parametrize("size", [1000, UNDER_CAP, MIB])
def test_every_malformed_shape_gives_a_bounded_error(shape: str, size: int) -> None:
    assert_bounded(refusal(malformed(size)[shape]))


def test_excerpt_keeps_the_start_of_the_entry() -> None:
    line = "17=gpu-node-17.example.com:0,1,2,3," + ",".join(["x"] * 1000)
    p = refusal(line).problems[0]
    assert p.line == 1
    assert p.text == "17=gpu-node-17.example.com:0,1,2,3,x,x,x,x,x,x,…"
    assert len(p.text) == EXCERPT_CHARS
    assert str(p).endswith("(in '17=gpu-node-17.example.com:0,1,2,3,x,x,x,x,x,x,…')")


def test_short_texts_are_quoted_whole() -> None:
    assert excerpt("a" * EXCERPT_CHARS) == "a" * EXCERPT_CHARS
    assert excerpt("a" * (EXCERPT_CHARS + 1)) == "a" * (EXCERPT_CHARS - 1) + "…"
    assert str(refusal("0=node1:0\n1=Node_2:1").problems[0]) == (
        "line 2: node name 'Node_2' is not a valid Kubernetes node name (lower-case letters, digits, '-' and "
        "'.', starting and ending alphanumeric) (in '1=Node_2:1')"
    )


def test_a_huge_node_name_is_not_echoed_whole() -> None:
    name = "n" * 100_000
    err = refusal(f"0={name}:0")
    [p] = err.problems
    assert f"node name '{'n' * (EXCERPT_CHARS - 1)}…' is not a valid" in p.message
    assert len(str(err)) < 400


def test_huge_tokens_are_not_echoed_whole() -> None:
    err = refusal("0=a:" + "x" * 100_000)
    assert f"GPU '{'x' * (EXCERPT_CHARS - 1)}…' is not" in err.problems[0].message
    err = refusal("x" * 100_000 + "=a:0")
    assert f"ordinal '{'x' * (EXCERPT_CHARS - 1)}…' is not" in err.problems[0].message
    err = refusal("0=" + "A" * 100_000 + ":")
    assert "no GPU index given for node 'AAAA" in str(err) and len(str(err)) < 800


def test_a_duplicate_of_a_large_entry_quotes_an_excerpt_of_it() -> None:
    first = "0=a:" + ",".join(str(i) for i in range(1024))
    err = refusal(f"{first}\n0=b:0")
    assert err.problems[0].message == f"ordinal 0 is already mapped on line 1 ({excerpt(first)})"


def test_problem_objects_bound_what_they_are_given() -> None:
    p = Problem(3, "t" * 10_000, "m" * 10_000)
    assert len(p.text) == EXCERPT_CHARS and len(p.message) == MAX_MESSAGE_CHARS
    assert len(str(p)) <= MAX_PROBLEM_CHARS
    # Characters repr() spells long still fit.
    assert len(str(Problem(1, "\U0010ffff" * 100, "x"))) <= MAX_PROBLEM_CHARS


# --- at most MAX_PROBLEMS_LISTED problems, then a count --------------------------------------------


def test_the_first_problems_are_listed_and_the_rest_counted() -> None:
    err = refusal("".join(f"bad{i}\n" for i in range(15)))
    assert [p.line for p in err.problems] == list(range(1, MAX_PROBLEMS_LISTED + 1))
    assert err.more == 5 and err.count == 15
    assert str(err).endswith("(in 'bad9'); and 5 more problems")
    assert str(err).count("line ") == MAX_PROBLEMS_LISTED


def test_one_more_problem_is_singular() -> None:
    err = refusal("".join(f"bad{i}\n" for i in range(MAX_PROBLEMS_LISTED + 1)))
    assert str(err).endswith("; and 1 more problem")


def test_up_to_the_limit_no_count_is_added() -> None:
    err = refusal("".join(f"bad{i}\n" for i in range(MAX_PROBLEMS_LISTED)))
    assert err.more == 0 and "more problem" not in str(err)


def test_map_error_built_from_many_problems_keeps_the_first() -> None:
    problems = [Problem(i, "x", "bad") for i in range(1, 100)]
    err = MapError(problems, more=1)
    assert len(err.problems) == MAX_PROBLEMS_LISTED and err.more == 90 and err.count == 100


# --- the size limit ----------------------------------------------------------------------------


def padded(size: int) -> str:
    """A valid map of exactly ``size`` UTF-8 bytes (a comment fills it up)."""
    head = "0=node1:0\n#"
    return head + "é" * ((size - len(head)) // 2) + "x" * ((size - len(head)) % 2)


def test_a_map_of_exactly_the_limit_is_parsed() -> None:
    text = padded(MAX_MAP_BYTES)
    assert utf8_size(text) == MAX_MAP_BYTES
    assert list(parse(text)) == [0]


def test_one_byte_more_is_refused_before_parsing() -> None:
    text = padded(MAX_MAP_BYTES + 1)
    err = refusal(text)
    assert str(err) == f"{ANNOTATION} is {MAX_MAP_BYTES + 1} bytes, more than the 262144-byte limit"
    [p] = err.problems
    assert p.line == 0 and p.text == ""


def test_size_counts_utf8_bytes_not_characters() -> None:
    text = "0=a:0#" + "\U0010ffff" * (MAX_MAP_BYTES // 4)  # fewer characters than the limit
    assert len(text) < MAX_MAP_BYTES
    assert f"is {6 + MAX_MAP_BYTES} bytes" in str(refusal(text))
    # A lone surrogate (JSON allows "\ud800") counts, and does not crash the count.
    assert "bytes, more than" in str(refusal("\ud800" * MAX_MAP_BYTES))
    assert "no '='" in str(refusal("\ud800"))


def test_the_refusal_does_not_read_the_map() -> None:
    # Errors beyond the limit are not reported: one message, whatever the content.
    assert len(refusal("bad\n" * MIB).problems) == 1


def test_a_3000_entry_map_fits_comfortably() -> None:
    text = "".join(
        f"{i}=gpu-node-{i // 4:04d}.us-east-1.example.com:{2 * (i % 4)},{2 * (i % 4) + 1}\n"
        for i in range(3000)
    )
    # ~134 KB with 37-character node names: about half the limit.
    assert utf8_size(text) < MAX_MAP_BYTES * 6 // 10
    assert len(parse(text)) == 3000


def test_not_a_string_names_the_type() -> None:
    assert str(refusal(b"0=a:0")) == "the map must be a string, not bytes"
    assert str(refusal(None)) == "the map must be a string, not NoneType"


# --- linear cost: the issue's bound ---------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(malformed(1000)))
def test_a_1_mib_malformed_map_is_refused_within_the_issues_bound(shape: str) -> None:
    text = malformed(MIB)[shape]
    seconds, peak, err = measure(lambda: refusal(text))
    assert "bytes, more than the 262144-byte limit" in str(err)
    # The issue's bound (1 s, 50 MB); measured: ~1 ms and ~0.2 MB.
    assert seconds < ISSUE_SECONDS, seconds
    assert peak < ISSUE_BYTES, peak


@pytest.mark.parametrize("shape", sorted(malformed(1000)))
def test_a_map_just_under_the_limit_is_parsed_in_linear_memory(shape: str) -> None:
    # Parsed in full (it is under the limit): the parser's own worst cases. Memory is the
    # regression signal here (quadratic messages took 128 MB for 16 KB); measured: at most ~5 MB.
    text = malformed(UNDER_CAP)[shape]
    _, peak, err = measure(lambda: refusal(text))
    assert_bounded(err)
    assert peak < ISSUE_BYTES, peak


def test_many_duplicates_of_a_gpu_in_one_entry_stay_linear() -> None:
    # 1024 distinct GPUs, then ~100k repeats: a list look-up per repeat would be quadratic.
    text = "0=a:" + ",".join(str(i) for i in range(1024)) + ",5" * ((UNDER_CAP - 6000) // 2)
    err = refusal(text)
    assert err.problems[0].message == "GPU 5 is listed twice in this entry"
    assert err.count > 100_000


# --- parse_cached -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    parse_cache_clear()


def test_parse_cached_returns_the_same_map_for_the_same_text() -> None:
    text = "0=a:0\n1=b:1\n"
    first = parse_cached(text)
    assert first == parse(text)
    assert parse_cached("".join(["0=a:0\n", "1=b:1\n"])) is first  # equal text, another string object
    assert parse_cache_size()[0] == 1


def test_parse_cached_raises_a_fresh_error_each_time() -> None:
    errors = []
    for _ in range(3):
        with pytest.raises(MapError) as info:
            parse_cached("0=a:0\n0=b:1\n")
        errors.append(info.value)
    assert len({id(e) for e in errors}) == 3
    assert len({str(e) for e in errors}) == 1
    assert str(errors[0]) == str(refusal("0=a:0\n0=b:1\n"))
    assert all(e.__traceback__ is not None and e.__context__ is None for e in errors)
    assert parse_cache_size()[0] == 1


def test_parse_cached_keeps_the_count_of_unlisted_problems() -> None:
    text = "bad\n" * 30
    with pytest.raises(MapError) as info:
        parse_cached(text)
    with pytest.raises(MapError) as again:
        parse_cached(text)
    assert again.value.more == info.value.more == 20
    assert str(again.value) == str(info.value)


def test_parse_cached_does_not_keep_oversize_texts() -> None:
    with pytest.raises(MapError, match="more than the 262144-byte limit"):
        parse_cached("x" * (MAX_MAP_BYTES + 1))
    assert parse_cache_size() == (0, 0)
    with pytest.raises(MapError, match="the map must be a string"):
        parse_cached(None)  # type: ignore[arg-type]


def test_the_cache_is_bounded_in_entries_and_bytes() -> None:
    cache = mapcache._ParseCache(max_entries=4, max_bytes=10**9)
    for i in range(10):
        cache.parse(f"0=n:{i}\n")
    assert cache.size()[0] == 4
    # Least recently used goes first: touch the oldest kept, add one more, it stays.
    kept = cache.parse("0=n:6\n")
    cache.parse("0=n:100\n")
    assert cache.parse("0=n:6\n") is kept
    small = mapcache._ParseCache(max_entries=1000, max_bytes=200_000)
    for i in range(20):
        small.parse("".join(f"{o}=n{i}-{o // 8}:{o % 8}\n" for o in range(40)))
        assert small.size()[1] <= 200_000
    assert 0 < small.size()[0] < 20


def test_the_default_cache_is_bounded() -> None:
    for i in range(mapcache.PARSE_CACHE_ENTRIES + 50):
        parse_cached(f"{i}=n:0")
    entries, size = parse_cache_size()
    assert entries == mapcache.PARSE_CACHE_ENTRIES
    assert size <= mapcache.PARSE_CACHE_BYTES


def test_parse_cached_from_many_threads() -> None:
    texts = [f"0=n:{i % 7}\n1=m:{i % 5}\n" for i in range(200)]
    failures: list[BaseException] = []

    def work() -> None:
        try:
            for text in texts:
                smap = parse_cached(text)
                assert smap == parse(text)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures
    assert parse_cache_size()[0] == 35  # 7 x 5 distinct texts


def test_equal_map_texts_are_kept_once_by_the_schedulers_pod_cache() -> None:
    from kube_gpu_scheduler.domain.mapcache import parse_cache_clear, shared_text
    from kube_gpu_scheduler.scheduler.state.pods import share_map_text

    parse_cache_clear()
    text = "".join(f"{i}=node{i % 7}:{i % 8}\n" for i in range(3000))
    pods = [
        share_map_text(
            {
                "metadata": {
                    "name": f"w-{i}",
                    "annotations": {"gpu-scheduling-map": "".join(text)},  # a fresh copy, as a decoded event
                    "managedFields": [{"manager": "x"}],
                }
            }
        )
        for i in range(3)
    ]
    kept = [p["metadata"]["annotations"]["gpu-scheduling-map"] for p in pods]
    assert kept[0] == text and kept[0] is kept[1] is kept[2]
    assert all("managedFields" not in p["metadata"] for p in pods)
    # A text the cache refuses to keep (over the size cap) is left as it is, not copied.
    huge = "x" * (2 * 1024 * 1024)
    assert shared_text(huge) is huge
