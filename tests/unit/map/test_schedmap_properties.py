"""Property tests for the grammar: round trips and "only MapError, whatever the text"."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kube_gpu_scheduler.domain.schedmap import (
    EXCERPT_CHARS,
    GPU,
    MAX_ERROR_CHARS,
    MAX_GPU_INDEX,
    MAX_ORDINAL,
    Entry,
    MapError,
    SchedulingMap,
    gpu_kind,
    gpu_name,
    parse,
    parse_gpu,
)

_LABEL = r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?"
node_names = st.from_regex(rf"{_LABEL}(\.{_LABEL}){{0,2}}", fullmatch=True)
ordinals = st.integers(min_value=0, max_value=MAX_ORDINAL)
gpu_indices = st.integers(min_value=0, max_value=MAX_GPU_INDEX)
# Normalized names: GPU-<lower hex 8-4-4-4-12>, dddd:bb:dd.f (lower case; a domain of 8 digits
# only when its first 4 are not all zero).
_hex = "[0-9a-f]"
gpu_uuids = st.from_regex(
    rf"GPU-{_hex}{{8}}-{_hex}{{4}}-{_hex}{{4}}-{_hex}{{4}}-{_hex}{{12}}", fullmatch=True
)
gpu_pci_ids = st.from_regex(
    rf"({_hex}{{4}}|[1-9a-f]{_hex}{{7}}):{_hex}{{2}}:{_hex}{{2}}\.[0-7]", fullmatch=True
)
GPUS_OF_KIND = {"index": gpu_indices, "uuid": gpu_uuids, "pci": gpu_pci_ids}


@st.composite
def scheduling_maps(draw: Any) -> SchedulingMap:
    """A valid map: unique ordinals, no GPU twice in an entry, each node's GPUs named one way
    (indices, UUIDs or PCI bus IDs); about half of them give a NODE:GPU to several ordinals
    (shared)."""
    nodes = draw(st.lists(node_names, min_size=1, max_size=4, unique=True))
    kinds = {n: draw(st.sampled_from(sorted(GPUS_OF_KIND))) for n in nodes}
    wanted = draw(st.lists(ordinals, min_size=1, max_size=8, unique=True))
    taken: set[tuple[str, GPU]] = set()
    entries: dict[int, Entry] = {}
    for ordinal in wanted:
        node = draw(st.sampled_from(nodes))
        gpus = draw(st.lists(GPUS_OF_KIND[kinds[node]], min_size=1, max_size=4, unique=True))
        if not draw(st.booleans()):
            gpus = [g for g in gpus if (node, g) not in taken]
        if not gpus:
            continue
        taken.update((node, g) for g in gpus)
        entries[ordinal] = Entry(ordinal, node, tuple(gpus))
    assume(entries)
    return SchedulingMap(entries)


spaces = st.sampled_from(["", " ", "  ", "\t", " \t "])
comment_text = st.text(
    alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=20
)


@st.composite
def renderings(draw: Any, smap: SchedulingMap) -> tuple[str, dict[int, int]]:
    """Render ``smap`` with random spacing, leading zeros, comments, ';', blank lines and CRLF.

    Returns the text and the line each ordinal was written on.
    """
    order = draw(st.permutations(list(smap)))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    out: list[str] = []
    line = 1
    where: dict[int, int] = {}

    def num(n: GPU) -> str:
        if isinstance(n, int):
            return "0" * draw(st.integers(0, 2)) + str(n)
        # A name in any case; a PCI bus ID's 4-digit domain perhaps as NVML's 8 digits.
        if gpu_kind(n) == "pci" and n.index(":") == 4 and draw(st.booleans()):
            n = "0000" + n
        return "".join(c.upper() if draw(st.booleans()) else c for c in n)

    def ws() -> str:
        return str(draw(spaces))

    for i, ordinal in enumerate(order):
        e = smap[ordinal]
        gpus = ",".join(ws() + num(g) + ws() for g in e.gpus)
        out.append(f"{ws()}{num(ordinal)}{ws()}={ws()}{e.node}{ws()}:{gpus}")
        where[ordinal] = line
        if i == len(order) - 1:
            tail = draw(st.sampled_from(["", eol, ";", ";" + eol, " # end" + eol]))
            out.append(tail)
            break
        sep = draw(
            st.sampled_from(["eol", "semi", "semi-eol", "comment", "blank", "comment-line", "semi-semi"])
        )
        if sep == "eol":
            out.append(eol)
            line += 1
        elif sep == "semi":
            out.append(ws() + ";")
        elif sep == "semi-semi":
            out.append(";" + ws() + ";")
        elif sep == "semi-eol":
            out.append(";" + eol)
            line += 1
        elif sep == "comment":
            out.append(ws() + "#" + draw(comment_text) + eol)
            line += 1
        elif sep == "blank":
            out.append(eol + ws() + eol)
            line += 2
        else:
            out.append(eol + "# " + draw(comment_text) + eol)
            line += 2
    return "".join(out), where


@settings(max_examples=300)
@given(scheduling_maps())
def test_format_then_parse_round_trips(smap: SchedulingMap) -> None:
    text = smap.format()
    back = parse(text)
    assert back == smap
    assert back.format() == text
    # format() writes one entry per line, in ordinal order.
    assert [back[o].line for o in back] == list(range(1, len(smap) + 1))
    # Shared: exactly the NODE:GPU pairs two or more entries name, with those ordinals.
    named: dict[tuple[str, GPU], list[int]] = {}
    for o in smap:
        for g in smap[o].gpus:
            named.setdefault((smap[o].node, g), []).append(o)
    assert back.shared() == {k: tuple(v) for k, v in named.items() if len(v) > 1}
    for o in back:
        assert back.mates(o) == {
            g: frozenset(named[(back[o].node, g)]) - {o}
            for g in back[o].gpus
            if len(named[(back[o].node, g)]) > 1
        }


@settings(max_examples=300)
@given(st.data())
def test_any_rendering_parses_back(data: st.DataObject) -> None:
    smap = data.draw(scheduling_maps())
    text, where = data.draw(renderings(smap))
    back = parse(text)
    assert back == smap
    assert {o: back[o].line for o in back} == where


@settings(max_examples=300)
@given(st.one_of(gpu_indices, gpu_uuids, gpu_pci_ids), st.data())
def test_a_gpu_name_normalizes_idempotently(gpu: GPU, data: st.DataObject) -> None:
    """Whatever case and domain width a name is written in, it reads as its normal form, and
    the normal form reads as itself."""
    assert parse_gpu(str(gpu)) == gpu
    if isinstance(gpu, str):
        assert gpu_name(gpu) == gpu
        written = "".join(c.upper() if data.draw(st.booleans()) else c for c in gpu)
        assert parse_gpu(f" {written}\t") == gpu
        assert gpu_name(gpu_name(written) or "") == gpu


grammar_soup = st.text(
    alphabet=st.sampled_from(list("0123456789=:,;# \t\r\nab-.Z_²٣\uff11\u00a0\u2028\x1c\x00éGPUf")),
    max_size=60,
)
huge_numbers = st.integers(min_value=MAX_ORDINAL + 1, max_value=10**30).map(str) | st.just("9" * 5000)


JUNK = (
    *("", "x", "-1", "²", "٣", "\uff11", "0x1", "Node", "a_b", ",", "=", ":", ";", "#"),
    *("GPU-", "0000:3b:00.0", "g", "-", ".", "f", "00000000:", "GPU-8a3c0d4e-1234-5678-9abc-def012345678"),
)


@st.composite
def near_misses(draw: Any) -> str:
    """A valid map with one token swapped for junk: exercises each error path."""
    smap = draw(scheduling_maps())
    text = smap.format()
    junk = draw(st.sampled_from(JUNK))
    junk = draw(st.just(junk) | huge_numbers)
    pos = draw(st.integers(0, len(text)))
    cut = draw(st.integers(0, 3))
    return text[:pos] + junk + text[pos + cut :]


def _assert_only_map_error(text: str) -> None:
    try:
        smap = parse(text)
    except MapError as err:
        assert err.problems
        lines = text.split("\n")
        for p in err.problems:
            assert 1 <= p.line <= len(lines)
            if p.message != "the map has no entries":
                # The text quoted is the start of a piece of the line it names (cut with "…").
                assert len(p.text) <= EXCERPT_CHARS
                assert p.text.removesuffix("…") in lines[p.line - 1]
        assert len(str(err)) <= MAX_ERROR_CHARS
        return
    # Whatever parses is canonical and round-trips.
    assert parse(smap.format()) == smap
    assert len(smap) >= 1


@settings(max_examples=500)
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_map_error(text: str) -> None:
    _assert_only_map_error(text)


@settings(max_examples=500)
@given(grammar_soup)
def test_grammar_like_soup_raises_only_map_error(text: str) -> None:
    _assert_only_map_error(text)


@settings(max_examples=300)
@given(near_misses())
def test_near_misses_raise_only_map_error(text: str) -> None:
    _assert_only_map_error(text)


@settings(max_examples=200)
@given(huge_numbers, huge_numbers)
def test_huge_numbers_are_map_errors(a: str, b: str) -> None:
    for text in (f"{a}=n:0", f"0=n:{b}", f"{a}=n:{b}"):
        try:
            parse(text)
        except MapError as err:
            assert all("larger than" in p.message for p in err.problems)
        else:  # pragma: no cover - the strategy only makes out-of-range numbers
            raise AssertionError(f"{text[:40]!r} parsed")
