"""What a pod needs from a node and what a node has: resources, host ports, node affinity.

The arithmetic behind the fit rules in :mod:`kube_gpu_scheduler.domain.rules`, written the
way kube-scheduler's NodeResourcesFit, NodePorts and NodeAffinity filters (and
the kubelet's admission) compute it, so that a pod this scheduler binds is one
the kubelet admits:

* a pod's requests are the larger of its biggest init container (plus the
  sidecars started before it) and the sum of its app containers plus every
  sidecar (an init container with ``restartPolicy: Always``), per resource;
  pod-level ``spec.resources.requests`` replace the containers' cpu, memory and
  hugepages; ``spec.overhead`` is added;
* amounts are whole numbers in the units kube-scheduler compares: millicores
  for cpu, bytes for memory, ephemeral-storage and hugepages, counts for the
  rest (rounded up);
* a node offers ``status.allocatable`` (never capacity), including ``pods``:
  a node that does not report ``pods`` takes none, as for kube-scheduler.

Pure functions over API-shaped dicts: nothing here talks to the API.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
HUGEPAGES_PREFIX = "hugepages-"
# Resources a pod-level spec.resources.requests replaces (kube-scheduler's supported pod-level resources).
POD_LEVEL = (CPU, MEMORY)

Amounts = dict[str, int]


def is_bytes(resource: str) -> bool:
    return resource in (MEMORY, EPHEMERAL_STORAGE) or resource.startswith(HUGEPAGES_PREFIX)


def to_amount(resource: str, raw: Any) -> int:
    """A quantity as kube-scheduler compares it (cpu in millicores, rounded up); 0 when unreadable."""
    return _amount(resource, str(raw))


# Every pod event's footprint reads its requests: the same few quantity strings ("1", "500m",
# "1Gi") each time, and the client's parse_quantity goes through Decimal (a tenth of the pod
# watch's handling). Bounded: a tenant writing many distinct quantities only evicts.
@functools.lru_cache(maxsize=4096)
def _amount(resource: str, raw: str) -> int:
    try:
        value = parse_quantity(raw)
    except (ValueError, TypeError, ArithmeticError):
        return 0
    if value <= 0:
        return 0
    if resource == CPU:
        value *= 1000
    return math.ceil(value)


def amounts(resources: Mapping[str, Any] | None) -> Amounts:
    """``{"cpu": "500m", "memory": "1Gi"}`` -> ``{"cpu": 500, "memory": 1073741824}`` (zeroes dropped)."""
    out: Amounts = {}
    for name, raw in (resources or {}).items():
        value = to_amount(str(name), raw)
        if value:
            out[str(name)] = value
    return out


def _requests(container: Mapping[str, Any]) -> Amounts:
    return amounts(((container.get("resources") or {}).get("requests")) or {})


def _add(into: Amounts, more: Mapping[str, int]) -> None:
    for name, value in more.items():
        into[name] = into.get(name, 0) + value


def _max(into: Amounts, other: Mapping[str, int]) -> None:
    for name, value in other.items():
        if value > into.get(name, 0):
            into[name] = value


def pod_requests(pod_spec: Mapping[str, Any] | None) -> Amounts:
    """What a pod asks of its node (kube-scheduler's ``PodRequests``), not counting the pod slot."""
    spec = pod_spec or {}
    total: Amounts = {}
    for container in spec.get("containers") or []:
        if isinstance(container, Mapping):
            _add(total, _requests(container))
    sidecars: Amounts = {}
    biggest_init: Amounts = {}
    for container in spec.get("initContainers") or []:
        if not isinstance(container, Mapping):
            continue
        own = _requests(container)
        if container.get("restartPolicy") == "Always":
            # A sidecar runs beside the app containers and beside every later init container.
            _add(total, own)
            _add(sidecars, own)
            step = dict(sidecars)
        else:
            step = dict(own)
            _add(step, sidecars)
        _max(biggest_init, step)
    _max(total, biggest_init)
    pod_level = amounts(((spec.get("resources") or {}).get("requests")) or {})
    for name, value in pod_level.items():
        if name in POD_LEVEL or name.startswith(HUGEPAGES_PREFIX):
            total[name] = value
    _add(total, amounts(spec.get("overhead")))
    return total


def allocatable(node: Mapping[str, Any] | None) -> Amounts:
    """The node's ``status.allocatable`` in comparable amounts."""
    return amounts(((node or {}).get("status") or {}).get("allocatable") or {})


def show(resource: str, value: int) -> str:
    """An amount as a person reads it: cores for cpu, binary units for bytes."""
    if resource == CPU:
        cores = Decimal(value) / 1000
        return format(cores.normalize(), "f") if value % 1000 else str(value // 1000)
    if is_bytes(resource):
        for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if value >= size:
                scaled = round(value / size, 2)
                text = f"{scaled:.2f}".rstrip("0").rstrip(".")
                return f"{text}{unit}"
        return str(value)
    return str(value)


# -- host ports -----------------------------------------------------------------------

WILDCARD_IP = "0.0.0.0"  # noqa: S104 (a host port on every address, not a bind)


@dataclass(frozen=True)
class HostPort:
    """One ``hostIP:hostPort/protocol`` a pod takes on its node."""

    ip: str
    port: int
    protocol: str

    def conflicts(self, other: HostPort) -> bool:
        """The kubelet's rule: same port and protocol, and the same address or either the wildcard."""
        if self.port != other.port or self.protocol != other.protocol:
            return False
        return self.ip == other.ip or WILDCARD_IP in (self.ip, other.ip)

    def __str__(self) -> str:
        where = "" if self.ip == WILDCARD_IP else f"{self.ip}:"
        return f"{where}{self.port}/{self.protocol}"


def host_ports(pod_spec: Mapping[str, Any] | None) -> tuple[HostPort, ...]:
    """The host ports of the pod's containers and sidecars (kube-scheduler's NodePorts)."""
    spec = pod_spec or {}
    containers: list[Any] = list(spec.get("containers") or [])
    containers += [
        c
        for c in spec.get("initContainers") or []
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
    ]
    out: list[HostPort] = []
    for container in containers:
        if not isinstance(container, Mapping):
            continue
        for port in container.get("ports") or []:
            if not isinstance(port, Mapping):
                continue
            number = port.get("hostPort")
            if not isinstance(number, int) or number <= 0:
                continue
            out.append(
                HostPort(str(port.get("hostIP") or WILDCARD_IP), number, str(port.get("protocol") or "TCP"))
            )
    return tuple(out)


# -- node affinity ----------------------------------------------------------------------


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    operator = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an unknown operator matches nothing: refuse rather than guess


def describe_requirement(req: Mapping[str, Any]) -> str:
    values = [str(v) for v in req.get("values") or []]
    shown = ",".join(values[:5]) + (",..." if len(values) > 5 else "")
    operator = req.get("operator")
    if operator in ("Exists", "DoesNotExist"):
        return f"{req.get('key')} {operator}"
    return f"{req.get('key')} {operator} [{shown}]"


def term_mismatch(term: Mapping[str, Any], node_name: str, labels: Mapping[str, str]) -> str | None:
    """Why one nodeSelectorTerm does not match the node (None when it matches).

    As in Kubernetes: expressions and fields of a term are ANDed; a term with
    neither matches no node; ``matchFields`` knows only ``metadata.name``.
    """
    expressions = [r for r in term.get("matchExpressions") or [] if isinstance(r, Mapping)]
    fields = [r for r in term.get("matchFields") or [] if isinstance(r, Mapping)]
    if not expressions and not fields:
        return "an empty term matches no node"
    for req in expressions:
        value = labels.get(str(req.get("key")))
        if not _requirement_matches(req, value):
            have = f"{req.get('key')}={value}" if value is not None else f"no label {req.get('key')}"
            return f"{describe_requirement(req)}: node has {have}"
    for req in fields:
        if req.get("key") != "metadata.name" or req.get("operator") not in ("In", "NotIn"):
            return (
                f"matchFields {describe_requirement(req)}: only metadata.name with In or NotIn is supported"
            )
        if not _requirement_matches(req, node_name):
            return f"matchFields {describe_requirement(req)}: node is named {node_name}"
    return None


def affinity_mismatch(pod_spec: Mapping[str, Any] | None, node: Mapping[str, Any]) -> str | None:
    """Why the node does not satisfy the pod's nodeSelector and required node affinity (None: it does)."""
    spec = pod_spec or {}
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    name = str(meta.get("name") or "")
    selector = spec.get("nodeSelector") or {}
    wrong = [
        f"{k}={v} (node has {f'{k}={labels[k]}' if k in labels else 'no such label'})"
        for k, v in sorted(selector.items())
        if labels.get(k) != v
    ]
    if wrong:
        return f"nodeSelector {', '.join(wrong[:3])}{' and more' if len(wrong) > 3 else ''}"
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    ) or None
    if required is None:
        return None
    terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, Mapping)]
    reasons = []
    for i, term in enumerate(terms):
        why = term_mismatch(term, name, labels)
        if why is None:
            return None
        reasons.append(f"term {i + 1}: {why}")
    if not terms:
        return "required node affinity has no nodeSelectorTerms, which matches no node"
    more = f"; and {len(reasons) - 3} more terms" if len(reasons) > 3 else ""
    return "required node affinity matches none of its terms (" + "; ".join(reasons[:3]) + more + ")"


