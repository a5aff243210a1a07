"""``verify-release`` in DRA mode: each replica's ResourceClaim against what its node publishes.

A pod checked in DRA mode (``--mode dra``, or in ``auto`` one that references its claim) must
reference the claim ``<pod>-gpus`` from the pod and each container; the claim must be allocated
exactly the devices the pod's entry resolves to on its node (the node's ResourceSlices read with
:mod:`kube_gpu_scheduler.domain.dra`, as the scheduler resolves them) and reserved for this pod.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.check.results import Result
from kube_gpu_scheduler.check.settings import DRA_MODE
from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.injection import pod_containers
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.schedmap import Entry
from kube_gpu_scheduler.kube.errors import api_error


@dataclass
class DraState:
    """What DRA mode reads besides the pods: the pods' ResourceClaims by name (None: unreadable,
    ``claim_errors`` says why) and the driver's ResourceSlices (``slices_error``: unreadable)."""

    claims: dict[str, Mapping[str, Any] | None] = field(default_factory=dict)
    claim_errors: dict[str, str] = field(default_factory=dict)
    slices: list[Mapping[str, Any]] = field(default_factory=list)
    slices_error: str | None = None


# Where a 403 on claims or slices comes from, and the way out.
DRA_RBAC_HINT = (
    "the check chart's helm test account reads ResourceClaims and ResourceSlices only with "
    "gpuScheduling.injectionMode=dra"
)


def pod_mode(pod: Mapping[str, Any], mode: str) -> str:
    """``dra`` for a pod checked in DRA mode: ``--mode dra``, or in auto a pod that references its claim."""
    if mode == DRA_MODE or (mode == "auto" and dra.pod_claim_name(pod) is not None):
        return DRA_MODE
    return mode


def dra_results(
    pod: Mapping[str, Any], entry: Entry, who: str, state: DraState
) -> tuple[list[Result], str | None, str | None]:
    """The DRA checks of one pod; also the devices it got and the devices its entry names
    (``gpu-2,gpu-0``: device names, map order) for the table."""
    view = Pod(pod)
    name = str(view.name)
    want_claim = dra.claim_name(name)
    have_claim = dra.pod_claim_name(pod)
    results = [
        Result(
            "dra:claim-ref",
            want_claim,
            have_claim,
            have_claim == want_claim,
            who,
            {"field": f"spec.resourceClaims[name={dra.POD_CLAIM}].resourceClaimName"},
        )
    ]
    missing = [
        str(c.get("name"))
        for c in pod_containers(view.spec)
        if not any(
            isinstance(ref, Mapping) and ref.get("name") == dra.POD_CLAIM
            for ref in (c.get("resources") or {}).get("claims") or []
        )
    ]
    results.append(
        Result(
            "dra:container-claims",
            f"every container lists claim {dra.POD_CLAIM} in resources.claims",
            {"without": missing},
            not missing,
            who,
        )
    )
    expected_shown: str | None = None
    resolved: list[dra.Device] | None = None
    if state.slices_error is not None:
        results.append(
            Result(
                "dra:devices",
                f"the {dra.DRIVER} devices of node {entry.node}",
                state.slices_error,
                False,
                who,
                {"why": DRA_RBAC_HINT},
            )
        )
    else:
        devices = dra.node_devices(state.slices, entry.node)
        try:
            resolved = dra.resolve(entry, devices)
        except dra.Unresolved as err:
            results.append(Result("dra:devices", str(entry), str(err), False, who))
        else:
            expected_shown = ",".join(d.name for d in resolved)
    if have_claim is None:
        return results, None, expected_shown
    claim = state.claims.get(have_claim)
    if claim is None:
        results.append(
            Result(
                "dra:claim",
                f"ResourceClaim {view.namespace}/{have_claim}",
                state.claim_errors.get(have_claim, "not found"),
                False,
                who,
            )
        )
        return results, None, expected_shown
    got = dra.allocation(claim)
    shown = ",".join(a.device for a in sorted(got, key=lambda a: a.request)) or None
    if resolved is not None:
        results.append(
            Result(
                "dra:allocation",
                [f"{d.pool}/{d.name}" for d in resolved],
                [f"{a.pool}/{a.device}" for a in sorted(got, key=lambda a: a.request)],
                dra.matches(claim, entry, resolved),
                who,
                {"claim": have_claim, "devices": [d.describe() for d in resolved]},
            )
        )
    uid = view.meta.get("uid")
    reserved = [
        r
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if isinstance(r, Mapping) and r.get("resource") == "pods"
    ]
    results.append(
        Result(
            "dra:reserved",
            f"pods/{name}",
            [f"pods/{r.get('name')}" for r in reserved],
            any(r.get("name") == name and (not uid or r.get("uid") == uid) for r in reserved),
            who,
            {"claim": have_claim},
        )
    )
    return results, shown, expected_shown


def raw_json(response: Any) -> Any:
    return json.loads(response.data)


def fetch_dra(api: Any, pods: Sequence[Mapping[str, Any]], namespace: str) -> tuple[DraState, bool]:
    """DRA mode: the claims the pods reference (get, in the namespace) and the driver's
    ResourceSlices (one list, cluster-scoped), raw JSON (the API's own camelCase); and whether a
    read was denied (a 401/403: waiting will not help)."""
    from kubernetes.client import ResourceV1Api

    resource = ResourceV1Api(api)
    state = DraState()
    forbidden = False
    try:
        state.slices = list(
            raw_json(
                resource.list_resource_slice(
                    field_selector=f"spec.driver={dra.DRIVER}", _preload_content=False
                )
            ).get("items")
            or []
        )
    except ApiException as err:
        state.slices_error = f"{err.status} {err.reason}: list resourceslices.resource.k8s.io"
        forbidden = forbidden or api_error(err).denied
    for pod in pods:
        name = dra.pod_claim_name(pod)
        if name is None or name in state.claims:
            continue
        try:
            state.claims[name] = raw_json(
                resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
            )
        except ApiException as err:
            state.claims[name] = None
            denied = api_error(err).denied
            state.claim_errors[name] = f"{err.status} {err.reason}: get resourceclaims.resource.k8s.io " + (
                f"{namespace}/{name} ({DRA_RBAC_HINT})" if denied else f"{namespace}/{name}"
            )
            forbidden = forbidden or denied
    return state, forbidden
