"""One placement step, for the standalone loop and the extender alike.

reserve the GPUs (and, standalone, the room on the node) → check leadership →
POST the Binding → on a refusal (4xx) drop the reservations, on an unknown
outcome (5xx, no answer) keep them until the watch says what happened.

The reservation comes first and is atomic with its conflict check
(:meth:`Ledger.reserve`), so two workers (or a worker and an extender call)
can never both take a GPU; the leadership check comes after it, so a process
that lost its Lease while deciding never binds.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules import Decision, Finding, gpus_in_use, room_refusals
from kube_gpu_scheduler.domain.schedmap import Entry
from kube_gpu_scheduler.kube.errors import ApiError, api_error
from kube_gpu_scheduler.scheduler.state.binding import BindOutcome, PodWriter
from kube_gpu_scheduler.scheduler.state.ledger import Claim, Ledger
from kube_gpu_scheduler.scheduler.state.usage import NodeUsage, footprint


class Outcome(enum.Enum):
    BOUND = "bound"  # our Binding was accepted
    ALREADY = "already"  # it was bound before, to the mapped node
    ELSEWHERE = "elsewhere"  # someone bound it to another node
    GONE = "gone"  # deleted or replaced (another UID) meanwhile
    TAKEN = "taken"  # another pod took a GPU or the room since the check: ``decision`` says which
    NOT_LEADER = "not-leader"  # the Lease was lost while deciding: whoever leads places it
    NOT_FOUND = "not-found"  # the Binding call said 404: deleted meanwhile
    FAILED = "failed"  # the Binding call failed: ``error``; ``kept`` when its outcome is unknown


KEPT_ON = (ApiError.SERVER_ERROR, ApiError.NO_ANSWER)  # the Binding may have been stored


@dataclass(frozen=True)
class Placed:
    outcome: Outcome
    decision: Decision | None = None
    node: str | None = None  # where the pod is bound (BOUND, ALREADY, ELSEWHERE)
    error: BaseException | None = None
    kept: bool = False  # FAILED with the reservations kept (5xx, no answer)
    bind_s: float | None = None  # the Binding's round trip (BOUND, ALREADY): the apiserver's share

    @property
    def bound(self) -> bool:
        return self.outcome in (Outcome.BOUND, Outcome.ALREADY)


class Placement:
    def __init__(
        self,
        ledger: Ledger,
        usage: NodeUsage,
        writer: PodWriter,
        is_leader: Callable[[], bool],
        released: Callable[[Iterable[str]], None] = lambda nodes: None,
    ) -> None:
        self.ledger = ledger
        self.usage = usage
        self.writer = writer
        self._is_leader = is_leader
        self._released = released  # nodes where a cancel freed room: pods waiting there retry
        # Tenancy: the limits checked under the ledger's lock with the reservation (None: off).
        self.limit: Callable[[Mapping[str, Any], Entry], Callable[[int], list[Finding]]] | None = None

    def cancel(self, pod: Mapping[str, Any]) -> None:
        """Drop this pod's reservations (GPUs, room on the node): its Binding did not happen."""
        self.ledger.cancel(pod)
        self._released(self.usage.cancel(Pod(pod).uid))

    def place(
        self, pod: Mapping[str, Any], decision: Decision, node: Mapping[str, Any] | None, room: bool
    ) -> Placed:
        """Reserve ``decision.entry``'s GPUs (and, with ``room``, what the pod takes of ``node``),
        then bind. ``decision`` must be ok."""
        entry = decision.entry
        assert decision.ok and entry is not None
        limit = self.limit(pod, entry) if self.limit is not None else None
        conflicts, over = self.ledger.reserve_within(pod, Claim.of(entry.node, entry.gpus), limit)
        if conflicts or over:  # another worker took a GPU (or the last GPUs of a limit) since the check
            self.cancel(pod)  # a reservation left by an earlier attempt must not block others
            refusals = tuple(gpus_in_use(entry, conflicts)) if conflicts else tuple(over)
            return Placed(Outcome.TAKEN, Decision(decision.ordinal, entry, refusals))
        if room and node is not None:
            fp = footprint({**pod, "spec": {**Pod(pod).spec, "nodeName": entry.node}})
            short = (
                self.usage.reserve(Pod(pod).uid, fp, lambda totals: room_refusals(pod, entry, node, totals))
                if fp is not None
                else []
            )
            if short:  # another worker took the room since the check
                self.cancel(pod)
                return Placed(Outcome.TAKEN, Decision(decision.ordinal, entry, tuple(short)))
        return self.bind(pod, entry.node, decision)

    def bind(self, pod: Mapping[str, Any], node: str, decision: Decision | None = None) -> Placed:
        """The leadership check and the Binding; without ``decision`` nothing was reserved."""
        reserved = decision is not None
        if not self._is_leader():
            if reserved:
                self.cancel(pod)
            return Placed(Outcome.NOT_LEADER, decision)
        sent = time.monotonic()
        try:
            result = self.writer.bind(pod, node)
        except Exception as err:
            kind = api_error(err)
            kept = kind in KEPT_ON
            if reserved and not kept:
                self.cancel(pod)  # refused (4xx): nothing was bound
            outcome = Outcome.NOT_FOUND if kind is ApiError.NOT_FOUND else Outcome.FAILED
            return Placed(outcome, decision, node, error=err, kept=reserved and kept)
        took = time.monotonic() - sent
        if result.outcome is BindOutcome.BOUND:
            return Placed(Outcome.BOUND, decision, node, bind_s=took)
        if result.outcome is BindOutcome.ALREADY:
            return Placed(Outcome.ALREADY, decision, node, bind_s=took)
        if reserved:
            self.cancel(pod)
        if result.outcome is BindOutcome.ELSEWHERE:
            return Placed(Outcome.ELSEWHERE, decision, result.node)
        return Placed(Outcome.GONE, decision)
