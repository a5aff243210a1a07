"""The ``gpu-scheduling-map`` annotation: the one parser of its grammar.

Grammar (one entry per line, or several separated by ``;``)::

    ORDINAL=NODE:GPU[,GPU...]      # comment to the end of the line
    ORDINAL=NODE:auto(N)           # a count: N GPUs of NODE, chosen for the replica (DRA mode)

* whitespace around every token is ignored, blank lines are ignored;
* ORDINAL is a non-negative decimal integer;
* NODE is a Kubernetes node name (an RFC 1123 DNS subdomain); the entry is split
  at the FIRST ``:`` after ``=`` (a node name has none, a PCI bus ID has two);
* a GPU is named one of three ways (:func:`gpu_kind`):

  - an *index*, a non-negative decimal integer (nvidia-smi's, PCI bus order),
    kept as an ``int``: every map of the index-only grammar parses as before;
  - a *UUID*, ``GPU-`` then 8-4-4-4-12 hex digits (NVIDIA's form, any case),
    kept as ``GPU-<lower-case hex>``;
  - a *PCI bus ID*, ``DOMAIN:BUS:DEVICE.FUNCTION`` with a 4- or 8-hex-digit
    domain (NVML's ``00000000:3B:00.0``, sysfs's ``0000:3b:00.0``), 2 hex bus,
    2 hex device, function 0-7, kept lower case with a 4-digit domain (an
    8-digit domain whose first 4 digits are zero loses them);

* a *count entry* ``NODE:auto(N)`` asks for N GPUs of its node instead of naming them
  (N a decimal integer, 1 to :data:`MAX_COUNT`: a ResourceClaim allocates at most 32 devices;
  leading zeros allowed, no whitespace inside the parentheses). It is the entry's only token:
  ``auto(2),3`` is an error. Any token that starts with ``auto`` is read as a count (no GPU
  name does). A count entry names no GPU, so it never shares one (sharing is only by naming the
  same GPU) and is outside the one-way-per-node rule; only DRA mode can give it GPUs
  (kube-scheduler chooses them: docs/dra.md), the other modes refuse it (GPUCountNeedsDRA);
* duplicates compare those normalized names: a GPU twice in an entry is an error;
* the same NODE:GPU named by several entries is *shared* by those replicas, on purpose
  (:meth:`SchedulingMap.shared`): partial overlaps too (``0=n:4,5`` and ``1=n:5,6`` share
  GPU 5). Where sharing is forbidden (chart value ``sharing.allowed=false``, a tenant's
  ``GPUPinningPolicy``), :func:`sharing_problems` says which lines share what;
* a node's GPUs are named one way in the whole map (all indices, all UUIDs or
  all PCI bus IDs): otherwise the same GPU could be given twice under two names.

Every error names the line (1-based, counted in the annotation's text) and an
excerpt of the offending text. The scheduler, the webhook, the check program
and the ``gpu-scheduler-map`` command all call :func:`parse` (or
:func:`kube_gpu_scheduler.domain.mapcache.parse_cached`, which remembers its answers); nothing else parses the
map.

Every input has a size, and the cost of an error does not grow with it:

* a text of more than :data:`MAX_MAP_BYTES` (UTF-8) is refused before any
  parsing, with one problem that says how large it is;
* a problem quotes at most :data:`EXCERPT_CHARS` characters of the entry (its
  start, then ``…``), and so does every token quoted in its message;
* a :class:`MapError` lists the first :data:`MAX_PROBLEMS_LISTED` problems and
  counts the rest (``...; and 42 more problems``).

Parsing is linear in the text's length.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial

# How one GPU is named: part of this grammar, re-exported (import them from here).
from kube_gpu_scheduler.domain.gpunames import (  # noqa: F401 (re-exported: part of the grammar)
    BAD_GPU,
    DIGITS_RE,
    GPU,
    KIND_WORDS,
    MAX_GPU_INDEX,
    GPUKind,
    gpu_kind,
    gpu_name,
    gpu_sort_key,
    parse_gpu,
)

ANNOTATION = "gpu-scheduling-map"

# RFC 1123 subdomain, as Kubernetes validates node names.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NODE_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NODE_MAX = 253
# Upper bounds that keep a typo from becoming a huge number downstream.
MAX_ORDINAL = 1_000_000
# The most GPUs a count entry may ask for: a ResourceClaim allocates at most 32 devices.
MAX_COUNT = 32
COUNT_WORD = "auto"
_COUNT_RE = re.compile(r"auto\(([0-9]*)\)")

# The largest map text accepted, in UTF-8 bytes: the apiserver's limit on all of
# an object's annotations together (256 KiB), so no map an apiserver stores is
# refused. A 3,000-entry map ("2999=gpu-node-17.example.com:0,1,2,3") is ~110 KB.
MAX_MAP_BYTES = 256 * 1024
# Characters of an entry (or of a token) an error message quotes.
EXCERPT_CHARS = 48
# Problems a MapError lists; the others are counted.
MAX_PROBLEMS_LISTED = 10
# Bounds on one problem's message and on its rendering (str(problem)); reached
# only by pathological text (repr() may spell a character with 10).
MAX_MESSAGE_CHARS = 300
MAX_PROBLEM_CHARS = 400
# Sharers of one GPU a warning names before it says "and N more".
_SHARERS_NAMED = 8
# So len(str(MapError)) <= MAX_ERROR_CHARS, whatever the map.
MAX_ERROR_CHARS = MAX_PROBLEMS_LISTED * (MAX_PROBLEM_CHARS + 2) + 40


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` when it has at most ``limit`` characters, else its start and ``…``."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _quoted(token: str) -> str:
    return repr(excerpt(token))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a lone surrogate counts 3), without copying all of it at once."""
    if len(text) * 4 <= MAX_MAP_BYTES:
        return len(text.encode("utf-8", "surrogatepass"))
    step = 1 << 16
    return sum(len(text[i : i + step].encode("utf-8", "surrogatepass")) for i in range(0, len(text), step))


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a map: where it is and why.

    ``text`` is an excerpt of the entry (at most EXCERPT_CHARS characters) and
    ``message`` is bounded too, whatever the caller passes. Line 0 is the whole
    map (its type, its size).
    """

    line: int
    text: str
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", excerpt(self.text))
        object.__setattr__(self, "message", _cut(self.message, MAX_MESSAGE_CHARS))

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        quoted = f" (in {self.text!r})" if self.text else ""
        return _cut(f"{where}{self.message}{quoted}", MAX_PROBLEM_CHARS)


class MapError(ValueError):
    """The map cannot be used.

    :attr:`problems` holds the first MAX_PROBLEMS_LISTED problems found, in text
    order, and :attr:`more` counts the others; ``str()`` lists the first ones and
    ends with ``and N more problems``.
    """

    def __init__(self, problems: Sequence[Problem], more: int = 0):
        listed = list(problems[:MAX_PROBLEMS_LISTED])
        self.problems = listed
        self.more = more + len(problems) - len(listed)
        message = "; ".join(str(p) for p in listed)
        if self.more:
            message += f"; and {self.more} more problem{'' if self.more == 1 else 's'}"
        super().__init__(message)

    @property
    def count(self) -> int:
        """How many problems were found in all."""
        return len(self.problems) + self.more


class _Problems:
    """The problems of one parse: the first MAX_PROBLEMS_LISTED kept, the rest counted."""

    def __init__(self) -> None:
        self.listed: list[Problem] = []
        self.count = 0

    def add(self, line: int, text: str, message: str | Callable[[], str]) -> None:
        self.count += 1
        if len(self.listed) < MAX_PROBLEMS_LISTED:
            self.listed.append(Problem(line, text, message if isinstance(message, str) else message()))

    def error(self) -> MapError:
        return MapError(self.listed, self.count - len(self.listed))


@dataclass(frozen=True)
class Entry:
    """Replica ``ordinal`` runs on ``node`` and sees GPUs ``gpus`` (in map order).

    All of an entry's GPUs are of one kind (:func:`gpu_kind`): indices (``int``), UUIDs or
    PCI bus IDs (normalized ``str``). A count entry (``NODE:auto(N)``) has no ``gpus`` and
    ``count`` N; a named entry has ``count`` 0.
    """

    ordinal: int
    node: str
    gpus: tuple[GPU, ...]
    line: int = field(default=0, compare=False)
    count: int = 0

    @property
    def devices(self) -> str:
        """The GPUs as CUDA_VISIBLE_DEVICES spells them: ``"0,1"``, ``"GPU-8a3c...,GPU-..."``
        (a count entry: ``"auto(2)"``, which only DRA mode gives GPUs for)."""
        if self.count:
            return f"{COUNT_WORD}({self.count})"
        return ",".join(str(g) for g in self.gpus)

    @property
    def size(self) -> int:
        """How many GPUs the entry gives its replica: its count, or the GPUs it names."""
        return self.count or len(self.gpus)

    @property
    def kind(self) -> GPUKind:
        """How the entry names its GPUs: ``"index"``, ``"uuid"`` or ``"pci"``."""
        return gpu_kind(self.gpus[0]) if self.gpus else "index"

    @property
    def indices(self) -> tuple[int, ...]:
        """The GPUs named by index (all of them, or none for an entry of names)."""
        return tuple(g for g in self.gpus if isinstance(g, int))

    def __str__(self) -> str:
        return f"{self.ordinal}={self.node}:{self.devices}"


@dataclass(frozen=True)
class SchedulingMap(Mapping[int, Entry]):
    """Parsed map: ordinal -> :class:`Entry`, iterated in ordinal order."""

    entries: Mapping[int, Entry]

    def __getitem__(self, ordinal: int) -> Entry:
        return self.entries[ordinal]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.entries))

    def __len__(self) -> int:
        return len(self.entries)

    def format(self) -> str:
        """Canonical text: one entry per line, ordinals ascending; parses back to an equal map."""
        return "".join(f"{self.entries[o]}\n" for o in self)

    def nodes(self) -> set[str]:
        return {e.node for e in self.entries.values()}

    @cached_property
    def _sharing(self) -> dict[tuple[str, GPU], tuple[int, ...]]:
        by_gpu: dict[tuple[str, GPU], list[int]] = {}
        for ordinal in self:
            entry = self.entries[ordinal]
            for gpu in entry.gpus:
                by_gpu.setdefault((entry.node, gpu), []).append(ordinal)
        return {where: tuple(ordinals) for where, ordinals in by_gpu.items() if len(ordinals) > 1}

    def shared(self) -> Mapping[tuple[str, GPU], tuple[int, ...]]:
        """``(node, gpu) -> ordinals`` (ascending) for every GPU that two or more entries name:
        those replicas share it. Empty for a map that shares nothing. Computed once per map
        (the maps :func:`~kube_gpu_scheduler.domain.mapcache.parse_cached` returns are shared, so once per distinct text)."""
        return self._sharing

    def mates(self, ordinal: int) -> Mapping[GPU, frozenset[int]]:
        """For each GPU of ``ordinal``'s entry that other entries name too, those other ordinals."""
        entry = self.entries.get(ordinal)
        if entry is None or not self._sharing:
            return {}
        out: dict[GPU, frozenset[int]] = {}
        for gpu in entry.gpus:
            others = self._sharing.get((entry.node, gpu))
            if others:
                out[gpu] = frozenset(o for o in others if o != ordinal)
        return out

    def sharing_lines(self, limit: int = MAX_PROBLEMS_LISTED) -> list[str]:
        """``"node4:3 by ordinals 3, 4 (lines 4, 5)"`` for the first ``limit`` shared GPUs
        (node and GPU order), then ``"and N more shared GPUs"``: for warnings."""
        shared = sorted(self._sharing.items(), key=lambda kv: (kv[0][0], gpu_sort_key(kv[0][1])))

        def some(values: Sequence[int]) -> str:
            shown = ", ".join(map(str, values[:_SHARERS_NAMED]))
            return shown + (
                f" and {len(values) - _SHARERS_NAMED} more" if len(values) > _SHARERS_NAMED else ""
            )

        out = [
            f"{excerpt(node)}:{gpu} by ordinals {some(ords)} (lines {some([self.entries[o].line for o in ords])})"
            for (node, gpu), ords in shared[:limit]
        ]
        if len(shared) > limit:
            more = len(shared) - limit
            out.append(f"and {more} more shared GPU{'' if more == 1 else 's'}")
        return out


