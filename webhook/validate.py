"""``POST /validate``: check a StatefulSet's map when it is created or updated.

A map that does not parse is refused (the message names the lines), so the
mistake shows at ``kubectl apply`` instead of as FailedCreate events later.
Everything else that looks wrong but might be intended (a replica without an
entry, a node that does not exist yet, a GPU index beyond what the node
advertises) is an admission warning: ``kubectl`` prints it as ``Warning: ...``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gpu_scheduling.podinfo import map_text
from gpu_scheduling.resources import GPU_RESOURCE
from gpu_scheduling.schedmap import ANNOTATION, MapError, SchedulingMap, excerpt, parse_cached
from webhook.nodes import NodeLookup, NodeLookupUnavailable
from webhook.podspec import MAX_WARNING, gpu_resource_policy
from webhook.review import BadRequest, Request, Verdict, dict_at, str_dict_at
from webhook.settings import Settings

log = logging.getLogger("webhook.validate")

# The apiserver keeps at most 4 KiB of warnings; a few precise ones beat a truncated list.
MAX_WARNINGS = 12
# Node look-ups per review (memory reads of the node cache), and the time they may take
# (the apiserver waits 10 s by default; a test's NodeLookup may be slower).
MAX_NODE_LOOKUPS = 4096
NODE_LOOKUP_BUDGET_S = 5.0


def _int_at(parent: dict[str, Any], key: str, default: int, where: str, uid: str) -> int:
    value = parent.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{where} must be a non-negative integer, got {value!r}", uid=uid)
    return value


def missing_ordinals(smap: SchedulingMap, start: int, replicas: int, show: int = 5) -> tuple[int, list[int]]:
    """How many of ordinals ``start .. start+replicas-1`` have no entry, and the first ``show`` of them."""
    covered = sum(1 for o in smap if start <= o < start + replicas)
    count = replicas - covered
    first: list[int] = []
    ordinal = start
    while len(first) < min(show, count):
        if ordinal not in smap:
            first.append(ordinal)
        ordinal += 1
    return count, first


def placement_warnings(pod_spec: dict[str, Any], ours: str) -> list[str]:
    """Warnings about a pod template that the GPU scheduler would not place (the webhook skips or refuses it)."""
    warnings: list[str] = []
    scheduler = pod_spec.get("schedulerName")
    if scheduler in (None, "", "default-scheduler"):
        warnings.append(
            "spec.template.spec.schedulerName is not set: the default scheduler will place these pods "
            f"and ignore {ANNOTATION}; set it to the GPU scheduler's name ({ours})"
        )
    elif scheduler != ours:
        warnings.append(
            f"spec.template.spec.schedulerName is {excerpt(str(scheduler), 40)!r}, not the GPU scheduler "
            f"({ours}): these pods get no GPU variables and their node is not the map's; "
            f"set it to {ours}"
        )
    node_name = pod_spec.get("nodeName")
    if node_name:
        warnings.append(
            f"spec.template.spec.nodeName is set ({excerpt(str(node_name), 40)!r}): every pod of this "
            f"StatefulSet will be refused, because a pod carrying {ANNOTATION} must be placed by {ours}; "
            "remove nodeName"
        )
    return warnings


def node_warnings(smap: SchedulingMap, nodes: NodeLookup, ctx: dict[str, Any]) -> list[str]:
    """Warnings about nodes that do not exist, report no GPUs, or have fewer GPUs than the map names."""
    warnings: list[str] = []
    by_node: dict[str, list[int]] = {}
    for ordinal in smap:
        by_node.setdefault(smap[ordinal].node, []).append(ordinal)
    deadline = time.monotonic() + NODE_LOOKUP_BUDGET_S
    for count, (node, ordinals) in enumerate(sorted(by_node.items())):
        if count >= MAX_NODE_LOOKUPS or time.monotonic() > deadline:
            log.debug("node checks stopped early", extra={**ctx, "checked": count, "nodes": len(by_node)})
            break
        try:
            info = nodes.get(node)
        except NodeLookupUnavailable as exc:
            log.debug("node checks skipped: %s", exc, extra=ctx)
            break
        entries = [smap[o] for o in ordinals]
        if info is None:
            lines = ", ".join(str(e.line) for e in entries)
            warnings.append(
                f"{ANNOTATION}: node {node!r} (ordinals {', '.join(map(str, ordinals))}, line {lines}) "
                "does not exist; those replicas stay Pending until it does"
            )
            continue
        if info.gpus is None:
            wanted = "; ".join(f"ordinal {e.ordinal} (line {e.line}) GPU {e.devices}" for e in entries)
            warnings.append(
                f"{ANNOTATION}: node {node!r} reports no {GPU_RESOURCE} (no GPUs, or no NVIDIA device "
                f"plugin), so the GPUs mapped to it cannot be checked: {wanted}"
            )
            continue
        for entry in entries:
            too_high = [g for g in entry.gpus if g >= info.gpus]
            if not too_high:
                continue
            have = f"node {node!r} has {info.gpus} allocatable {GPU_RESOURCE}"
            have += f" (indices 0..{info.gpus - 1})" if info.gpus else ""
            warnings.append(
                f"{ANNOTATION} line {entry.line}: ordinal {entry.ordinal} wants GPU "
                f"{','.join(map(str, too_high))} but {have}"
            )
    return warnings


def admit_statefulset(req: Request, settings: Settings, nodes: NodeLookup) -> Verdict:
    """Decide on a StatefulSet CREATE or UPDATE: deny a malformed map, warn about the rest."""
    if (req.group, req.version, req.kind) != ("apps", "v1", "StatefulSet"):
        raise BadRequest(
            f"/validate admits apps/v1 StatefulSets, got {req.gvk}: check the webhook's rules", uid=req.uid
        )
    obj = req.object or {}
    metadata = dict_at(obj, "metadata", "metadata", req.uid)
    name = req.name or str(metadata.get("name") or "")
    namespace = req.namespace or str(metadata.get("namespace") or "")
    ctx: dict[str, Any] = {"statefulset": f"{namespace}/{name}", "uid": req.uid, "operation": req.operation}
    if req.operation not in ("CREATE", "UPDATE") or req.sub_resource or not obj:
        log.debug("not a StatefulSet CREATE/UPDATE, allowed", extra=ctx)
        return Verdict(allowed=True)

    spec = dict_at(obj, "spec", "spec", req.uid)
    template = dict_at(spec, "template", "spec.template", req.uid)
    template_meta = dict_at(template, "metadata", "spec.template.metadata", req.uid)
    annotations = str_dict_at(template_meta, "annotations", "spec.template.metadata.annotations", req.uid)
    text = map_text({"annotations": annotations})
    if text is None:
        own = str_dict_at(metadata, "annotations", "metadata.annotations", req.uid)
        if ANNOTATION in own:
            log.info("map on the StatefulSet itself, not on its pod template", extra=ctx)
            return Verdict(
                allowed=True,
                warnings=[
                    f"{ANNOTATION} is on the StatefulSet's metadata, where it has no effect: move it to "
                    "spec.template.metadata.annotations so every pod carries it"
                ],
            )
        log.debug("no %s annotation on the pod template, allowed", ANNOTATION, extra=ctx)
        return Verdict(allowed=True)

    try:
        smap = parse_cached(text)
    except MapError as exc:
        log.info("denied: malformed map", extra={**ctx, "error": str(exc)})
        where = "spec.template.metadata.annotations"
        return Verdict.deny(400, f"invalid {ANNOTATION} annotation in {where}: {exc}")

    pod_spec = dict_at(template, "spec", "spec.template.spec", req.uid)
    warnings: list[str] = []
    denial, warning = gpu_resource_policy(
        pod_spec, "spec.template.spec", req.uid, settings.gpu_resource_policy, "the pod template", log, ctx
    )
    if denial:
        return denial
    if warning:
        warnings.append(warning)

    replicas = _int_at(spec, "replicas", 1, "spec.replicas", req.uid)
    ordinals = dict_at(spec, "ordinals", "spec.ordinals", req.uid)
    start = _int_at(ordinals, "start", 0, "spec.ordinals.start", req.uid)
    count, first = missing_ordinals(smap, start, replicas)
    if count:
        shown = ", ".join(map(str, first)) + (f" and {count - len(first)} more" if count > len(first) else "")
        warnings.append(
            f"{ANNOTATION} has no entry for ordinal {shown} ({count} of {replicas} replicas): "
            "those pods get no GPU variables from the map"
        )

    warnings.extend(placement_warnings(pod_spec, settings.scheduler_name))

    warnings.extend(node_warnings(smap, nodes, ctx))
    log.info("allowed", extra={**ctx, "replicas": replicas, "entries": len(smap), "warnings": warnings})
    return Verdict(allowed=True, warnings=limit_warnings(warnings))


def limit_warnings(warnings: list[str]) -> list[str]:
    """At most MAX_WARNINGS warnings of at most MAX_WARNING characters each (the rest is in the log)."""
    short = [w if len(w) <= MAX_WARNING else w[: MAX_WARNING - 3] + "..." for w in warnings]
    if len(short) <= MAX_WARNINGS:
        return short
    extra = len(short) - MAX_WARNINGS + 1
    return [*short[: MAX_WARNINGS - 1], f"... and {extra} more warnings (see the webhook's log)"]
