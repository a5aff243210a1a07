"""DRA mode's writes, on the scheduler's one API client (beside
:class:`kube_gpu_scheduler.scheduler.state.binding.PodWriter`, which evicts).

* create a replica's ResourceClaim;
* remove the pod's scheduling gate ``gpu-scheduler.io/claim``: a JSON patch whose ``test``
  op checks that the gate is still where it was read (the ``<release>-pods`` policy lets the
  scheduler's account make exactly this change);
* write ``status.reservedFor`` (the StatefulSet's pin, added or removed): a PUT of the
  status carrying the claim's resourceVersion, so a claim changed meanwhile is a conflict;
* delete a claim, with its UID as a precondition.

Each write answers True when it was done, False when the object changed or went under us
(the watch brings the news and the caller looks again); other failures raise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.objects import Meta
from kube_gpu_scheduler.kube.errors import ApiError, api_error
from kube_gpu_scheduler.kube.jsonio import send_json
from kube_gpu_scheduler.scheduler.state.binding import TIMEOUT

JSON_PATCH = "application/json-patch+json"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


class ClaimWriter:
    def __init__(self, api_client: Any, field_manager: str) -> None:
        self._api = api_client
        self._field_manager = field_manager

    def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        stale: tuple[ApiError, ...],
        *,
        managed: bool = True,
        content_type: str = "application/json",
    ) -> bool:
        """One write: True when done, False for an answer in ``stale`` (changed or gone under us);
        raise anything else. ``managed``: as this field manager."""
        query = [("fieldManager", self._field_manager)] if managed else []
        try:
            send_json(self._api, method, path, body, TIMEOUT, query=query, content_type=content_type)
        except ApiException as err:
            if api_error(err) in stale:
                return False
            raise
        return True

    def create(self, body: Mapping[str, Any]) -> bool:
        """POST the claim; False when one of that name exists already (our watch is behind)."""
        meta = Meta(body)
        return self._send("POST", CLAIMS.format(namespace=meta.namespace), body, (ApiError.CONFLICT,))

    def open_gate(self, pod: Mapping[str, Any]) -> bool:
        """Remove the pod's gate (a JSON patch that tests the gate is where it was)."""
        meta = Meta(pod)
        gates = meta.spec.get("schedulingGates") or []
        at = next(i for i, g in enumerate(gates) if g.get("name") == dra.GATE)
        patch = [
            {"op": "test", "path": f"/spec/schedulingGates/{at}/name", "value": dra.GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{at}"},
        ]
        return self._send(
            "PATCH",
            f"/api/v1/namespaces/{meta.namespace}/pods/{meta.name}",
            patch,
            (ApiError.CONFLICT, ApiError.NOT_FOUND, ApiError.INVALID),
            managed=False,
            content_type=JSON_PATCH,
        )

    def put_reserved(self, claim: Mapping[str, Any], reserved: Sequence[Mapping[str, Any]]) -> bool:
        """Write the claim's ``status.reservedFor`` (as read, at its resourceVersion)."""
        meta = Meta(claim)
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": meta.name,
                "namespace": meta.namespace,
                "resourceVersion": meta.resource_version,
                "uid": meta.uid,
            },
            "spec": claim.get("spec"),
            "status": {**meta.status, "reservedFor": list(reserved) or None},
        }
        return self._send(
            "PUT",
            f"{CLAIMS.format(namespace=meta.namespace)}/{meta.name}/status",
            body,
            (ApiError.CONFLICT, ApiError.NOT_FOUND),
        )

    def delete(self, claim: Mapping[str, Any]) -> bool:
        """Delete the claim, this UID only."""
        meta = Meta(claim)
        return self._send(
            "DELETE",
            f"{CLAIMS.format(namespace=meta.namespace)}/{meta.name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": meta.uid}},
            (ApiError.CONFLICT, ApiError.NOT_FOUND),
            managed=False,
        )

    def publish_topology(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Server-side apply of the topology ConfigMap's ``data`` (this manager owns it all: a
        node left out loses its key)."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": dict(data),
        }
        path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
        send_json(
            self._api,
            "PATCH",
            path,
            body,
            TIMEOUT,
            query=[("fieldManager", self._field_manager), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )
