"""The ``nvidia.com/gpu`` resource, read the same way by the scheduler and the webhook."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes.utils import parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"
# Why a pod with a map must not also ask the device plugin for GPUs (admission warning and event).
PITFALL_ADVICE = (
    "the device plugin then picks the GPUs and renumbers them from 0 in the container, so the "
    f"gpu-scheduling-map indices would point at the wrong GPU; drop the {GPU_RESOURCE} request"
)


def quantity_int(raw: Any) -> int | None:
    """A resource quantity ("4", "4000m", "1k") as a whole number; None when unreadable or negative."""
    if raw is None:
        return None
    try:
        value = parse_quantity(str(raw))
    except (ValueError, TypeError, ArithmeticError):
        return None
    return int(value) if value >= 0 else None


def node_gpus(status: Mapping[str, Any] | None) -> int | None:
    """A node's ``status.allocatable`` (else ``capacity``) ``nvidia.com/gpu``; None when not reported."""
    status = status or {}
    for part in ("allocatable", "capacity"):
        raw = (status.get(part) or {}).get(GPU_RESOURCE)
        if raw is not None:
            return quantity_int(raw)
    return None


def requests_gpu(resources: Mapping[str, Any] | None) -> bool:
    """True when a container's ``resources`` request or limit a non-zero amount of ``nvidia.com/gpu``."""
    for part in ("requests", "limits"):
        amount = ((resources or {}).get(part) or {}).get(GPU_RESOURCE)
        if amount is not None and str(amount).strip().strip("0.") != "":
            return True
    return False


def gpu_requesting_containers(pod_spec: Mapping[str, Any] | None) -> list[str]:
    """Names of the (init) containers of a pod spec that ask the device plugin for GPUs."""
    spec = pod_spec or {}
    containers: Iterable[Mapping[str, Any]] = [
        *(spec.get("initContainers") or []),
        *(spec.get("containers") or []),
    ]
    return [str(c.get("name") or "?") for c in containers if requests_gpu(c.get("resources"))]
