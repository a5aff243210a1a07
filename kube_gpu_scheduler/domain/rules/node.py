"""The mapped node's own state: it exists, is not cordoned, is Ready, its taints are tolerated.

kube-scheduler's NodeName, NodeUnschedulable and TaintToleration plugins, with
the Kubernetes toleration semantics they use. Checked when binding only: the
webhook looks a StatefulSet's nodes up for NodeNotFound, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kube_gpu_scheduler.domain.rules.framework import ON_NODE, ON_POD, REFUSE, WARN, Finding, emits, rule
from kube_gpu_scheduler.domain.schedmap import Entry

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
# The taints the node lifecycle controller puts on a node whose Ready condition is False
# (not-ready) or Unknown (unreachable): said once, as NodeNotReady, when the node is not Ready.
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
NOT_READ = "the CLI does not read nodes; a Pod's admission does not look them up"
LIVE = "node state that changes by the minute: checked when binding only"

NODE_NOT_FOUND = rule(
    "NodeNotFound",
    "NodeExists",
    "the mapped node exists",
    {ON_NODE},
    NOT_READ,
    scheduler=REFUSE,
    validate=WARN,
)
NODE_UNSCHEDULABLE = rule(
    "NodeUnschedulable",
    "NodeSchedulable",
    "the mapped node is not cordoned (unless the pod tolerates it)",
    {ON_NODE, ON_POD},
    LIVE,
    scheduler=REFUSE,
)
NODE_NOT_READY = rule(
    "NodeNotReady", "NodeReady", "the mapped node is Ready", {ON_NODE}, LIVE, scheduler=REFUSE
)
TAINT_NOT_TOLERATED = rule(
    "TaintNotTolerated",
    "TaintToleration",
    "the pod tolerates the node's NoSchedule/NoExecute taints",
    {ON_NODE, ON_POD},
    LIVE,
    scheduler=REFUSE,
)


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


def ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond
    return None


@emits(NODE_NOT_FOUND, NODE_UNSCHEDULABLE, NODE_NOT_READY, TAINT_NOT_TOLERATED)
def node_state_findings(
    pod: Mapping[str, Any], entry: Entry, node: Mapping[str, Any] | None
) -> list[Finding]:
    """Node exists, is not cordoned, is Ready, its taints are tolerated."""
    where = f"replica {entry.ordinal} is mapped to {entry.node}:{entry.devices}"
    if node is None:
        return [
            Finding(
                NODE_NOT_FOUND,
                f"node {entry.node!r} does not exist ({where}): the replica waits and is placed as soon "
                f"as a node named {entry.node!r} registers (it was deleted, or has not joined yet); "
                "or change the map",
            )
        ]
    refusals = []
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    if cordoned and not is_tolerated(tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        refusals.append(
            Finding(
                NODE_UNSCHEDULABLE,
                f"node {entry.node!r} is cordoned (spec.unschedulable=true; {where}): the map pins the "
                f"replica to this node, so it waits; `kubectl uncordon {entry.node}` places it there, "
                "nothing else to do",
            )
        )
    ready = ready_condition(node)
    not_ready = ready is None or ready.get("status") != "True"
    if ready is None:
        refusals.append(
            Finding(
                NODE_NOT_READY,
                f"node {entry.node!r} has no Ready condition yet ({where}): placed once its kubelet "
                "reports Ready",
            )
        )
    elif not_ready:
        detail = ": ".join(x for x in (ready.get("reason"), ready.get("message")) if x)
        state = (
            "unreachable: its kubelet stopped reporting" if ready.get("status") == "Unknown" else "not Ready"
        )
        refusals.append(
            Finding(
                NODE_NOT_READY,
                f"node {entry.node!r} is not Ready (Ready={ready.get('status')}"
                + (f", {detail}" if detail else "")
                + f"; {where}): the node is {state}; the replica waits and is placed once the node "
                f"is Ready again (`kubectl describe node {entry.node}`)",
            )
        )
    for taint in untolerated_taints(node, tolerations):
        if cordoned and taint.get("key") == UNSCHEDULABLE_TAINT:
            continue  # already said: cordoned
        if not_ready and taint.get("key") in NOT_READY_TAINTS:
            continue  # already said: not Ready (the node lifecycle controller's taint)
        refusals.append(
            Finding(
                TAINT_NOT_TOLERATED,
                f"node {entry.node!r} has taint {format_taint(taint)} that the pod does not tolerate",
            )
        )
    return refusals
