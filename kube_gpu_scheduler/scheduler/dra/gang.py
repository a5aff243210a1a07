"""Gang placement in DRA mode: every replica's scheduling gate stays closed until all can be allocated.

In DRA mode kube-scheduler allocates and binds, so "can be placed" is what the claim controller
can know before kube-scheduler looks: every replica of the StatefulSet exists at this map
revision, its ResourceClaim asks for its entry, and every GPU of every entry is published,
untainted, and neither allocated to another claim nor promised to another gang. Then the
gates open, one per member as each is processed, and the gang's devices are *promised* to it
for :data:`PROMISE_S` seconds, so a second gang that wants one of them waits whole instead of
racing the first in kube-scheduler (where each would get half). kube-scheduler's own filters
(the pod's resources, affinity) still run after the gates open.

A waiting member says why in a ``GangWaiting`` Warning, naming each blocked replica.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kube_gpu_scheduler.domain import dra, draclaims
from kube_gpu_scheduler.domain.gang import Blocked, GangKey, gang_note, gang_of, missing, replica_ordinals
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import entry_for, ordinal_of, pod_map
from kube_gpu_scheduler.domain.rules import FAILED_SCHEDULING, GANG_WAITING
from kube_gpu_scheduler.domain.schedmap import MapError
from kube_gpu_scheduler.scheduler.dra.handlers import POD
from kube_gpu_scheduler.scheduler.dra.index import DeviceKey
from kube_gpu_scheduler.scheduler.dra.taints import tainted

PROMISE_S = 120.0  # an opened gang's devices are kept from other gangs this long (or until allocated)


class Controller(Protocol):
    """What the gang check reads of the claim controller (``ClaimController``)."""

    driver: str
    index: Any
    pods: Any
    claims: Any
    statefulsets: Any
    queue: Any
    _events: Any

    def devices(self, node: str) -> list[dra.Device]: ...


class DraGangs:
    def __init__(self, controller: Controller, clock: Callable[[], float] = time.monotonic) -> None:
        self._c = controller
        self._clock = clock
        self._lock = threading.Lock()
        self._promised: dict[DeviceKey, tuple[GangKey, float]] = {}

    def may_open(self, pod: Mapping[str, Any]) -> bool:
        """True when the pod is no gang member, or its whole gang can be allocated now (its devices
        are then promised to it); else a GangWaiting Warning says why, and the gate stays closed."""
        gang = gang_of(pod)
        if gang is None:
            return True
        sts = self._c.statefulsets.get(f"{gang.namespace}/{gang.owner_name}")
        ordinals = replica_ordinals(sts) if sts is not None and Pod(sts).uid == gang.owner_uid else range(0)
        policy = Pod(sts).spec.get("podManagementPolicy") if sts is not None else None
        blocked: list[Blocked] = []
        wanted: list[tuple[Blocked, DeviceKey]] = []  # each device, with what to say if another gang has it
        for ordinal in ordinals:
            member = self._c.pods.get(f"{gang.namespace}/{gang.owner_name}-{ordinal}")
            if member is None or gang_of(member) != gang or Pod(member).deleting:
                blocked.append(missing(ordinal, f"{gang.owner_name}-{ordinal}", policy))
                continue
            if not dra.gated(member):
                continue  # opened already (or bound): kube-scheduler has it
            found = self._member(member, wanted)
            if found is not None:
                blocked.append(found)
        now = self._clock()
        if not blocked:
            with self._lock:
                taken = [
                    said
                    for said, device in wanted
                    if (p := self._promised.get(device)) and p[0] != gang and now - p[1] < PROMISE_S
                ]
                if not taken:
                    for _, device in wanted:
                        self._promised[device] = (gang, now)
            if not taken:
                for ordinal in ordinals:  # the other gated members open theirs as each is processed
                    key = f"{gang.namespace}/{gang.owner_name}-{ordinal}"
                    if key != Pod(pod).key:
                        self._c.queue.add(POD + key)
                return True
            blocked = taken
        note = gang_note(gang, len(ordinals), blocked)
        self._c._events.warning(pod, FAILED_SCHEDULING, f"{GANG_WAITING}: {note}")
        self._c.index.wait(Pod(pod).key, [d for _, d in wanted])
        return False

    def _member(self, member: Mapping[str, Any], wanted: list[tuple[Blocked, DeviceKey]]) -> Blocked | None:
        """Why this gated member could not be allocated now (None: it could), its devices added to ``wanted``."""
        view = Pod(member)
        ordinal = ordinal_of(view.name, view.labels) or 0
        try:
            _, entry = entry_for(view.meta)
        except MapError:
            entry = None
        if entry is None:
            return Blocked(ordinal, None, "", "no entry in the map")
        try:
            smap = pod_map(view.meta)
        except MapError:
            smap = None
        parts = draclaims.layout(smap, ordinal, view.name or "") if smap is not None else []
        own = {f"{view.namespace}/{p.name}" for p in parts}
        for part in parts:
            claim = self._c.claims.get(f"{view.namespace}/{part.name}")
            annotation, want = part.made_for
            if claim is None or Pod(claim).annotations.get(annotation) != want:
                return Blocked(
                    ordinal,
                    entry,
                    "",
                    f"its ResourceClaim {view.namespace}/{part.name} is not made for its entry yet",
                )
        try:
            devices = dra.resolve(entry, self._c.devices(entry.node))
        except dra.Unresolved as err:
            return Blocked(ordinal, entry, "", str(err))
        if tainted(devices):
            return Blocked(
                ordinal, entry, "", "a GPU of its entry has a NoSchedule or NoExecute device taint"
            )
        for device in devices:
            key: DeviceKey = (self._c.driver, device.pool, device.name)
            promised = f"{device.describe()} is promised to another gang whose gates are open"
            wanted.append((Blocked(ordinal, entry, "", promised), key))
            for holder in self._c.index.holders(key):
                other = self._c.claims.get(holder)
                if holder not in own and other is not None and dra.allocation(other):
                    return Blocked(
                        ordinal, entry, "", f"{device.describe()} is allocated to ResourceClaim {holder}"
                    )
        return None
