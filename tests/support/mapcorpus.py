"""Seeded ``gpu-scheduling-map`` texts for agreement tests: maps the parser accepts, written in
every form the grammar allows, and near misses it refuses.

:func:`corpus` yields ``count`` texts from one seed (the same texts for the same seed):

* valid maps of 1-40 entries, each written differently: whitespace around every token (spaces,
  tabs, and what else ``str.isspace()`` accepts: NBSP, EM SPACE, ``\\v``, ``\\f``, ``\\x1c``...),
  ``;``-separated entries, ``#`` comments holding ``;``, ``=`` and entries, blank lines, CRLF,
  leading zeros, entries in any order; each node's GPUs named one way: by index (most), by
  UUID (``GPU-...`` in any case) or by PCI bus ID (any case, 4- or 8-digit domain); about a
  third of them share GPUs (more entries naming some of an entry's GPUs, perhaps spelt
  otherwise: whole or partial overlaps, two sharers or more); about one in ten has a count
  entry (``NODE:auto(N)``, perhaps ``auto(02)``, on a node whose other entries name GPUs any
  way), which a sharer may copy (two count entries on one node share nothing);
* the same maps with one mistake: a duplicate ordinal (perhaps sharing a GPU), a GPU listed
  twice (perhaps in an entry that shares it), a huge ordinal or GPU index, non-ASCII digits,
  an invalid node name, a missing ``=`` or ``:``, a stray ``,``, a character that is not whitespace to the parser (ZERO WIDTH
  SPACE), no entry at all, a UUID or PCI bus ID that is not one (bad hex, wrong group lengths,
  function 8, a 3- or 5-digit domain), a node named two ways (in one entry, or on two lines),
  the same UUID or PCI bus ID twice once normalized in one entry; a count that is not one
  (``auto(0)``, ``auto(33)``, ``auto(x)``, ``auto( 2)``, ``Auto(2)``...) or listed with other
  GPUs;
* random strings over the grammar's alphabet (most refused, some accepted).

:func:`large_map` writes a valid map of about ``size`` bytes (up to the 256 KiB the apiserver
allows for all of an object's annotations), with every third node's GPUs named by UUID when
``named``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from kube_gpu_scheduler.domain.schedmap import GPU, MAX_COUNT, MAX_GPU_INDEX, MAX_ORDINAL

# The map this package was written for: replicas 3 and 4 share GPU 3 of node4.
TASK_MAP = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:3\n"

PLAIN_SPACE = (" ", "\t", "  ", " \t")
# Whitespace to str.isspace() besides the plain ones ("\r" ends CRLF lines).
OTHER_SPACE = ("\u00a0", "\u2003", "\u3000", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\u2028", "\u202f", "\r")
# Not whitespace to the parser.
NOT_SPACE = ("\u200b", "\u180e", "\ufeff")
NON_ASCII_DIGITS = ("\u0663", "\uff13", "\u00b2", "\u0967")
NODES = ("node1", "node2", "gpu-node-17.example.com", "a", "n-0.b-1", "x9", "0.0")
BAD_NODES = ("Node1", "node_1", "-node", "node-", "a..b", "a.-b", ".a", "a" * 254, "nöde", "a/b")
COMMENTS = ("# comment", "#", "# 0=node1:0;1=node2:1", "#;;==::", "# ünïcödé ✓", "# 7=a:1,2 ; # x")


def _space(r: random.Random, exotic: bool) -> str:
    roll = r.random()
    if roll < 0.55:
        return ""
    if exotic and roll < 0.75:
        return r.choice(OTHER_SPACE)
    return r.choice(PLAIN_SPACE)


def _num(r: random.Random, n: int) -> str:
    return ("0" * r.randint(1, 3) if r.random() < 0.15 else "") + str(n)


def uuid(r: random.Random) -> str:
    """A GPU UUID in the map's normal form."""
    h = f"{r.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def pci(r: random.Random) -> str:
    """A PCI bus ID in the map's normal form (a domain of 8 digits only past 0xffff)."""
    domain = r.choice(("0000", "0000", "0001", f"{r.randrange(0x10000, 1 << 32):08x}"))
    return f"{domain}:{r.randrange(256):02x}:{r.randrange(32):02x}.{r.randrange(8)}"


