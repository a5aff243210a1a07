"""The admission and lint findings: what the webhook and the CLI say about a pod spec, a
StatefulSet's replicas and the nodes of its map (never a scheduler refusal, but
GPUResourceRequested, the scheduler's warning Event on a bound pod).

The rules that only these front ends evaluate are defined here, beside their
checks; the StatefulSet forms of the pod's and the GPUs' rules
(:func:`replica_findings`, :func:`map_node_findings`) emit those rules' reasons.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kube_gpu_scheduler.domain.resources import GPU_RESOURCE, PITFALL_ADVICE
from kube_gpu_scheduler.domain.rules.framework import NEVER, ON_POD, REFUSE, WARN, Finding, emits, rule
from kube_gpu_scheduler.domain.rules.gpus import GPU_OUT_OF_RANGE, NO_GPU_RESOURCE
from kube_gpu_scheduler.domain.rules.node import NODE_NOT_FOUND
from kube_gpu_scheduler.domain.rules.pod import ORDINAL_NOT_MAPPED
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, Entry, SchedulingMap, excerpt

GPU_RESOURCE_REQUESTED = rule(
    "GPUResourceRequested",
    "NoDevicePluginGPUs",
    f"no container also requests a non-zero {GPU_RESOURCE} (the device plugin would renumber)",
    NEVER,
    "",
    scheduler=WARN,
    mutate=WARN,  # REFUSE with WEBHOOK_GPU_RESOURCE_POLICY=deny
    validate=WARN,  # REFUSE with WEBHOOK_GPU_RESOURCE_POLICY=deny
    lint=WARN,
)
SCHEDULER_NAME_MISMATCH = rule(
    "SchedulerNameMismatch",
    "SchedulerName",
    "spec.schedulerName is the GPU scheduler's configured name",
    {ON_POD},
    "the scheduler never sees pods of another scheduler",
    mutate=WARN,
    validate=WARN,
    lint=WARN,
)
NODE_NAME_SET = rule(
    "NodeNameSet",
    "NoNodeName",
    "spec.nodeName is not set on a mapped pod (it would bypass the scheduler's checks)",
    NEVER,
    "a pod with spec.nodeName is bound already: the scheduler never sees it pending",
    mutate=REFUSE,
    validate=WARN,
    lint=WARN,
)
MAP_NOT_ON_TEMPLATE = rule(
    "MapNotOnPodTemplate",
    "MapOnPodTemplate",
    "the map is on the pod template, not on the controller's own metadata",
    NEVER,
    "",
    validate=WARN,
    lint=WARN,
)
RUNTIME_CLASS_CONFLICT = rule(
    "RuntimeClassConflict",
    "RuntimeClass",
    "in nvidia-cdi device mode, a mapped pod names no runtimeClassName or the one the injector gives",
    NEVER,
    "only the admission front ends know the device mode",
    mutate=REFUSE,
    validate=REFUSE,
)
ORDINAL_UNUSED = rule("OrdinalNotUsed", "OrdinalUsed", "every map entry is a replica", NEVER, "", lint=WARN)
# The YAML-only lints: their checks read the document (kube_gpu_scheduler.mapcli.manifest).
NO_ORDINALS = rule(
    "NotAStatefulSet", "HasOrdinals", "the object's pods have ordinals (a StatefulSet)", NEVER, "", lint=WARN
)
MISSPELT_ANNOTATION = rule(
    "MisspeltAnnotation", "AnnotationKey", f"no near-miss of {ANNOTATION}", NEVER, "", lint=WARN
)
FOLDED_MAP = rule("FoldedMap", "LiteralBlock", "the map is not a folded YAML block", NEVER, "", lint=WARN)


@emits(GPU_RESOURCE_REQUESTED)
def gpu_resource_requested(names: Sequence[str], subject: str = "this pod", width: int = 256) -> Finding:
    """GPUResourceRequested, in at most ``width`` characters (an admission warning's limit).

    As many container names as fit; the explanation itself is never cut.
    """
    for count, name_width in ((len(names), 63), (3, 24), (2, 16), (1, 16)):
        shown = ", ".join(repr(n[:name_width]) for n in names[:count]) + (
            ", ..." if len(names) > count else ""
        )
        text = f"{subject} also requests {GPU_RESOURCE} ({shown}): {PITFALL_ADVICE}"
        if len(text) <= width:
            break
    return Finding(GPU_RESOURCE_REQUESTED, text)


def gpu_resource_denial(names: Sequence[str]) -> str:
    """GPUResourceRequested in full, for a denial (status messages are not truncated)."""
    return (
        f"the pod uses {ANNOTATION} and also requests {GPU_RESOURCE} "
        f"(containers {', '.join(repr(n) for n in names)}): the NVIDIA device plugin would choose which GPUs "
        "the container gets and "
        "they are renumbered from 0 inside it, so the map's indices would point at the wrong GPU. "
        f"Remove the {GPU_RESOURCE} requests/limits (the map already reserves the GPUs), or ask the "
        "operator to set WEBHOOK_GPU_RESOURCE_POLICY=warn"
    )


@emits(SCHEDULER_NAME_MISMATCH)
def other_scheduler(scheduler: str, ours: str, width: int = 256) -> Finding:
    """SchedulerNameMismatch on a Pod: the webhook leaves it alone (within ``width`` characters)."""
    return Finding(
        SCHEDULER_NAME_MISMATCH,
        (
            f"spec.schedulerName is {excerpt(scheduler, 40)!r}, not {excerpt(ours, 40)!r}: {ANNOTATION} "
            "ignored, no GPU variables set (the map's GPU indices would be used on whatever node that "
            f"scheduler picks); set spec.schedulerName: {excerpt(ours, 40)}"
        )[:width],
        "spec.schedulerName",
    )


@emits(NODE_NAME_SET)
def node_name_on_pod(node_name: str, ours: str) -> Finding:
    """NodeNameSet on a Pod: the webhook denies it."""
    return Finding(
        NODE_NAME_SET,
        f"spec.nodeName is set ({excerpt(node_name)!r}) on a pod carrying {ANNOTATION}: such a pod "
        f"bypasses the scheduler, so its GPUs could be given twice; {ours} binds it to "
        "the node its map names. Remove spec.nodeName",
        "spec.nodeName",
    )


@emits(SCHEDULER_NAME_MISMATCH, NODE_NAME_SET)
def pod_template_findings(pod_spec: Mapping[str, Any], ours: str, where: str) -> list[Finding]:
    """SchedulerNameMismatch and NodeNameSet for a pod template (its spec at ``where``)."""
    findings: list[Finding] = []
    scheduler = pod_spec.get("schedulerName")
    if scheduler in (None, "", "default-scheduler"):
        findings.append(
            Finding(
                SCHEDULER_NAME_MISMATCH,
                f"{where}.schedulerName is not set: the default scheduler will place these pods "
                f"and ignore {ANNOTATION}; set it to the GPU scheduler's name ({ours})",
                f"{where}.schedulerName",
            )
        )
    elif scheduler != ours:
        findings.append(
            Finding(
                SCHEDULER_NAME_MISMATCH,
                f"{where}.schedulerName is {excerpt(str(scheduler), 40)!r}, not the GPU scheduler "
                f"({ours}): these pods get no GPU variables and their node is not the map's; "
                f"set it to {ours}",
                f"{where}.schedulerName",
            )
        )
    node_name = pod_spec.get("nodeName")
    if node_name:
        findings.append(
            Finding(
                NODE_NAME_SET,
                f"{where}.nodeName is set ({excerpt(str(node_name), 40)!r}): every pod of this "
                f"StatefulSet will be refused, because a pod carrying {ANNOTATION} must be placed by {ours}; "
                "remove nodeName",
                f"{where}.nodeName",
            )
        )
    return findings


@emits(RUNTIME_CLASS_CONFLICT)
def runtime_class_conflict(have: str, want: str, where: str) -> Finding:
    """RuntimeClassConflict: the pod (or template, its spec at ``where``) names another
    RuntimeClass than the one nvidia-cdi mode gives (``want``). Refused, never overwritten: the
    class may be a sandbox (gVisor, Kata) someone chose, and under it the GPUs' CDI names would
    give no GPU, or fail the container."""
    return Finding(
        RUNTIME_CLASS_CONFLICT,
        f"{where}.runtimeClassName is {excerpt(have, 63)!r}, but this cluster's GPU injection "
        f"(device mode nvidia-cdi) gives the map's GPUs through RuntimeClass {want!r}, NVIDIA's "
        "container runtime, which alone reads the runtime.nvidia.com/gpu devices in "
        "NVIDIA_VISIBLE_DEVICES: under another class the replica would get no GPU. Remove "
        f"runtimeClassName (the injector sets {want!r}), or ask the operator to set the chart's "
        "injection.runtimeClassName to a class that runs NVIDIA's runtime",
        f"{where}.runtimeClassName",
    )


@emits(MAP_NOT_ON_TEMPLATE)
def map_not_on_template(kind: str) -> Finding:
    """MapNotOnPodTemplate: the annotation is on a controller's own metadata, where no pod sees it."""
    return Finding(
        MAP_NOT_ON_TEMPLATE,
        f"{ANNOTATION} is on the {kind}'s own metadata, where it has no effect: move it to "
        "spec.template.metadata.annotations so every pod carries it",
        "metadata.annotations",
    )


def missing_ordinals(smap: SchedulingMap, start: int, replicas: int, show: int = 5) -> tuple[int, list[int]]:
    """How many of ordinals ``start .. start+replicas-1`` have no entry, and the first ``show`` of them.

    Work is bounded by the map's size and ``show``, not by ``replicas`` (which may be huge).
    """
    covered = sum(1 for o in smap if start <= o < start + replicas)
    count = replicas - covered
    first: list[int] = []
    ordinal = start
    while len(first) < min(show, count):
        if ordinal not in smap:
            first.append(ordinal)
        ordinal += 1
    return count, first


@emits(ORDINAL_NOT_MAPPED)
def replica_findings(smap: SchedulingMap, start: int, replicas: int) -> list[Finding]:
    """OrdinalNotInMap for a StatefulSet: replicas ``start .. start+replicas-1`` without an entry."""
    count, first = missing_ordinals(smap, start, replicas)
    if not count:
        return []
    shown = ", ".join(map(str, first)) + (f" and {count - len(first)} more" if count > len(first) else "")
    return [
        Finding(
            ORDINAL_NOT_MAPPED,
            f"{ANNOTATION} has no entry for ordinal {shown} ({count} of {replicas} replicas): "
            "those pods get no GPU variables and cannot be placed",
        )
    ]


@emits(ORDINAL_UNUSED)
def unused_ordinals(smap: SchedulingMap, start: int, replicas: int) -> list[Finding]:
    """OrdinalNotUsed: entries for ordinals no replica has (lint only: harmless, likely a mistake)."""
    unused = [o for o in smap if not start <= o < start + replicas]
    if not unused:
        return []
    span = f"ordinals {start}-{start + replicas - 1}" if replicas else "no pods"
    return [
        Finding(ORDINAL_UNUSED, f"ordinal(s) {ranges(unused)} are not used with replicas {replicas} ({span})")
    ]


def ranges(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    nums = sorted(set(numbers))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(out)


@emits(NODE_NOT_FOUND, NO_GPU_RESOURCE, GPU_OUT_OF_RANGE)
def map_node_findings(node: str, entries: Sequence[Entry], exists: bool, gpus: int | None) -> list[Finding]:
    """NodeNotFound / NoGPUResource / GPUIndexOutOfRange for every entry of a map on ``node``.

    The StatefulSet form of :func:`check_node`'s GPU part (one finding per node, naming map lines).
    """
    if not exists:
        ordinals = ", ".join(str(e.ordinal) for e in entries)
        lines = ", ".join(str(e.line) for e in entries)
        return [
            Finding(
                NODE_NOT_FOUND,
                f"{ANNOTATION}: node {node!r} (ordinals {ordinals}, line {lines}) "
                "does not exist; those replicas stay Pending until it does",
            )
        ]
    if gpus is None:
        wanted = "; ".join(f"ordinal {e.ordinal} (line {e.line}) GPU {e.devices}" for e in entries)
        return [
            Finding(
                NO_GPU_RESOURCE,
                f"{ANNOTATION}: node {node!r} reports no {GPU_RESOURCE} (no GPUs, or no NVIDIA device "
                f"plugin), so the GPUs mapped to it cannot be checked: {wanted}",
            )
        ]
    findings: list[Finding] = []
    for entry in entries:
        have = f"node {node!r} has {gpus} allocatable {GPU_RESOURCE}"
        if entry.kind == "uuid" and len(entry.gpus) > gpus:
            findings.append(
                Finding(
                    GPU_OUT_OF_RANGE,
                    f"{ANNOTATION} line {entry.line}: ordinal {entry.ordinal} names "
                    f"{len(entry.gpus)} GPUs by UUID but {have}",
                )
            )
        too_high = [g for g in entry.indices if g >= gpus]
        if not too_high:
            continue
        have += f" (indices 0..{gpus - 1})" if gpus else ""
        findings.append(
            Finding(
                GPU_OUT_OF_RANGE,
                f"{ANNOTATION} line {entry.line}: ordinal {entry.ordinal} wants GPU "
                f"{','.join(map(str, too_high))} but {have}",
            )
        )
    return findings


def entries_by_node(smap: SchedulingMap) -> dict[str, list[Entry]]:
    """The map's entries grouped by node, nodes sorted by name."""
    by_node: dict[str, list[Entry]] = {}
    for ordinal in smap:
        by_node.setdefault(smap[ordinal].node, []).append(smap[ordinal])
    return dict(sorted(by_node.items()))
