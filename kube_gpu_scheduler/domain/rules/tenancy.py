"""Tenancy's rules: the namespace may pin the node, within every granting policy's limits; and a
replica admitted without its variables waits for its namespace to be opted in to injection.

The counting and the policies are :mod:`kube_gpu_scheduler.domain.tenancy`'s; these are the
rules and their words, for the scheduler (from its caches), the webhook and the
ValidatingAdmissionPolicy (from the resolved grants the scheduler publishes; the chart's
``tenancy-policy.yaml`` says the same in CEL).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kube_gpu_scheduler.domain.rules.framework import (
    ON_GPU_HOLDER,
    ON_NAMESPACE,
    ON_POLICY,
    REFUSE,
    Finding,
    emits,
    rule,
)
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, Entry, excerpt
from kube_gpu_scheduler.domain.selectors import IN, Selector
from kube_gpu_scheduler.domain.tenancy import KIND, Grants, holders_text

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

NOT_GRANTED = rule(
    "NotGranted",
    "PinningGranted",
    f"with tenancy on, some {KIND} grants the pod's namespace the mapped node (its "
    "namespaceSelector selects the namespace, its nodeSelector the node)",
    {ON_POLICY},
    "the CLI knows no policies",
    scheduler=REFUSE,
    mutate=REFUSE,
    validate=REFUSE,
)
GPU_LIMIT_REACHED = rule(
    "GPULimitReached",
    "PinningLimits",
    f"with tenancy on, the replica's GPUs keep every {KIND} that grants its namespace the node "
    "within spec.maxGPUs and its spec.gpuTypes limit for the node's GPU type",
    {ON_POLICY, ON_GPU_HOLDER},
    "only the scheduler counts what is held",
    scheduler=REFUSE,
)
NAMESPACE_NOT_OPTED_IN = rule(
    "NamespaceNotOptedIn",
    "NamespaceInjected",
    "a replica admitted without its GPU variables is in a namespace injection serves (else it is "
    "not deleted and recreated: it would come back the same)",
    {ON_NAMESPACE},
    "only the scheduler sees a pod admitted without its variables",
    scheduler=REFUSE,
)


def _names(policies: Sequence[str]) -> str:
    return ", ".join(policies[:8]) + (f" and {len(policies) - 8} more" if len(policies) > 8 else "")


@emits(NOT_GRANTED)
def not_granted(namespace: str, entry: Entry, considered: Sequence[tuple[str, str]]) -> Finding:
    """NotGranted for the scheduler: ``considered`` is ``(policy, its nodeSelector)`` for each
    policy that selects the namespace (none of which selects the node)."""
    where = f"replica {entry.ordinal} is mapped to {excerpt(str(entry))}"
    if not considered:
        return Finding(
            NOT_GRANTED,
            f"no {KIND} selects namespace '{namespace}' ({where}): with tenancy on, a namespace pins "
            "GPUs only through a policy an admin writes",
        )
    named = [f"{name} (nodeSelector {excerpt(nodes)})" for name, nodes in considered]
    return Finding(
        NOT_GRANTED,
        f"no {KIND} grants namespace '{namespace}' node '{entry.node}' ({where}); policies "
        f"considered: {_names(named)}",
    )


@emits(NOT_GRANTED)
def map_not_granted(entries: Iterable[Entry], namespace: str, grants: Grants) -> list[Finding]:
    """NotGranted at admission, once: the first of ``entries`` (in text order:
    ``SchedulingMap.entries.values()``) whose node no policy grants ``namespace``, its line and
    the policies considered, and how many more entries fail. The chart's ``tenancy-policy.yaml``
    says the same, word for word."""
    failing = [e for e in entries if not grants.granted(namespace, e.node)]
    if not failing:
        return []
    first, considered = failing[0], grants.considered(namespace)
    more = len(failing) - 1
    policies = ", ".join(considered) if considered else f"none selects namespace '{namespace}'"
    return [
        Finding(
            NOT_GRANTED,
            f"{ANNOTATION} line {first.line}: replica {first.ordinal} is mapped to node "
            f"'{first.node}', which no {KIND} grants namespace '{namespace}' (policies considered: "
            f"{policies})" + (f" (and {more} more entr{'y' if more == 1 else 'ies'})" if more else ""),
        )
    ]


@emits(GPU_LIMIT_REACHED)
def limit_reached(
    policy: str,
    what: str,
    most: int,
    product: str,
    held: int,
    holders: Sequence[str],
    entry: Entry,
    want: int,
) -> Finding:
    """GPULimitReached: binding ``entry`` (``want`` GPUs) would take ``policy`` past one limit."""
    kind = f" of type '{product}'" if what != "spec.maxGPUs" else ""
    return Finding(
        GPU_LIMIT_REACHED,
        f"{KIND} '{policy}' allows {most} GPU{'' if most == 1 else 's'}{kind} ({what}) to the "
        f"namespaces it selects on its nodes; {held} {'is' if held == 1 else 'are'} held "
        f"({holders_text(holders)}) and replica {entry.ordinal} needs {want} more "
        f"({excerpt(str(entry))}): it binds when GPUs are freed or the limit is raised",
    )


def opt_in_advice(namespace: str, scope: Selector, labels: dict[str, str]) -> str:
    """What makes ``namespace`` one that injection serves (a label to set, or why it cannot be)."""
    failing = scope.failing(labels)
    if any(r.key == NAMESPACE_NAME_LABEL for r in failing):
        return (
            "it is excluded by name (injection.excludeNamespaces, or the chart's release namespace): "
            "run the workload in another namespace"
        )
    simple = [r for r in failing if r.operator == IN and len(r.values) == 1]
    if simple and len(simple) == len(failing):
        pairs = " ".join(f"{r.key}={next(iter(r.values))}" for r in simple)
        return f"opt it in: kubectl label namespace {namespace} {pairs}"
    return f"opt it in: give it labels that match injection.namespaceSelector ({excerpt(str(scope))})"


@emits(NAMESPACE_NOT_OPTED_IN)
def not_opted_in(namespace: str, scope: Selector, labels: dict[str, str], entry: Entry) -> Finding:
    """NamespaceNotOptedIn: the replica was admitted without its variables because injection does
    not serve its namespace; recreating it would change nothing until the namespace is opted in."""
    return Finding(
        NAMESPACE_NOT_OPTED_IN,
        f"namespace '{namespace}' is not one injection serves (injection.namespaceSelector "
        f"{excerpt(str(scope))}), so replica {entry.ordinal} ({excerpt(str(entry))}) was admitted "
        "without its GPU variables and is not deleted and recreated (it would come back the same); "
        f"{opt_in_advice(namespace, scope, labels)}; it is then recreated through admission and placed",
    )
