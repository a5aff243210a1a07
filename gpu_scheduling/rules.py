"""Every placement rule, once: the scheduler, the webhook, the map CLI and the check only translate.

Modelled on kube-scheduler's framework: one filter per concern, each with its
reason constant (an Event's words, a metrics label, the ``reason`` of a CLI
finding), a message builder, and the changes that can unblock it (its
EventsToRegister). :data:`RULES` lists them with what each front end makes of
a finding: the scheduler refuses (the pod waits) or binds with a warning
Event, the webhook denies or warns, the CLI reports an error or a warning.

Pure functions over plain dicts (an API object as JSON, an AdmissionReview's
object, a YAML document): nothing here talks to the API. The scheduler passes
its node cache and its ledger of held GPUs, the webhook its node cache, the
CLI what it read from the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_scheduling.fit import (
    PODS,
    NodeTotals,
    affinity_mismatch,
    allocatable,
    host_ports,
    pod_requests,
    port_conflicts,
    shortfalls,
    show,
)
from gpu_scheduling.injection import injection_state
from gpu_scheduling.podinfo import POD_INDEX_LABEL, entry_for
from gpu_scheduling.resources import GPU_RESOURCE, PITFALL_ADVICE, gpu_requesting_containers, node_gpus
from gpu_scheduling.schedmap import ANNOTATION, Entry, MapError, SchedulingMap, excerpt

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

# Reasons of the scheduler's refusals (Event words and the `reason` label of the failures metric).
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
NODE_AFFINITY = "NodeAffinityMismatch"
INSUFFICIENT_RESOURCES = "InsufficientResources"
HOST_PORT_CONFLICT = "HostPortConflict"
KUBELET_REFUSED = "KubeletRefused"

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
    NODE_AFFINITY,
    INSUFFICIENT_RESOURCES,
    HOST_PORT_CONFLICT,
    KUBELET_REFUSED,
)

# Reasons of the admission and lint findings (never a scheduler refusal).
GPU_RESOURCE_REQUESTED = "GPUResourceRequested"  # also the scheduler's warning Event on a bound pod
SCHEDULER_NAME_MISMATCH = "SchedulerNameMismatch"
NODE_NAME_SET = "NodeNameSet"
MAP_NOT_ON_TEMPLATE = "MapNotOnPodTemplate"
ORDINAL_UNUSED = "OrdinalNotUsed"
NO_ORDINALS = "NotAStatefulSet"
MISSPELT_ANNOTATION = "MisspeltAnnotation"
FOLDED_MAP = "FoldedMap"

# The front ends, and what each makes of a finding.
SCHEDULER = "scheduler"  # REFUSE: not bound, the pod waits; WARN: bound, with a warning Event
MUTATE = "mutate"  # the webhook on a Pod: REFUSE denies the pod; WARN is an admission warning
VALIDATE = "validate"  # the webhook on a StatefulSet: the same
LINT = "lint"  # gpu-scheduler-map validate: REFUSE is an error (exit 1), WARN a warning
FRONT_ENDS = (SCHEDULER, MUTATE, VALIDATE, LINT)
REFUSE = "refuse"
WARN = "warn"

# What can unblock a refusal (kube-scheduler's EventsToRegister): a change of ...
ON_NODE = "node"  # the mapped node (added, uncordoned, Ready, taints, GPU count)
ON_GPU_HOLDER = "gpu-holder"  # a pod holding a mapped GPU (deleted, finished, rebound)
ON_POD = "pod"  # the pod itself (annotation, pod-index label, tolerations)
ON_NODE_PODS = "node-pods"  # a pod on the mapped node (ended, deleted, shrunk), whoever placed it
NEVER: frozenset[str] = frozenset()  # nothing: the pod must be recreated


@dataclass(frozen=True)
class Rule:
    """One filter: its reason, what it checks, what unblocks it, what each front end does with it.

    ``severity`` maps a front end to REFUSE or WARN; a front end it does not
    name does not evaluate the rule (and says so in :attr:`why_not`).
    """

    reason: str
    name: str
    checks: str
    unblocked_by: frozenset[str]
    severity: Mapping[str, str]
    why_not: str = ""


def _rule(
    reason: str, name: str, checks: str, unblocked_by: Iterable[str], why_not: str = "", **severity: str
) -> Rule:
    return Rule(reason, name, checks, frozenset(unblocked_by), severity, why_not)


RULES: dict[str, Rule] = {
    r.reason: r
    for r in (
        _rule(
            NO_MAP,
            "HasMap",
            f"the pod carries the {ANNOTATION} annotation",
            {ON_POD},
            "the webhook and the CLI only look at objects that carry a map",
            scheduler=REFUSE,
        ),
        _rule(
            INVALID_MAP,
            "MapParses",
            "the map parses (gpu_scheduling.schedmap, the one grammar)",
            {ON_POD},
            scheduler=REFUSE,
            mutate=REFUSE,
            validate=REFUSE,
            lint=REFUSE,
        ),
        _rule(
            NO_ORDINAL,
            "HasOrdinal",
            f"the pod's ordinal is known: label {POD_INDEX_LABEL}, else a trailing -N in its name",
            {ON_POD},
            "a StatefulSet's pods always have one",
            scheduler=REFUSE,
            mutate=WARN,
            lint=WARN,
        ),
        _rule(
            ORDINAL_NOT_MAPPED,
            "OrdinalInMap",
            "the map has an entry for the pod's ordinal (for a StatefulSet: for every replica)",
            {ON_POD},
            scheduler=REFUSE,
            mutate=WARN,
            validate=WARN,
            lint=WARN,
        ),
        _rule(
            NODE_NOT_FOUND,
            "NodeExists",
            "the mapped node exists",
            {ON_NODE},
            "the CLI does not read nodes; a Pod's admission does not look them up",
            scheduler=REFUSE,
            validate=WARN,
        ),
        _rule(
            NODE_UNSCHEDULABLE,
            "NodeSchedulable",
            "the mapped node is not cordoned (unless the pod tolerates it)",
            {ON_NODE, ON_POD},
            "node state that changes by the minute: checked when binding only",
            scheduler=REFUSE,
        ),
        _rule(
            NODE_NOT_READY,
            "NodeReady",
            "the mapped node is Ready",
            {ON_NODE},
            "node state that changes by the minute: checked when binding only",
            scheduler=REFUSE,
        ),
        _rule(
            TAINT_NOT_TOLERATED,
            "TaintToleration",
            "the pod tolerates the node's NoSchedule/NoExecute taints",
            {ON_NODE, ON_POD},
            "node state that changes by the minute: checked when binding only",
            scheduler=REFUSE,
        ),
        _rule(
            NO_GPU_RESOURCE,
            "NodeReportsGPUs",
            f"the mapped node reports {GPU_RESOURCE} (allocatable, else capacity)",
            {ON_NODE},
            "the CLI does not read nodes; a Pod's admission does not look them up",
            scheduler=REFUSE,
            validate=WARN,
        ),
        _rule(
            GPU_OUT_OF_RANGE,
            "GPUIndexExists",
            f"every mapped GPU index is below the node's {GPU_RESOURCE} count",
            {ON_NODE},
            "the CLI does not read nodes; a Pod's admission does not look them up",
            scheduler=REFUSE,
            validate=WARN,
        ),
        _rule(
            NODE_AFFINITY,
            "NodeAffinity",
            "the mapped node matches the pod's nodeSelector and required node affinity (every "
            "operator, matchFields too)",
            {ON_NODE},
            "node labels change by the minute: checked when binding only",
            scheduler=REFUSE,
        ),
        _rule(
            INSUFFICIENT_RESOURCES,
            "NodeResourcesFit",
            "the pod's requests (cpu, memory, ephemeral-storage, hugepages, extended resources, a pod "
            "slot) fit the node's allocatable minus the requests of every non-terminated pod bound there",
            {ON_NODE, ON_NODE_PODS},
            "what a node has free changes by the second: checked when binding only",
            scheduler=REFUSE,
        ),
        _rule(
            HOST_PORT_CONFLICT,
            "NodePorts",
            "no other pod on the mapped node takes one of the pod's host ports",
            {ON_NODE_PODS},
            "checked when binding only",
            scheduler=REFUSE,
        ),
        _rule(
            KUBELET_REFUSED,
            "NotRefusedByKubelet",
            "the node's kubelet has not refused this replica at admission (OutOfcpu, NodeAffinity, ...) "
            "since the node, the pods on it or the pod last changed",
            {ON_NODE, ON_NODE_PODS, ON_POD},
            "only the scheduler sees pods fail",
            scheduler=REFUSE,
        ),
        _rule(
            GPU_IN_USE,
            "GPUsFree",
            "no other active pod holds a mapped GPU (the ledger)",
            {ON_GPU_HOLDER},
            "only the scheduler keeps the ledger",
            scheduler=REFUSE,
        ),
        _rule(
            NOT_INJECTED,
            "Injected",
            "every container carries the webhook's GPU variables for the entry",
            NEVER,
            "the webhook is what injects them",
            scheduler=REFUSE,
        ),
        _rule(
            GPU_RESOURCE_REQUESTED,
            "NoDevicePluginGPUs",
            f"no container also requests a non-zero {GPU_RESOURCE} (the device plugin would renumber)",
            NEVER,
            "",
            scheduler=WARN,
            mutate=WARN,  # REFUSE with WEBHOOK_GPU_RESOURCE_POLICY=deny
            validate=WARN,  # REFUSE with WEBHOOK_GPU_RESOURCE_POLICY=deny
            lint=WARN,
        ),
        _rule(
            SCHEDULER_NAME_MISMATCH,
            "SchedulerName",
            "spec.schedulerName is the GPU scheduler's configured name",
            {ON_POD},
            "the scheduler never sees pods of another scheduler",
            mutate=WARN,
            validate=WARN,
            lint=WARN,
        ),
        _rule(
            NODE_NAME_SET,
            "NoNodeName",
            "spec.nodeName is not set on a mapped pod (it would bypass the scheduler's checks)",
            NEVER,
            "a pod with spec.nodeName is bound already: the scheduler never sees it pending",
            mutate=REFUSE,
            validate=WARN,
            lint=WARN,
        ),
        _rule(
            MAP_NOT_ON_TEMPLATE,
            "MapOnPodTemplate",
            "the map is on the pod template, not on the controller's own metadata",
            NEVER,
            "",
            validate=WARN,
            lint=WARN,
        ),
        _rule(ORDINAL_UNUSED, "OrdinalUsed", "every map entry is a replica", NEVER, "", lint=WARN),
        _rule(
            NO_ORDINALS,
            "HasOrdinals",
            "the object's pods have ordinals (a StatefulSet)",
            NEVER,
            "",
            lint=WARN,
        ),
        _rule(MISSPELT_ANNOTATION, "AnnotationKey", f"no near-miss of {ANNOTATION}", NEVER, "", lint=WARN),
        _rule(FOLDED_MAP, "LiteralBlock", "the map is not a folded YAML block", NEVER, "", lint=WARN),
    )
}


@dataclass(frozen=True)
class Finding:
    """One rule's verdict on an object: its reason and a message that names what and where.

    ``path`` is the field it concerns, when that is one field (``spec.template.spec.nodeName``),
    so that the CLI can point at its line.
    """

    reason: str
    message: str
    path: str | None = None

    @property
    def rule(self) -> Rule:
        return RULES[self.reason]


# The scheduler's word for a finding that blocks binding.
Refusal = Finding


@dataclass(frozen=True)
class Decision:
    """The outcome of the checks: ``entry`` to bind to, or the refusals.

    ``entry`` is set whenever the map resolved (also when refused), so the
    caller knows which node a waiting pod waits for.
    """

    ordinal: int | None
    entry: Entry | None
    refusals: tuple[Refusal, ...] = ()
    # Findings that do not block binding (the scheduler's warning Events).
    warnings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        return self.entry is not None and not self.refusals

    @property
    def reason(self) -> str:
        return self.refusals[0].reason if self.refusals else ""

    @property
    def message(self) -> str:
        return "; ".join(r.message for r in self.refusals)


class NodeUse(Protocol):
    """What the fit checks need from the scheduler's index of the pods on each node."""

    def totals(self, node: str, exclude_uid: str | None = None) -> NodeTotals:
        """The summed footprint of the non-terminated pods bound to ``node`` (and reserved for it)."""
        ...


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
    """The node's GPU count (:func:`gpu_scheduling.resources.node_gpus`); None when not reported."""
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
    labels = tuple(sorted(((node.get("metadata") or {}).get("labels") or {}).items()))
    offered = tuple(sorted(allocatable(node).items()))
    return (bool(spec.get("unschedulable")), ready.get("status"), taints, gpu_count(node), labels, offered)


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
    refusals.extend(gpu_index_findings(entry, gpu_count(node)))
    return refusals


