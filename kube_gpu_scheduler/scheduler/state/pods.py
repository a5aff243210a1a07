"""What the scheduler reads of its own pods: pending or not, gated, what a retry depends on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kube_gpu_scheduler.domain.mapcache import shared_text
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL
from kube_gpu_scheduler.domain.schedmap import ANNOTATION

Obj = dict[str, Any]


def is_pending(pod: Mapping[str, Any]) -> bool:
    """Waiting for a node: not bound, not being deleted, not finished."""
    view = Pod(pod)
    return not view.node_name and not view.deleting and view.phase in (None, "Pending")


def share_map_text(pod: Obj) -> Obj:
    """What the cache keeps of one of our pods: all but managedFields, its map text shared with
    every other pod carrying the same map (``schedmap.shared_text``)."""
    meta = pod.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            text = annotations.get(ANNOTATION)
            if isinstance(text, str):
                annotations[ANNOTATION] = shared_text(text)
    return pod


def is_gated(pod: Mapping[str, Any]) -> bool:
    """``spec.schedulingGates`` is not empty: not to be scheduled yet (the apiserver refuses a Binding)."""
    return bool(Pod(pod).spec.get("schedulingGates"))


# Metadata the API server changes on every write (and ``generation``, on a change of the spec,
# compared itself, or a deletion): never read by a placement check.
_BOOKKEEPING = frozenset(("resourceVersion", "managedFields", "generation"))
# And what a deletion sets: a bound pod holds its GPUs and its room until it is gone.
_DELETION = _BOOKKEEPING | {"deletionTimestamp", "deletionGracePeriodSeconds"}
_MISSING = object()
# Phases after which a pod holds nothing (kube_gpu_scheduler.domain.holding.FINISHED_PHASES).
_FINISHED = frozenset(("Succeeded", "Failed"))


def quiet_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """From ``old`` to ``new`` nothing changed that the GPU ledger, the node's room, the gangs or
    the retry signature read, so the watch handler has nothing to record again:

    * only the status and the metadata's bookkeeping: the kubelet (or kwok) reporting containers
      started or ready, a condition written;
    * a bound pod's phase between Pending and Running (its spec, equal, names its node: it is
      never pending either way), not into or out of a finished one (the GPUs freed);
    * a bound pod's deletion starting (``deletionTimestamp``): it holds its GPUs and its room
      until it is gone. A pending pod's is recorded: it is no longer waiting.

    Two of a placed pod's three updates are quiet (its first status, its deletion); its Binding
    is not."""
    o, n = Pod(old), Pod(new)
    if o.spec != n.spec:
        return False
    bound = n.node_name is not None
    if o.phase != n.phase and (not bound or o.phase in _FINISHED or n.phase in _FINISHED):
        return False
    om, nm = o.meta, n.meta
    allowed = _DELETION if bound else _BOOKKEEPING
    if any(k not in allowed and nm.get(k, _MISSING) != v for k, v in om.items()):
        return False
    return all(k in om or k in allowed for k in nm)


def pod_signature(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the checks read from a pod: a change makes a waiting pod try again at once."""
    view = Pod(pod)
    return (
        view.meta.get("uid"),
        view.annotations.get(ANNOTATION),
        view.labels.get(POD_INDEX_LABEL),
        json.dumps(view.spec.get("tolerations") or [], sort_keys=True),
        len(view.spec.get("schedulingGates") or []),
    )


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's controller ownerReference (StatefulSet, Job, ...), or None for a bare pod."""
    return Pod(pod).owner


def recreate_slot(pod: Mapping[str, Any], ordinal: int | None) -> str | None:
    """The key of a replica across its recreations: namespace, controller UID, ordinal.

    The namespace is part of it because an ownerReference is the pod owner's claim: a
    tenant naming another namespace's controller UID only ever shares its own backoff.
    """
    owner = controller_of(pod)
    if owner is None:
        return None
    return f"{Pod(pod).namespace}/{owner['uid']}/{ordinal}"
