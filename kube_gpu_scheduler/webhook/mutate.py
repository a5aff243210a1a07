"""``POST /mutate``: give every container of a mapped pod the GPUs its map entry names.

The pod's entry, and every rule about it, comes from :mod:`kube_gpu_scheduler.domain.rules`
(the scheduler's own :func:`~kube_gpu_scheduler.domain.rules.resolve`); this module turns
the entry into a JSONPatch and the findings into a denial or warnings. The patch is computed
from what the pod already holds, so a second call on a mutated pod yields no
patch (safe with ``reinvocationPolicy: IfNeeded``).
"""

from __future__ import annotations

import logging
from typing import Any

from kube_gpu_scheduler.domain.injection import desired_env, foreign_runtime_class, runtime_class_for
from kube_gpu_scheduler.domain.mapcache import parse_cached
from kube_gpu_scheduler.domain.podinfo import map_text
from kube_gpu_scheduler.domain.rules import (
    INVALID_MAP,
    Finding,
    gpus_shared,
    node_name_on_pod,
    other_scheduler,
    pci_needs_dra,
    resolve,
    runtime_class_conflict,
    sharing_forbidden,
)
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, excerpt
from kube_gpu_scheduler.domain.sharing import RELEASE_FORBIDS
from kube_gpu_scheduler.webhook.podspec import MAX_WARNING, containers, gpu_resource_policy
from kube_gpu_scheduler.webhook.review import BadRequest, Request, Verdict, dict_at, list_at, str_dict_at
from kube_gpu_scheduler.webhook.settings import Settings
from kube_gpu_scheduler.webhook.tenancy import GrantsLookup, created_by_statefulset_controller, grant_findings

log = logging.getLogger("webhook.mutate")


def env_patch(spec: dict[str, Any], desired: list[tuple[str, str]], uid: str) -> list[dict[str, Any]]:
    """JSONPatch operations that make every (init) container's env hold ``desired``.

    * no ``env``: add it, holding the variables;
    * a variable present with another value, or set through ``valueFrom``: replace that
      item in place (every occurrence, should the name be listed twice);
    * a variable missing: insert it at the front, in ``desired`` order, so that other
      variables can refer to it as ``$(CUDA_VISIBLE_DEVICES)``; the others keep their order.

    Replacements address the original indices and come before the insertions.
    """
    ops: list[dict[str, Any]] = []
    for list_name, index, container in containers(spec, "spec", uid):
        base = f"/spec/{list_name}/{index}/env"
        env = list_at(container, "env", f"spec.{list_name}[{index}].env", uid)
        if env is None:
            ops.append({"op": "add", "path": base, "value": [{"name": n, "value": v} for n, v in desired]})
            continue
        missing: list[tuple[str, str]] = []
        for name, value in desired:
            found = False
            for pos, item in enumerate(env):
                if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                    where = f"spec.{list_name}[{index}].env[{pos}]"
                    raise BadRequest(f"{where} must be an object with a name", uid=uid)
                if item["name"] != name:
                    continue
                found = True
                plain = {"name": name, "value": value}
                if item != plain:
                    ops.append({"op": "replace", "path": f"{base}/{pos}", "value": plain})
            if not found:
                missing.append((name, value))
        ops.extend(
            {"op": "add", "path": f"{base}/{pos}", "value": {"name": n, "value": v}}
            for pos, (n, v) in enumerate(missing)
        )
    return ops


