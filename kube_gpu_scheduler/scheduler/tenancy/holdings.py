"""Tenancy in the scheduler: what each GPUPinningPolicy's namespaces hold, and the checks at bind.

With ``GPU_SCHEDULER_TENANCY`` (chart ``tenancy.enabled``) the scheduler watches the policies
and the namespaces, and counts, for every policy, the GPUs held through it: a GPU a namespace
holds on a node counts against every policy that grants that namespace that node
(:mod:`kube_gpu_scheduler.domain.tenancy`). The counts come from the ledger alone (the pods'
immutable fields, its reservations included), told to :meth:`Tenancy.moved` under the
ledger's lock on every change, so they survive nothing and need nothing remembered: a restart
lists the pods and counts again.

A replica binds only where some policy grants its namespace its node (``NotGranted``), where
no policy that selects its namespace forbids shared GPUs if its map gives one of its GPUs to
another replica too (``GPUSharingForbidden``: ``spec.allowSharedGPUs: false``), and within every
granting policy's limits (``GPULimitReached``). The limit is checked again under
the ledger's lock when its GPUs are reserved (:meth:`Tenancy.limit`, through
``Ledger.reserve_within``), so two workers never both take the last GPUs of a limit. A refused
replica waits; it is tried again when GPUs are released, or a policy, a namespace's labels or
a node's labels change.

What each policy selects is resolved once per (namespace, node) and cached until a policy, a
namespace's labels or a node's labels change; then, at the next use, every count is rebuilt
from the ledger's per-(namespace, node) totals (once, however many changes came: a start lists
every node). Nothing here grows with the number of pods.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kube_gpu_scheduler.domain.gang import PHANTOM, Blocked
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import pod_map
from kube_gpu_scheduler.domain.rules import (
    GPU_LIMIT_REACHED,
    GPU_NAME_NEEDS_DRA,
    GPU_SHARING_FORBIDDEN,
    NOT_GRANTED,
    NOT_INJECTED,
    Decision,
    Finding,
    limit_reached,
    not_granted,
    replica_sharing_forbidden,
)
from kube_gpu_scheduler.domain.schedmap import GPU, Entry, MapError
from kube_gpu_scheduler.domain.sharing import tenant_forbids
from kube_gpu_scheduler.domain.tenancy import Held, Policy, labels_of, product_of
from kube_gpu_scheduler.kube.informer import Obj
from kube_gpu_scheduler.scheduler.state.ledger import Ledger

log = logging.getLogger("gpu_scheduler.tenancy")

TENANCY_REASONS = (NOT_GRANTED, GPU_SHARING_FORBIDDEN, GPU_LIMIT_REACHED)
FIRST = (NOT_GRANTED, GPU_SHARING_FORBIDDEN)  # before the placement rules' refusals
ALONE = (NOT_INJECTED, GPU_NAME_NEEDS_DRA)  # refusals the tenancy checks do not join


class Lookup:
    """What the checks read of the caches: a node or a namespace by name, every policy."""

    def __init__(
        self,
        node: Callable[[str], Obj | None],
        namespace: Callable[[str], Obj | None],
        policies: Callable[[], list[Obj]],
    ) -> None:
        self.node, self.namespace, self.policies = node, namespace, policies


class Tenancy:
    def __init__(self, ledger: Ledger, lookup: Lookup, retry: Callable[[str], None]) -> None:
        self.ledger = ledger
        self.lookup = lookup
        self._retry = retry  # put a pod key on the work queue
        # Guarded by the ledger's lock (every method that touches them runs under it):
        self._policies: dict[str, Policy] = {}
        self._places: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}  # -> (product, policies)
        self._held: dict[str, Held] = {}
        self._stale = True  # rebuild before the next use
        self._waiting: set[str] = set()  # pod keys refused by a tenancy rule
        self._waiting_lock = threading.Lock()
        self.changed = threading.Event()  # set on every change of a count or a grant (the publisher)
        self.grants_changed = threading.Event()  # a policy, a namespace's or a node's labels
        self.on_refused: Callable[[str], None] = lambda policy: None  # a limit refused a replica
        ledger.listen(self.moved)

    # -- the counts (the ledger's lock held) ------------------------------------------------

    def _place(self, namespace: str, node: str) -> tuple[str, tuple[str, ...]]:
        """The GPU type of ``node`` and the policies that grant ``namespace`` that node (cached)."""
        key = (namespace, node)
        found = self._places.get(key)
        if found is None:
            node_obj, ns_labels = self.lookup.node(node), labels_of(self.lookup.namespace(namespace))
            node_labels = labels_of(node_obj)
            granting = tuple(
                name
                for name, policy in sorted(self._policies.items())
                if policy.selects_namespace(ns_labels) and policy.selects_node(node_labels)
            )
            found = self._places[key] = (product_of(node_obj), granting)
        return found

    def _ensure(self) -> None:
        """Rebuild if something changed since the last use (the ledger's lock held)."""
        if self._stale:
            self._stale = False
            self.ledger.atomically(self._rebuild)

    def moved(self, namespace: str, node: str, gpus: int) -> None:
        """The ledger's listener: ``namespace`` holds ``gpus`` more (fewer) GPUs on ``node``."""
        if self._stale:
            self._ensure()  # the ledger's totals already hold this change
        else:
            product, granting = self._place(namespace, node)
            for name in granting:
                self._held[name].add(namespace, product, gpus)
        self.changed.set()
        if gpus < 0:
            self.retry_waiting()

    def _rebuild(self, places: Mapping[tuple[str, str], int]) -> None:
        self._policies = {}
        for obj in self.lookup.policies():
            policy = Policy.of(obj)
            self._policies[policy.name] = policy
        self._places.clear()
        self._held = {name: Held() for name in self._policies}
        for (namespace, node), gpus in places.items():
            product, granting = self._place(namespace, node)
            for name in granting:
                self._held[name].add(namespace, product, gpus)

    def refresh(self) -> None:
        """A policy, or the labels of a namespace or a node, changed: resolve and count again
        (at the next use), and try every waiting replica again."""
        self._stale = True
        self.changed.set()
        self.grants_changed.set()
        self.retry_waiting()

    def snapshot(self) -> tuple[dict[str, Policy], dict[str, Held]]:
        """The policies and a copy of their counts, consistent with each other."""

        def copy(_: Any) -> tuple[dict[str, Policy], dict[str, Held]]:
            self._ensure()
            return dict(self._policies), {n: Held(h.total, dict(h.by)) for n, h in self._held.items()}

        return self.ledger.atomically(copy)

    # -- the checks --------------------------------------------------------------------------

    def _refusals(self, namespace: str, entry: Entry, already: int) -> list[Finding]:
        """NotGranted, or a GPULimitReached per limit that ``entry`` would pass (lock held)."""
        self._ensure()
        product, granting = self._place(namespace, entry.node)
        if not granting:
            ns_labels = labels_of(self.lookup.namespace(namespace))
            considered = [
                (name, str(p.nodes))
                for name, p in sorted(self._policies.items())
                if p.selects_namespace(ns_labels)
            ]
            return [not_granted(namespace, entry, considered)]
        return self._over(granting, product, entry, len(entry.gpus) - already, {}, ())

    def _over(
        self,
        granting: Sequence[str],
        product: str,
        entry: Entry,
        want: int,
        added: dict[tuple[str, str], int],
        before: Sequence[str],
    ) -> list[Finding]:
        """GPULimitReached per limit that ``want`` more GPUs on ``entry``'s node would pass, with
        ``added`` (by policy and limit) taken by replicas ``before`` it that are not held yet (a
        gang's); adds ``want`` to ``added`` (lock held)."""
        out = []
        for name in granting:
            held = self._held[name]
            for what, most in self._policies[name].limits(product):
                counted = held.counted(what, product) + added.get((name, what), 0)
                if want > 0 and counted + want > most:

                    def counts(ns: str, node: str, name: str = name, what: str = what) -> bool:
                        place = self._place(ns, node)
                        return name in place[1] and (what == "spec.maxGPUs" or place[0] == product)

                    holders = [*self.ledger.holdings(counts), *before]
                    self.on_refused(name)
                    out.append(limit_reached(name, what, most, product, counted, holders, entry, want))
                added[(name, what)] = added.get((name, what), 0) + max(want, 0)
        return out

    def _forbidder(self, namespace: str) -> str | None:
        """The first policy (by name) that selects ``namespace`` and forbids shared GPUs (lock held)."""
        self._ensure()
        if all(p.allow_sharing for p in self._policies.values()):
            return None
        ns_labels = labels_of(self.lookup.namespace(namespace))
        return next(
            (
                name
                for name, p in sorted(self._policies.items())
                if not p.allow_sharing and p.selects_namespace(ns_labels)
            ),
            None,
        )

    def _sharing(self, pod: Mapping[str, Any], namespace: str, entry: Entry) -> list[Finding]:
        """GPUSharingForbidden when the replica shares a GPU and a policy of its namespace forbids it."""
        try:
            smap = pod_map(Pod(pod).meta)
        except MapError:
            return []
        if smap is None or not smap.mates(entry.ordinal):
            return []
        policy = self.ledger.atomically(lambda _: self._forbidder(namespace))
        if policy is None:
            return []
        found = replica_sharing_forbidden(smap, entry, tenant_forbids(policy, namespace))
        return [found] if found is not None else []

    def decide(self, pod: Mapping[str, Any], decision: Decision) -> Decision:
        """``decision`` with the tenancy refusals: NotGranted and GPUSharingForbidden first,
        GPULimitReached last."""
        entry = decision.entry
        if entry is None or decision.reason in ALONE:
            return decision
        view = Pod(pod)
        namespace = view.namespace or ""
        # A GPU the namespace holds already (this pod's own, or a mate's it shares) adds nothing.
        found = self.ledger.atomically(
            lambda _: self._refusals(namespace, entry, self.ledger.counted(namespace, entry.node, entry.gpus))
        )
        found = self._sharing(pod, namespace, entry) + found
        if not found:
            return decision
        self._wait(view.key)
        first = [f for f in found if f.reason in FIRST]
        last = [f for f in found if f.reason not in FIRST]
        return Decision(decision.ordinal, entry, (*first, *decision.refusals, *last), decision.warnings)

    def limit(self, pod: Mapping[str, Any], entry: Entry) -> Callable[[int], list[Finding]]:
        """The check ``Ledger.reserve_within`` runs under its lock for this pod's reservation."""
        view = Pod(pod)

        def check(already: int) -> list[Finding]:
            found = self._refusals(view.namespace or "", entry, already)
            if found:
                self._wait(view.key)
            return found

        return check

    def limit_all(self, members: Sequence[tuple[Mapping[str, Any], Entry]]) -> Callable[[], list[Blocked]]:
        """The check ``Ledger.reserve_all_within`` runs under its lock for a gang: its members'
        GPUs counted together against each limit (each alone may fit where all do not)."""

        def check() -> list[Blocked]:
            self._ensure()
            added: dict[tuple[str, str], int] = {}
            before: list[str] = []
            out: list[Blocked] = []
            # GPUs an earlier member takes: a member sharing one of them adds nothing for it.
            taken: set[tuple[str, str, GPU]] = set()
            for pod, entry in members:
                view = Pod(pod)
                namespace = view.namespace or ""
                new = [
                    g
                    for g in entry.gpus
                    if (namespace, entry.node, g) not in taken
                    and not self.ledger.counted(namespace, entry.node, (g,))
                ]
                taken.update((namespace, entry.node, g) for g in entry.gpus)
                want = len(new)
                product, granting = self._place(namespace, entry.node)
                found = (
                    self._over(granting, product, entry, want, added, before)
                    if granting
                    else self._refusals(namespace, entry, 0)
                )
                out += [Blocked(entry.ordinal, entry, f.reason, f.message) for f in found]
                if want > 0:
                    before.append(f"{view.key} (this gang's, not bound yet)")
            if out:
                for pod, _ in members:
                    if not Pod(pod).uid.startswith(PHANTOM):
                        self._wait(Pod(pod).key)  # retried when GPUs are freed or a policy changes
            return out

        return check

    # -- who waits -----------------------------------------------------------------------------

    def _wait(self, key: str) -> None:
        with self._waiting_lock:
            self._waiting.add(key)

    def forget(self, key: str) -> None:
        """The pod is bound, finished or gone."""
        with self._waiting_lock:
            self._waiting.discard(key)

    def retry_waiting(self) -> None:
        with self._waiting_lock:
            keys = list(self._waiting)
        for key in keys:
            self._retry(key)

    # -- watch handlers ---------------------------------------------------------------------------

    def policy_changed(self, old: Obj | None, new: Obj | None) -> None:
        """A policy added, deleted, or its spec changed (a status written by us changes nothing)."""
        gen = [((o or {}).get("metadata") or {}).get("generation") for o in (old, new)]
        if old is None or new is None or gen[0] != gen[1]:
            log.info(
                "GPUPinningPolicy changed, counting again",
                extra={"policy": ((new or old or {}).get("metadata") or {}).get("name")},
            )
            self.refresh()

    def labels_changed(self, old: Obj | None, new: Obj | None) -> None:
        """A namespace or a node added, deleted, or its labels changed."""
        if old is None or new is None or labels_of(old) != labels_of(new):
            self.refresh()