def gpu_index_findings(entry: Entry, count: int | None) -> list[Refusal]:
    """NoGPUResource / GPUIndexOutOfRange for one replica's entry, given its node's GPU count."""
    where = f"replica {entry.ordinal} is mapped to {entry.node}:{entry.devices}"
    if count is None:
        return [
            Refusal(
                NO_GPU_RESOURCE,
                f"node {entry.node!r} reports no {GPU_RESOURCE} in allocatable or capacity, so GPU "
                f"{entry.devices} cannot be checked: it has no GPUs, or its device plugin is not "
                f"running ({where})",
            )
        ]
    missing = [g for g in entry.gpus if g >= count]
    if not missing:
        return []
    indices = ", ".join(str(g) for g in missing)
    valid = f"valid indices 0-{count - 1}" if count else "it has none"
    return [
        Refusal(
            GPU_OUT_OF_RANGE,
            f"GPU {indices} on node {entry.node!r} does not exist: the node reports "
            f"{GPU_RESOURCE} allocatable={count} ({valid}; {where})",
        )
    ]


def check_fit(pod: Mapping[str, Any], entry: Entry, node: Mapping[str, Any], usage: NodeUse) -> list[Refusal]:
    """NodeAffinityMismatch, InsufficientResources and HostPortConflict on the mapped node.

    What kube-scheduler's NodeAffinity, NodeResourcesFit and NodePorts filters (and the
    kubelet's admission after them) check, against every non-terminated pod bound to the
    node whoever placed it, so the kubelet does not refuse what we bind.
    """
    spec = pod.get("spec") or {}
    where = f"replica {entry.ordinal} is mapped to it"
    refusals: list[Refusal] = []
    mismatch = affinity_mismatch(spec, node)
    if mismatch is not None:
        refusals.append(
            Refusal(NODE_AFFINITY, f"node {entry.node!r} does not match the pod's {mismatch} ({where})")
        )
    totals = usage.totals(entry.node, exclude_uid=(pod.get("metadata") or {}).get("uid"))
    return refusals + room_refusals(pod, entry, node, totals)