def _int(token: str, what: str, limit: int, *, line: int, text: str, problems: _Problems) -> int | None:
    if not DIGITS_RE.fullmatch(token):
        problems.add(line, text, f"{what} {_quoted(token)} is not a non-negative integer")
        return None
    # Compare lengths first: int() refuses strings of more than 4300 digits with a
    # plain ValueError, and parse() promises to raise nothing but MapError.
    digits = token.lstrip("0") or "0"
    if len(digits) > len(str(limit)):
        problems.add(line, text, f"{what} {digits[:20]}... is larger than {limit}")
        return None
    value = int(digits)
    if value > limit:
        problems.add(line, text, f"{what} {value} is larger than {limit}")
        return None
    return value


def _parse_entry(chunk: str, line: int, problems: _Problems) -> Entry | None:
    text = chunk.strip()
    ordinal_s, eq, rest = text.partition("=")
    if not eq:
        problems.add(line, text, "expected ORDINAL=NODE:GPU[,GPU...], found no '='")
        return None
    node_s, colon, gpus_s = rest.partition(":")
    if not colon:
        problems.add(line, text, "expected NODE:GPU[,GPU...] after '=', found no ':'")
        return None
    before = problems.count
    ordinal = _int(ordinal_s.strip(), "ordinal", MAX_ORDINAL, line=line, text=text, problems=problems)
    node = node_s.strip()
    if not node:
        problems.add(line, text, "node name is empty")
    # The length test comes first: the regular expression only ever sees short names.
    elif len(node) > _NODE_MAX or not _NODE_RE.fullmatch(node):
        problems.add(
            line,
            text,
            f"node name {_quoted(node)} is not a valid Kubernetes node name "
            "(lower-case letters, digits, '-' and '.', starting and ending alphanumeric)",
        )
    gpus: list[GPU] = []
    seen: set[GPU] = set()
    kinds: dict[GPUKind, None] = {}
    count = 0
    tokens = gpus_s.split(",")
    if len(tokens) == 1 and not tokens[0].strip():
        problems.add(line, text, f"no GPU index given for node {_quoted(node)}")
        tokens = []
    for raw in tokens:
        token = raw.strip()
        if not token:
            problems.add(line, text, "empty GPU index (stray ',')")
            continue
        gpu: GPU | None
        if token.startswith(COUNT_WORD):
            count = _count(token, line=line, text=text, problems=problems) or -1
            continue
        if DIGITS_RE.fullmatch(token):
            gpu = _int(token, "GPU index", MAX_GPU_INDEX, line=line, text=text, problems=problems)
        elif (gpu := gpu_name(token)) is None:
            problems.add(line, text, f"GPU {_quoted(token)} {BAD_GPU}")
        if gpu is None:
            continue
        if gpu in seen:
            problems.add(line, text, f"GPU {gpu} is listed twice in this entry")
            continue
        seen.add(gpu)
        kinds[gpu_kind(gpu)] = None
        gpus.append(gpu)
    if len(kinds) > 1:
        first, second = (KIND_WORDS[k] for k in list(kinds)[:2])
        problems.add(
            line,
            text,
            f"the GPUs of node {_quoted(node)} are named both by {first} and by {second} in this "
            f"entry: {_ONE_WAY}",
        )
    if count and len(tokens) > 1:
        problems.add(line, text, _COUNT_ALONE)
    if problems.count != before or ordinal is None:
        return None
    return Entry(ordinal=ordinal, node=node, gpus=tuple(gpus), line=line, count=max(count, 0))


