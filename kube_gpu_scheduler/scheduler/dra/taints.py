"""DRA mode's device taints: the taints on a replica's GPUs, and what the claim controller says.

A GPU carries the taints its ResourceSlice gives it (the DRA driver's) and those of every
``DeviceTaintRule`` that selects it (an admin's; the rules' cache, indexed by pool in
:class:`kube_gpu_scheduler.scheduler.dra.index.ClaimIndex`, so a device's look-up reads only
the rules that may select it). The claims gpu-scheduler makes tolerate no taint, so a
``NoSchedule`` or ``NoExecute`` taint on a GPU of a replica's entry keeps the replica waiting:

* kube-scheduler allocates a tainted device to no claim that does not tolerate it; and a
  claim already allocated (pinned by its StatefulSet) would be reused by a new pod without
  that check, so the controller keeps the replica's scheduling gate closed while a GPU of
  its entry is tainted (``GPUTainted``, naming the taint, its rule and the device);
* ``NoExecute`` on a GPU a running replica's claim is allocated: kube-controller-manager's
  device taint eviction deletes the pod. The pin must not keep the tainted allocation
  alive: once no pod uses the claim, the controller unpins and deletes it
  (``TaintedClaimReleased``), so the device is deallocated and the next pod of the replica
  waits with ``GPUTainted`` instead of going back onto it;
* a taint that goes (the rule deleted, the slice republished without it) queues the replicas
  of that node again (:mod:`kube_gpu_scheduler.scheduler.dra.handlers`): the gate is opened
  and kube-scheduler allocates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.devicetaints import Taint, blocking, rule_taint
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules.catalogue import GPU_TAINTED, TAINTED_CLAIM_RELEASED
from kube_gpu_scheduler.domain.schedmap import Entry
from kube_gpu_scheduler.kube.informer import Cache
from kube_gpu_scheduler.scheduler.dra.index import ClaimIndex
from kube_gpu_scheduler.scheduler.report.events import EventRecorder

# A device and the taints on it that keep a claim of ours off it (NoExecute first).
Tainted = tuple[dra.Device, list[Taint]]


def tainted(devices: Iterable[dra.Device]) -> list[Tainted]:
    """The devices with a NoSchedule or NoExecute taint, each with those taints."""
    return [(d, found) for d in devices if (found := blocking(d.taints))]


def evicting(found: Sequence[Tainted]) -> list[Tainted]:
    """Those with a NoExecute taint."""
    return [(d, [t for t in ts if t.evicts]) for d, ts in found if any(t.evicts for t in ts)]


def _where(node: str, found: Sequence[Tainted]) -> str:
    """``n1/gpu-2 (0000:3a:00.0, GPU-...) is tainted k=v:NoExecute (DeviceTaintRule r)``"""
    return "; ".join(
        f"{node}/{d.describe()} is tainted {', '.join(t.describe() for t in ts)}" for d, ts in found
    )


def _way_out(found: Sequence[Tainted]) -> str:
    """What removes the taints: each rule deleted, or the driver clearing its slice's."""
    rules = sorted({t.rule for _, ts in found for t in ts if t.rule})
    ways = [f"kubectl delete devicetaintrule {r} (or change its selector)" for r in rules]
    if any(not t.rule for _, ts in found for t in ts):
        ways.append(
            "the DRA driver removes the taint from its ResourceSlice (it taints a device it finds unhealthy)"
        )
    return "; ".join(ways)