def _pool(r: random.Random, size: int) -> list[GPU]:
    """A node's GPUs, all named one way."""
    roll = r.random()
    if roll < 0.7:
        return list(r.sample(range(0, 16 if r.random() < 0.9 else MAX_GPU_INDEX + 1), size))
    return [uuid(r) if roll < 0.94 else pci(r) for _ in range(size)]


def _spell(r: random.Random, gpu: GPU) -> str:
    """``gpu`` as a user may write it: an index perhaps with leading zeros, a name in any case,
    a PCI bus ID's 4-digit domain perhaps as NVML's 8 digits, a count (``auto(N)``) perhaps
    with leading zeros."""
    if isinstance(gpu, int):
        return _num(r, gpu)
    if gpu.lower().startswith("auto"):  # a count as written (a bad one as it is)
        return f"auto({_num(r, int(gpu[5:-1]))})" if re.fullmatch(r"auto\([0-9]+\)", gpu) else gpu
    if ":" in gpu and gpu.index(":") == 4 and r.random() < 0.4:
        gpu = "0000" + gpu
    roll = r.random()
    if roll < 0.4:
        return gpu
    if roll < 0.7:
        return gpu.upper()
    return "".join(c.upper() if r.random() < 0.5 else c.lower() for c in gpu)


def _entries(r: random.Random, count: int) -> list[tuple[int, str, list[GPU]]]:
    ordinals = r.sample(range(0, 40 if r.random() < 0.8 else MAX_ORDINAL + 1), count)
    free: dict[str, list[GPU]] = {}
    out = []
    for o in ordinals:
        node = r.choice(NODES)
        pool = free.setdefault(node, _pool(r, 16))
        if not pool:
            node = f"n{o}"
            pool = free.setdefault(node, _pool(r, 8))
        take = min(len(pool), r.randint(1, 4))
        gpus, free[node] = pool[:take], pool[take:]
        out.append((o, node, gpus))
    if r.random() < 0.1:  # a count entry: N GPUs of its node, named by none
        at = r.randrange(len(out))
        out[at] = (out[at][0], out[at][1], [count_token(r)])
    return out


def count_token(r: random.Random, largest: int = MAX_COUNT) -> str:
    """A count token in its normal form: ``auto(N)``."""
    return f"auto({r.randint(1, 4) if r.random() < 0.8 else r.randint(1, largest)})"


BAD_COUNTS = (
    "auto(0)",
    "auto(000)",
    "auto(33)",
    "auto(100)",
    "auto(99999999999999999999999)",
    "auto(x)",
    "auto()",
    "auto(-1)",
    "auto(1.5)",
    "auto(2",
    "auto2)",
    "auto",
    "autox(2)",
    "auto(2)x",
    "auto((2))",
    "Auto(2)",
    "AUTO(2)",
    "auto( 2)",
    "auto(2 )",
    "auto (2)",
)


def _share(r: random.Random, entries: list[tuple[int, str, list[GPU]]]) -> list[tuple[int, str, list[GPU]]]:
    """``entries`` and 1-3 more, each naming some or all of an existing entry's GPUs (shared:
    whole or partial overlaps; a GPU may get three sharers or more), anywhere in the text."""
    out = list(entries)
    used = {o for o, _, _ in entries}
    for _ in range(r.randint(1, 3)):
        _, node, gpus = r.choice(out)
        shared = r.sample(gpus, r.randint(1, len(gpus)))
        ordinal = r.randrange(0, 40 if r.random() < 0.8 else MAX_ORDINAL + 1)
        while ordinal in used:
            ordinal = r.randrange(0, MAX_ORDINAL + 1)
        used.add(ordinal)
        out.insert(r.randrange(len(out) + 1), (ordinal, node, shared))
    return out


