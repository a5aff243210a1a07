"""Why a container sees no GPU, or other GPUs than its mode gives it: the cluster setting to look at.

From inside a container the check sees what its runtime did: the NVIDIA device nodes in
``/dev`` (``nvidiactl`` and one ``nvidia<minor>`` per GPU), whether NVML loads, how many GPUs
it counts, and the GPU variables it was given. Each combination points at a setting outside the
pod (README, "Which mode for my cluster"; docs/check.md, "When a container sees no GPU"):

* nothing at all: no runtime acted on the variables. On a GPU Operator with CDI on (the
  default since 25.10) NVIDIA's runtime is not the default one, so a pod without
  ``runtimeClassName`` runs under plain runc, which ignores ``NVIDIA_VISIBLE_DEVICES``; NVIDIA's
  runtime itself ignores it in an unprivileged container when
  ``accept-nvidia-visible-devices-envvar-when-unprivileged`` is false;
* device nodes without NVML: the driver's libraries were not mounted;
* more GPUs than the entry where the mode isolates them: they came another way (privileged,
  a host ``/dev``, the device plugin, the image's ``NVIDIA_VISIBLE_DEVICES=all`` under a
  default NVIDIA runtime in DRA mode);
* fewer indices than cuda mode names: something isolated the GPUs cuda mode expects to see all of.

Pure: the settings, NVML's report and the device nodes in, a :class:`Diagnosis` (or None) out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.check.nvml import DeviceNodes, NvmlReport
from kube_gpu_scheduler.check.settings import DRA_MODE, Settings
from kube_gpu_scheduler.domain.injection import ISOLATING_MODES
from kube_gpu_scheduler.domain.schedmap import Entry

# The causes (the ``cause`` key of a failing GPU check and of the ``devices seen`` record).
NO_GPU = "no-gpu-from-runtime"
NO_LIBRARY = "devices-without-nvml"
CONTROL_ONLY = "no-gpu-device-node"
NOT_ISOLATED = "more-gpus-than-the-entry"
TOO_FEW = "fewer-gpus-than-the-entry"
CUDA_ISOLATED = "cuda-mode-sees-too-few"

ACCEPT_ENVVAR = "accept-nvidia-visible-devices-envvar-when-unprivileged"
CDI_DEFAULT = (
    "on a GPU Operator with CDI on (the default since 25.10) NVIDIA's runtime is not the default runtime"
)
USE_CDI_OR_DRA = "use injection.deviceMode nvidia-cdi (it sets the pod's runtimeClassName) or DRA mode"


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "diagnosis": self.why}


def isolating(settings: Settings, entry: Entry) -> bool:
    """Whether the container should see exactly the entry's GPUs: DRA mode, nvidia and nvidia-cdi
    modes, or NVIDIA_VISIBLE_DEVICES naming exactly the entry's GPUs in cuda mode."""
    mode = settings.injection_mode
    return mode == DRA_MODE or mode in ISOLATING_MODES or settings.nvidia_visible_devices == entry.devices


def _shown(nodes: DeviceNodes | None) -> str:
    if nodes is None or not nodes.gpus:
        return "no /dev/nvidia<N>"
    return ", ".join(nodes.gpus)


def _nvml(report: NvmlReport) -> str:
    if report.available:
        return "NVML counts no GPU"
    return report.reason or "NVML not available"


def _variable(settings: Settings) -> str:
    value = settings.nvidia_visible_devices
    if value is None:
        return "NVIDIA_VISIBLE_DEVICES is not set (the pod was not injected: see the env checks)"
    if value == "void":
        return "NVIDIA_VISIBLE_DEVICES reads void (a CDI spec was applied, yet it gave no GPU)"
    shown = value if len(value) <= 120 else value[:119] + "…"
    return f"NVIDIA_VISIBLE_DEVICES={shown} was not acted on"


def _no_gpu(settings: Settings, report: NvmlReport) -> Diagnosis:
    mode = settings.injection_mode
    head = f"the container runtime gave this container no GPU (no /dev/nvidiactl, no /dev/nvidia<N>; {_nvml(report)})"
    if mode == DRA_MODE:
        tail = (
            "its ResourceClaim's devices were not applied: the kubelet did not prepare the claim through "
            "the DRA driver, or containerd does not apply CDI specs (CDI on, the driver's spec folder in "
            "cdi_spec_dirs); look at kubectl describe resourceclaim <pod>-gpus and the DRA driver's "
            "kubelet-plugin logs"
        )
    elif mode == "nvidia-cdi":
        tail = (
            f"{_variable(settings)}: the pod's RuntimeClass (the scheduler chart's injection.runtimeClassName, "
            "default nvidia; none when it is empty) does not run NVIDIA's container runtime on this node, "
            f"or that runtime ignores the variable in an unprivileged container ({ACCEPT_ENVVAR} = false, "
            "as hardened clusters set it: then only DRA mode gives a pod its GPUs); look at "
            "kubectl get pod -o jsonpath='{.spec.runtimeClassName}', kubectl get runtimeclass, and the "
            "node's nvidia-container-runtime config.toml"
        )
    elif mode == "nvidia":
        tail = (
            f"{_variable(settings)}: {CDI_DEFAULT}, so a pod without runtimeClassName runs under plain "
            "runc, which ignores NVIDIA_VISIBLE_DEVICES (and under runtimeClassName nvidia the bare indices "
            "fail the container instead: unresolvable CDI devices management.nvidia.com/gpu=N); NVIDIA's "
            f"runtime also ignores the variable in an unprivileged container when {ACCEPT_ENVVAR} = false; "
            f"{USE_CDI_OR_DRA}"
        )
    else:
        tail = (
            "cuda mode only sets CUDA_VISIBLE_DEVICES and needs a container that already sees the node's "
            f"GPUs: {CDI_DEFAULT}, so a pod without runtimeClassName runs under plain runc, which ignores "
            f"NVIDIA_VISIBLE_DEVICES (the CUDA image's `all` included); {USE_CDI_OR_DRA}"
        )
    return Diagnosis(NO_GPU, f"{head}: {tail}")


