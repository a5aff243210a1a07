"""Reading a pod spec (a Pod's, or a StatefulSet's template) the way both handlers need it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from gpu_scheduling.resources import GPU_RESOURCE, PITFALL_ADVICE, requests_gpu
from webhook.review import BadRequest, Verdict, dict_at, list_at

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
    """Names of the containers that request or limit ``nvidia.com/gpu`` (a non-zero amount)."""
    names: list[str] = []
    for list_name, index, container in containers(spec, where, uid):
        resources = dict_at(container, "resources", f"{where}.{list_name}[{index}].resources", uid)
        for part in ("requests", "limits"):  # malformed parts are a 400 naming the path
            dict_at(resources, part, f"{where}.{list_name}[{index}].resources.{part}", uid)
        if requests_gpu(resources):
            name = container.get("name")
            names.append(name if isinstance(name, str) and name else f"{list_name}[{index}]")
    return names


def gpu_resource_warning(names: list[str], subject: str = "this pod") -> str:
    """One admission warning (<= 256 characters) about the device-plugin renumbering pitfall."""
    advice = PITFALL_ADVICE
    # As many container names as fit; the explanation itself is never cut.
    for count, width in ((len(names), 63), (3, 24), (2, 16), (1, 16)):
        shown = ", ".join(repr(n[:width]) for n in names[:count]) + (", ..." if len(names) > count else "")
        text = f"{subject} also requests {GPU_RESOURCE} ({shown}): {advice}"
        if len(text) <= MAX_WARNING:
            break
    return text


def gpu_resource_denial(names: list[str]) -> str:
    """The full explanation, for a denial (status messages are not truncated)."""
    return (
        f"the pod uses gpu-scheduling-map and also requests {GPU_RESOURCE} "
        f"(containers {', '.join(repr(n) for n in names)}): the NVIDIA device plugin would choose which GPUs "
        "the container gets and "
        "they are renumbered from 0 inside it, so the map's indices would point at the wrong GPU. "
        f"Remove the {GPU_RESOURCE} requests/limits (the map already reserves the GPUs), or ask the "
        "operator to set WEBHOOK_GPU_RESOURCE_POLICY=warn"
    )


def gpu_resource_policy(
    spec: dict[str, Any],
    where: str,
    uid: str,
    policy: str,
    subject: str,
    log: logging.Logger,
    ctx: dict[str, Any],
) -> tuple[Verdict | None, str | None]:
    """WEBHOOK_GPU_RESOURCE_POLICY for a pod spec at ``where``: ``(denial, None)``,
    ``(None, warning)``, or ``(None, None)`` when no container asks the device plugin for GPUs."""
    requesters = gpu_requesters(spec, where, uid)
    if not requesters:
        return None, None
    if policy == "deny":
        log.info(f"denied: {subject} requests {GPU_RESOURCE}", extra={**ctx, "containers": requesters})
        return Verdict.deny(403, gpu_resource_denial(requesters)), None
    log.warning(f"{subject} requests {GPU_RESOURCE} next to a map", extra={**ctx, "containers": requesters})
    return None, gpu_resource_warning(requesters, subject=subject)
