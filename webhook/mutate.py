"""``POST /mutate``: give every container of a mapped pod the GPUs its map entry names.

The pod's entry comes from :func:`gpu_scheduling.podinfo.entry_for` (the one map
grammar); this module only turns it into a JSONPatch. The patch is computed
from what the pod already holds, so a second call on a mutated pod yields no
patch (safe with ``reinvocationPolicy: IfNeeded``).
"""

from __future__ import annotations

import logging
from typing import Any

from gpu_scheduling.injection import desired_env
from gpu_scheduling.podinfo import entry_for, map_text
from gpu_scheduling.schedmap import ANNOTATION, MapError, excerpt
from webhook.podspec import MAX_WARNING, containers, gpu_resource_policy
from webhook.review import BadRequest, Request, Verdict, dict_at, list_at, str_dict_at
from webhook.settings import Settings

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


def other_scheduler_warning(scheduler: str, ours: str) -> str:
    """Why a mapped pod of another scheduler gets no GPU variables (within MAX_WARNING characters)."""
    return (
        f"spec.schedulerName is {excerpt(scheduler, 40)!r}, not {excerpt(ours, 40)!r}: {ANNOTATION} ignored, "
        "no GPU variables set (the map's GPU indices would be used on whatever node that scheduler "
        f"picks); set spec.schedulerName: {excerpt(ours, 40)}"
    )[:MAX_WARNING]


def admit_pod(req: Request, settings: Settings) -> Verdict:
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
    if map_text({"annotations": annotations}) is None:
        log.debug("no %s annotation, allowed unchanged", ANNOTATION, extra=ctx)
        return Verdict(allowed=True)
    spec = dict_at(obj, "spec", "spec", req.uid)

    node_name = spec.get("nodeName")
    if node_name:
        log.info("denied: spec.nodeName set on a mapped pod", extra={**ctx, "node": excerpt(str(node_name))})
        return Verdict.deny(
            403,
            f"spec.nodeName is set ({excerpt(str(node_name))!r}) on a pod carrying {ANNOTATION}: such a pod "
            f"bypasses the scheduler, so its GPUs could be given twice; {settings.scheduler_name} binds it to "
            "the node its map names. Remove spec.nodeName",
        )
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if scheduler != settings.scheduler_name:
        log.info(
            "another scheduler, allowed unchanged",
            extra={**ctx, "scheduler_name": excerpt(str(scheduler))},
        )
        return Verdict(
            allowed=True, warnings=[other_scheduler_warning(str(scheduler), settings.scheduler_name)]
        )

    try:
        ordinal, entry = entry_for({"name": name, "labels": labels, "annotations": annotations}, name=name)
    except MapError as exc:
        message = f"invalid {ANNOTATION} annotation: {exc}"
        log.info("denied: malformed map", extra={**ctx, "error": str(exc)})
        return Verdict.deny(400, message)

    warnings: list[str] = []
    denial, warning = gpu_resource_policy(
        spec, "spec", req.uid, settings.gpu_resource_policy, "this pod", log, ctx
    )
    if denial:
        return denial
    if warning:
        warnings.append(warning)

    if ordinal is None:
        warnings.append(
            f"{ANNOTATION}: cannot tell pod {name or '(no name yet)'!r}'s ordinal (no "
            "apps.kubernetes.io/pod-index label, no trailing -N in its name); no GPU variables set"
        )
        log.info("no ordinal, allowed unchanged", extra=ctx)
        return Verdict(allowed=True, warnings=warnings)
    if entry is None:
        warnings.append(f"{ANNOTATION} has no entry for ordinal {ordinal}; no GPU variables set")
        log.info("no map entry for ordinal, allowed unchanged", extra={**ctx, "ordinal": ordinal})
        return Verdict(allowed=True, warnings=warnings)

    desired = desired_env(entry, settings.injection_mode)
    patch = env_patch(spec, desired, req.uid)
    log.info(
        "patched" if patch else "already carries its GPU variables, no patch",
        extra={**ctx, "ordinal": ordinal, "entry": str(entry), "env": dict(desired), "ops": len(patch)},
    )
    return Verdict(allowed=True, patch=patch, warnings=warnings)
