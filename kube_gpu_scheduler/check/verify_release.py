"""``verify-release``: through the API, every selected pod is Running on its mapped node with the mapped env.

In DRA mode (``--mode dra``, or in ``auto`` a pod that references its ResourceClaim), the GPUs
are the claim's allocation, so instead of CUDA_VISIBLE_DEVICES it checks that the pod and each of
its containers reference the claim ``<pod>-gpus``, that the claim is allocated exactly the
devices the pod's entry resolves to on its node (read from the node's ResourceSlices, with
kube_gpu_scheduler.domain.dra, as the scheduler resolves them) and that the claim is reserved for this pod.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.check.podcheck import env_results
from kube_gpu_scheduler.check.release_dra import DraState, dra_results, fetch_dra, pod_mode
from kube_gpu_scheduler.check.results import (
    EXIT_USAGE,
    Result,
    log,
    passed,
    report,
    verdict,
)
from kube_gpu_scheduler.check.settings import DRA_MODE
from kube_gpu_scheduler.domain.injection import CDI_GPU_PREFIX, NVIDIA_VISIBLE_DEVICES
from kube_gpu_scheduler.domain.objects import Meta, Pod
from kube_gpu_scheduler.domain.podinfo import ordinal_of
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, MapError, SchedulingMap, parse
from kube_gpu_scheduler.kube.client import KubeConfigError, load_client
from kube_gpu_scheduler.kube.errors import api_error


@dataclass
class PodRow:
    name: str
    ordinal: int | None
    phase: str
    node: str | None
    expected_node: str | None
    devices: str | None
    expected_devices: str | None
    ok: bool


def _container_env(container: Mapping[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for var in container.get("env") or []:
        name = var.get("name")
        if name:
            # valueFrom is not what the webhook writes: it shows as None and fails the comparison.
            out[name] = var.get("value") if "valueFrom" not in var else None
    return out


def _detect_mode(env: Mapping[str, str | None], mode: str) -> str:
    if mode != "auto":
        return mode
    visible = env.get(NVIDIA_VISIBLE_DEVICES)
    if visible is not None and visible.startswith(CDI_GPU_PREFIX):
        return "nvidia-cdi"
    return "nvidia" if NVIDIA_VISIBLE_DEVICES in env else "cuda"


def _parse_or_none(text: str | None) -> SchedulingMap | None:
    if text is None:
        return None
    try:
        return parse(text)
    except MapError:
        return None


def _owner_of(pod: Mapping[str, Any]) -> str | None:
    """Name of the StatefulSet that controls ``pod``, if one does."""
    return Pod(pod).owner_of_kind("StatefulSet")


def _map_of(obj: Mapping[str, Any]) -> str | None:
    value = Meta(obj).annotations.get(ANNOTATION)
    return value if isinstance(value, str) else None


REVISION_LABEL = "controller-revision-hash"


def revision_result(
    pod: Mapping[str, Any], owner: Mapping[str, Any], ordinal: int | None, who: str
) -> Result | None:
    """The pod is of its StatefulSet's update revision, where the update strategy says it must
    be by now (RollingUpdate, at or above the partition); None where no revision is expected.

    A changed map is not the only change a release makes: an image, an env, a resource. A pod
    of the previous revision with the same map would otherwise pass for the new release."""
    spec, status = owner.get("spec") or {}, owner.get("status") or {}
    strategy = spec.get("updateStrategy") or {}
    if strategy.get("type") == "OnDelete" or ordinal is None:
        return None  # the operator decides when each pod moves
    if ordinal < ((strategy.get("rollingUpdate") or {}).get("partition") or 0):
        return None  # the partition keeps it at the current revision
    generation = Meta(owner).meta.get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return Result(
            "pod:revision",
            f"StatefulSet generation {generation} observed by its controller",
            observed,
            False,
            who,
        )
    update = status.get("updateRevision")
    if not update:
        return None
    have = Meta(pod).labels.get(REVISION_LABEL)
    return Result("pod:revision", update, have, have == update, who, {"label": REVISION_LABEL})


def evaluate_release(
    pods: Sequence[Mapping[str, Any]],
    owners: Mapping[str, Mapping[str, Any] | None],
    namespace: str,
    mode: str = "auto",
    owner_errors: Mapping[str, str] | None = None,
    dra_state: DraState | None = None,
) -> tuple[list[Result], list[PodRow]]:
    """Pure logic of verify-release: pods and their owning StatefulSets (by name) as API dicts;
    in DRA mode also the pods' claims and the ResourceSlices (``dra_state``)."""
    results: list[Result] = []
    rows: list[PodRow] = []
    # A pod with no map and no owning StatefulSet is not part of the placement (the
    # `helm test` pod itself carries the release's labels): leave it out.
    placed = [p for p in pods if _owner_of(p) is not None or _map_of(p) is not None]
    for p in pods:
        if p not in placed:
            log.debug(
                "ignoring pod without a map",
                extra={"pod": f"{namespace}/{Pod(p).name}"},
            )
    pods = placed
    if not pods:
        results.append(Result("pods", "at least one pod with a map", 0, False, f"{namespace}/-"))
        return results, rows
    seen: dict[str, set[int]] = {}
    for pod in sorted(pods, key=lambda p: str(Pod(p).name)):
        view = Pod(pod)
        meta, spec, status = view.meta, view.spec, view.status
        name = str(view.name)
        who = f"{view.namespace or namespace}/{name}"
        before = len(results)
        owner_name = _owner_of(pod)
        pod_text = _map_of(pod)
        owner = owners.get(owner_name) if owner_name else None
        if owner is not None:
            want_text = Meta(Meta(owner).spec.get("template")).annotations.get(ANNOTATION)
            source = f"StatefulSet {owner_name}"
        else:
            want_text = pod_text
            source = "the pod's annotation"
        ordinal = ordinal_of(name, meta.get("labels"))
        if owner_name and ordinal is not None and not meta.get("deletionTimestamp"):
            seen.setdefault(owner_name, set()).add(ordinal)
        try:
            smap = parse(want_text) if isinstance(want_text, str) else None
        except MapError as err:
            results.append(
                Result("map", f"a valid map in {source}", want_text, False, who, {"detail": str(err)})
            )
            smap = None
        if smap is None:
            if len(results) == before:
                results.append(Result("map", f"a map in {source}", None, False, who))
            rows.append(
                PodRow(
                    name, ordinal, status.get("phase") or "?", spec.get("nodeName"), None, None, None, False
                )
            )
            continue
        if owner is not None:
            # A pod from an older revision still carries the older map: not converged yet.
            results.append(Result("pod:map", smap.format(), pod_text, _parse_or_none(pod_text) == smap, who))
            revision = revision_result(pod, owner, ordinal, who)
            if revision is not None:
                results.append(revision)
        entry = smap.get(ordinal) if ordinal is not None else None
        results.append(
            Result(
                "ordinal",
                "an entry for the pod's ordinal",
                {"ordinal": ordinal, "entry": str(entry) if entry else None},
                entry is not None,
                who,
            )
        )
        phase = "Terminating" if meta.get("deletionTimestamp") else (status.get("phase") or "Pending")
        results.append(Result("phase", "Running", phase, phase == "Running", who))
        node = spec.get("nodeName")
        devices_shown: str | None = None
        expected_devices = entry.devices if entry else None
        checked_as = pod_mode(pod, mode)
        if entry is not None and checked_as == DRA_MODE:
            results.append(Result("node", entry.node, node, node == entry.node, who))
            found, devices_shown, expected_devices = dra_results(
                pod, entry, who, dra_state or DraState(), smap
            )
            results.extend(found)
            for container in spec.get("containers") or []:
                for r in env_results(entry, DRA_MODE, _container_env(container), who):
                    r.extra.update({"container": container.get("name"), "mode": DRA_MODE})
                    results.append(r)
        elif entry is not None:
            results.append(Result("node", entry.node, node, node == entry.node, who))
            if entry.count:  # a count entry names no GPU: only DRA mode gives it GPUs
                why = f"entry '{entry}' asks for a count of GPUs, which only DRA mode (dra.enabled) gives"
                results.append(Result("mode", DRA_MODE, checked_as, False, who, {"why": why}))
            for container in [] if entry.count else spec.get("containers") or []:
                env = _container_env(container)
                cmode = _detect_mode(env, mode)
                devices_shown = devices_shown or env.get("CUDA_VISIBLE_DEVICES")
                for r in env_results(entry, cmode, env, who):
                    r.extra.update({"container": container.get("name"), "mode": cmode})
                    results.append(r)
        ok = all(r.ok is not False for r in results[before:])
        rows.append(
            PodRow(
                name,
                ordinal,
                phase,
                node,
                entry.node if entry else None,
                devices_shown,
                expected_devices,
                ok,
            )
        )
    for owner_name, owner in sorted(owners.items()):
        if owner is None:
            results.append(
                Result(
                    "statefulset",
                    f"StatefulSet {owner_name} readable",
                    (owner_errors or {}).get(owner_name),
                    False,
                    f"{namespace}/{owner_name}",
                    {"why": "its spec.replicas is the expected replica count"},
                )
            )
            continue
        spec = owner.get("spec") or {}
        replicas = spec.get("replicas", 1)
        start = (spec.get("ordinals") or {}).get("start", 0)
        want = list(range(start, start + replicas))
        have = sorted(seen.get(owner_name, set()))
        results.append(
            Result("replicas", want, have, have == want, f"{namespace}/{owner_name}", {"kind": "StatefulSet"})
        )
    return results, rows