class TaintedGpus:
    """The DeviceTaintRules' cache (set by the controller's ``attach``) and the notes about taints."""

    def __init__(self, index: ClaimIndex, events: EventRecorder, driver: str) -> None:
        self._index = index
        self._events = events
        self._driver = driver
        self.rules: Cache

    def with_rules(self, devices: Sequence[dra.Device]) -> list[dra.Device]:
        """``devices`` (their slice's taints) with the taints of the DeviceTaintRules that select them."""
        out = []
        for d in devices:
            extra = tuple(
                t
                for key in self._index.rules_for(d.pool)
                if (rule := self.rules.get(key)) is not None
                and (t := rule_taint(rule, self._driver, d.pool, d.name)) is not None
            )
            out.append(replace(d, taints=d.taints + extra) if extra else d)
        return out

    def waits(
        self,
        pod: Mapping[str, Any],
        ordinal: int,
        entry: Entry,
        claim: Mapping[str, Any],
        found: Sequence[Tainted],
        *,
        users: Sequence[str] = (),
    ) -> None:
        """The replica is not placed yet and a GPU of its entry is tainted."""
        cview = Pod(claim)
        name = f"{cview.namespace}/{cview.name}"
        note = (
            f"{GPU_TAINTED}: replica {ordinal} (entry '{entry}') waits: {_where(entry.node, found)}. "
            "kube-scheduler allocates a tainted device to no claim that does not tolerate the taint, "
        )
        if dra.allocation(claim) and evicting(found):
            gone = (
                f"{', '.join(f'pod {cview.namespace}/{u}' for u in users)} {'is' if len(users) == 1 else 'are'} gone"
                if users
                else "no pod uses it"
            )
            note += (
                f"and its ResourceClaim {name} is released (unpinned and deleted) once {gone}: a NoExecute "
                "taint must not stay allocated. "
            )
        else:
            # A gate opened before the taint came cannot be closed again: kube-scheduler then
            # keeps the pod pending (its own FailedScheduling says so) until the taint goes.
            hold = (
                "gpu-scheduler keeps the pod's scheduling gate closed"
                if dra.gated(pod)
                else "the pod stays pending (its gate was opened before the taint came)"
            )
            if dra.allocation(claim) and not dra.gated(pod):
                note += (
                    f"but its ResourceClaim {name} is allocated already and its gate was opened before the "
                    "taint came: kube-scheduler checks taints only when it allocates, so it may still bind "
                    "the pod to that claim. "
                )
            elif dra.allocation(claim):
                note += f"and its ResourceClaim {name} keeps the GPU pinned (NoSchedule evicts nothing), so {hold}. "
            else:
                note += f"so {hold}. "
        note += f"It is placed as soon as the taint is gone: {_way_out(found)}; or map the replica to another GPU."
        self._events.warning(pod, GPU_TAINTED, note)

    def running(
        self,
        pod: Mapping[str, Any],
        ordinal: int,
        entry: Entry,
        claim: Mapping[str, Any],
        found: Sequence[Tainted],
    ) -> None:
        """The replica runs with a tainted GPU of its claim."""
        view, cview = Pod(pod), Pod(claim)
        name = f"{cview.namespace}/{cview.name}"
        note = f"{GPU_TAINTED}: replica {ordinal} (entry '{entry}') runs with {_where(entry.node, found)}. "
        if evicting(found):
            note += (
                "Kubernetes' device taint eviction (kube-controller-manager's device-taint-eviction-controller) "
                f"evicts the pod; once it is gone gpu-scheduler releases ResourceClaim {name} (unpins and "
                "deletes it) and the replica's next pod waits until the taint is gone. If that controller does "
                f"not run in this cluster, delete pod {view.key}."
            )
        else:
            note += (
                f"It keeps running (NoSchedule evicts nothing) and ResourceClaim {name} stays pinned; a new "
                f"pod of the replica waits until the taint is gone ({_way_out(found)})."
            )
        self._events.warning(pod, GPU_TAINTED, note)

    def released(
        self, pod: Mapping[str, Any], claim: Mapping[str, Any], found: Sequence[Tainted], node: str
    ) -> None:
        cview = Pod(claim)
        self._events.normal(
            pod,
            TAINTED_CLAIM_RELEASED,
            f"{TAINTED_CLAIM_RELEASED}: ResourceClaim {cview.namespace}/{cview.name} is unpinned and deleted: "
            f"{_where(node, found)}, and no pod uses the claim any more, so its GPUs are deallocated. The "
            f"replica waits until the taint is gone ({GPU_TAINTED}), then its new claim is allocated.",
        )
