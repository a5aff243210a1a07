"""Every reason the product writes: the rules' (``RULES``) and the others, once.

An Event's reason, the ``reason`` label of the failures metric, a CLI finding's
reason, a log line's ``reason``: each comes from here, so a reason is spelt in
one place (tests/unit/rules/test_rules_catalogue.py holds scheduler/ to that).

``RULES`` is what the group modules registered (:func:`.framework.rule`), each
rule beside its checks: :mod:`.pod` (the map, the ordinal, the injection),
:mod:`.node` (the node's state), :mod:`.gpus` (the mapped GPUs), :mod:`.fit`
(room on the node), :mod:`.tenancy` (GPUPinningPolicies, the namespaces injection serves),
:mod:`.sharing` (shared GPUs: forbidden, or warned about), :mod:`.findings` (admission and lint
only).
"""

from __future__ import annotations

from kube_gpu_scheduler.domain.rules import findings, fit, gpus, node, pod, sharing, tenancy
from kube_gpu_scheduler.domain.rules.framework import REFUSE, REGISTRY, SCHEDULER, Rule

GROUPS = (pod, node, gpus, fit, tenancy, sharing, findings)

RULES: dict[str, Rule] = REGISTRY

# The scheduler's refusals: Event reasons and the `reason` label of the failures metric.
ALL_REASONS = tuple(r.reason for r in RULES.values() if r.severity.get(SCHEDULER) == REFUSE)

# -- reasons that are no rule's ---------------------------------------------------------

# The scheduler's Events on a pod (kube-scheduler's words).
SCHEDULED = "Scheduled"  # Normal: bound
FAILED_SCHEDULING = "FailedScheduling"  # Warning: not bound, the note names the rule's reason
REFUSED_BY_KUBELET = "RefusedByKubelet"  # Warning: the node's kubelet refused the bound pod
# The PodScheduled condition's reason while a pod waits (v1.PodReasonUnschedulable).
POD_UNSCHEDULABLE = "Unschedulable"

# Failures that are not a rule's refusal (kube-scheduler's Error status): metrics labels.
API_ERROR = "APIError"  # the apiserver refused or failed a write
BOUND_ELSEWHERE = "BoundElsewhere"  # someone else bound the pod first

# The extender's answers for a node it filters out (the note's first word), and its log reason.
NOT_LEADER = "NotLeader"
NOT_SYNCED = "NotSynced"
MAPPED_ELSEWHERE = "NotMappedNode"
NOT_A_CANDIDATE = "NotACandidate"

# The scheduler's Event on an outdated replica it evicts so that its StatefulSet's rollout can
# go on (the replica of the new revision waits for a GPU the outdated one holds).
EVICTED_FOR_ROLLOUT = "EvictedForRollout"

# The scheduler's Event on one of its pods that is terminating on a node that is not Ready: it
# keeps its GPUs (and its StatefulSet makes no replacement) until the node comes back or the
# operator force-deletes it (kube_gpu_scheduler/scheduler/report/lostnode.py).
TERMINATING_ON_NOT_READY_NODE = "TerminatingOnNotReadyNode"

# DRA mode (kube_gpu_scheduler/scheduler/dra/controller.py): Events on a replica about its ResourceClaim.
CLAIM_CREATED = "ClaimCreated"  # Normal: its claim was made from its entry
CLAIM_REPLACED = "ClaimReplaced"  # Normal: a claim made for another entry was deleted, to be made again
CLAIM_NOT_OURS = "ClaimNotOurs"  # Warning: a claim of that name exists that gpu-scheduler did not make
GPU_NOT_PUBLISHED = "GPUNotPublished"  # Warning: a GPU of the entry is in no ResourceSlice of its node
GPU_ALLOCATED_ELSEWHERE = "GPUAllocatedElsewhere"  # Warning: a GPU of the entry is another claim's
ALLOCATED_GPU_GONE = "AllocatedGPUGone"  # Warning: the claim is allocated a GPU its node no longer publishes
GPU_TAINTED = "GPUTainted"  # Warning: a GPU of the entry has a NoSchedule or NoExecute device taint
TAINTED_CLAIM_RELEASED = "TaintedClaimReleased"  # Normal: a claim on a NoExecute-tainted GPU was released
GPUS_CHOSEN = "GPUsChosen"  # Normal: kube-scheduler allocated a count entry's claim these GPUs
GPU_COUNT_WAITS = "GPUCountWaits"  # Warning: no topology group of the node has the count's GPUs free
GPUS_SPAN_TOPOLOGY = "GPUsSpanTopology"  # Warning: a named entry's GPUs span PCIe roots (else NUMA nodes)

# Tenancy (kube_gpu_scheduler/scheduler/tenancy/holdings.py): the reasons of a GPUPinningPolicy's status
# conditions, Enforced (True: counted; False: its spec does not parse) and LimitReached.
POLICY_COUNTED = "Counted"
POLICY_INVALID = "InvalidSpec"
POLICY_AT_LIMIT = "AtLimit"
POLICY_BELOW_LIMITS = "BelowLimits"
# Gang placement (kube_gpu_scheduler/domain/gang.py): a member of a gang that cannot be placed
# whole waits; its FailedScheduling note opens with this and names each blocked replica.
GANG_WAITING = "GangWaiting"
# gpu-scheduler-map plan: another map not yet placed (a replica of another StatefulSet in the
# cluster or in the same input) names the same GPU: whichever is placed first gets it.
MAP_CONFLICT = "MapConflict"

# The leader elector's Event on its Lease.
ABSURD_LEASE_DURATION = "AbsurdLeaseDuration"

# status.reason of a pod the kubelet rejected at admission (besides OutOf<resource>).
KUBELET_OUT_OF = "OutOf"
KUBELET_ADMISSION_REASONS = frozenset(
    {
        "NodeAffinity",
        "NodePorts",
        "NodeName",
        "UnexpectedAdmissionError",
        "TopologyAffinityError",
        "InvalidNodeInfo",
        "PodOSNotSupported",
        "PodOSSelectorNodeLabelDoesNotMatch",
        "SysctlForbidden",
    }
)

# DRA mode's claim controller: the reasons of its Events (its metrics export each at zero).
DRA_CLAIM_REASONS = (
    CLAIM_CREATED,
    CLAIM_REPLACED,
    CLAIM_NOT_OURS,
    GPU_NOT_PUBLISHED,
    GPU_ALLOCATED_ELSEWHERE,
    ALLOCATED_GPU_GONE,
    GPU_TAINTED,
    TAINTED_CLAIM_RELEASED,
    GPUS_CHOSEN,
    GPU_COUNT_WAITS,
    GPUS_SPAN_TOPOLOGY,
)

OTHER_REASONS = (
    SCHEDULED,
    FAILED_SCHEDULING,
    REFUSED_BY_KUBELET,
    POD_UNSCHEDULABLE,
    API_ERROR,
    BOUND_ELSEWHERE,
    NOT_LEADER,
    NOT_SYNCED,
    MAPPED_ELSEWHERE,
    NOT_A_CANDIDATE,
    ABSURD_LEASE_DURATION,
    EVICTED_FOR_ROLLOUT,
    TERMINATING_ON_NOT_READY_NODE,
    *DRA_CLAIM_REASONS,
    POLICY_COUNTED,
    POLICY_INVALID,
    POLICY_AT_LIMIT,
    POLICY_BELOW_LIMITS,
    GANG_WAITING,
    MAP_CONFLICT,
)
