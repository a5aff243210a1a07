"""Reading pods and events from the local control plane's apiserver, as API-shaped dicts."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from kube_gpu_scheduler.kube.errors import ApiError, api_error


def read_pod(kube: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as the apiserver returns it (camelCase keys), None when it does not exist."""
    try:
        resp = client.CoreV1Api(kube).read_namespaced_pod(name, namespace, _preload_content=False)
    except client.ApiException as err:
        if api_error(err) is ApiError.NOT_FOUND:
            return None
        raise
    return dict(json.loads(resp.data))


def pod_events(kube: Any, namespace: str, pod: str, reason: str | None = None) -> list[dict[str, Any]]:
    """core/v1 Events about ``pod`` (optionally of one ``reason``)."""
    selector = f"involvedObject.name={pod}" + (f",reason={reason}" if reason else "")
    resp = client.CoreV1Api(kube).list_namespaced_event(
        namespace, field_selector=selector, _preload_content=False
    )
    return list(json.loads(resp.data)["items"])


def failed_scheduling(kube: Any, namespace: str, pod: str, *words: str) -> dict[str, Any] | None:
    """The pod's first FailedScheduling Event whose message contains every one of ``words``."""
    for ev in pod_events(kube, namespace, pod, "FailedScheduling"):
        if all(w in (ev.get("message") or "") for w in words):
            return ev
    return None


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A metav1.Status as kube-apiserver writes it: an error's body, a watch ERROR event's object."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body