def affinity_signature(pod_spec: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What the affinity and fit checks read from a pod (a change may unblock it)."""
    spec = pod_spec or {}
    return (
        tuple(sorted(pod_requests(spec).items())),
        host_ports(spec),
        repr(sorted((spec.get("nodeSelector") or {}).items())),
        repr(
            ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            )
        ),
    )


# -- what a node's pods take ------------------------------------------------------------


@dataclass(frozen=True)
class PodFootprint:
    """What one pod bound to a node takes there: requests, a pod slot, host ports."""

    key: str  # namespace/name
    node: str
    requests: tuple[tuple[str, int], ...]
    ports: tuple[HostPort, ...]

    @classmethod
    def of(cls, key: str, node: str, pod_spec: Mapping[str, Any] | None) -> PodFootprint:
        return cls(key, node, tuple(sorted(pod_requests(pod_spec).items())), host_ports(pod_spec))


@dataclass
class NodeTotals:
    """The sum of the footprints of the pods on one node."""

    requested: Amounts
    pods: int
    ports: list[tuple[HostPort, str]]  # (port, holder pod)

    @classmethod
    def of(cls, footprints: Iterable[PodFootprint]) -> NodeTotals:
        totals = cls({}, 0, [])
        for fp in footprints:
            totals.pods += 1
            _add(totals.requested, dict(fp.requests))
            totals.ports.extend((p, fp.key) for p in fp.ports)
        return totals


@dataclass(frozen=True)
class Shortfall:
    """One resource the node lacks for the pod."""

    resource: str
    requested: int
    free: int
    allocatable: int
    used: int


def shortfalls(
    requests: Mapping[str, int], offered: Mapping[str, int], totals: NodeTotals
) -> list[Shortfall]:
    """Every resource (and the pod slot) the pod needs more of than the node has free."""
    out: list[Shortfall] = []
    slots = offered.get(PODS, 0)
    if totals.pods + 1 > slots:
        out.append(Shortfall(PODS, 1, max(0, slots - totals.pods), slots, totals.pods))
    for name in sorted(requests):
        want = requests[name]
        if name == PODS or want <= 0:
            continue
        have = offered.get(name, 0)
        used = totals.requested.get(name, 0)
        if want > have - used:
            out.append(Shortfall(name, want, max(0, have - used), have, used))
    return out


def port_conflicts(ports: Sequence[HostPort], totals: NodeTotals) -> list[tuple[HostPort, str]]:
    """``(port, holder)`` for each of the pod's host ports another pod on the node already takes."""
    return [(mine, holder) for mine in ports for theirs, holder in totals.ports if mine.conflicts(theirs)]
