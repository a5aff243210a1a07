"""``wait-ready``: wait until the placement path really works, before the check's pods exist.

Ready means both of:

1. **a scheduler holds its Lease**: the Lease (``--lease-namespace``/``--lease-name``, the
   scheduler chart's leader election) has a ``holderIdentity``, and its ``renewTime`` is
   within its ``leaseDurationSeconds`` of this process's clock, or the record changed
   less than ``leaseDurationSeconds`` ago as observed here (so a node whose clock is off
   does not keep a working scheduler from counting);
2. **the webhook injects**: a server-side dry-run create (``dryRun=All``) of a pod
   carrying the map annotation, the scheduler's ``schedulerName`` and the pod-index
   label of the map's lowest ordinal comes back with that entry's variables
   (``CUDA_VISIBLE_DEVICES``/``CUDA_DEVICE_ORDER``, and ``NVIDIA_VISIBLE_DEVICES`` in
   ``nvidia`` mode; in ``dra`` mode, the reference to its ResourceClaim and
   ``CUDA_DEVICE_ORDER`` alone). The apiserver runs the mutating webhooks of a dry-run request
   (the chart's declares ``sideEffects: None``) and stores nothing.

Why the check chart runs this first (a Helm pre-install/pre-upgrade hook, an Argo CD
Sync hook in wave "-1"), instead of trusting the order it is installed in: Argo CD's
RollingSync can count the scheduler's step complete on the previous revision's
Synced/Healthy (argo-cd issue 29410), and a Healthy webhook Deployment says nothing
of whether cert-manager's cainjector has filled the ``caBundle`` the apiserver needs
to call it.

Every poll logs what is still missing, in words, and the last line the verdict (ready after
how long, or what was still missing at the timeout). A failure's verdict also goes into
``--termination-message-path``, which Argo CD shows for a failed hook and ``kubectl describe
pod`` for a Helm hook; a success writes nothing there (see :func:`cmd_wait_ready`).
"""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kube_gpu_scheduler.check.lease import LeaseTracker, LeaseView, lease_problem
from kube_gpu_scheduler.check.results import EXIT_MISMATCH, EXIT_OK, EXIT_USAGE, log
from kube_gpu_scheduler.check.settings import DRA_MODE
from kube_gpu_scheduler.check.verify_release import TERMINATION_MESSAGE_LIMIT, _write_termination_message
from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.injection import (
    CUDA_DEVICE_ORDER,
    CUDA_VISIBLE_DEVICES,
    PCI_BUS_ID,
    InjectionMode,
    desired_env,
    plain_env,
    pod_containers,
)
from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, Entry, MapError, SchedulingMap, parse
from kube_gpu_scheduler.kube.client import KubeConfigError, load_client
from kube_gpu_scheduler.kube.errors import ApiError, api_error, error_message
from kube_gpu_scheduler.kube.jsonio import read_json

DEFAULT_TIMEOUT = 240.0
DEFAULT_INTERVAL = 2.0
# A 401/403 in the first seconds is waited out: Helm and Argo CD create the hook's
# RoleBindings just before its pod, and the apiserver's RBAC cache may not have them yet.
# After that a refusal will not change by waiting: the command stops with it.
DENIED_GRACE = 15.0
# One API call may not eat the whole budget.
REQUEST_TIMEOUT = (5, 15)
PROBE_LABEL = "gpu-scheduler.io/wait-ready-probe"
PROBE_PREFIX = "gpu-scheduler-wait-ready-probe-"


# ---------------------------------------------------------------- the dry-run pod (pure)
@dataclass(frozen=True)
class Target:
    """What to wait for."""

    namespace: str  # where the probe pod is dry-run created (the check's own namespace)
    lease_namespace: str
    lease_name: str  # "" skips the Lease (a scheduler running without leader election)
    scheduler_name: str
    smap: SchedulingMap
    mode: InjectionMode = "cuda"
    image: str = "gpu-scheduler-check"
    dra: bool = False  # DRA mode (--mode dra): a claim reference instead of a device list
    service_account: str = ""  # "" lets the apiserver use "default"

    @property
    def ordinal(self) -> int:
        return min(self.smap)

    @property
    def entry(self) -> Entry:
        return self.smap[self.ordinal]


