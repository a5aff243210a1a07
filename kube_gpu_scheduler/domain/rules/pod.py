"""The pod itself: it carries a map that parses, has an ordinal the map names, and was injected.

What the scheduler reads from the pod before looking at any node; the webhook
asks the same of a Pod it admits, the CLI of a Pod it lints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube_gpu_scheduler.domain.injection import injection_state
from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL, entry_for
from kube_gpu_scheduler.domain.rules.framework import NEVER, ON_POD, REFUSE, WARN, Finding, emits, rule
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, Entry, MapError

NO_MAP = rule(
    "NoSchedulingMap",
    "HasMap",
    f"the pod carries the {ANNOTATION} annotation",
    {ON_POD},
    "the webhook and the CLI only look at objects that carry a map",
    scheduler=REFUSE,
)
INVALID_MAP = rule(
    "InvalidSchedulingMap",
    "MapParses",
    "the map parses (kube_gpu_scheduler.domain.schedmap, the one grammar)",
    {ON_POD},
    scheduler=REFUSE,
    mutate=REFUSE,
    validate=REFUSE,
    lint=REFUSE,
)
NO_ORDINAL = rule(
    "NoOrdinal",
    "HasOrdinal",
    f"the pod's ordinal is known: label {POD_INDEX_LABEL}, else a trailing -N in its name",
    {ON_POD},
    "a StatefulSet's pods always have one",
    scheduler=REFUSE,
    mutate=WARN,
    lint=WARN,
)
ORDINAL_NOT_MAPPED = rule(
    "OrdinalNotInMap",
    "OrdinalInMap",
    "the map has an entry for the pod's ordinal (for a StatefulSet: for every replica)",
    {ON_POD},
    scheduler=REFUSE,
    mutate=WARN,
    validate=WARN,
    lint=WARN,
)
NOT_INJECTED = rule(
    "NotInjected",
    "Injected",
    "every container carries the webhook's GPU variables for the entry",
    NEVER,
    "the webhook is what injects them",
    scheduler=REFUSE,
)


@emits(INVALID_MAP)
def invalid_map(err: MapError, where: str = "") -> Finding:
    """InvalidSchedulingMap: the map does not parse; ``where`` names the field for a template."""
    return Finding(INVALID_MAP, f"invalid {ANNOTATION} annotation{f' in {where}' if where else ''}: {err}")


@emits(NO_MAP, NO_ORDINAL, ORDINAL_NOT_MAPPED)
def unmapped(meta: Mapping[str, Any], ordinal: int | None) -> Finding:
    """Why a pod whose map parses has no entry: no map, no ordinal, or no entry for its ordinal."""
    if (meta.get("annotations") or {}).get(ANNOTATION) is None:
        return Finding(NO_MAP, f"the pod has no {ANNOTATION} annotation")
    if ordinal is None:
        return Finding(
            NO_ORDINAL,
            f"cannot tell the replica ordinal: no {POD_INDEX_LABEL} label and the name "
            f"{meta.get('name')!r} does not end in -N",
        )
    return Finding(ORDINAL_NOT_MAPPED, f"annotation {ANNOTATION} has no entry for replica {ordinal}")


def pod_entry(pod: Mapping[str, Any]) -> tuple[int | None, Entry | None, Finding | None]:
    """The pod's ordinal and map entry, or why there is none (the ordinal is None when the map does not parse)."""
    meta = pod.get("metadata") or {}
    try:
        ordinal, entry = entry_for(meta)
    except MapError as err:
        return None, None, invalid_map(err)
    return ordinal, entry, None if entry is not None else unmapped(meta, ordinal)


@emits(NOT_INJECTED)
def check_injected(pod: Mapping[str, Any], entry: Entry) -> list[Finding]:
    """Every container carries the webhook's GPU variables for ``entry``.

    Read from the container spec, which nobody can change after creation: a pod
    admitted while the webhook was down (failurePolicy Ignore) or timed out never
    gets them, whatever its annotations say.
    """
    state = injection_state(pod.get("spec"), entry)
    if state.ok:
        return []
    shown = ", ".join(repr(n[:63]) for n in state.missing[:5]) + (", ..." if len(state.missing) > 5 else "")
    return [
        Finding(
            NOT_INJECTED,
            f"the pod was admitted without the webhook's GPU variables for replica {entry.ordinal} "
            f"({entry.node}:{entry.devices}): container {shown} has {state.found}; the webhook was "
            "unreachable or timed out when the pod was created (in injection policy mode: the pod "
            "was created before the policy existed, or without the apps.kubernetes.io/pod-index label)",
        )
    ]