def _print_rows(rows: Sequence[PodRow]) -> None:
    table = [("POD", "ORDINAL", "PHASE", "NODE", "WANT-NODE", "GPUS", "WANT-GPUS", "OK")]
    for r in rows:
        table.append(
            (
                r.name,
                "-" if r.ordinal is None else str(r.ordinal),
                r.phase,
                r.node or "-",
                r.expected_node or "-",
                r.devices or "-",
                r.expected_devices or "-",
                "yes" if r.ok else "NO",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@dataclass
class _Fetched:
    pods: list[dict[str, Any]]
    owners: dict[str, Mapping[str, Any] | None]
    owner_errors: dict[str, str]
    forbidden: bool  # a 401/403: waiting will not help
    dra_state: DraState | None = None


def _fetch_release(
    api: Any, core: Any, apps: Any, namespace: str, selector: str, mode: str = "auto"
) -> _Fetched:
    """The selected pods and their owning StatefulSets, as API-shaped dicts (camelCase keys);
    in DRA mode also their claims and the ResourceSlices."""
    pods: list[dict[str, Any]] = (
        api.sanitize_for_serialization(core.list_namespaced_pod(namespace, label_selector=selector)).get(
            "items"
        )
        or []
    )
    out = _Fetched(pods, {}, {}, forbidden=False)
    for pod in pods:
        name = _owner_of(pod)
        if name is None or name in out.owners:
            continue
        try:
            out.owners[name] = api.sanitize_for_serialization(
                apps.read_namespaced_stateful_set(name, namespace)
            )
        except ApiException as err:
            out.owners[name] = None
            out.owner_errors[name] = f"{err.status} {err.reason}: get statefulsets.apps {namespace}/{name}"
            out.forbidden = out.forbidden or api_error(err).denied
    if any(pod_mode(p, mode) == DRA_MODE for p in pods):
        out.dra_state, denied = fetch_dra(api, pods, namespace)
        out.forbidden = out.forbidden or denied
    return out


# What a kubelet keeps of a termination message (bytes).
TERMINATION_MESSAGE_LIMIT = 4096


def failure_summary(results: Sequence[Result]) -> str:
    """One line naming every failing replica and what is wrong with it, e.g.
    ``gpu-scheduler-check-1: node want node9 got None, phase want Running got Pending``:
    the container's termination message, which Argo CD shows for a failed hook."""
    by_pod: dict[str, list[str]] = {}
    for r in results:
        if r.ok is False:
            name = r.pod.rsplit("/", 1)[-1]
            by_pod.setdefault(name, []).append(f"{r.check} want {r.expected} got {r.actual}")
    if not by_pod:
        return "release matches its maps"
    text = "placement wrong: " + "; ".join(f"{pod}: {', '.join(w)}" for pod, w in sorted(by_pod.items()))
    raw = text.encode()
    return (
        text
        if len(raw) <= TERMINATION_MESSAGE_LIMIT
        else raw[: TERMINATION_MESSAGE_LIMIT - 3].decode(errors="ignore") + "..."
    )


def _write_termination_message(path: str | None, text: str) -> None:
    """Write ``text`` into ``path`` if that file exists (in a pod the kubelet creates
    /dev/termination-log; elsewhere nothing is created)."""
    if not path or not os.path.isfile(path):
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:  # a read-only or missing path must not change the verdict
        log.warning("cannot write the termination message", extra={"path": path, "error": str(err)})


def cmd_verify_release(args: argparse.Namespace) -> int:
    from kubernetes.client import AppsV1Api, CoreV1Api

    try:
        api = load_client(args.kubeconfig, user_agent="gpu-scheduler-check")
    except KubeConfigError as err:  # no kubeconfig, no in-cluster token, unreadable file...
        log.error(
            "cannot configure the Kubernetes client", extra={"error": f"{err.__class__.__name__}: {err}"}
        )
        return EXIT_USAGE
    core, apps = CoreV1Api(api), AppsV1Api(api)
    deadline = time.monotonic() + args.timeout
    ctx = {"namespace": args.namespace, "selector": args.selector}
    results: list[Result] = []
    rows: list[PodRow] = []
    while True:
        try:
            got = _fetch_release(api, core, apps, args.namespace, args.selector, args.mode)
            results, rows = evaluate_release(
                got.pods, got.owners, args.namespace, args.mode, got.owner_errors, got.dra_state
            )
            if got.forbidden:
                break  # permissions will not change while we wait
        except ApiException as err:
            results = [
                Result(
                    "api",
                    "pods listed",
                    f"{err.status} {err.reason}",
                    False,
                    f"{args.namespace}/-",
                    {"detail": (err.body or "")[:500] if isinstance(err.body, str) else None},
                )
            ]
            rows = []
            if api_error(err).denied:
                break  # permissions will not change while we wait
        except Exception as err:  # connection refused while the apiserver restarts, and the like
            results = [
                Result("api", "pods listed", f"{err.__class__.__name__}: {err}", False, f"{args.namespace}/-")
            ]
            rows = []
        if passed(results) or time.monotonic() >= deadline:
            break
        failing = [f"{r.pod} {r.check}" for r in results if r.ok is False]
        log.info("waiting for the release to converge", extra={**ctx, "failing": failing[:20]})
        time.sleep(min(args.interval, max(0.0, deadline - time.monotonic())))
    ok = report(results)
    if rows:
        _print_rows(rows)
    _write_termination_message(getattr(args, "termination_message_path", None), failure_summary(results))
    return verdict(
        ok,
        "release matches its maps",
        "release does NOT match its maps",
        {**ctx, "ok": ok, "pods": len(rows)},
    )
