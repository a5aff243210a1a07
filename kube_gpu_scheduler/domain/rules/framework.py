"""What a rule is: kube-scheduler's framework (interface.go), for the GPU map's rules.

A :class:`Rule` is one filter's metadata: its reason (an Event's words, a
metrics label, the ``reason`` of a CLI finding), what it checks, the changes
that can unblock it (kube-scheduler's EventsToRegister) and what each front end
makes of a :class:`Finding`. The group modules (``node``, ``gpus``, ``fit``,
``pod``, ``findings``) each define their rules with :func:`rule` next to the
checks that emit them, and mark each check with :func:`emits`; the catalogue
(``catalogue.RULES``) is what they registered.

The status vocabulary, against kube-scheduler's: a front end REFUSEs
(``Unschedulable``: the pod waits until one of ``unblocked_by`` changes; with
``unblocked_by`` NEVER, ``UnschedulableAndUnresolvable``: the pod must be
recreated) or WARNs (binds, admits or lints with a warning). An API error is
kube-scheduler's ``Error``: not a rule, its reason is in ``reasons``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
ON_POLICY = "policy"  # a GPUPinningPolicy, or the labels of a namespace or node one selects
ON_NAMESPACE = "namespace"  # the pod's namespace (its labels)
NEVER: frozenset[str] = frozenset()  # nothing: the pod must be recreated


@dataclass(frozen=True)
class Rule:
    """One filter: its reason, what it checks, what unblocks it, what each front end does with it.

    ``severity`` maps a front end to REFUSE or WARN; a front end it does not
    name does not evaluate the rule (and says so in :attr:`why_not`).
    ``filters`` are the functions that emit its findings (:func:`emits`).
    """

    reason: str
    name: str
    checks: str
    unblocked_by: frozenset[str]
    severity: Mapping[str, str]
    why_not: str = ""
    filters: list[Callable[..., Any]] = field(default_factory=list, compare=False, repr=False)


# reason -> Rule, in the order the group modules registered them (catalogue.RULES).
REGISTRY: dict[str, Rule] = {}


def rule(
    reason: str, name: str, checks: str, unblocked_by: Iterable[str], why_not: str = "", **severity: str
) -> str:
    """Register one rule; returns its reason, the constant its checks and callers use."""
    if reason in REGISTRY:
        raise ValueError(f"rule {reason} registered twice")
    REGISTRY[reason] = Rule(reason, name, checks, frozenset(unblocked_by), severity, why_not)
    return reason


F = TypeVar("F", bound=Callable[..., Any])


def emits(*reasons: str) -> Callable[[F], F]:
    """Mark a check as the filter of these rules: it constructs findings of no other reason
    (tests/unit/rules/test_rules_catalogue.py reads every check's source to hold it to that)."""

    def mark(check: F) -> F:
        for reason in reasons:
            REGISTRY[reason].filters.append(check)
        return check

    return mark


@dataclass(frozen=True)
class Finding:
    """One rule's verdict on an object: its reason and a message that names what and where.

    ``path`` is the field it concerns, when that is one field (``spec.template.spec.nodeName``),
    so that the CLI can point at its line. The scheduler calls the findings that block
    binding its refusals.
    """

    reason: str
    message: str
    path: str | None = None

    @property
    def rule(self) -> Rule:
        return REGISTRY[self.reason]
