"""Read-only typed views of the API objects the code reads: pods, nodes, any object's metadata.

The scheduler's watch caches, an AdmissionReview's object and the check's API
reads all hold plain dicts in the API's shape (camelCase keys). These views
answer the few questions the code asks of them, with the defaults written once
(a missing ``metadata`` is empty, a missing label map is ``{}``), so no caller
digs through ``get("metadata") or {}`` itself. A view wraps the dict and never
copies or changes it: ``Pod(d).raw is d``. kopf's ``bodies.py`` is the model.

Only the shape is handled here; what a value *means* (a map entry, a GPU
count, a placement rule) is decided elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_EMPTY: Mapping[str, Any] = {}


def _mapping(value: Any) -> Mapping[str, Any]:
    # A dict first: what every cache holds, and far cheaper than the ABC's isinstance (the
    # scheduler asks ~100 of these per pod placed).
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY


def _str_map(value: Any) -> Mapping[str, str]:
    return value if type(value) is dict or isinstance(value, Mapping) else {}


class Meta:
    """An object's ``metadata``: identity, labels, annotations, owners."""

    __slots__ = ("raw",)

    def __init__(self, obj: Mapping[str, Any] | None) -> None:
        self.raw: Mapping[str, Any] = obj if obj is not None else _EMPTY

    @property
    def meta(self) -> Mapping[str, Any]:
        return _mapping(self.raw.get("metadata"))

    @property
    def spec(self) -> Mapping[str, Any]:
        return _mapping(self.raw.get("spec"))

    @property
    def status(self) -> Mapping[str, Any]:
        return _mapping(self.raw.get("status"))

    @property
    def name(self) -> str | None:
        name = self.meta.get("name")
        return name if isinstance(name, str) else None

    @property
    def namespace(self) -> str | None:
        ns = self.meta.get("namespace")
        return ns if isinstance(ns, str) else None

    @property
    def uid(self) -> str:
        """The UID, ``""`` when the object has none (yet)."""
        return str(self.meta.get("uid") or "")

    @property
    def resource_version(self) -> str | None:
        rv = self.meta.get("resourceVersion")
        return str(rv) if rv else None

    @property
    def key(self) -> str:
        """``namespace/name`` for a namespaced object, ``name`` for a cluster-scoped one."""
        ns = self.namespace
        return f"{ns}/{self.name}" if ns else str(self.name)

    @property
    def labels(self) -> Mapping[str, str]:
        return _str_map(self.meta.get("labels"))

    @property
    def annotations(self) -> Mapping[str, str]:
        return _str_map(self.meta.get("annotations"))

    @property
    def deleting(self) -> bool:
        """``metadata.deletionTimestamp`` is set: the object is being deleted."""
        return bool(self.meta.get("deletionTimestamp"))

    @property
    def owner_references(self) -> Sequence[Mapping[str, Any]]:
        refs = self.meta.get("ownerReferences") or []
        return [r for r in refs if isinstance(r, Mapping)]

    @property
    def owner(self) -> Mapping[str, Any] | None:
        """The controller ownerReference (StatefulSet, Job, ...) with a UID, or None for a bare object."""
        for ref in self.owner_references:
            if ref.get("controller") and ref.get("uid"):
                return ref
        return None

    def owner_of_kind(self, kind: str) -> str | None:
        """Name of the controller of ``kind`` (``"StatefulSet"``) that owns the object, if one does."""
        for ref in self.owner_references:
            if ref.get("kind") == kind and ref.get("controller"):
                return str(ref.get("name"))
        return None


class Pod(Meta):
    """A pod as the API returns it (``spec``, ``status``)."""

    __slots__ = ()

    @property
    def key(self) -> str:
        """``namespace/name``, always with the namespace (``None/name`` when it has none)."""
        meta = self.meta
        ns, name = meta.get("namespace"), meta.get("name")
        return f"{ns if isinstance(ns, str) else None}/{name if isinstance(name, str) else None}"

    @property
    def node_name(self) -> str | None:
        """``spec.nodeName``: the node the pod is bound to, None while pending."""
        node = self.spec.get("nodeName")
        return node if isinstance(node, str) and node else None

    @property
    def phase(self) -> str | None:
        phase = self.status.get("phase")
        return phase if isinstance(phase, str) and phase else None

    @property
    def scheduler_name(self) -> str | None:
        name = self.spec.get("schedulerName")
        return name if isinstance(name, str) else None

    @property
    def containers(self) -> Sequence[Mapping[str, Any]]:
        return [c for c in self.spec.get("containers") or [] if isinstance(c, Mapping)]

    @property
    def init_containers(self) -> Sequence[Mapping[str, Any]]:
        return [c for c in self.spec.get("initContainers") or [] if isinstance(c, Mapping)]

    @property
    def tolerations(self) -> Sequence[Mapping[str, Any]]:
        return [t for t in self.spec.get("tolerations") or [] if isinstance(t, Mapping)]


class Node(Meta):
    """A node as the API returns it."""

    __slots__ = ()

    @property
    def unschedulable(self) -> bool:
        """``spec.unschedulable``: the node is cordoned."""
        return bool(self.spec.get("unschedulable"))

    @property
    def taints(self) -> Sequence[Mapping[str, Any]]:
        return [t for t in self.spec.get("taints") or [] if isinstance(t, Mapping)]

    @property
    def ready_condition(self) -> Mapping[str, Any] | None:
        for cond in self.status.get("conditions") or []:
            if isinstance(cond, Mapping) and cond.get("type") == "Ready":
                return cond
        return None

    @property
    def ready(self) -> bool:
        """The Ready condition is ``True``."""
        cond = self.ready_condition
        return cond is not None and cond.get("status") == "True"

    @property
    def allocatable(self) -> Mapping[str, Any]:
        return _mapping(self.status.get("allocatable"))

    @property
    def capacity(self) -> Mapping[str, Any]:
        return _mapping(self.status.get("capacity"))
