"""``POST /validate``: check a StatefulSet's map when it is created or updated.

A map that does not parse is refused (the message names the lines), so the
mistake shows at ``kubectl apply`` instead of as FailedCreate events later. A map that
shares GPUs (several entries name one) is admitted with a warning naming each shared GPU, or
refused where sharing is forbidden (``GPU_SCHEDULER_ALLOW_SHARING=false``, or a
GPUPinningPolicy's ``spec.allowSharedGPUs: false``).
Everything else that looks wrong but might be intended (a replica without an
entry, a node that does not exist yet, a GPU index beyond what the node
advertises) is an admission warning: ``kubectl`` prints it as ``Warning: ...``.
The rules and their messages are :mod:`kube_gpu_scheduler.domain.rules`; this module
reads the request and translates findings into a denial or warnings.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kube_gpu_scheduler.domain.injection import foreign_runtime_class
from kube_gpu_scheduler.domain.mapcache import parse_cached
from kube_gpu_scheduler.domain.podinfo import map_text
from kube_gpu_scheduler.domain.rules import (
    Finding,
    entries_by_node,
    gpus_shared,
    invalid_map,
    map_node_findings,
    map_not_on_template,
    pci_needs_dra,
    pod_template_findings,
    replica_findings,
    runtime_class_conflict,
    sharing_forbidden,
)
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, MapError, SchedulingMap
from kube_gpu_scheduler.domain.sharing import RELEASE_FORBIDS
from kube_gpu_scheduler.webhook.nodes import NodeLookup, NodeLookupUnavailable
from kube_gpu_scheduler.webhook.podspec import MAX_WARNING, gpu_resource_policy
from kube_gpu_scheduler.webhook.review import BadRequest, Request, Verdict, dict_at, str_dict_at
from kube_gpu_scheduler.webhook.settings import Settings
from kube_gpu_scheduler.webhook.tenancy import GrantsLookup, grant_findings

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


def node_findings(smap: SchedulingMap, nodes: NodeLookup, ctx: dict[str, Any]) -> list[Finding]:
    """The map's node rules (:func:`kube_gpu_scheduler.domain.rules.map_node_findings`) from the node cache.

    Look-ups are bounded in count and time; an unavailable cache skips them (nothing here may
    make an admission fail).
    """
    findings: list[Finding] = []
    by_node = entries_by_node(smap)
    deadline = time.monotonic() + NODE_LOOKUP_BUDGET_S
    for count, (node, entries) in enumerate(by_node.items()):
        if count >= MAX_NODE_LOOKUPS or time.monotonic() > deadline:
            log.debug("node checks stopped early", extra={**ctx, "checked": count, "nodes": len(by_node)})
            break
        try:
            info = nodes.get(node)
        except NodeLookupUnavailable as exc:
            log.debug("node checks skipped: %s", exc, extra=ctx)
            break
        findings.extend(map_node_findings(node, entries, info is not None, info.gpus if info else None))
    return findings


def admit_statefulset(
    req: Request, settings: Settings, nodes: NodeLookup, grants: GrantsLookup | None = None
) -> Verdict:
    """Decide on a StatefulSet CREATE or UPDATE: deny a malformed map (with tenancy, one naming a
    node no GPUPinningPolicy grants the namespace), warn about the rest."""
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
            return allow(ctx, [map_not_on_template("StatefulSet")])
        log.debug("no %s annotation on the pod template, allowed", ANNOTATION, extra=ctx)
        return Verdict(allowed=True)

    pod_spec = dict_at(template, "spec", "spec.template.spec", req.uid)
    if pod_spec.get("schedulerName") != settings.scheduler_name:
        # Not this scheduler's map (none reads it, or another release's: the webhook
        # configuration sends only the former): said so, and not parsed, so that N releases
        # side by side cost what one does. Its own release checks it.
        return allow(ctx, pod_template_findings(pod_spec, settings.scheduler_name, "spec.template.spec"))

    try:
        smap = parse_cached(text)
    except MapError as exc:
        invalid = invalid_map(exc, "spec.template.metadata.annotations")
        log.info("denied: malformed map", extra={**ctx, "error": str(exc), "reasons": [invalid.reason]})
        return Verdict.deny(400, invalid.message)

    # PCI bus IDs (another release, which does not look here, may run in DRA mode).
    needs_dra = pci_needs_dra(smap.values())
    if needs_dra:
        log.info("denied: %s", needs_dra[0].reason, extra={**ctx, "reasons": [needs_dra[0].reason]})
        return Verdict.deny(400, needs_dra[0].message)
    # Sharing forbidden for the release (another release may allow it).
    forbidden = [] if settings.allow_sharing else sharing_forbidden(smap, RELEASE_FORBIDS)
    if forbidden:
        log.info("denied: %s", forbidden[0].reason, extra={**ctx, "reasons": [forbidden[0].reason]})
        return Verdict.deny(403, forbidden[0].message)
    ungranted = grant_findings(smap, namespace, grants)
    if ungranted:
        log.info("denied: %s", ungranted[0].reason, extra={**ctx, "reasons": [ungranted[0].reason]})
        return Verdict.deny(403, ungranted[0].message)

    # nvidia-cdi mode: every replica of this scheduler would be refused for its RuntimeClass.
    foreign = foreign_runtime_class(pod_spec, settings.injection_mode, settings.runtime_class_name)
    if foreign is not None:
        refusal = runtime_class_conflict(foreign, settings.runtime_class_name, "spec.template.spec")
        log.info("denied: %s", refusal.reason, extra={**ctx, "reasons": [refusal.reason]})
        return Verdict.deny(403, refusal.message)
    denial, findings = gpu_resource_policy(
        pod_spec, "spec.template.spec", req.uid, settings.gpu_resource_policy, "the pod template", log, ctx
    )
    if denial:
        return denial
    replicas = _int_at(spec, "replicas", 1, "spec.replicas", req.uid)
    ordinals = dict_at(spec, "ordinals", "spec.ordinals", req.uid)
    start = _int_at(ordinals, "start", 0, "spec.ordinals.start", req.uid)
    findings += gpus_shared(smap)
    findings += replica_findings(smap, start, replicas)
    findings += pod_template_findings(pod_spec, settings.scheduler_name, "spec.template.spec")
    findings += node_findings(smap, nodes, ctx)
    return allow({**ctx, "replicas": replicas, "entries": len(smap)}, findings)


def allow(ctx: dict[str, Any], findings: list[Finding]) -> Verdict:
    """Allow, with each finding as a warning (logged with its reason)."""
    warnings = [f.message for f in findings]
    log.info("allowed", extra={**ctx, "warnings": warnings, "reasons": [f.reason for f in findings]})
    return Verdict(allowed=True, warnings=limit_warnings(warnings))


def limit_warnings(warnings: list[str]) -> list[str]:
    """At most MAX_WARNINGS warnings of at most MAX_WARNING characters each (the rest is in the log)."""
    short = [w if len(w) <= MAX_WARNING else w[: MAX_WARNING - 3] + "..." for w in warnings]
    if len(short) <= MAX_WARNINGS:
        return short
    extra = len(short) - MAX_WARNINGS + 1
    return [*short[: MAX_WARNINGS - 1], f"... and {extra} more warnings (see the webhook's log)"]
