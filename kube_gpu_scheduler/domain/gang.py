"""Gang placement: every replica of a map revision, or none.

A StatefulSet opts in with the pod-template annotation ``gpu-scheduler.io/gang: "true"``.
Its *gang* is one map revision: the pods of one StatefulSet (namespace and controller UID)
that carry the same ``gpu-scheduling-map`` text. The scheduler binds no member until every
replica of the StatefulSet can be placed (``spec.replicas`` ordinals from
``spec.ordinals.start``), then reserves every pending member's GPUs in one step and binds
them all; ``gpu-scheduler-map plan`` decides the same way.

Pure: which gang a pod belongs to, the replica pods a StatefulSet makes (for an ordinal whose
pod is not there to ask), and the words of a gang's wait. The rules themselves are
:func:`kube_gpu_scheduler.domain.rules.evaluate`'s.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.domain.objects import Meta, Pod
from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL, map_text
from kube_gpu_scheduler.domain.rules.catalogue import GANG_WAITING
from kube_gpu_scheduler.domain.rules.framework import Finding
from kube_gpu_scheduler.domain.schedmap import Entry

GANG_ANNOTATION = "gpu-scheduler.io/gang"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
ORDERED_READY = "OrderedReady"
# The blocked entries a note lists by name; the rest are counted (a note has a bounded size).
NOTE_ENTRIES = 5


def is_gang(obj: Mapping[str, Any] | None) -> bool:
    """The object (a pod, or a StatefulSet's pod template) asks for gang placement."""
    return Meta(obj).annotations.get(GANG_ANNOTATION) == "true"


# The UID prefix of a replica not created yet whose GPUs the scheduler holds for its gang.
PHANTOM = "gang:"


@dataclass(frozen=True)
class GangKey:
    """One map revision of one StatefulSet: the gang a pod belongs to."""

    namespace: str
    owner_uid: str
    owner_name: str
    text: str  # the map's text: pods with the same text are the same revision

    @property
    def revision(self) -> str:
        """A short name for the map revision (the first 10 hex digits of its SHA-256)."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:10]

    @property
    def workload(self) -> str:
        return f"{self.namespace}/{self.owner_name}"

    def __str__(self) -> str:
        return f"StatefulSet {self.workload} (map revision {self.revision})"


def gang_of(pod: Mapping[str, Any]) -> GangKey | None:
    """The gang of a pod that asks for one and is a StatefulSet's replica carrying a map."""
    if not is_gang(pod):
        return None
    view = Pod(pod)
    owner = view.owner
    text = map_text(view.meta)
    if owner is None or owner.get("kind") != "StatefulSet" or text is None:
        return None
    return GangKey(view.namespace or "", str(owner.get("uid")), str(owner.get("name")), text)


def replica_ordinals(statefulset: Mapping[str, Any]) -> range:
    """The ordinals a StatefulSet's replicas have: ``spec.ordinals.start`` on, ``spec.replicas`` of them."""
    spec = Meta(statefulset).spec
    start = (spec.get("ordinals") or {}).get("start") or 0
    replicas = spec.get("replicas")
    count = replicas if isinstance(replicas, int) else 1
    first = start if isinstance(start, int) else 0
    return range(first, first + max(0, count))


def replica_pod(statefulset: Mapping[str, Any], ordinal: int, uid: str = "") -> dict[str, Any]:
    """The pod the StatefulSet controller would make for ``ordinal``, as far as the rules read it:
    its name, the pod-index label, the template's labels, annotations and spec, the owner."""
    sts = Meta(statefulset)
    template = sts.spec.get("template") or {}
    tmeta = template.get("metadata") or {}
    name = f"{sts.name}-{ordinal}"
    labels = {**(tmeta.get("labels") or {}), POD_INDEX_LABEL: str(ordinal), POD_NAME_LABEL: name}
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts.name, "controller": True}
    owner["uid"] = sts.uid or f"planned:{sts.namespace}/{sts.name}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": sts.namespace,
            "uid": uid,
            "labels": labels,
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [owner],
        },
        "spec": copy.deepcopy(template.get("spec") or {}),
        "status": {"phase": "Pending"},
    }


def sibling_pod(pod: Mapping[str, Any], ordinal: int) -> dict[str, Any]:
    """A gang member's pod as it would be for ``ordinal``: the same template (every replica of a
    revision has one), its own name and index. For an ordinal whose pod is not there to ask."""
    view = Pod(pod)
    meta = dict(view.meta)
    name = view.name or ""
    stem = name.rsplit("-", 1)[0] if "-" in name else name
    meta["name"] = f"{stem}-{ordinal}"
    meta["uid"] = ""
    meta["labels"] = {**view.labels, POD_INDEX_LABEL: str(ordinal), POD_NAME_LABEL: f"{stem}-{ordinal}"}
    return {"metadata": meta, "spec": {k: v for k, v in view.spec.items() if k != "nodeName"}}


@dataclass(frozen=True)
class Blocked:
    """Why one replica of a gang cannot be placed now."""

    ordinal: int
    entry: Entry | None
    reason: str  # a rule's reason, or "" for a replica whose pod does not exist yet
    message: str

    def __str__(self) -> str:
        where = f" ({self.entry.ordinal}={self.entry.node}:{self.entry.devices})" if self.entry else ""
        said = f"{self.reason}: {self.message}" if self.reason else self.message
        return f"replica {self.ordinal}{where}: {said}"


def missing(ordinal: int, name: str, policy: str | None) -> Blocked:
    """A replica whose pod the StatefulSet controller has not created (yet)."""
    why = f"pod {name} does not exist yet"
    if policy == ORDERED_READY:
        why += (
            f": podManagementPolicy is {ORDERED_READY}, so the StatefulSet controller creates it only "
            "once the replica before it runs and is Ready, and a gang binds none before all exist. "
            "Gang placement needs podManagementPolicy: Parallel (immutable: recreate the "
            "StatefulSet), or remove the gpu-scheduler.io/gang annotation"
        )
    return Blocked(ordinal, None, "", why)


def gang_note(gang: GangKey, size: int, blocked: Iterable[Blocked]) -> str:
    """The note on every waiting member (after its reason, ``GangWaiting: ``): the gang, and each
    blocked replica with its reason."""
    listed = sorted(blocked, key=lambda b: b.ordinal)
    shown = "; ".join(str(b) for b in listed[:NOTE_ENTRIES])
    more = f"; and {len(listed) - NOTE_ENTRIES} more" if len(listed) > NOTE_ENTRIES else ""
    return (
        f"gang {gang} binds none of its {size} replicas until every one can be placed; "
        f"{len(listed)} cannot: {shown}{more}"
    )


def gang_finding(gang: GangKey, size: int, blocked: Iterable[Blocked]) -> Finding:
    """The gang's wait as the first refusal of a member's decision (its Event, condition, metric)."""
    return Finding(GANG_WAITING, gang_note(gang, size, blocked))