def _render(r: random.Random, entries: list[tuple[int, str, list[GPU]]], exotic: bool) -> str:
    def sp() -> str:
        return _space(r, exotic)

    chunks = [
        f"{sp()}{_num(r, o)}{sp()}={sp()}{node}{sp()}:{sp()}"
        + ",".join(f"{sp()}{_spell(r, g)}{sp()}" for g in gpus)
        + sp()
        for o, node, gpus in entries
    ]
    lines: list[str] = []
    while chunks:
        take = 1 if r.random() < 0.7 else r.randint(1, 3)
        line = ";".join(chunks[:take]) + (";" if r.random() < 0.1 else "")
        chunks = chunks[take:]
        if r.random() < 0.2:
            line += sp() + r.choice(COMMENTS)
        lines.append(line)
        if r.random() < 0.1:
            lines.append(r.choice(("", sp(), r.choice(COMMENTS))))
    if r.random() < 0.2:
        lines.insert(0, r.choice(COMMENTS))
    newline = "\r\n" if r.random() < 0.15 else "\n"
    return newline.join(lines) + (newline if r.random() < 0.7 else "")


BAD_NAMES = (
    "GPU-12",
    "GPU-8a3c0d4e-1234-5678-9abc-def01234567",  # a group too short
    "GPU-8a3c0d4e-1234-5678-9abc-def0123456789",  # too long
    "GPU-8a3c0d4-e1234-5678-9abc-def012345678",  # groups of the wrong lengths
    "GPU-8a3c0d4g-1234-5678-9abc-def012345678",  # not hex
    "GPU8a3c0d4e-1234-5678-9abc-def012345678",
    "MIG-8a3c0d4e-1234-5678-9abc-def012345678",
    "8a3c0d4e-1234-5678-9abc-def012345678",
    "0000:3b:00.8",  # function 0-7
    "000:3b:00.0",
    "00000:3b:00.0",
    "000000000:3b:00.0",
    "0000:3b:0.0",
    "0000:3bb:00.0",
    "0000:3g:00.0",
    "0000:3b:00",
    "3b:00.0",
    "0000:3b:00.0.0",
    "0000:3b:00:0",
    "a.b",
    "x",
)


def _other_kind(r: random.Random, gpu: GPU) -> GPU:
    """A GPU named another way than ``gpu``."""
    if isinstance(gpu, int):
        return uuid(r) if r.random() < 0.5 else pci(r)
    return r.randrange(8) if r.random() < 0.5 else (pci(r) if gpu.startswith("GPU-") else uuid(r))


