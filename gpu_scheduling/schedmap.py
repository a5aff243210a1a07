"""The ``gpu-scheduling-map`` annotation: the one parser of its grammar.

Grammar (one entry per line, or several separated by ``;``)::

    ORDINAL=NODE:GPU[,GPU...]      # comment to the end of the line

* whitespace around every token is ignored, blank lines are ignored;
* ORDINAL and GPU are non-negative decimal integers;
* NODE is a Kubernetes node name (an RFC 1123 DNS subdomain).

Every error names the line (1-based, counted in the annotation's text) and the
offending text. The scheduler, the webhook, the check program and the
``gpu-scheduler-map`` command all call :func:`parse`; nothing else parses the
map.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

ANNOTATION = "gpu-scheduling-map"

# RFC 1123 subdomain, as Kubernetes validates node names.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NODE_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NODE_MAX = 253
_INT_RE = re.compile(r"[0-9]+")
# Upper bounds that keep a typo from becoming a huge number downstream.
MAX_ORDINAL = 1_000_000
MAX_GPU_INDEX = 1023


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a map: where it is and why."""

    line: int
    text: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message} (in {self.text!r})"


class MapError(ValueError):
    """The map cannot be used; :attr:`problems` lists every reason found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class Entry:
    """Replica ``ordinal`` runs on ``node`` and sees GPUs ``gpus`` (in map order)."""

    ordinal: int
    node: str
    gpus: tuple[int, ...]
    line: int = field(default=0, compare=False)

    @property
    def devices(self) -> str:
        """The GPUs as CUDA_VISIBLE_DEVICES spells them: ``"0,1"``."""
        return ",".join(str(g) for g in self.gpus)

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


def _int(token: str, what: str, limit: int, *, line: int, text: str, problems: list[Problem]) -> int | None:
    if not _INT_RE.fullmatch(token):
        problems.append(Problem(line, text, f"{what} {token!r} is not a non-negative integer"))
        return None
    # Compare lengths first: int() refuses strings of more than 4300 digits with a
    # plain ValueError, and parse() promises to raise nothing but MapError.
    digits = token.lstrip("0") or "0"
    if len(digits) > len(str(limit)):
        problems.append(Problem(line, text, f"{what} {digits[:20]}... is larger than {limit}"))
        return None
    value = int(digits)
    if value > limit:
        problems.append(Problem(line, text, f"{what} {value} is larger than {limit}"))
        return None
    return value


def _parse_entry(chunk: str, line: int, problems: list[Problem]) -> Entry | None:
    text = chunk.strip()
    ordinal_s, eq, rest = text.partition("=")
    if not eq:
        problems.append(Problem(line, text, "expected ORDINAL=NODE:GPU[,GPU...], found no '='"))
        return None
    node_s, colon, gpus_s = rest.partition(":")
    if not colon:
        problems.append(Problem(line, text, "expected NODE:GPU[,GPU...] after '=', found no ':'"))
        return None
    before = len(problems)
    ordinal = _int(ordinal_s.strip(), "ordinal", MAX_ORDINAL, line=line, text=text, problems=problems)
    node = node_s.strip()
    if not node:
        problems.append(Problem(line, text, "node name is empty"))
    elif len(node) > _NODE_MAX or not _NODE_RE.fullmatch(node):
        problems.append(
            Problem(
                line,
                text,
                f"node name {node!r} is not a valid Kubernetes node name "
                "(lower-case letters, digits, '-' and '.', starting and ending alphanumeric)",
            )
        )
    gpus: list[int] = []
    tokens = [t.strip() for t in gpus_s.split(",")]
    if tokens == [""]:
        problems.append(Problem(line, text, f"no GPU index given for node {node!r}"))
        tokens = []
    for token in tokens:
        if not token:
            problems.append(Problem(line, text, "empty GPU index (stray ',')"))
            continue
        gpu = _int(token, "GPU index", MAX_GPU_INDEX, line=line, text=text, problems=problems)
        if gpu is None:
            continue
        if gpu in gpus:
            problems.append(Problem(line, text, f"GPU {gpu} is listed twice in this entry"))
            continue
        gpus.append(gpu)
    if len(problems) != before or ordinal is None:
        return None
    return Entry(ordinal=ordinal, node=node, gpus=tuple(gpus), line=line)


def parse(text: str) -> SchedulingMap:
    """Parse the annotation's value; raise :class:`MapError` listing every problem.

    Never raises anything else, whatever ``text`` holds.
    """
    if not isinstance(text, str):
        raise MapError([Problem(0, repr(text)[:80], "the map must be a string")])
    problems: list[Problem] = []
    entries: dict[int, Entry] = {}
    owners: dict[tuple[str, int], Entry] = {}
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
                problems.append(
                    Problem(
                        lineno,
                        chunk.strip(),
                        f"ordinal {entry.ordinal} is already mapped on line {first.line} ({first})",
                    )
                )
                continue
            clash = [(entry.node, g) for g in entry.gpus if (entry.node, g) in owners]
            if clash:
                node, gpu = clash[0]
                other = owners[(node, gpu)]
                problems.append(
                    Problem(
                        lineno,
                        chunk.strip(),
                        f"{node}:{gpu} is already given to ordinal {other.ordinal} on line {other.line}",
                    )
                )
                continue
            entries[entry.ordinal] = entry
            for g in entry.gpus:
                owners[(entry.node, g)] = entry
    if problems:
        raise MapError(problems)
    if not entries:
        raise MapError([Problem(1, text.strip()[:80], "the map has no entries")])
    return SchedulingMap(entries)