def room_refusals(
    pod: Mapping[str, Any], entry: Entry, node: Mapping[str, Any], totals: NodeTotals
) -> list[Refusal]:
    """InsufficientResources and HostPortConflict, given what the node's other pods take."""
    spec = pod.get("spec") or {}
    where = f"replica {entry.ordinal} is mapped to it"
    refusals: list[Refusal] = []
    for short in shortfalls(pod_requests(spec), allocatable(node), totals):
        if short.resource == PODS:
            text = (
                f"Too many pods: node {entry.node!r} has {short.used} of {short.allocatable} pod slots "
                f"taken ({where})"
            )
        else:
            name = short.resource
            text = (
                f"Insufficient {name}: the pod requests {show(name, short.requested)}, node "
                f"{entry.node!r} has {show(name, short.free)} of {show(name, short.allocatable)} free "
                f"({show(name, short.used)} requested by {totals.pods} pods there; {where})"
            )
        refusals.append(Refusal(INSUFFICIENT_RESOURCES, text))
    for port, holder in port_conflicts(host_ports(spec), totals):
        refusals.append(
            Refusal(HOST_PORT_CONFLICT, f"host port {port} on node {entry.node!r} is taken by pod {holder}")
        )
    return refusals


def kubelet_refused(entry: Entry, reason: str, message: str, ago_s: float) -> Refusal:
    """KubeletRefused: the node refused this replica at admission and nothing has changed since."""
    said = f"{reason}: {message}" if message else reason
    return Refusal(
        KUBELET_REFUSED,
        f"node {entry.node!r} refused replica {entry.ordinal} at admission {ago_s:.0f}s ago ({said[:300]}); "
        "not binding it there again until the node, the pods on it or this pod change",
    )


