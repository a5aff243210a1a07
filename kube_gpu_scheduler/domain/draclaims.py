"""DRA mode: which ResourceClaims a replica's pod references, when its map shares GPUs.

A device is allocated to one claim only, so replicas that share a GPU (the map names the same
``NODE:GPU`` in several entries, :meth:`SchedulingMap.shared`) must share one claim for it. A
pod may reference several claims; each replica's GPUs are grouped by their *sharer set*
``S(g)``, the ordinals whose entries name that GPU on that node:

* the GPUs only this replica names stay in its own claim ``<pod>-gpus``, in map order, exactly
  as without sharing (a map that shares nothing gives every replica this one claim, so the
  claims of existing users do not change);
* each group of GPUs with the same ``S`` (two or more ordinals) is ONE claim that every replica
  of ``S`` references: ``<statefulset>-<min(S)>-shared-<g>``, ``g`` the group's smallest GPU
  (index order, else name order; ``:`` written ``-``, names lower case). ``min(S)`` fixes the
  node (every entry of ``S`` is on it) and each GPU belongs to exactly one group, so the name
  is unique in the StatefulSet; it is computed from the map alone, so the injection policy
  (CEL) computes it at the pod's admission as this module does. Its requests ask for the
  group's GPUs in that order, so every sharer makes the same claim.

A partial overlap works: ``0=n:4,5`` and ``1=n:5,6`` give replica 0 ``w-0-gpus`` {4} and
``w-0-shared-5`` {5}, replica 1 ``w-0-shared-5`` {5} and ``w-1-gpus`` {6}. A replica whose GPUs
are all shared has no claim of its own. In the pod, the own claim is ``gpu-scheduler`` (as
ever) and the shared ones ``gpu-scheduler-shared-<i>`` in the order of their smallest GPU in the
entry; every container lists them all.

One claim per connected component of the sharing (replicas 0 and 1 above in one claim, each
container naming the requests it uses) would need a transitive closure over the map, which
the admission policy cannot compute; grouping by ``S`` needs only the entries of one node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.schedmap import GPU, Entry, MapError, SchedulingMap, gpu_sort_key, parse

# The claim references in the pod: the own claim's (dra.POD_CLAIM) and the shared ones'.
OWN_REF = dra.POD_CLAIM
SHARED_REF = "gpu-scheduler-shared-"
SHARED_INFIX = "-shared-"
# On a shared claim, instead of the own claim's entry: its node and GPUs (``node4:3``).
SHARED_ANNOTATION = "gpu-scheduler.io/shared"
OWN_SUFFIX = dra.CLAIM_SUFFIX


def statefulset_name(pod_name: str) -> str:
    """``w`` for ``w-3``: the pod's name up to its last ``-`` (the whole name if it has none)."""
    at = pod_name.rfind("-")
    return pod_name[:at] if at > 0 else pod_name


def gpu_token(gpu: GPU) -> str:
    """A GPU as a claim's name writes it: ``3``, ``gpu-8a3c...``, ``0000-3b-00.0``."""
    return str(gpu).lower().replace(":", "-")


def shared_claim_name(statefulset: str, first: int, gpu: GPU) -> str:
    return f"{statefulset}-{first}{SHARED_INFIX}{gpu_token(gpu)}"


@dataclass(frozen=True)
class Part:
    """One claim a replica's pod references: ``ref`` in the pod, the claim ``name``, what it asks
    (``entry``: the node and GPUs; its ordinal the replica's, or ``min(S)`` for a shared claim)
    and ``sharers`` (the replica alone for its own claim)."""

    ref: str
    name: str
    entry: Entry
    sharers: tuple[int, ...]

    @property
    def shared(self) -> bool:
        return len(self.sharers) > 1

    @property
    def made_for(self) -> tuple[str, str]:
        """The annotation that says what the claim was made for, and its value."""
        if self.shared:
            return SHARED_ANNOTATION, f"{self.entry.node}:{self.entry.devices}"
        return "gpu-scheduler.io/entry", str(self.entry)


def _group(smap: SchedulingMap, node: str, sharers: tuple[int, ...]) -> list[GPU]:
    """The GPUs of node ``node`` that exactly ``sharers`` name, in claim order."""
    shared = smap.shared()
    first = smap[sharers[0]]
    return sorted((g for g in first.gpus if shared.get((node, g)) == sharers), key=gpu_sort_key)


def layout(smap: SchedulingMap, ordinal: int, pod_name: str) -> list[Part]:
    """The claims of replica ``ordinal`` (pod ``pod_name``): its own first (if it has GPUs of its
    own), then the shared ones in the order of their smallest GPU in its entry. [] without an entry."""
    entry = smap.get(ordinal)
    if entry is None:
        return []
    if entry.count:  # a count entry names no GPU, so it shares none: its own claim alone
        return [Part(OWN_REF, pod_name + OWN_SUFFIX, entry, (ordinal,))]
    shared = smap.shared()
    own = tuple(g for g in entry.gpus if (entry.node, g) not in shared)
    parts: list[Part] = []
    if own:
        parts.append(
            Part(OWN_REF, pod_name + OWN_SUFFIX, Entry(ordinal, entry.node, own, entry.line), (ordinal,))
        )
    sts, seen = statefulset_name(pod_name), set()
    for gpu in entry.gpus:
        sharers = shared.get((entry.node, gpu))
        if sharers is None or sharers in seen:
            continue
        seen.add(sharers)
        group = _group(smap, entry.node, sharers)
        parts.append(
            Part(
                f"{SHARED_REF}{len(parts) - (1 if own else 0)}",
                shared_claim_name(sts, sharers[0], group[0]),
                Entry(sharers[0], entry.node, tuple(group)),
                sharers,
            )
        )
    return parts


def shared_part(smap: SchedulingMap, statefulset: str, node: str, gpu: GPU) -> Part | None:
    """The shared claim that holds ``node:gpu`` in ``smap`` (None: no two entries name it)."""
    sharers = smap.shared().get((node, gpu))
    if sharers is None:
        return None
    group = _group(smap, node, sharers)
    return Part(
        "",
        shared_claim_name(statefulset, sharers[0], group[0]),
        Entry(sharers[0], node, tuple(group)),
        sharers,
    )


def claim_asks(claim: Mapping[str, Any]) -> Entry | None:
    """What a claim of gpu-scheduler's was made for: its entry (own claim; its ordinal the
    replica's) or its node and GPUs (shared claim; ordinal 0). None when it says neither."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    own, shared = annotations.get("gpu-scheduler.io/entry"), annotations.get(SHARED_ANNOTATION)
    text = own if isinstance(own, str) else f"0={shared}" if isinstance(shared, str) else None
    if text is None:
        return None
    try:
        return next(iter(parse(text).values()), None)
    except MapError:
        return None


def is_shared(claim: Mapping[str, Any]) -> bool:
    return SHARED_ANNOTATION in ((claim.get("metadata") or {}).get("annotations") or {})