_COUNT_ALONE = (
    "auto(N) asks for a number of GPUs and cannot be listed with other GPUs: "
    "write either NODE:auto(N) or NODE:GPU[,GPU...]"
)
_COUNT_FORM = f"write auto(N), N a whole number from 1 to {MAX_COUNT}"


def _count(token: str, *, line: int, text: str, problems: _Problems) -> int | None:
    """A count token's N (``auto(2)``: 2), or None after adding its problem."""
    m = _COUNT_RE.fullmatch(token)
    if m is None or not m.group(1):
        problems.add(line, text, f"GPU count {_quoted(token)} is not auto(N): {_COUNT_FORM}")
        return None
    digits = m.group(1).lstrip("0") or "0"
    if digits == "0":
        problems.add(line, text, f"GPU count 0 asks for no GPU: {_COUNT_FORM}")
        return None
    if len(digits) > 2 or int(digits) > MAX_COUNT:
        shown = digits[:20] + ("..." if len(digits) > 20 else "")
        problems.add(
            line,
            text,
            f"GPU count {shown} is larger than {MAX_COUNT} (a ResourceClaim allocates at most {MAX_COUNT} devices)",
        )
        return None
    return int(digits)


_ONE_WAY = (
    "the same GPU could then be given twice; name all of a node's GPUs one way "
    "(all indices, all UUIDs or all PCI bus IDs)"
)


