"""Reading pods and events from the local control plane's apiserver, as API-shaped dicts; making
and deleting the tests' namespaces (through the API client: a kubectl process costs about as
much as the request itself, many times over on a loaded machine)."""

from __future__ import annotations

import contextlib
import json
import time
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


def create_namespace(kube: Any, name: str, timeout: float = 60) -> None:
    """Create namespace ``name`` and wait for its ``default`` ServiceAccount (the controller-manager
    creates it shortly after the namespace; pods are refused until it exists)."""
    core = client.CoreV1Api(kube)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", name, _preload_content=False)
            return
        except client.ApiException as err:
            if api_error(err) is not ApiError.NOT_FOUND or time.monotonic() > deadline:
                raise AssertionError(f"no ServiceAccount {name}/default after {timeout:.0f}s: {err}") from err
        time.sleep(0.1)


def delete_namespace(kube: Any, name: str) -> None:
    """Delete namespace ``name`` without waiting for it to go; a failure is not the test's (as
    ``kubectl delete --wait=false`` with check=False was)."""
    with contextlib.suppress(client.ApiException):
        client.CoreV1Api(kube).delete_namespace(name, _preload_content=False)
