"""Can this pod go where its map says? Pure functions over API dicts.

Every refusal carries a machine reason (an Event's words and a metrics label)
and a message that says exactly which node, which GPU and which holder.
Nothing here talks to the API: the caller passes the node from its watch
cache and the ledger of held GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_scheduling.injection import injection_state
from gpu_scheduling.podinfo import POD_INDEX_LABEL, entry_for
from gpu_scheduling.resources import GPU_RESOURCE, node_gpus
from gpu_scheduling.schedmap import ANNOTATION, Entry, MapError

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

# Reasons (Event words and the `reason` label of the failures metric).
NO_MAP = "NoSchedulingMap"
INVALID_MAP = "InvalidSchedulingMap"
NO_ORDINAL = "NoOrdinal"
ORDINAL_NOT_MAPPED = "OrdinalNotInMap"
NODE_NOT_FOUND = "NodeNotFound"
NODE_UNSCHEDULABLE = "NodeUnschedulable"
NODE_NOT_READY = "NodeNotReady"
TAINT_NOT_TOLERATED = "TaintNotTolerated"
GPU_OUT_OF_RANGE = "GPUIndexOutOfRange"
GPU_IN_USE = "GPUInUse"
NO_GPU_RESOURCE = "NoGPUResource"
NOT_INJECTED = "NotInjected"

ALL_REASONS = (
    NO_MAP,
    INVALID_MAP,
    NO_ORDINAL,
    ORDINAL_NOT_MAPPED,
    NODE_NOT_FOUND,
    NODE_UNSCHEDULABLE,
    NODE_NOT_READY,
    TAINT_NOT_TOLERATED,
    GPU_OUT_OF_RANGE,
    GPU_IN_USE,
    NO_GPU_RESOURCE,
    NOT_INJECTED,
)


@dataclass(frozen=True)
class Refusal:
    """One reason the pod cannot be bound now."""

    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """The outcome of the checks: ``entry`` to bind to, or the refusals.

    ``entry`` is set whenever the map resolved (also when refused), so the
    caller knows which node a waiting pod waits for.
    """

    ordinal: int | None
    entry: Entry | None
    refusals: tuple[Refusal, ...] = ()

    @property
    def ok(self) -> bool:
        return self.entry is not None and not self.refusals

    @property
    def reason(self) -> str:
        return self.refusals[0].reason if self.refusals else ""

    @property
    def message(self) -> str:
        return "; ".join(r.message for r in self.refusals)


class Holders(Protocol):
    """What the checks need from the ledger."""

    def holders(
        self, node: str, gpus: Iterable[int], exclude_uid: str | None = None
    ) -> list[tuple[int, str]]:
        """``(gpu, "namespace/name")`` for every mapped GPU held by another active pod."""
        ...


# -- tolerations ---------------------------------------------------------------


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``.

    * an empty toleration effect matches every effect;
    * an empty toleration key (only valid with ``Exists``) matches every key;
    * operator ``Exists`` ignores the value, ``Equal`` (the default) compares it.
    """
    effect = toleration.get("effect") or ""
    if effect and effect != (taint.get("effect") or ""):
        return False
    key = toleration.get("key") or ""
    if key and key != (taint.get("key") or ""):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    # Unknown operators (and the alpha Lt/Gt) tolerate nothing: refuse rather than guess.
    return False


def is_tolerated(tolerations: Sequence[Mapping[str, Any]] | None, taint: Mapping[str, Any]) -> bool:
    return any(tolerates(t, taint) for t in tolerations or ())


def untolerated_taints(
    node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]] | None
) -> list[Mapping[str, Any]]:
    """The node's NoSchedule/NoExecute taints that no toleration matches."""
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints if t.get("effect") in BLOCKING_EFFECTS and not is_tolerated(tolerations, t)]