def _named_otherwise(entry: Entry, first: Entry) -> str:
    return (
        f"node {_quoted(entry.node)} has its GPUs named by {KIND_WORDS[entry.kind]} here and by "
        f"{KIND_WORDS[first.kind]} on line {first.line} ({excerpt(str(first))}): {_ONE_WAY}"
    )


def _already_mapped(ordinal: int, first: Entry) -> str:
    return f"ordinal {ordinal} is already mapped on line {first.line} ({excerpt(str(first))})"


def parse(text: str) -> SchedulingMap:
    """Parse the annotation's value; raise :class:`MapError` naming the problems.

    Never raises anything else, whatever ``text`` holds; a text of more than
    MAX_MAP_BYTES is refused before it is parsed.
    """
    if not isinstance(text, str):
        raise MapError([Problem(0, "", f"the map must be a string, not {type(text).__name__}")])
    if len(text) > MAX_MAP_BYTES // 4 and (size := utf8_size(text)) > MAX_MAP_BYTES:
        raise MapError(
            [Problem(0, "", f"{ANNOTATION} is {size} bytes, more than the {MAX_MAP_BYTES}-byte limit")]
        )
    problems = _Problems()
    entries: dict[int, Entry] = {}
    # The first entry of each node: how the map names that node's GPUs.
    forms: dict[str, Entry] = {}
    # Lines are counted as editors and kubectl count them: on "\n" only.
    for lineno, raw in enumerate(text.split("\n"), start=1):
        content = raw.split("#", 1)[0]
        for chunk in content.split(";"):
            if not chunk.strip():
                continue
            entry = _parse_entry(chunk, lineno, problems)
            if entry is None:
                continue
            first = entries.get(entry.ordinal)
            if first is not None:
                # Built only when listed: str(first) may name a thousand GPUs.
                problems.add(lineno, chunk.strip(), partial(_already_mapped, entry.ordinal, first))
                continue
            form = entry if entry.count else forms.setdefault(entry.node, entry)
            if form.kind != entry.kind:
                problems.add(lineno, chunk.strip(), partial(_named_otherwise, entry, form))
                continue
            entries[entry.ordinal] = entry
    if problems.count:
        raise problems.error()
    if not entries:
        raise MapError([Problem(1, text.strip(), "the map has no entries")])
    return SchedulingMap(entries)


def sharing_problems(smap: SchedulingMap, why: str) -> MapError | None:
    """Where sharing is forbidden: a :class:`MapError` naming, for each entry (in text order)
    that names a GPU an earlier entry names, the line, the GPU and the earlier ordinal, each
    message ending with ``why`` (who forbids it and how to allow it); ``None`` when the map
    shares nothing."""
    if not smap.shared():
        return None
    problems = _Problems()
    first: dict[tuple[str, GPU], Entry] = {}
    for entry in sorted(smap.entries.values(), key=lambda e: (e.line, e.ordinal)):
        clash = next(((entry.node, g) for g in entry.gpus if (entry.node, g) in first), None)
        if clash is not None:
            other = first[clash]
            problems.add(
                entry.line,
                str(entry),
                f"{clash[0]}:{clash[1]} is also given to ordinal {other.ordinal} on line {other.line}: {why}",
            )
        for g in entry.gpus:
            first.setdefault((entry.node, g), entry)
    return problems.error()
