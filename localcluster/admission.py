"""AdmissionReview requests as kube-apiserver sends them to the webhook.

One builder for every caller that talks to the webhook without an apiserver: the
unit and integration tests and ``tools/webhook_load.py``. ``admission_review(obj)``
wraps an object (a Pod by default; ``kind="StatefulSet"`` for ``/validate``);
``mapped_pod(name, map_text)`` is the smallest pod that carries a map.
"""

from __future__ import annotations

from typing import Any, Literal

from kube_gpu_scheduler.domain.schedmap import ANNOTATION

Kind = Literal["Pod", "StatefulSet"]
KINDS: dict[str, dict[str, str]] = {
    "Pod": {"group": "", "version": "v1", "kind": "Pod"},
    "StatefulSet": {"group": "apps", "version": "v1", "kind": "StatefulSet"},
}
RESOURCES: dict[str, dict[str, str]] = {
    "Pod": {"group": "", "version": "v1", "resource": "pods"},
    "StatefulSet": {"group": "apps", "version": "v1", "resource": "statefulsets"},
}

# The rule of a MutatingWebhookConfiguration that sends pod creations to the webhook
# (the chart's, as the host-process webhook of the tests and the bench registers it).
POD_CREATE_RULE: dict[str, Any] = {
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "operations": ["CREATE"],
    "resources": ["pods"],
    "scope": "Namespaced",
}


def admission_review(
    obj: dict[str, Any] | None,
    *,
    kind: Kind = "Pod",
    uid: str = "uid",
    operation: str = "CREATE",
    name: str | None = None,
    namespace: str = "team",
    resource: bool = False,
) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview of ``obj``; ``name`` defaults to the
    object's; ``resource=True`` adds ``request.resource`` (the apiserver always sends it)."""
    request: dict[str, Any] = {"uid": uid, "kind": dict(KINDS[kind])}
    if resource:
        request["resource"] = dict(RESOURCES[kind])
    request["operation"] = operation
    request["name"] = ((obj or {}).get("metadata") or {}).get("name", "") if name is None else name
    request["namespace"] = namespace
    request["object"] = obj
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def mapped_pod(
    name: str,
    map_text: str,
    *,
    scheduler: str = "gpu-scheduler",
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod named ``name`` carrying the map ``map_text``, for ``scheduler``, one container ``main``."""
    return {
        "metadata": {"name": name, "annotations": {ANNOTATION: map_text}},
        "spec": {"schedulerName": scheduler, "containers": containers or [{"name": "main"}]},
    }