def format_taint(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    key = taint.get("key", "")
    return f"{key}={value}:{taint.get('effect')}" if value else f"{key}:{taint.get('effect')}"


# -- node state -------------------------------------------------------------------


def ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond
    return None


def gpu_count(node: Mapping[str, Any]) -> int | None:
    """``status.allocatable["nvidia.com/gpu"]`` (else capacity) as an integer; None when not reported."""
    return node_gpus(node.get("status"))


def node_signature(node: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """Everything the checks read from a node: when it changes, waiting pods are retried."""
    if node is None:
        return ()
    spec = node.get("spec") or {}
    ready = ready_condition(node) or {}
    taints = tuple(
        sorted(
            (t.get("key") or "", t.get("value") or "", t.get("effect") or "")
            for t in spec.get("taints") or []
            if t.get("effect") in BLOCKING_EFFECTS
        )
    )
    return (bool(spec.get("unschedulable")), ready.get("status"), taints, gpu_count(node))


# -- the checks ---------------------------------------------------------------------


def check_node(pod: Mapping[str, Any], entry: Entry, node: Mapping[str, Any] | None) -> list[Refusal]:
    """Node exists, is not cordoned, is Ready, its taints are tolerated, the GPU indices exist."""
    where = f"replica {entry.ordinal} is mapped to {entry.node}:{entry.devices}"
    if node is None:
        return [Refusal(NODE_NOT_FOUND, f"node {entry.node!r} does not exist ({where})")]
    refusals = []
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    if (node.get("spec") or {}).get("unschedulable") and not is_tolerated(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        refusals.append(
            Refusal(NODE_UNSCHEDULABLE, f"node {entry.node!r} is cordoned (spec.unschedulable=true; {where})")
        )
    ready = ready_condition(node)
    if ready is None:
        refusals.append(Refusal(NODE_NOT_READY, f"node {entry.node!r} has no Ready condition yet ({where})"))
    elif ready.get("status") != "True":
        detail = ": ".join(x for x in (ready.get("reason"), ready.get("message")) if x)
        refusals.append(
            Refusal(
                NODE_NOT_READY,
                f"node {entry.node!r} is not Ready (Ready={ready.get('status')}"
                + (f", {detail}" if detail else "")
                + f"; {where})",
            )
        )
    for taint in untolerated_taints(node, tolerations):
        if (node.get("spec") or {}).get("unschedulable") and taint.get("key") == UNSCHEDULABLE_TAINT:
            continue  # already said: cordoned
        refusals.append(
            Refusal(
                TAINT_NOT_TOLERATED,
                f"node {entry.node!r} has taint {format_taint(taint)} that the pod does not tolerate",
            )
        )
    count = gpu_count(node)
    if count is None:
        refusals.append(
            Refusal(
                NO_GPU_RESOURCE,
                f"node {entry.node!r} reports no {GPU_RESOURCE} in allocatable or capacity, so GPU "
                f"{entry.devices} cannot be checked: it has no GPUs, or its device plugin is not "
                f"running ({where})",
            )
        )
    else:
        missing = [g for g in entry.gpus if g >= count]
        if missing:
            indices = ", ".join(str(g) for g in missing)
            valid = f"valid indices 0-{count - 1}" if count else "it has none"
            refusals.append(
                Refusal(
                    GPU_OUT_OF_RANGE,
                    f"GPU {indices} on node {entry.node!r} does not exist: the node reports "
                    f"{GPU_RESOURCE} allocatable={count} ({valid}; {where})",
                )
            )
    return refusals


def check_gpus(pod: Mapping[str, Any], entry: Entry, ledger: Holders) -> list[Refusal]:
    """No other active pod holds any of the mapped node:GPU pairs."""
    uid = (pod.get("metadata") or {}).get("uid")
    held = ledger.holders(entry.node, entry.gpus, exclude_uid=uid)
    return [
        Refusal(GPU_IN_USE, f"GPU {entry.node}:{gpu} is held by pod {holder}") for gpu, holder in sorted(held)
    ]


def resolve(pod: Mapping[str, Any]) -> Decision:
    """The pod's ordinal and map entry, or why there is none."""
    meta = pod.get("metadata") or {}
    try:
        ordinal, entry = entry_for(meta)
    except MapError as err:
        return Decision(None, None, (Refusal(INVALID_MAP, f"annotation {ANNOTATION} is invalid: {err}"),))
    if entry is not None:
        return Decision(ordinal, entry)
    if (meta.get("annotations") or {}).get(ANNOTATION) is None:
        return Decision(ordinal, None, (Refusal(NO_MAP, f"the pod has no {ANNOTATION} annotation"),))
    if ordinal is None:
        return Decision(
            None,
            None,
            (
                Refusal(
                    NO_ORDINAL,
                    f"cannot tell the replica ordinal: no {POD_INDEX_LABEL} label and the name "
                    f"{meta.get('name')!r} does not end in -N",
                ),
            ),
        )
    return Decision(
        ordinal,
        None,
        (Refusal(ORDINAL_NOT_MAPPED, f"annotation {ANNOTATION} has no entry for replica {ordinal}"),),
    )


def check_injected(pod: Mapping[str, Any], entry: Entry) -> list[Refusal]:
    """Every container carries the webhook's GPU variables for ``entry``.

    Read from the container spec, which nobody can change after creation: a pod
    admitted while the webhook was down (failurePolicy Ignore) or timed out never
    gets them, whatever its annotations say.
    """
    state = injection_state(pod.get("spec"), entry)
    if state.ok:
        return []
    shown = ", ".join(repr(n[:63]) for n in state.missing[:5]) + (", ..." if len(state.missing) > 5 else "")
    return [
        Refusal(
            NOT_INJECTED,
            f"the pod was admitted without the webhook's GPU variables for replica {entry.ordinal} "
            f"({entry.node}:{entry.devices}): container {shown} has {state.found}; the webhook was "
            "unreachable or timed out when the pod was created",
        )
    ]


def evaluate(
    pod: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
    ledger: Holders,
    require_injection: bool = True,
) -> Decision:
    """All the checks, in order; the first refusal names the reason, the message lists them all.

    A pod that lacks its injection is refused with that reason alone: nothing
    about the node can make it bindable, since its containers cannot change.
    """
    decision = resolve(pod)
    if decision.entry is None:
        return decision
    entry = decision.entry
    if require_injection:
        not_injected = check_injected(pod, entry)
        if not_injected:
            return Decision(decision.ordinal, entry, tuple(not_injected))
    refusals = check_node(pod, entry, nodes.get(entry.node)) + check_gpus(pod, entry, ledger)
    return Decision(decision.ordinal, entry, tuple(refusals))
