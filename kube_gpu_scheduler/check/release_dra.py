"""``verify-release`` in DRA mode: each replica's ResourceClaim against what its node publishes.

A pod checked in DRA mode (``--mode dra``, or in ``auto`` one that references its claims) must
reference its claims from the pod and each container: ``<pod>-gpus``, and where its map shares
GPUs the shared claims of :mod:`kube_gpu_scheduler.domain.draclaims`; each claim must be allocated
exactly the devices its GPUs resolve to on the node (the node's ResourceSlices read with
:mod:`kube_gpu_scheduler.domain.dra`, as the scheduler resolves them) and reserved for this pod.
A count entry (``NODE:auto(N)``) names no device: its claim must be allocated exactly N
different devices of its node, whichever kube-scheduler chose.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.check.results import Result
from kube_gpu_scheduler.check.settings import DRA_MODE
from kube_gpu_scheduler.domain import dra, draclaims
from kube_gpu_scheduler.domain.injection import pod_containers
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.schedmap import Entry, SchedulingMap
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
    """``dra`` for a pod checked in DRA mode: ``--mode dra``, or in auto a pod that references its claims."""
    if mode == DRA_MODE or (mode == "auto" and dra.pod_claims(pod)):
        return DRA_MODE
    return mode


def dra_results(
    pod: Mapping[str, Any], entry: Entry, who: str, state: DraState, smap: SchedulingMap | None = None
) -> tuple[list[Result], str | None, str | None]:
    """The DRA checks of one pod; also the devices it got and the devices its entry names
    (``gpu-2,gpu-0``: device names, map order) for the table.

    Its claims are those of :func:`kube_gpu_scheduler.domain.draclaims.layout` (``smap``, the
    map it is checked against; the entry's alone without it): its own ``<pod>-gpus`` and one
    per group of GPUs it shares with other replicas, each checked alike."""
    view = Pod(pod)
    name = str(view.name)
    parts = draclaims.layout(smap or SchedulingMap({entry.ordinal: entry}), entry.ordinal, name)
    want_refs = {p.ref: p.name for p in parts}
    have_refs = dra.pod_claims(pod)
    results = [
        Result(
            "dra:claim-ref",
            want_refs,
            have_refs,
            have_refs == want_refs,
            who,
            {"field": "spec.resourceClaims[].resourceClaimName"},
        )
    ]
    missing = [
        str(c.get("name"))
        for c in pod_containers(view.spec)
        if not set(want_refs)
        <= {
            str(ref.get("name"))
            for ref in (c.get("resources") or {}).get("claims") or []
            if isinstance(ref, Mapping)
        }
    ]
    results.append(
        Result(
            "dra:container-claims",
            f"every container lists claims {', '.join(want_refs)} in resources.claims",
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
            resolved = [] if entry.count else dra.resolve(entry, devices)
        except dra.Unresolved as err:
            results.append(Result("dra:devices", str(entry), str(err), False, who))
        else:
            # A count entry: "auto(2)", any two of the node's devices (checked below).
            expected_shown = entry.devices if entry.count else ",".join(d.name for d in resolved)
    of = dict(zip(entry.gpus, resolved or (), strict=False))
    got_all: dict[Any, str] = {}
    uid = view.meta.get("uid")
    for part in parts:
        if have_refs.get(part.ref) != part.name:
            continue
        claim = state.claims.get(part.name)
        if claim is None:
            results.append(
                Result(
                    "dra:claim",
                    f"ResourceClaim {view.namespace}/{part.name}",
                    state.claim_errors.get(part.name, "not found"),
                    False,
                    who,
                )
            )
            continue
        got = sorted(dra.allocation(claim), key=lambda a: a.request)
        for gpu, a in zip(part.entry.gpus, got, strict=False):
            got_all[gpu] = a.device
        if entry.count and resolved is not None:
            results.append(_counted(claim, entry, devices, who, part.name))
            got_all.update({i: a.device for i, a in enumerate(got)})
        elif resolved is not None:
            wanted = [of[g] for g in part.entry.gpus]
            extra: dict[str, Any] = {"claim": part.name, "devices": [d.describe() for d in wanted]}
            if part.shared:
                extra["sharedBy"] = list(part.sharers)
            results.append(
                Result(
                    "dra:allocation",
                    [f"{d.pool}/{d.name}" for d in wanted],
                    [f"{a.pool}/{a.device}" for a in got],
                    dra.matches(claim, part.entry, wanted),
                    who,
                    extra,
                )
            )
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
                {"claim": part.name},
            )
        )
    shown = ",".join(got_all[g] for g in (range(entry.count) if entry.count else entry.gpus) if g in got_all)
    return results, shown or None, expected_shown


def _counted(
    claim: Mapping[str, Any], entry: Entry, devices: Sequence[dra.Device], who: str, name: str
) -> Result:
    """``dra:allocation`` of a count entry (``NODE:auto(N)``): its claim is allocated exactly N
    different devices, each one the entry's node publishes (which ones, kube-scheduler chose)."""
    got = [(a.pool, a.device) for a in dra.allocation(claim) if a.driver == dra.DRIVER]
    mine = {(d.pool, d.name) for d in devices}
    foreign = [f"{p}/{d}" for p, d in got if (p, d) not in mine]
    ok = len(got) == entry.count and len(set(got)) == len(got) and not foreign
    extra: dict[str, Any] = {"claim": name, "count": entry.count}
    if foreign:
        extra["notOnNode"] = foreign
    return Result(
        "dra:allocation",
        f"{entry.count} devices of node {entry.node}",
        [f"{p}/{d}" for p, d in got],
        ok,
        who,
        extra,
    )


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
    for name in dict.fromkeys(n for pod in pods for n in dra.pod_claims(pod).values()):
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