def probe_pod(target: Target) -> dict[str, Any]:
    """The pod a StatefulSet replica of the map's lowest ordinal would be, as far as the
    webhook and the scheduler look: map annotation, schedulerName, pod-index label.
    Restricted security context and small requests, so that a namespace's Pod Security
    level, LimitRange or quota does not refuse it for reasons of its own."""
    ordinal = target.ordinal
    spec: dict[str, Any] = {
        "schedulerName": target.scheduler_name,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "probe",
                "image": target.image,
                "command": ["gpu-scheduler-check", "--help"],
                "resources": {
                    "requests": {"cpu": "10m", "memory": "32Mi"},
                    "limits": {"cpu": "10m", "memory": "32Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }
    if target.service_account:
        spec["serviceAccountName"] = target.service_account
    meta: dict[str, Any] = {
        # generateName: never collides with a real pod; the ordinal is the label's.
        "generateName": PROBE_PREFIX,
        "namespace": target.namespace,
        "labels": {POD_INDEX_LABEL: str(ordinal), PROBE_LABEL: "true"},
        "annotations": {ANNOTATION: target.smap.format()},
    }
    if target.dra:
        # DRA mode: the policy names the claim after the pod (<pod>-gpus), so it mutates only a
        # pod whose name is known at admission; the apiserver fills generateName later. A random
        # suffix made here does the same job (a dry-run stores nothing).
        del meta["generateName"]
        meta["name"] = PROBE_PREFIX + secrets.token_hex(4)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _shown(value: str | None) -> str:
    if value is None:
        return "(valueFrom)"
    return repr(value if len(value) <= 40 else value[:40] + "…")


def _dra_problem(pod: Mapping[str, Any], what: str) -> str | None:
    """DRA mode: the pod references its claims (its own, or where the map shares its GPUs the
    shared ones), every container lists them all and has CUDA_DEVICE_ORDER=PCI_BUS_ID and no
    CUDA_VISIBLE_DEVICES."""
    refs = dra.pod_claims(pod)
    if not refs:
        return (
            f"{what} came back without its ResourceClaim (spec.resourceClaims[name={dra.POD_CLAIM}]): "
            "the injection policy does not run in DRA mode (the scheduler chart's dra.enabled) yet"
        )
    for container in pod_containers(pod.get("spec")):
        claims = (container.get("resources") or {}).get("claims") or []
        listed = {str(c.get("name")) for c in claims if isinstance(c, Mapping)}
        if not set(refs) <= listed:
            return (
                f"{what} came back with container {container.get('name')} not listing claim "
                f"{', '.join(sorted(set(refs) - listed))}"
            )
        env = plain_env(container)
        if env.get(CUDA_DEVICE_ORDER) != PCI_BUS_ID:
            return f"{what} came back without {CUDA_DEVICE_ORDER}={PCI_BUS_ID}"
        if CUDA_VISIBLE_DEVICES in env:
            return (
                f"{what} came back with {CUDA_VISIBLE_DEVICES}={_shown(env[CUDA_VISIBLE_DEVICES])}, which DRA "
                "mode never sets (injected by something else, or the policy is not in DRA mode)"
            )
    return None


def injection_problem(
    pod: Mapping[str, Any], entry: Entry, mode: InjectionMode, ordinal: int, dra_mode: bool = False
) -> str | None:
    """None when every container of the dry-run's answer carries ``entry``'s variables for
    ``mode`` (in DRA mode: its claim, see :func:`_dra_problem`), else the first thing missing,
    in words."""
    containers = pod_containers(pod.get("spec"))
    what = f"dry-run of a mapped pod (ordinal {ordinal}, {entry})"
    if not containers:
        return f"{what} came back without containers"
    if dra_mode:
        return _dra_problem(pod, what)
    for container in containers:
        env = plain_env(container)
        for name, want in desired_env(entry, mode):
            if name not in env:
                return f"{what} came back without {name} (the webhook/policy has not injected yet)"
            if env[name] != want:
                return (
                    f"{what} came back with {name}={_shown(env[name])}, not {want!r} "
                    f"(injected by something else, or in another injection mode than {mode})"
                )
    return None


def injected_text(entry: Entry, mode: InjectionMode, dra_mode: bool = False) -> str:
    if dra_mode:
        return f"its ResourceClaim reference ({dra.POD_CLAIM}) and {CUDA_DEVICE_ORDER}={PCI_BUS_ID}"
    return ", ".join(f"{k}={v}" for k, v in desired_env(entry, mode))


# ---------------------------------------------------------------- one poll
@dataclass
class Poll:
    lease: str | None = None  # what is missing about the Lease (None: held)
    injection: str | None = None  # what is missing about the injection (None: injected)
    denied: list[str] = field(default_factory=list)  # 401/403 answers: waiting may not help
    holder: str = ""
    warnings: str = ""  # the apiserver's Warning headers on the dry-run (webhook warnings)

    @property
    def ready(self) -> bool:
        return self.lease is None and self.injection is None

    @property
    def problems(self) -> list[str]:
        return [p for p in (self.lease, self.injection) if p]


def check_lease(coord: Any, target: Target, tracker: LeaseTracker, poll: Poll, api: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    where = f"Lease {target.lease_name} in namespace {target.lease_namespace}"
    try:
        lease = api.sanitize_for_serialization(
            coord.read_namespaced_lease(
                target.lease_name, target.lease_namespace, _request_timeout=REQUEST_TIMEOUT
            )
        )
    except ApiException as err:
        kind = api_error(err)
        if kind is ApiError.NOT_FOUND:
            tracker.observe(None)
            poll.lease = lease_problem(None, target.lease_namespace, target.lease_name, datetime.now(UTC))
            return
        poll.lease = f"cannot read {where}: {error_message(err)}"
        if kind.denied:
            poll.lease += f" (the hook's Role in {target.lease_namespace} must grant get on this Lease)"
            poll.denied.append(poll.lease)
        return
    except Exception as err:  # connection refused, timeouts, TLS: the apiserver is not there yet
        poll.lease = f"cannot read {where}: {type(err).__name__}: {err}"
        return
    changed_ago = tracker.observe(lease)
    poll.holder = LeaseView.of(lease).holder
    poll.lease = lease_problem(
        lease, target.lease_namespace, target.lease_name, datetime.now(UTC), changed_ago
    )


def check_injection(core: Any, target: Target, poll: Poll) -> None:
    from kubernetes.client.exceptions import ApiException

    what = f"dry-run of a mapped pod (ordinal {target.ordinal}) in namespace {target.namespace}"
    try:
        resp = core.create_namespaced_pod(
            target.namespace,
            probe_pod(target),
            dry_run="All",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        warnings = resp.headers.get("Warning") if getattr(resp, "headers", None) is not None else None
        answer = read_json(resp)
    except ApiException as err:
        poll.injection = f"{what} was refused: {error_message(err)}"
        if api_error(err).denied:
            poll.denied.append(poll.injection)
        return
    except Exception as err:
        poll.injection = f"{what} failed: {type(err).__name__}: {err}"
        return
    poll.warnings = str(warnings or "")
    if not isinstance(answer, Mapping):
        poll.injection = f"{what} came back with no pod"
        return
    poll.injection = injection_problem(answer, target.entry, target.mode, target.ordinal, target.dra)


def poll_once(api: Any, coord: Any, core: Any, target: Target, tracker: LeaseTracker) -> Poll:
    poll = Poll()
    if target.lease_name:
        check_lease(coord, target, tracker, poll, api)
    check_injection(core, target, poll)
    return poll


# ---------------------------------------------------------------- the command
def _limit(text: str) -> str:
    raw = text.encode()
    if len(raw) <= TERMINATION_MESSAGE_LIMIT:
        return text
    return raw[: TERMINATION_MESSAGE_LIMIT - 3].decode(errors="ignore") + "..."


def ready_summary(target: Target, poll: Poll, elapsed: float, polls: int) -> str:
    lease = (
        f"a scheduler ({poll.holder}) holds Lease {target.lease_namespace}/{target.lease_name}"
        if target.lease_name
        else "Lease check skipped (no --lease-name)"
    )
    return (
        f"placement path ready after {elapsed:.1f} s ({polls} poll{'s' if polls != 1 else ''}): {lease}; "
        f"a dry-run pod for ordinal {target.ordinal} came back with {injected_text(target.entry, target.mode, target.dra)}"
    )


def not_ready_summary(poll: Poll, elapsed: float, why: str) -> str:
    return f"placement path NOT ready after {elapsed:.0f} s ({why}): " + "; ".join(poll.problems)


def build_target(args: argparse.Namespace) -> Target:
    """Raises ValueError (with the parser's message) for a bad or empty map."""
    text = args.map or ""
    try:
        smap = parse(text)
    except MapError as err:
        raise ValueError(f"--map: {err}") from None
    return Target(
        namespace=args.namespace,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name or "",
        scheduler_name=args.scheduler_name,
        smap=smap,
        mode="nvidia" if args.mode == "nvidia" else "cuda",
        image=args.image,
        service_account=args.service_account or "",
        dra=args.mode == DRA_MODE,
    )


def cmd_wait_ready(
    args: argparse.Namespace,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    from kubernetes.client import CoordinationV1Api, CoreV1Api

    try:
        target = build_target(args)
    except ValueError as err:
        log.error(str(err))
        _write_termination_message(args.termination_message_path, _limit(str(err)))
        return EXIT_USAGE
    try:
        api = load_client(args.kubeconfig, user_agent="gpu-scheduler-check")
    except KubeConfigError as err:
        log.error(
            "cannot configure the Kubernetes client", extra={"error": f"{err.__class__.__name__}: {err}"}
        )
        return EXIT_USAGE
    coord, core = CoordinationV1Api(api), CoreV1Api(api)
    ctx = {
        "namespace": target.namespace,
        "lease": f"{target.lease_namespace}/{target.lease_name}" if target.lease_name else None,
        "ordinal": target.ordinal,
        "entry": str(target.entry),
        "mode": DRA_MODE if target.dra else target.mode,
    }
    log.info("waiting for the placement path", extra={**ctx, "timeout_s": args.timeout})
    start = clock()
    deadline = start + args.timeout
    tracker = LeaseTracker(clock)
    polls = 0
    while True:
        poll = poll_once(api, coord, core, target, tracker)
        polls += 1
        elapsed = clock() - start
        if poll.ready:
            text = ready_summary(target, poll, elapsed, polls)
            extra = {**ctx, "ready": True, "elapsed_s": round(elapsed, 3), "polls": polls}
            if poll.warnings:
                extra["warnings"] = poll.warnings
            log.info(text, extra=extra)
            # No termination message on success: in the check chart this is the verification
            # Pod's init container, and Argo CD shows a failed Pod's first non-empty termination
            # message, init containers first: the verification's (naming the misplaced replica)
            # must be that one.
            return EXIT_OK
        why = ""
        if poll.denied and elapsed >= DENIED_GRACE:
            why = "refused: waiting will not change it"
        elif clock() >= deadline:
            why = f"timeout {args.timeout:g} s"
        if why:
            text = not_ready_summary(poll, elapsed, why)
            log.error(text, extra={**ctx, "ready": False, "elapsed_s": round(elapsed, 3), "polls": polls})
            _write_termination_message(args.termination_message_path, _limit(text))
            return EXIT_MISMATCH
        log.info(
            "not ready yet: " + "; ".join(poll.problems),
            extra={**ctx, "missing": poll.problems, "elapsed_s": round(elapsed, 3)},
        )
        sleep(max(0.0, min(args.interval, deadline - clock())))


__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_TIMEOUT",
    "DENIED_GRACE",
    "LeaseTracker",
    "LeaseView",
    "Poll",
    "Target",
    "build_target",
    "cmd_wait_ready",
    "injection_problem",
    "lease_problem",
    "probe_pod",
]
