"""How the map names one GPU: an index, a UUID or a PCI bus ID, and their normal forms.

Part of the map's grammar (:mod:`kube_gpu_scheduler.domain.schedmap` re-exports every name
here; import them from there): a GPU token is an *index* (a non-negative decimal integer,
kept as an ``int``), a *UUID* (``GPU-`` then 8-4-4-4-12 hex digits, any case, kept as
``GPU-<lower-case hex>``) or a *PCI bus ID* (``DOMAIN:BUS:DEVICE.FUNCTION`` with a 4- or
8-hex-digit domain, kept lower case with a 4-digit domain).
"""

from __future__ import annotations

import re
from typing import Literal

DIGITS_RE = re.compile(r"[0-9]+")
_HEX = "[0-9a-fA-F]"
_UUID_RE = re.compile(rf"[Gg][Pp][Uu]-{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}")
_PCI_RE = re.compile(rf"({_HEX}{{4}}|{_HEX}{{8}}):({_HEX}{{2}}):({_HEX}{{2}})\.([0-7])")
_UUID_LEN = 40  # "GPU-" + 36
_PCI_MAX_LEN = 16  # "00000000:3b:00.0"
MAX_GPU_INDEX = 1023


# A GPU as the map names it: an index (int), a UUID or a PCI bus ID (normalized str).
GPU = int | str
GPUKind = Literal["index", "uuid", "pci"]
# How a message names each kind.
KIND_WORDS: dict[GPUKind, str] = {"index": "index", "uuid": "UUID", "pci": "PCI bus ID"}
BAD_GPU = "is not an index, a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) or a PCI bus ID (0000:3b:00.0)"


def gpu_kind(gpu: GPU) -> GPUKind:
    """``"index"`` for an int, ``"uuid"`` for ``GPU-...``, else ``"pci"`` (a parsed, normalized name)."""
    if isinstance(gpu, int):
        return "index"
    return "uuid" if gpu.startswith("GPU-") else "pci"


def gpu_name(token: str) -> str | None:
    """The normalized UUID or PCI bus ID ``token`` spells (no whitespace around), else None."""
    if len(token) == _UUID_LEN and _UUID_RE.fullmatch(token):
        return "GPU-" + token[4:].lower()
    if len(token) <= _PCI_MAX_LEN and (m := _PCI_RE.fullmatch(token)):
        domain = m.group(1).lower()
        if len(domain) == 8 and domain.startswith("0000"):
            domain = domain[4:]
        return f"{domain}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"
    return None


def parse_gpu(token: str) -> GPU | None:
    """One GPU token as the map reads it (whitespace around ignored), or None when it names none."""
    token = token.strip()
    if DIGITS_RE.fullmatch(token):
        digits = token.lstrip("0") or "0"
        if len(digits) > len(str(MAX_GPU_INDEX)) or int(digits) > MAX_GPU_INDEX:
            return None
        return int(digits)
    return gpu_name(token)


def gpu_sort_key(gpu: GPU) -> tuple[int, int, str]:
    """Sorts GPUs of any kinds together: indices (ascending) first, then names."""
    return (0, gpu, "") if isinstance(gpu, int) else (1, 0, gpu)
