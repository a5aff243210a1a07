"""The in-pod checks: map, ordinal, node, env, NVML (pure functions of the settings and NVML's report)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kube_gpu_scheduler.check import nvml
from kube_gpu_scheduler.check.diagnose import Diagnosis, diagnose, isolating
from kube_gpu_scheduler.check.results import Result
from kube_gpu_scheduler.check.settings import DRA_MODE, MODES, Settings
from kube_gpu_scheduler.domain.injection import (
    CUDA_DEVICE_ORDER,
    CUDA_VISIBLE_DEVICES,
    INJECTION_MODES,
    NVIDIA_VISIBLE_DEVICES,
    PCI_BUS_ID,
    desired_env,
)
from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL, ordinal_of
from kube_gpu_scheduler.domain.schedmap import Entry, MapError, SchedulingMap, gpu_name, parse

# What NVIDIA's runtime (CDI and jit-cdi modes) leaves in NVIDIA_VISIBLE_DEVICES once it has
# applied the devices the variable asked for.
CDI_APPLIED = "void"
# The checks of what the container got; a failing one carries the diagnosis (diagnose.py).
GPU_CHECKS = frozenset({"nvml", "dev", "nvml:count", "nvml:indices", "nvml:uuids", "nvml:pci_bus_ids"})


def expected_env(entry: Entry, mode: str) -> dict[str, str]:
    """The variables the webhook sets for ``entry`` in injection ``mode`` (kube_gpu_scheduler.domain.injection).

    DRA mode: CUDA_DEVICE_ORDER alone. The DRA driver mounts only the claim's GPUs, so CUDA
    numbers them 0..n-1 by itself (in PCI bus ID order)."""
    if mode == DRA_MODE:
        return {CUDA_DEVICE_ORDER: PCI_BUS_ID}
    return dict(desired_env(entry, mode if mode in INJECTION_MODES else "cuda"))


def env_results(
    entry: Entry, mode: str, env: Mapping[str, str | None], pod: str, in_container: bool = False
) -> list[Result]:
    """One result per variable the mode requires: equal strings, nothing looser. In DRA mode
    also CUDA_VISIBLE_DEVICES unset: over the claim's GPUs (numbered from 0) it would hide or
    reorder some of them.

    ``in_container``: the env a process of the container reads, where NVIDIA's runtime in a CDI
    mode has replaced ``NVIDIA_VISIBLE_DEVICES`` with ``void`` once it applied the devices (its
    generated CDI spec's edit): that is the variable acted on, and the devices are checked by
    ``dev`` and NVML. Never in the pod spec (verify-release), where ``void`` asks for no GPU."""
    results = []
    for name, want in expected_env(entry, mode).items():
        have = env.get(name)
        if in_container and name == NVIDIA_VISIBLE_DEVICES and have == CDI_APPLIED:
            why = (
                "NVIDIA's runtime applied the CDI devices asked for and set the variable to void "
                "(its generated spec's edit); dev and nvml check the GPUs"
            )
            results.append(Result(f"env:{name}", want, have, True, pod, {"note": why}))
            continue
        results.append(Result(f"env:{name}", want, have, have == want, pod))
    if mode == DRA_MODE:
        have = env.get(CUDA_VISIBLE_DEVICES)
        results.append(
            Result(
                f"env:{CUDA_VISIBLE_DEVICES}",
                None,
                have,
                CUDA_VISIBLE_DEVICES not in env,
                pod,
                {"why": "DRA mode: the container sees only its claim's GPUs, numbered from 0; unset it"},
            )
        )
    return results


def map_results(settings: Settings) -> tuple[list[Result], Entry | None]:
    """The checks that need no GPU: map, ordinal, node, env. Returns the entry when one applies."""
    pod = settings.pod
    results: list[Result] = []
    if settings.injection_mode not in MODES:
        results.append(Result("mode", list(MODES), settings.injection_mode, False, pod))
    if settings.map_text is None:
        results.append(
            Result("map", "a valid map", None, False, pod, {"detail": "GPU_SCHEDULING_MAP is not set"})
        )
        return results, None
    try:
        smap: SchedulingMap = parse(settings.map_text)
    except MapError as err:
        results.append(
            Result(
                "map",
                "a valid map",
                settings.map_text,
                False,
                pod,
                {"problems": [str(p) for p in err.problems]},
            )
        )
        return results, None
    results.append(Result("map", "a valid map", smap.format().strip().replace("\n", "; "), True, pod))
    labels = {POD_INDEX_LABEL: settings.pod_index} if settings.pod_index is not None else {}
    ordinal = ordinal_of(settings.pod_name, labels)
    entry = smap.get(ordinal) if ordinal is not None else None
    results.append(
        Result(
            "ordinal",
            f"an entry for the pod's ordinal (POD_INDEX={settings.pod_index!r}, POD_NAME={settings.pod_name!r})",
            {"ordinal": ordinal, "entry": str(entry) if entry else None},
            entry is not None,
            pod,
        )
    )
    if entry is None:
        return results, None
    results.append(Result("node", entry.node, settings.node_name, settings.node_name == entry.node, pod))
    if entry.count and settings.injection_mode != DRA_MODE:
        # A count entry names no GPU: only DRA mode gives it GPUs (GPUCountNeedsDRA elsewhere).
        why = f"entry '{entry}' asks for a count of GPUs, which only DRA mode (dra.enabled) gives"
        results.append(Result("mode", DRA_MODE, settings.injection_mode, False, pod, {"why": why}))
        return results, entry
    if settings.injection_mode in MODES:
        given = {
            "CUDA_VISIBLE_DEVICES": settings.cuda_visible_devices,
            "CUDA_DEVICE_ORDER": settings.cuda_device_order,
            "NVIDIA_VISIBLE_DEVICES": settings.nvidia_visible_devices,
        }
        env = {name: value for name, value in given.items() if value is not None}  # None: unset
        results.extend(env_results(entry, settings.injection_mode, env, pod, in_container=True))
    return results, entry


def nvml_results(
    settings: Settings, entry: Entry | None, report: nvml.NvmlReport, nodes: nvml.DeviceNodes | None = None
) -> list[Result]:
    """Report NVML's GPUs (and, when listed, the NVIDIA device nodes in /dev); compare them with the
    entry when there is one. A failing check says why, when the container's view points at a
    setting outside the pod (:func:`kube_gpu_scheduler.check.diagnose.diagnose`)."""
    results = _nvml_checks(settings, entry, report)
    if nodes is not None:
        results.insert(1, dev_result(settings, entry, report, nodes))
    why = diagnose(settings, entry, report, nodes)
    if why is not None:
        for r in results:
            if r.ok is False and r.check in GPU_CHECKS:
                r.extra.update(why.to_json())
    return results


def dev_result(
    settings: Settings, entry: Entry | None, report: nvml.NvmlReport, nodes: nvml.DeviceNodes
) -> Result:
    """``dev``: the GPU device nodes (/dev/nvidia<N>) the runtime or DRA driver gave the container.
    Where the mode isolates the entry's GPUs (nvidia, nvidia-cdi, DRA) exactly that many; in cuda
    mode at least that many (the container sees the node's GPUs)."""
    pod = settings.pod
    if nodes.empty:
        if settings.expect_no_gpu:
            why = "no NVIDIA device node; CHECK_EXPECT_NO_GPU=true declares nodes without GPUs"
            return Result("dev", None, nodes.to_json(), None, pod, {"skipped": why})
        if report.available and report.count:
            # Only a stand-in NVML (tests, a driver root of its own) counts GPUs without /dev/nvidiactl.
            why = f"NVML counts {report.count} GPUs without any NVIDIA device node in {settings.dev_dir}"
            return Result("dev", None, nodes.to_json(), None, pod, {"skipped": why})
    if entry is None:
        return Result("dev", None, nodes.to_json(), True, pod)
    want = entry.size  # a count entry (auto(N)): N, whichever GPUs were chosen
    if isolating(settings, entry):
        return Result("dev", want, nodes.to_json(), len(nodes.gpus) == want, pod)
    return Result("dev", f"at least {want}", nodes.to_json(), len(nodes.gpus) >= want, pod)


def _nvml_checks(settings: Settings, entry: Entry | None, report: nvml.NvmlReport) -> list[Result]:
    """NVML's report, its count where the GPUs are isolated, and the entry's indices, UUIDs or PCI
    bus IDs among its GPUs."""
    pod = settings.pod
    if not report.available:
        if settings.expect_no_gpu:
            # Declared by the operator (check chart check.expectNoGPU): nothing to look at.
            why = f"{report.reason}; CHECK_EXPECT_NO_GPU=true declares nodes without GPUs"
            return [Result("nvml", None, None, None, pod, {"skipped": why})]
        # Not looking is not passing: without NVML the GPUs the pod got cannot be verified.
        return [
            Result(
                "nvml",
                "NVML available",
                report.reason,
                False,
                pod,
                {
                    "why": "cannot verify devices; only on nodes without GPUs set the check chart's "
                    "check.expectNoGPU=true (env CHECK_EXPECT_NO_GPU)"
                },
            )
        ]
    results = [Result("nvml", None, report.to_json(), not report.errors, pod)]
    if entry is None:
        return results
    dra_mode = settings.injection_mode == DRA_MODE
    if isolating(settings, entry):
        # The container runtime exposes only the mapped GPUs: NVML must count exactly those.
        why = (
            "DRA mode: the driver mounts only the claim's GPUs"
            if dra_mode
            else "NVIDIA_VISIBLE_DEVICES isolates the mapped GPUs"
        )
        results.append(
            Result(
                "nvml:count",
                entry.size,
                report.count,
                report.count == entry.size,
                pod,
                {"why": why}
                if not entry.count
                else {"why": why, "count": f"entry '{entry}': any {entry.count}"},
            )
        )
    if entry.kind in ("uuid", "pci"):
        # The map names the GPUs by UUID (or, in DRA mode, PCI bus ID): each must be among those
        # NVML sees (all of the node's in cuda mode, only the isolated ones otherwise), compared in
        # the map's normal form (NVML's 00000000:3B:00.0 is the map's 0000:3b:00.0).
        check = "nvml:uuids" if entry.kind == "uuid" else "nvml:pci_bus_ids"
        key = (lambda d: d.uuid) if entry.kind == "uuid" else (lambda d: d.pci_bus_id)
        seen = {gpu_name(key(d)) or key(d): d for d in report.devices}
        missing = [g for g in entry.gpus if g not in seen]
        results.append(
            Result(
                check,
                list(entry.gpus),
                {"count": report.count, "missing": missing},
                not missing,
                pod,
                {"devices": [seen[g].to_json() for g in entry.gpus if g in seen]},
            )
        )
    elif settings.injection_mode == "cuda":
        # CUDA_VISIBLE_DEVICES holds physical indices: each must exist among NVML's GPUs.
        missing_indices = [g for g in entry.indices if g >= report.count]
        devices = [d.to_json() for g in entry.indices if (d := report.by_index(g)) is not None]
        results.append(
            Result(
                "nvml:indices",
                list(entry.gpus),
                {"count": report.count, "missing": missing_indices},
                not missing_indices and len(devices) == len(entry.gpus),
                pod,
                {"devices": devices},
            )
        )
    return results


NvmlQuery = Callable[[], nvml.NvmlReport]


NodesQuery = Callable[[str], nvml.DeviceNodes]


def run_checks(
    settings: Settings, nvml_query: NvmlQuery = nvml.query, nodes_query: NodesQuery = nvml.device_nodes
) -> list[Result]:
    """Every check, in order: mode, map, ordinal, node, env, NVML, device nodes."""
    results, entry = map_results(settings)
    try:
        report = nvml_query()
    except Exception as err:  # a crash in the NVML bindings must not take the check down
        report = nvml.NvmlReport(True, errors=(f"NVML query failed: {err.__class__.__name__}: {err}",))
    results.extend(nvml_results(settings, entry, report, nodes_query(settings.dev_dir)))
    return results


def diagnosis_of(results: list[Result]) -> Diagnosis | None:
    """The diagnosis a run's failing GPU checks carry (they all carry the same one)."""
    for r in results:
        if "cause" in r.extra:
            return Diagnosis(r.extra["cause"], r.extra["diagnosis"])
    return None
