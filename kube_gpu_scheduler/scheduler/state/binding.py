"""The scheduler's writes to a pod: bind, the PodScheduled condition, and recreate.

A placement is ONE write: the Binding subresource (with the pod's UID as a
precondition). Nothing is written on the pod before it: what a bound pod holds
is read back from its own immutable fields (``spec.nodeName`` and the GPU
variables in its containers, see ``kube_gpu_scheduler/scheduler/state/ledger.py``), so a scheduler that
dies at any point leaves nothing half-done and nothing a tenant can forge.
``409`` because the pod is already bound counts as success when it is bound to
the mapped node.

``recreate`` deletes a pending pod (UID precondition) that was admitted
without the webhook's GPU variables, so that its controller creates it again
through the webhook.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules import POD_UNSCHEDULABLE
from kube_gpu_scheduler.kube.errors import ApiError, api_error
from kube_gpu_scheduler.kube.jsonio import discard, read_json, send_json
from kube_gpu_scheduler.kube.timefmt import rfc3339

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
TIMEOUT = (5, 30)


# Condition messages are shown by `kubectl describe`; keep them as short as an Event's note.
MESSAGE_LIMIT = 1024


def truncate_message(message: str, limit: int = MESSAGE_LIMIT) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


class BindOutcome(enum.Enum):
    BOUND = "bound"  # our Binding was accepted
    ALREADY = "already"  # it was bound before, to the mapped node
    ELSEWHERE = "elsewhere"  # it is bound to another node: nothing to do but say so
    GONE = "gone"  # the pod was deleted or replaced (another UID)


@dataclass(frozen=True)
class BindResult:
    outcome: BindOutcome
    node: str | None = None


def _named(pod: Mapping[str, Any]) -> tuple[Pod, str, str]:
    view = Pod(pod)
    if not view.name or not view.namespace:
        raise ValueError(f"pod {view.key} has no name or namespace")
    return view, view.name, view.namespace


class PodWriter:
    def __init__(self, core: client.CoreV1Api, field_manager: str) -> None:
        self._core = core
        self._apps = client.AppsV1Api(core.api_client)
        self._field_manager = field_manager

    @staticmethod
    def _raw(call: Any, *args: Any, **kwargs: Any) -> Any:
        """An API call whose answer we read ourselves (``_preload_content=False``), with our timeout.

        The client cannot deserialise some answers (the Binding it gets back: a
        long-standing client bug), and reading raw JSON is cheaper anyway.
        """
        return call(*args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)

    def recreate(self, pod: Mapping[str, Any]) -> bool:
        """Delete the pod (only this UID); False when it was already gone or replaced."""
        view, name, namespace = _named(pod)
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=view.uid or None))
        try:
            resp = self._raw(self._core.delete_namespaced_pod, name, namespace, body=body)
        except ApiException as err:
            if api_error(err) in (ApiError.NOT_FOUND, ApiError.CONFLICT):  # gone, or another pod of that name
                return False
            raise
        discard(resp)
        return True

    def bind(self, pod: Mapping[str, Any], node: str) -> BindResult:
        view, name, namespace = _named(pod)
        metadata: dict[str, Any] = {"name": name}
        if view.uid:
            metadata["uid"] = view.uid  # a precondition: never bind a newer pod of the same name
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            send_json(
                self._core.api_client,
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                body,
                TIMEOUT,
                query=[("fieldManager", self._field_manager)],
            )
            return BindResult(BindOutcome.BOUND, node)
        except ApiException as err:
            kind = api_error(err)
            if kind is ApiError.NOT_FOUND:
                return BindResult(BindOutcome.GONE)
            if kind is not ApiError.CONFLICT:
                raise
        # 409: already bound, or the UID precondition failed. Look at the pod once.
        try:
            current = read_json(self._raw(self._core.read_namespaced_pod, name, namespace))
        except ApiException as err:
            if api_error(err) is ApiError.NOT_FOUND:
                return BindResult(BindOutcome.GONE)
            raise
        now = Pod(current)
        if now.uid != view.uid:
            return BindResult(BindOutcome.GONE)
        bound_to = now.node_name
        if bound_to == node:
            return BindResult(BindOutcome.ALREADY, node)
        if bound_to:
            return BindResult(BindOutcome.ELSEWHERE, bound_to)
        raise RuntimeError(f"binding refused with 409 but the pod is not bound: {json.dumps(current)[:200]}")

    def evict(self, pod: Mapping[str, Any]) -> None:
        """The Eviction API (policy/v1) for this UID: PodDisruptionBudgets are honoured (429)."""
        view, name, namespace = _named(pod)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": view.uid}} if view.uid else {},
        }
        send_json(
            self._core.api_client,
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            body,
            TIMEOUT,
        )

    def read_statefulset(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The StatefulSet as the API has it now, or None when it is gone."""
        try:
            resp = self._raw(self._apps.read_namespaced_stateful_set, name, namespace)
        except ApiException as err:
            if api_error(err) is ApiError.NOT_FOUND:
                return None
            raise
        found = read_json(resp)
        return found if isinstance(found, dict) else None

    def set_unschedulable(self, pod: Mapping[str, Any], message: str) -> None:
        """PodScheduled=False, reason Unschedulable, as kube-scheduler reports it."""
        _, name, namespace = _named(pod)
        body = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": POD_UNSCHEDULABLE,
                        "message": truncate_message(message),
                        "lastTransitionTime": rfc3339(),
                        "lastProbeTime": None,
                    }
                ]
            }
        }
        resp = self._raw(
            self._core.patch_namespaced_pod_status,
            name,
            namespace,
            body,
            field_manager=self._field_manager,
            _content_type=STRATEGIC_PATCH,
        )
        discard(resp)
