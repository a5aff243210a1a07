"""Reading a pod spec (a Pod's, or a StatefulSet's template) the way both handlers need it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpu_scheduling.resources import GPU_RESOURCE, PITFALL_ADVICE, requests_gpu
from webhook.review import BadRequest, dict_at, list_at

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