def admit_pod(req: Request, settings: Settings, grants: GrantsLookup | None = None) -> Verdict:
    """Decide on a Pod CREATE: patch, allow unchanged with a warning, or deny.

    A mapped pod is denied when it names its node (spec.nodeName: it would skip
    the scheduler's checks) and left unchanged, with a warning, when another
    scheduler places it (the map's GPU indices mean nothing on that node).
    """
    if (req.group, req.version, req.kind) != ("", "v1", "Pod"):
        raise BadRequest(f"/mutate admits v1 Pods, got {req.gvk}: check the webhook's rules", uid=req.uid)
    obj = req.object or {}
    metadata = dict_at(obj, "metadata", "metadata", req.uid)
    labels = str_dict_at(metadata, "labels", "metadata.labels", req.uid)
    annotations = str_dict_at(metadata, "annotations", "metadata.annotations", req.uid)
    name = req.name or str(metadata.get("name") or "")
    namespace = req.namespace or str(metadata.get("namespace") or "")
    ctx = {"pod": f"{namespace}/{name or metadata.get('generateName') or '?'}", "uid": req.uid}

    if req.operation != "CREATE" or req.sub_resource:
        log.debug("not a pod CREATE, allowed unchanged", extra={**ctx, "operation": req.operation})
        return Verdict(allowed=True)
    text = map_text({"annotations": annotations})
    if text is None:
        log.debug("no %s annotation, allowed unchanged", ANNOTATION, extra=ctx)
        return Verdict(allowed=True)
    spec = dict_at(obj, "spec", "spec", req.uid)

    node_name = spec.get("nodeName")
    if node_name:
        bypass = node_name_on_pod(str(node_name), settings.scheduler_name)
        log.info(
            "denied: spec.nodeName set on a mapped pod",
            extra={**ctx, "node": excerpt(str(node_name)), "reasons": [bypass.reason]},
        )
        return Verdict.deny(403, bypass.message)
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if scheduler != settings.scheduler_name:
        other = other_scheduler(str(scheduler), settings.scheduler_name, MAX_WARNING)
        log.info(
            "another scheduler, allowed unchanged",
            extra={**ctx, "scheduler_name": excerpt(str(scheduler)), "reasons": [other.reason]},
        )
        return Verdict(allowed=True, warnings=[other.message])
    # nvidia-cdi mode: a pod naming another RuntimeClass would get no GPU under it (or a sandbox
    # chosen for it would be dropped): refused whatever its map says.
    foreign = foreign_runtime_class(spec, settings.injection_mode, settings.runtime_class_name)
    if foreign is not None:
        refusal = runtime_class_conflict(foreign, settings.runtime_class_name, "spec")
        log.info(
            "denied: the pod names another RuntimeClass",
            extra={**ctx, "runtime_class": excerpt(foreign), "reasons": [refusal.reason]},
        )
        return Verdict.deny(403, refusal.message)

    decision = resolve({"metadata": {"name": name, "labels": labels, "annotations": annotations}})
    if decision.reason == INVALID_MAP:
        log.info("denied: malformed map", extra={**ctx, "error": decision.message, "reasons": [INVALID_MAP]})
        return Verdict.deny(400, decision.message)

    # A map that names a GPU by PCI bus ID: no variable can give it (outside DRA mode).
    needs_dra = pci_needs_dra(parse_cached(text).values())
    if needs_dra:
        log.info("denied: %s", needs_dra[0].reason, extra={**ctx, "reasons": [needs_dra[0].reason]})
        return Verdict.deny(400, needs_dra[0].message)
    # A bare pod's map is checked as a StatefulSet's is (the StatefulSet controller's pods carry a
    # template /validate checked): shared GPUs where sharing is forbidden are refused, else said;
    # with tenancy, a node no policy grants the namespace is refused.
    bare = not created_by_statefulset_controller(req)
    if bare and not settings.allow_sharing:
        forbidden = sharing_forbidden(parse_cached(text), RELEASE_FORBIDS)
        if forbidden:
            log.info("denied: %s", forbidden[0].reason, extra={**ctx, "reasons": [forbidden[0].reason]})
            return Verdict.deny(403, forbidden[0].message)
    if grants is not None and bare:
        ungranted = grant_findings(parse_cached(text), namespace, grants)
        if ungranted:
            log.info("denied: %s", ungranted[0].reason, extra={**ctx, "reasons": [ungranted[0].reason]})
            return Verdict.deny(403, ungranted[0].message)

    denial, findings = gpu_resource_policy(
        spec, "spec", req.uid, settings.gpu_resource_policy, "this pod", log, ctx
    )
    if denial:
        return denial
    if bare:
        findings += gpus_shared(parse_cached(text))
    entry = decision.entry
    if entry is None:
        # NoOrdinal, OrdinalNotInMap: the pod is let in, the scheduler will say the same.
        findings += [Finding(r.reason, f"{r.message}; no GPU variables set") for r in decision.refusals]
        warnings = [f.message[:MAX_WARNING] for f in findings]
        log.info(
            "no map entry for the pod, allowed unchanged",
            extra={**ctx, "ordinal": decision.ordinal, "reasons": [f.reason for f in findings]},
        )
        return Verdict(allowed=True, warnings=warnings)

    desired = desired_env(entry, settings.injection_mode)
    patch = env_patch(spec, desired, req.uid)
    runtime_class = runtime_class_for(settings.injection_mode, settings.runtime_class_name)
    if runtime_class is not None and spec.get("runtimeClassName") != runtime_class:
        patch.append({"op": "add", "path": "/spec/runtimeClassName", "value": runtime_class})
    log.info(
        "patched" if patch else "already carries its GPU variables, no patch",
        extra={
            **ctx,
            "ordinal": decision.ordinal,
            "entry": str(entry),
            "env": dict(desired),
            **({"runtime_class": runtime_class} if runtime_class else {}),
            "ops": len(patch),
            "reasons": [f.reason for f in findings],
        },
    )
    return Verdict(allowed=True, patch=patch, warnings=[f.message for f in findings])