def check_gpus(pod: Mapping[str, Any], entry: Entry, ledger: Holders) -> list[Refusal]:
    """No other active pod holds any of the mapped node:GPU pairs."""
    uid = (pod.get("metadata") or {}).get("uid")
    return gpus_in_use(entry, ledger.holders(entry.node, entry.gpus, exclude_uid=uid))


def gpus_in_use(entry: Entry, held: Iterable[tuple[int, str]]) -> list[Refusal]:
    """GPUInUse: one refusal per ``(gpu, "namespace/name")`` that holds a GPU of ``entry``."""
    return [
        Refusal(GPU_IN_USE, f"GPU {entry.node}:{gpu} is held by pod {holder}") for gpu, holder in sorted(held)
    ]


def resolve(pod: Mapping[str, Any]) -> Decision:
    """The pod's ordinal and map entry, or why there is none."""
    meta = pod.get("metadata") or {}
    try:
        ordinal, entry = entry_for(meta)
    except MapError as err:
        return Decision(None, None, (invalid_map(err),))
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
    usage: NodeUse | None = None,
) -> Decision:
    """All the checks, in order; the first refusal names the reason, the message lists them all.

    The fit checks (:func:`check_fit`) run when ``usage``, the index of what the
    pods on each node take, is given: the scheduler passes it.

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
    node = nodes.get(entry.node)
    refusals = check_node(pod, entry, node)
    if node is not None and usage is not None:
        refusals += check_fit(pod, entry, node, usage)
    refusals += check_gpus(pod, entry, ledger)
    requesters = gpu_requesting_containers(pod.get("spec"))
    warnings = (gpu_resource_requested(requesters),) if requesters else ()
    return Decision(decision.ordinal, entry, tuple(refusals), warnings)


def invalid_map(err: MapError, where: str = "") -> Finding:
    """InvalidSchedulingMap: the map does not parse; ``where`` names the field for a template."""
    return Finding(INVALID_MAP, f"invalid {ANNOTATION} annotation{f' in {where}' if where else ''}: {err}")


# -- admission and lint: a pod spec, a StatefulSet's replicas, a map's nodes ------------------


def gpu_resource_requested(names: Sequence[str], subject: str = "this pod", width: int = 256) -> Finding:
    """GPUResourceRequested, in at most ``width`` characters (an admission warning's limit).

    As many container names as fit; the explanation itself is never cut.
    """
    for count, name_width in ((len(names), 63), (3, 24), (2, 16), (1, 16)):
        shown = ", ".join(repr(n[:name_width]) for n in names[:count]) + (
            ", ..." if len(names) > count else ""
        )
        text = f"{subject} also requests {GPU_RESOURCE} ({shown}): {PITFALL_ADVICE}"
        if len(text) <= width:
            break
    return Finding(GPU_RESOURCE_REQUESTED, text)


def gpu_resource_denial(names: Sequence[str]) -> str:
    """GPUResourceRequested in full, for a denial (status messages are not truncated)."""
    return (
        f"the pod uses {ANNOTATION} and also requests {GPU_RESOURCE} "
        f"(containers {', '.join(repr(n) for n in names)}): the NVIDIA device plugin would choose which GPUs "
        "the container gets and "
        "they are renumbered from 0 inside it, so the map's indices would point at the wrong GPU. "
        f"Remove the {GPU_RESOURCE} requests/limits (the map already reserves the GPUs), or ask the "
        "operator to set WEBHOOK_GPU_RESOURCE_POLICY=warn"
    )


def other_scheduler(scheduler: str, ours: str, width: int = 256) -> Finding:
    """SchedulerNameMismatch on a Pod: the webhook leaves it alone (within ``width`` characters)."""
    return Finding(
        SCHEDULER_NAME_MISMATCH,
        (
            f"spec.schedulerName is {excerpt(scheduler, 40)!r}, not {excerpt(ours, 40)!r}: {ANNOTATION} "
            "ignored, no GPU variables set (the map's GPU indices would be used on whatever node that "
            f"scheduler picks); set spec.schedulerName: {excerpt(ours, 40)}"
        )[:width],
        "spec.schedulerName",
    )


def node_name_on_pod(node_name: str, ours: str) -> Finding:
    """NodeNameSet on a Pod: the webhook denies it."""
    return Finding(
        NODE_NAME_SET,
        f"spec.nodeName is set ({excerpt(node_name)!r}) on a pod carrying {ANNOTATION}: such a pod "
        f"bypasses the scheduler, so its GPUs could be given twice; {ours} binds it to "
        "the node its map names. Remove spec.nodeName",
        "spec.nodeName",
    )


def pod_template_findings(pod_spec: Mapping[str, Any], ours: str, where: str) -> list[Finding]:
    """SchedulerNameMismatch and NodeNameSet for a pod template (its spec at ``where``)."""
    findings: list[Finding] = []
    scheduler = pod_spec.get("schedulerName")
    if scheduler in (None, "", "default-scheduler"):
        findings.append(
            Finding(
                SCHEDULER_NAME_MISMATCH,
                f"{where}.schedulerName is not set: the default scheduler will place these pods "
                f"and ignore {ANNOTATION}; set it to the GPU scheduler's name ({ours})",
                f"{where}.schedulerName",
            )
        )
    elif scheduler != ours:
        findings.append(
            Finding(
                SCHEDULER_NAME_MISMATCH,
                f"{where}.schedulerName is {excerpt(str(scheduler), 40)!r}, not the GPU scheduler "
                f"({ours}): these pods get no GPU variables and their node is not the map's; "
                f"set it to {ours}",
                f"{where}.schedulerName",
            )
        )
    node_name = pod_spec.get("nodeName")
    if node_name:
        findings.append(
            Finding(
                NODE_NAME_SET,
                f"{where}.nodeName is set ({excerpt(str(node_name), 40)!r}): every pod of this "
                f"StatefulSet will be refused, because a pod carrying {ANNOTATION} must be placed by {ours}; "
                "remove nodeName",
                f"{where}.nodeName",
            )
        )
    return findings


def map_not_on_template(kind: str) -> Finding:
    """MapNotOnPodTemplate: the annotation is on a controller's own metadata, where no pod sees it."""
    return Finding(
        MAP_NOT_ON_TEMPLATE,
        f"{ANNOTATION} is on the {kind}'s own metadata, where it has no effect: move it to "
        "spec.template.metadata.annotations so every pod carries it",
        "metadata.annotations",
    )


def missing_ordinals(smap: SchedulingMap, start: int, replicas: int, show: int = 5) -> tuple[int, list[int]]:
    """How many of ordinals ``start .. start+replicas-1`` have no entry, and the first ``show`` of them.

    Work is bounded by the map's size and ``show``, not by ``replicas`` (which may be huge).
    """
    covered = sum(1 for o in smap if start <= o < start + replicas)
    count = replicas - covered
    first: list[int] = []
    ordinal = start
    while len(first) < min(show, count):
        if ordinal not in smap:
            first.append(ordinal)
        ordinal += 1
    return count, first


def replica_findings(smap: SchedulingMap, start: int, replicas: int) -> list[Finding]:
    """OrdinalNotInMap for a StatefulSet: replicas ``start .. start+replicas-1`` without an entry."""
    count, first = missing_ordinals(smap, start, replicas)
    if not count:
        return []
    shown = ", ".join(map(str, first)) + (f" and {count - len(first)} more" if count > len(first) else "")
    return [
        Finding(
            ORDINAL_NOT_MAPPED,
            f"{ANNOTATION} has no entry for ordinal {shown} ({count} of {replicas} replicas): "
            "those pods get no GPU variables and cannot be placed",
        )
    ]


def unused_ordinals(smap: SchedulingMap, start: int, replicas: int) -> list[Finding]:
    """OrdinalNotUsed: entries for ordinals no replica has (lint only: harmless, likely a mistake)."""
    unused = [o for o in smap if not start <= o < start + replicas]
    if not unused:
        return []
    span = f"ordinals {start}-{start + replicas - 1}" if replicas else "no pods"
    return [
        Finding(ORDINAL_UNUSED, f"ordinal(s) {ranges(unused)} are not used with replicas {replicas} ({span})")
    ]


def ranges(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    nums = sorted(set(numbers))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(out)


def map_node_findings(node: str, entries: Sequence[Entry], exists: bool, gpus: int | None) -> list[Finding]:
    """NodeNotFound / NoGPUResource / GPUIndexOutOfRange for every entry of a map on ``node``.

    The StatefulSet form of :func:`check_node`'s GPU part (one finding per node, naming map lines).
    """
    if not exists:
        ordinals = ", ".join(str(e.ordinal) for e in entries)
        lines = ", ".join(str(e.line) for e in entries)
        return [
            Finding(
                NODE_NOT_FOUND,
                f"{ANNOTATION}: node {node!r} (ordinals {ordinals}, line {lines}) "
                "does not exist; those replicas stay Pending until it does",
            )
        ]
    if gpus is None:
        wanted = "; ".join(f"ordinal {e.ordinal} (line {e.line}) GPU {e.devices}" for e in entries)
        return [
            Finding(
                NO_GPU_RESOURCE,
                f"{ANNOTATION}: node {node!r} reports no {GPU_RESOURCE} (no GPUs, or no NVIDIA device "
                f"plugin), so the GPUs mapped to it cannot be checked: {wanted}",
            )
        ]
    findings: list[Finding] = []
    for entry in entries:
        too_high = [g for g in entry.gpus if g >= gpus]
        if not too_high:
            continue
        have = f"node {node!r} has {gpus} allocatable {GPU_RESOURCE}"
        have += f" (indices 0..{gpus - 1})" if gpus else ""
        findings.append(
            Finding(
                GPU_OUT_OF_RANGE,
                f"{ANNOTATION} line {entry.line}: ordinal {entry.ordinal} wants GPU "
                f"{','.join(map(str, too_high))} but {have}",
            )
        )
    return findings


def entries_by_node(smap: SchedulingMap) -> dict[str, list[Entry]]:
    """The map's entries grouped by node, nodes sorted by name."""
    by_node: dict[str, list[Entry]] = {}
    for ordinal in smap:
        by_node.setdefault(smap[ordinal].node, []).append(smap[ordinal])
    return dict(sorted(by_node.items()))