def _break(r: random.Random, entries: list[tuple[int, str, list[GPU]]], exotic: bool) -> str:
    """A rendering of ``entries`` with one mistake the parser refuses."""
    entries = [(o, n, list(g)) for o, n, g in entries]
    o, node, gpus = entries[0]
    kind = r.randrange(21)
    if kind >= 19:
        # A count that is not one, or a count listed with other GPUs (perhaps a second count).
        if kind == 19:
            entries[0] = (o, node, [r.choice(BAD_COUNTS)])  # type: ignore[list-item]
        else:
            other: list[GPU] = [count_token(r)] if r.random() < 0.3 else list(gpus)
            entries[0] = (o, node, [*other, count_token(r)] if r.random() < 0.5 else [count_token(r), *other])
        if r.random() < 0.5:
            r.shuffle(entries)
        return _render(r, entries, exotic)
    if kind >= 14:
        # The GPU names: a token that names none, a node named two ways, a name twice.
        if kind == 14:
            entries[0] = (o, node, [*gpus[:-1], r.choice(BAD_NAMES)])  # type: ignore[list-item]
        elif kind == 15:  # two ways in one entry
            entries[0] = (o, node, [*gpus, _other_kind(r, gpus[0])])
        elif kind == 16:  # two ways on one node
            entries.append((max(e[0] for e in entries) + 1, node, [_other_kind(r, gpus[0])]))
        elif kind == 17:  # one GPU twice in an entry (the same name, perhaps spelt otherwise)
            entries[0] = (o, node, [*gpus, gpus[0]])
        else:  # one GPU shared by two ordinals, and listed twice in the second (spelt otherwise)
            entries.append((max(e[0] for e in entries) + 1, node, [gpus[0], gpus[0]]))
        if r.random() < 0.5:
            r.shuffle(entries)
        return _render(r, entries, exotic)
    if kind == 0:  # a duplicate ordinal
        entries.append((o, "other-node", [0]))
    elif kind == 1:  # a GPU listed twice in one entry
        entries[0] = (o, node, [*gpus, gpus[0]])
    elif kind == 2:  # a duplicate ordinal that shares a GPU of the first entry
        entries.append((o, node, [gpus[-1]]))
    elif kind == 3:
        entries[0] = (r.choice((MAX_ORDINAL + 1, 10**7, 10**30, 2**63)), node, gpus)
    elif kind == 4:
        entries[0] = (o, node, [*gpus[:-1], r.choice((MAX_GPU_INDEX + 1, 2000, 10**30))])
        if not isinstance(gpus[0], int):  # an index past the limit is a problem of its own
            entries[0] = (o, f"{node}x", entries[0][2][-1:])
    elif kind == 5:
        entries[0] = (o, r.choice(BAD_NODES), gpus)
    text = _render(r, entries, exotic)
    if kind <= 5:
        return text
    line, rest = text.split("\n", 1) if "\n" in text else (text, "")
    if kind == 6:
        bad = f"{o}{r.choice(NON_ASCII_DIGITS)}={node}:{gpus[0]}"
    elif kind == 7:
        bad = f"{o}={node}:{r.choice(NON_ASCII_DIGITS)}"
    elif kind == 8:
        bad = r.choice((f"{o} {node}:{gpus[0]}", f"{node}:{gpus[0]}", "garbage"))
    elif kind == 9:
        bad = r.choice((f"{o}={node} {gpus[0]}", f"{o}={node}", f"{o}=:"))
    elif kind == 10:
        bad = r.choice(
            (f"{o}={node}:{gpus[0]},", f"{o}={node}:,{gpus[0]}", f"{o}={node}:", f"{o}=:{gpus[0]}")
        )
    elif kind == 11:
        bad = f"{o}={node}:{r.choice(NOT_SPACE)}{gpus[0]}"
    elif kind == 12:
        return r.choice(("", " ", "\n", "# only a comment\n", ";;\n", " ; \r\n# x=y:1\n"))
    else:
        bad = r.choice((f"x={node}:0", f"-1={node}:0", f"+1={node}:0", f"1.0={node}:0", f"{o}={node}:0x1"))
    where = r.randrange(3)
    if where == 0:
        return f"{bad}\n{text}"
    if where == 1:
        return f"{line};{bad}\n{rest}" if "#" not in line else f"{bad}\n{text}"
    return f"{text}{'' if text.endswith(chr(10)) or not text else chr(10)}{bad}\n"


ALPHABET = "0123456789=:,;#\n \t\r-.an"


def _soup(r: random.Random) -> str:
    return "".join(r.choice(ALPHABET) for _ in range(r.randint(0, 40)))


def corpus(seed: int, count: int) -> Iterator[str]:
    """``count`` map texts: about half valid, the rest near misses and random strings."""
    r = random.Random(seed)
    for _ in range(count):
        exotic = r.random() < 0.3
        entries = _entries(r, r.randint(1, 6) if r.random() < 0.8 else r.randint(7, 40))
        roll = r.random()
        if roll < 0.5:
            yield _render(r, _share(r, entries) if r.random() < 0.35 else entries, exotic)
        elif roll < 0.9:
            yield _break(r, entries, exotic)
        else:
            yield _soup(r)


def large_uuid(node: int, gpu: int) -> str:
    """The UUID :func:`large_map` gives GPU ``gpu`` of node ``node``."""
    return f"GPU-{node:08x}-0000-4000-8000-{gpu:012x}"


def large_map(size: int, *, comment: str = "", named: bool = False) -> str:
    """A valid map of at most ``size`` UTF-8 bytes and as close to it as lines allow:
    ``N=gpu-node-K.example.com:0,1,2,3`` lines, 4 GPUs per ordinal, 2 ordinals per node;
    ``comment`` (when given) ends every line. ``named``: every third node's GPUs are named
    by UUID (a map of mixed kinds: the policy's check that each node is named one way)."""
    lines: list[str] = []
    used = 0
    o = 0
    while True:
        node = o // 2
        gpus: list[GPU] = [(o % 2) * 4 + i for i in range(4)]
        if named and node % 3 == 0:
            gpus = [large_uuid(node, g) for g in gpus]
        line = f"{o}=gpu-node-{node}.example.com:{','.join(map(str, gpus))}{comment}\n"
        cost = len(line.encode())
        if used + cost > size:
            break
        lines.append(line)
        used += cost
        o += 1
    return "".join(lines)
