"""The GPU variables the webhook writes into a pod's containers, and reading them back.

One module says what "injected" means, so the webhook (which writes the
variables), the scheduler (which binds only a pod that carries them, and
derives from them which GPUs a bound pod holds) and the check program agree.

Why the container spec: a pod's ``spec.containers[*].env`` cannot be changed
after the pod is created, by anyone. What the webhook wrote at admission is
therefore a fact about the pod, unlike an annotation, which any tenant with
``pods patch`` in the namespace can rewrite.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kube_gpu_scheduler.domain.schedmap import GPU, Entry, gpu_kind, gpu_sort_key, parse_gpu

InjectionMode = Literal["cuda", "nvidia", "nvidia-cdi"]
INJECTION_MODES: tuple[InjectionMode, ...] = ("cuda", "nvidia", "nvidia-cdi")
# The device modes whose container runtime exposes only the entry's GPUs (numbered 0..n-1 inside).
ISOLATING_MODES: tuple[InjectionMode, ...] = ("nvidia", "nvidia-cdi")

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
PCI_BUS_ID = "PCI_BUS_ID"
# nvidia-cdi mode: the CDI kind NVIDIA's container runtime (>= 1.15, cdi, jit-cdi or auto mode)
# resolves itself from NVML, a GPU by index (NVML's, PCI bus order) or UUID:
# NVIDIA_VISIBLE_DEVICES=runtime.nvidia.com/gpu=0,runtime.nvidia.com/gpu=GPU-...
CDI_GPU_KIND = "runtime.nvidia.com/gpu"
CDI_GPU_PREFIX = CDI_GPU_KIND + "="
# The RuntimeClass nvidia-cdi mode gives a pod by default (the GPU Operator's, NVIDIA's runtime).
DEFAULT_RUNTIME_CLASS = "nvidia"
# Init containers first: the order in which the kubelet runs them, and the order of the webhook's patch.
CONTAINER_LISTS = ("initContainers", "containers")
# A device list longer than this is not something the webhook wrote.
_MAX_DEVICE_TEXT = 4096


def desired_env(entry: Entry, mode: InjectionMode) -> list[tuple[str, str]]:
    """The variables (in the order they are added) that make a container see ``entry``'s GPUs.

    ``cuda``: CUDA_VISIBLE_DEVICES lists the physical (nvidia-smi) indices, or the UUIDs.
    ``nvidia``: NVIDIA_VISIBLE_DEVICES lists them for the NVIDIA container runtime,
    which exposes only those GPUs, so CUDA sees them renumbered 0..n-1.
    ``nvidia-cdi``: the same, each GPU written as the CDI device ``runtime.nvidia.com/gpu=<GPU>``
    that NVIDIA's runtime in CDI mode resolves itself (a bare index there names the
    management kind's device, which a GPU Operator >= 25.10 does not define: the container
    fails to start); the pod also gets a RuntimeClass (:func:`runtime_class_for`).

    Both variables take an index or a UUID (``GPU-...``), never a PCI bus ID: an entry
    naming its GPUs by PCI bus ID is refused outside DRA mode (GPUNameNeedsDRA) before
    this is asked.
    """
    order = (CUDA_DEVICE_ORDER, PCI_BUS_ID)
    if mode in ISOLATING_MODES:
        renumbered = ",".join(str(i) for i in range(len(entry.gpus)))
        visible = cdi_devices(entry.gpus) if mode == "nvidia-cdi" else entry.devices
        return [(NVIDIA_VISIBLE_DEVICES, visible), (CUDA_VISIBLE_DEVICES, renumbered), order]
    return [(CUDA_VISIBLE_DEVICES, entry.devices), order]


def cdi_devices(gpus: Iterable[GPU]) -> str:
    """``runtime.nvidia.com/gpu=0,runtime.nvidia.com/gpu=GPU-...``: each GPU as it is written."""
    return ",".join(CDI_GPU_PREFIX + str(g) for g in gpus)


def runtime_class_for(mode: InjectionMode, configured: str) -> str | None:
    """The RuntimeClass a mapped pod must run under in ``mode``: ``configured`` (the chart's
    ``injection.runtimeClassName``) in nvidia-cdi mode, None otherwise or when it is empty (a
    cluster whose default runtime is NVIDIA's in CDI mode needs none)."""
    return configured or None if mode == "nvidia-cdi" else None


def foreign_runtime_class(spec: Mapping[str, Any] | None, mode: InjectionMode, configured: str) -> str | None:
    """The pod spec's own ``runtimeClassName`` when it names another class than the one
    ``mode`` gives (nvidia-cdi mode), else None."""
    want = runtime_class_for(mode, configured)
    have = (spec or {}).get("runtimeClassName")
    if want is None or have in (None, "", want):
        return None
    return str(have)


def pod_containers(spec: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """Every init container and container of a pod spec (ephemeral containers excluded)."""
    out: list[Mapping[str, Any]] = []
    for list_name in CONTAINER_LISTS:
        items = (spec or {}).get(list_name) or []
        if isinstance(items, list):
            out.extend(c for c in items if isinstance(c, Mapping))
    return out


def plain_env(container: Mapping[str, Any]) -> dict[str, str | None]:
    """``name -> value`` of a container's env; a variable set through ``valueFrom`` maps to None.

    A name listed twice keeps its last value, as the kubelet does.
    """
    out: dict[str, str | None] = {}
    for item in container.get("env") or []:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            continue
        value = item.get("value")
        out[item["name"]] = None if "valueFrom" in item or not isinstance(value, str) else value
    return out


def container_injected(env: Mapping[str, str | None], entry: Entry) -> InjectionMode | None:
    """The mode whose variables ``env`` carries exactly for ``entry``, or None."""
    for mode in INJECTION_MODES:
        if all(env.get(name) == value for name, value in desired_env(entry, mode)):
            return mode
    return None


@dataclass(frozen=True)
class InjectionState:
    """Whether every container of a pod carries the webhook's variables for its map entry."""

    ok: bool
    # Names of the containers that do not (empty when ok).
    missing: tuple[str, ...] = ()
    # What the first such container has instead, for the message: "CUDA_VISIBLE_DEVICES unset".
    found: str = ""


def injection_state(spec: Mapping[str, Any] | None, entry: Entry) -> InjectionState:
    """Check every (init) container; a pod with no container at all is not injected."""
    containers = pod_containers(spec)
    if not containers:
        return InjectionState(False, ("(none)",), "the pod has no containers")
    missing: list[str] = []
    found = ""
    for index, container in enumerate(containers):
        env = plain_env(container)
        if container_injected(env, entry) is not None:
            continue
        name = container.get("name")
        missing.append(name if isinstance(name, str) and name else f"#{index}")
        if not found:
            found = describe_env(env)
    return InjectionState(not missing, tuple(missing), found)


def describe_env(env: Mapping[str, str | None]) -> str:
    """A short account of a container's GPU variables, for messages."""
    parts = []
    for name in (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER):
        if name not in env:
            continue
        value = env[name]
        shown = "(valueFrom)" if value is None else repr(value[:40] + ("…" if len(value) > 40 else ""))
        parts.append(f"{name}={shown}")
    return ", ".join(parts) if parts else f"{CUDA_VISIBLE_DEVICES} unset"


def parse_devices(text: str | None, prefix: str = "") -> tuple[GPU, ...] | None:
    """A comma-separated list of GPU indices or UUIDs (``"0,2"``, ``"GPU-8a3c...,GPU-..."``),
    as the map reads them (UUIDs normalized); None when it is not one. With ``prefix``
    (:data:`CDI_GPU_PREFIX`), every item must carry it (``runtime.nvidia.com/gpu=0``)."""
    # Each item of a CDI list is up to 23 characters longer.
    if text is None or not text.strip() or len(text) > _MAX_DEVICE_TEXT * (8 if prefix else 1):
        return None
    out: list[GPU] = []
    for raw in text.split(","):
        token = raw.strip()
        if prefix:
            if not token.startswith(prefix):
                return None
            token = token[len(prefix) :]
        if not token.isascii() or len(token) > (4 if token.isdigit() else 40):
            return None
        value = parse_gpu(token)
        if value is None or gpu_kind(value) == "pci":
            return None
        if value not in out:
            out.append(value)
    return tuple(out)


def held_devices(spec: Mapping[str, Any] | None) -> tuple[GPU, ...]:
    """The physical GPUs (indices or UUIDs) a pod's containers are set up to use: the union over
    containers.

    A container's physical GPUs are ``NVIDIA_VISIBLE_DEVICES`` when it is a
    list of indices or UUIDs (``nvidia`` mode) or of ``runtime.nvidia.com/gpu=`` CDI devices
    naming them (``nvidia-cdi`` mode), else ``CUDA_VISIBLE_DEVICES``. Sorted
    (:func:`gpu_sort_key`).
    """
    held: set[GPU] = set()
    for container in pod_containers(spec):
        env = plain_env(container)
        visible = env.get(NVIDIA_VISIBLE_DEVICES)
        devices = parse_devices(visible)
        if devices is None:
            devices = parse_devices(visible, CDI_GPU_PREFIX)
        if devices is None:
            devices = parse_devices(env.get(CUDA_VISIBLE_DEVICES))
        held.update(devices or ())
    return tuple(sorted(held, key=gpu_sort_key))


def format_devices(gpus: Iterable[GPU]) -> str:
    return ",".join(str(g) for g in gpus)
