"""Reading a pod spec (a Pod's, or a StatefulSet's template) the way both handlers need it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from kube_gpu_scheduler.domain.resources import GPU_RESOURCE, requests_gpu
from kube_gpu_scheduler.domain.rules import (
    GPU_RESOURCE_REQUESTED,
    Finding,
    gpu_resource_denial,
    gpu_resource_requested,
)
from kube_gpu_scheduler.webhook.review import BadRequest, Verdict, dict_at, list_at

# Init containers first: the order in which the kubelet runs them, and the order of the patch.
CONTAINER_LISTS = ("initContainers", "containers")
# Kubernetes truncates admission warnings longer than this.
MAX_WARNING = 256


def containers(spec: dict[str, Any], where: str, uid: str) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """``(list name, index, container)`` for every init container and container."""
    for list_name in CONTAINER_LISTS:
        items = list_at(spec, list_name, f"{where}.{list_name}", uid) or []
        for index, container in enumerate(items):
            if not isinstance(container, dict):
                raise BadRequest(
                    f"{where}.{list_name}[{index}] must be an object, got {type(container).__name__}", uid=uid
                )
            yield list_name, index, container


def gpu_requesters(spec: dict[str, Any], where: str, uid: str) -> list[str]:
    """Names of the containers that request or limit the GPU resource (a non-zero amount).

    :func:`kube_gpu_scheduler.domain.resources.requests_gpu` decides; this adds the 400 on a malformed shape.
    """
    names: list[str] = []
    for list_name, index, container in containers(spec, where, uid):
        resources = dict_at(container, "resources", f"{where}.{list_name}[{index}].resources", uid)
        for part in ("requests", "limits"):  # malformed parts are a 400 naming the path
            dict_at(resources, part, f"{where}.{list_name}[{index}].resources.{part}", uid)
        if requests_gpu(resources):
            name = container.get("name")
            names.append(name if isinstance(name, str) and name else f"{list_name}[{index}]")
    return names


def gpu_resource_policy(
    spec: dict[str, Any],
    where: str,
    uid: str,
    policy: str,
    subject: str,
    log: logging.Logger,
    ctx: dict[str, Any],
) -> tuple[Verdict | None, list[Finding]]:
    """The GPUResourceRequested rule under WEBHOOK_GPU_RESOURCE_POLICY for a pod spec at ``where``:
    ``(denial, [])``, ``(None, [finding])``, or ``(None, [])`` when no container asks the device
    plugin for GPUs."""
    requesters = gpu_requesters(spec, where, uid)
    if not requesters:
        return None, []
    if policy == "deny":
        log.info(
            f"denied: {subject} requests {GPU_RESOURCE}",
            extra={**ctx, "containers": requesters, "reasons": [GPU_RESOURCE_REQUESTED]},
        )
        return Verdict.deny(403, gpu_resource_denial(requesters)), []
    log.warning(f"{subject} requests {GPU_RESOURCE} next to a map", extra={**ctx, "containers": requesters})
    return None, [gpu_resource_requested(requesters, subject, MAX_WARNING)]
