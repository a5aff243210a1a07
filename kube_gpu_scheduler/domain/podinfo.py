"""What a pod is, for the map: its ordinal and the entry that applies to it.

Works on plain dicts (an AdmissionReview's object, a watch event's raw object)
so the webhook, the scheduler and the check program share it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kube_gpu_scheduler.domain.mapcache import parse_cached
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, Entry, SchedulingMap

POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
# Where the scheduler records what it bound, for the ledger and for users.
ASSIGNMENT_ANNOTATION = "gpu-scheduler/assigned"
# ASCII digits only (no "٣"), anchored with \Z so a trailing newline is not accepted,
# and bounded so int() never sees a pathological string.
_TRAILING_ORDINAL = re.compile(r"-([0-9]{1,18})\Z")
_DIGITS = re.compile(r"[0-9]{1,18}")


def ordinal_of(name: str | None, labels: Mapping[str, str] | None) -> int | None:
    """Label ``apps.kubernetes.io/pod-index``, else the trailing ``-N`` of the name."""
    value = (labels or {}).get(POD_INDEX_LABEL)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    match = _TRAILING_ORDINAL.search(name or "")
    return int(match.group(1)) if match else None


def map_text(metadata: Mapping[str, Any] | None) -> str | None:
    annotations = (metadata or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION)
    return value if isinstance(value, str) else None


def pod_map(metadata: Mapping[str, Any] | None) -> SchedulingMap | None:
    """The pod's parsed map, ``None`` when it has no annotation; raises MapError when malformed.

    Every pod of a StatefulSet carries the same text: it is parsed once
    (:func:`kube_gpu_scheduler.domain.mapcache.parse_cached`).
    """
    text = map_text(metadata)
    return None if text is None else parse_cached(text)


def entry_for(metadata: Mapping[str, Any] | None, name: str | None = None) -> tuple[int | None, Entry | None]:
    """``(ordinal, entry)`` for a pod's metadata; entry is None when the map has no line for it.

    ``name`` overrides ``metadata.name`` (an admission request may carry the name
    only in ``request.name`` while ``generateName`` is being resolved).
    """
    smap = pod_map(metadata)
    meta = metadata or {}
    ordinal = ordinal_of(name or meta.get("name"), meta.get("labels"))
    if smap is None or ordinal is None:
        return ordinal, None
    return ordinal, smap.get(ordinal)