def _too_many(settings: Settings, seen: int, want: int, nodes: DeviceNodes | None) -> Diagnosis:
    mode = settings.injection_mode
    head = (
        f"the container sees {seen} GPUs ({_shown(nodes)}), more than the {want} of its entry, which "
        f"{mode} mode gives it alone"
    )
    elsewhere = "a privileged container or a hostPath /dev (every device of the node), nvidia.com/gpu from the device plugin"
    if mode == DRA_MODE:
        tail = (
            f"the DRA driver's CDI spec holds only the claim's GPUs; the others came another way: {elsewhere}, "
            "or NVIDIA's runtime as the node's default runtime acting on the image's NVIDIA_VISIBLE_DEVICES="
            f"{settings.nvidia_visible_devices or '(unset)'} (CUDA images set `all`: set NVIDIA_VISIBLE_DEVICES=void "
            "in the pod, or keep runc the default runtime, as the GPU Operator >= 25.10 does)"
        )
    else:
        tail = (
            f"NVIDIA_VISIBLE_DEVICES did not limit it: {elsewhere}, a cdi.k8s.io/ annotation, or a runtime that "
            f"ignored the variable (plain runc; NVIDIA's runtime with {ACCEPT_ENVVAR} = false in an "
            "unprivileged container) while something else gave every GPU"
        )
    return Diagnosis(NOT_ISOLATED, f"{head}: {tail}")


def diagnose(
    settings: Settings, entry: Entry | None, report: NvmlReport, nodes: DeviceNodes | None
) -> Diagnosis | None:
    """The likeliest reason the container's GPUs are not its entry's, or None when nothing points
    outside the pod (or the nodes are declared GPU-less: CHECK_EXPECT_NO_GPU)."""
    if entry is None:
        return None
    no_nodes = nodes is None or nodes.empty
    if not report.available or report.count == 0:
        if settings.expect_no_gpu or "pynvml is not installed" in (report.reason or ""):
            return None
        if nodes is not None and nodes.gpus:
            return Diagnosis(
                NO_LIBRARY,
                f"the container has GPU device nodes ({_shown(nodes)}) but no NVML ({_nvml(report)}): its "
                "runtime mounted the devices without the driver's libraries (NVIDIA_DRIVER_CAPABILITIES "
                "without `utility`?), or they come from outside NVIDIA's runtime and DRA driver (a "
                "privileged container, a hostPath /dev)",
            )
        if nodes is not None and nodes.control:
            return Diagnosis(
                CONTROL_ONLY,
                f"the container has /dev/nvidiactl but no GPU device node ({_nvml(report)}): the runtime "
                "resolved no GPU (NVIDIA_VISIBLE_DEVICES=void or none, or a CDI device naming no GPU)",
            )
        return _no_gpu(settings, report) if no_nodes else None
    want = entry.size
    counts = [report.count] + ([] if no_nodes or nodes is None else [len(nodes.gpus)])
    if isolating(settings, entry):
        if max(counts) > want:
            return _too_many(settings, max(counts), want, nodes)
        if min(counts) < want:
            return Diagnosis(
                TOO_FEW,
                f"the container sees {min(counts)} of its entry's {want} GPUs ({_shown(nodes)}): the runtime "
                "resolved fewer devices than it was asked for (a GPU of another node, by UUID?)",
            )
        return None
    missing = [g for g in entry.indices if g >= report.count]
    if missing:
        return Diagnosis(
            CUDA_ISOLATED,
            f"cuda mode names the node's own indices ({entry.devices}), but the container sees only "
            f"{report.count} GPUs, numbered 0..{report.count - 1}: something isolated them (NVIDIA's runtime "
            "with an NVIDIA_VISIBLE_DEVICES list, the device plugin's nvidia.com/gpu, a DRA claim), so the map's "
            "indices point past them; use injection.deviceMode nvidia-cdi (or nvidia), which hands the list "
            "to the runtime and numbers CUDA's GPUs from 0",
        )
    return None
