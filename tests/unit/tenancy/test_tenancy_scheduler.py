"""Tenancy in ``Scheduler.process``, without an apiserver: caches fed by hand (as in
test_scheduler_process.py), the policies and namespaces too.

A replica binds only where a policy grants its namespace its node, within every granting
policy's limits (all of them count a GPU); the limit holds when many workers place at once
(the check is atomic with the ledger's reservation); a refused replica is tried again when
GPUs are freed or a policy changes; a replica admitted without its variables in a namespace
injection does not serve waits instead of being deleted and recreated.
"""

from __future__ import annotations

import threading
from typing import Any

from kube_gpu_scheduler.domain import rules as R
from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION
from kube_gpu_scheduler.domain.injection import desired_env
from kube_gpu_scheduler.domain.rules import GANG_WAITING
from kube_gpu_scheduler.domain.schedmap import parse
from kube_gpu_scheduler.domain.selectors import parse_selector
from kube_gpu_scheduler.scheduler.placing.optin import InjectionScope
from kube_gpu_scheduler.scheduler.tenancy.holdings import Lookup, Tenancy
from kube_gpu_scheduler.scheduler.tenancy.status import MAX_LAG_S, PolicyCollector, status_due
from tests.unit.scheduler.test_scheduler_process import Cache, World, node


def ns(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


def policy(name: str, team: str, pool: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 1},
        "spec": {
            "namespaceSelector": {"matchLabels": {"team": team}} if team else {},
            "nodeSelector": {"matchLabels": {"pool": pool}},
            **spec,
        },
    }


def pool_node(name: str, pool: str, product: str = "") -> dict[str, Any]:
    n = node(name)
    n["metadata"].setdefault("labels", {})["pool"] = pool
    if product:
        n["metadata"]["labels"]["nvidia.com/gpu.product"] = product
    return n


def replica(
    namespace: str, name: str, smap: str, *, bound: bool = False, injected: bool = True
) -> dict[str, Any]:
    ordinal = int(name.rsplit("-", 1)[1])
    entry = parse(smap)[ordinal]
    env = [{"name": k, "value": v} for k, v in desired_env(entry, "cuda")] if injected else []
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "annotations": {"gpu-scheduling-map": smap},
            "labels": {"apps.kubernetes.io/pod-index": str(ordinal)},
            "ownerReferences": [
                {"kind": "StatefulSet", "name": "w", "uid": f"sts-{namespace}", "controller": True}
            ],
        },
        "spec": {
            "schedulerName": "gpu-scheduler",
            "containers": [{"name": "main", "image": "x", "env": env}],
        },
        "status": {"phase": "Running" if bound else "Pending"},
    }
    if bound:
        pod["spec"]["nodeName"] = entry.node
    return pod


class Tenants(World):
    """A World with tenancy on: policies and namespaces in caches, the checks attached."""

    def __init__(
        self, pods: list[dict[str, Any]], nodes: list[dict[str, Any]], policies: list[dict[str, Any]]
    ):
        self.policies = Cache(policies)
        self.namespaces = Cache([ns("ta", team="a"), ns("tb", team="b"), ns("tc", team="c")])
        super().__init__(pods, nodes, require_injection=True)
        self.tenancy = Tenancy(
            self.sched.ledger,
            Lookup(self.sched.nodes.get, self.namespaces.get, self.policies.items),
            self.sched.queue.add,
        )
        self.sched.attach_tenancy(self.tenancy, None, _Nothing())
        for p in pods:  # counted from the ledger: observed again now that tenancy listens
            self.sched.ledger.forget(p)
            self.sched.ledger.observe(p)

    def add(self, pod: dict[str, Any]) -> str:
        self.pods.objs[Cache.key(pod)] = pod
        return Cache.key(pod)

    def notes(self, reason: str) -> list[str]:
        return [
            note for _, _, r, note in self.events.sent if r == "FailedScheduling" and note.startswith(reason)
        ]


class _Nothing:
    def caches(self) -> dict[str, Any]:
        return {}

    def busy(self) -> bool:
        return False

    def start_workers(self, stop: threading.Event) -> list[threading.Thread]:
        return []

    def started_leading(self) -> None: ...

    def shutdown(self) -> None: ...


NODES = [pool_node("a1", "a"), pool_node("s1", "shared", "A100"), pool_node("s2", "shared", "H100")]


def test_a_namespace_pins_only_the_nodes_a_policy_grants_it() -> None:
    w = Tenants([], NODES, [policy("team-a", "a", "a")])
    ok = w.add(replica("ta", "w-0", "0=a1:0,1"))
    other = w.add(replica("tb", "x-0", "0=a1:2"))
    elsewhere = w.add(replica("ta", "y-0", "0=s1:0"))
    for key in (ok, other, elsewhere):
        w.sched.process(key)
    assert w.writer.binds == [(ok, "a1")]
    (nobody, considered) = w.notes(R.NOT_GRANTED)
    assert "no GPUPinningPolicy selects namespace 'tb'" in nobody
    assert "no GPUPinningPolicy grants namespace 'ta' node 's1'" in considered
    assert "policies considered: team-a (nodeSelector pool=a)" in considered


def test_a_gpu_counts_against_every_granting_policy_and_none_is_exceeded() -> None:
    held = replica("ta", "w-0", "0=s1:0,1", bound=True)
    w = Tenants(
        [held],
        NODES,
        [policy("shared", "", "shared", maxGPUs=4), policy("team-a", "a", "shared", maxGPUs=3)],
    )
    # 2 held; team-a allows 3: a replica wanting 2 more waits, one wanting 1 binds.
    two = w.add(replica("ta", "v-0", "0=s1:2,3"))
    w.sched.process(two)
    assert w.writer.binds == []
    (note,) = w.notes(R.GPU_LIMIT_REACHED)
    assert "GPUPinningPolicy 'team-a' allows 3 GPUs (spec.maxGPUs)" in note
    assert "2 are held (ta/w-0 s1:0,1)" in note and "needs 2 more" in note
    one = w.add(replica("ta", "u-0", "0=s2:0"))
    w.sched.process(one)
    assert w.writer.binds == [(one, "s2")]
    # tb is granted only through 'shared' (4), where ta's 3 GPUs count too: 1 is left.
    w.sched.process(w.add(replica("tb", "x-0", "0=s2:1,2")))
    assert "GPUPinningPolicy 'shared' allows 4 GPUs" in w.notes(R.GPU_LIMIT_REACHED)[-1]
    _, counts = w.tenancy.snapshot()
    assert {n: c.total for n, c in counts.items()} == {"shared": 3, "team-a": 3}
    assert counts["shared"].by == {("ta", "A100"): 2, ("ta", "H100"): 1}


def test_a_gpu_type_has_its_own_limit() -> None:
    w = Tenants([], NODES, [policy("shared", "a", "shared", gpuTypes=[{"product": "A100", "maxGPUs": 1}])])
    w.sched.process(w.add(replica("ta", "w-0", "0=s1:0,1")))
    assert "allows 1 GPU of type 'A100' (spec.gpuTypes[A100])" in w.notes(R.GPU_LIMIT_REACHED)[0]
    h100 = w.add(replica("ta", "x-0", "0=s2:0,1,2"))
    w.sched.process(h100)
    assert w.writer.binds == [(h100, "s2")]


def test_many_workers_never_take_a_policy_past_its_limit() -> None:
    """The check is made again under the ledger's lock with the reservation: 12 replicas of
    two namespaces, each wanting 1 GPU of a limit of 5, placed by 12 threads at once (each
    Binding slow), bind exactly 5."""
    smap = "\n".join(f"{i}=s{1 + i % 2}:{i // 2}" for i in range(12))
    w = Tenants([], NODES, [policy("shared", "", "shared", maxGPUs=5)])
    w.writer.delay = 0.02
    keys = [w.add(replica("ta" if i % 2 else "tb", f"w-{i}", smap)) for i in range(12)]
    start = threading.Barrier(len(keys))

    def place(key: str) -> None:
        start.wait()
        w.sched.process(key)

    threads = [threading.Thread(target=place, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(w.writer.binds) == 5
    assert w.tenancy.snapshot()[1]["shared"].total == 5


def test_a_refused_replica_is_tried_again_when_gpus_are_freed_or_the_limit_is_raised() -> None:
    held = replica("ta", "w-0", "0=s1:0", bound=True)
    w = Tenants([held], NODES, [policy("shared", "a", "shared", maxGPUs=1)])
    waiting = w.add(replica("ta", "v-0", "0=s1:1"))
    w.sched.process(waiting)
    assert w.notes(R.GPU_LIMIT_REACHED) and w.writer.binds == []
    w.sched.queue._due.clear()
    w.sched.handlers()[0].on_delete(held)  # scale-down: its GPU is freed
    assert w.sched.queue.get(timeout=0) == waiting
    w.sched.queue.done(waiting)
    # Held again by another; then the admin raises the limit: tried again at once, and bound.
    w.sched.ledger.observe(held)
    w.sched.process(waiting)
    w.sched.queue._due.clear()
    w.policies.objs["shared"] = policy("shared", "a", "shared", maxGPUs=2)
    w.policies.objs["shared"]["metadata"]["generation"] = 2
    w.tenancy.policy_changed(policy("shared", "a", "shared", maxGPUs=1), w.policies.objs["shared"])
    assert w.sched.queue.get(timeout=0) == waiting
    w.sched.process(waiting)
    assert w.writer.binds == [(waiting, "s1")]


def test_a_status_write_of_our_own_changes_no_count() -> None:
    w = Tenants([], NODES, [policy("shared", "a", "shared", maxGPUs=1)])
    w.tenancy.snapshot()
    before = dict(w.policies.objs["shared"])
    after = {**before, "status": {"held": 0}}
    w.tenancy._stale = False
    w.tenancy.policy_changed(before, after)
    assert w.tenancy._stale is False


def test_the_status_is_written_once_the_counts_are_still_or_at_the_latest_after_the_lag() -> None:
    changed = threading.Event()
    # Nothing changed: nothing to write.
    assert status_due(changed, None, 0.0) == (None, False)
    # One change (a bind), then a quiet round: written on the quiet round, not the first.
    changed.set()
    since, due = status_due(changed, None, 1.0)
    assert (since, due) == (1.0, False)
    assert not changed.is_set()
    assert status_due(changed, since, 2.0) == (1.0, True)
    # A burst: a change every round defers the write until MAX_LAG_S after the first one.
    since = None
    rounds = []
    for second in range(1, 30):
        changed.set()
        since, due = status_due(changed, since, float(second))
        rounds.append(due)
        if due:
            since = None
    assert rounds.index(True) == MAX_LAG_S, rounds
    assert rounds.count(True) == 29 // (MAX_LAG_S + 1), rounds


def test_the_metrics_per_policy() -> None:
    w = Tenants(
        [replica("ta", "w-0", "0=s1:0,1", bound=True)],
        NODES,
        [policy("shared", "a", "shared", maxGPUs=4, gpuTypes=[{"product": "A100", "maxGPUs": 2}])],
    )
    samples = {
        (m.name, tuple(sorted(s.labels.items()))): s.value
        for m in PolicyCollector(w.tenancy).collect()
        for s in m.samples
    }
    assert samples[("gpu_scheduler_policy_gpus_held", (("policy", "shared"),))] == 2
    key = (("namespace", "ta"), ("policy", "shared"), ("product", "A100"))
    assert samples[("gpu_scheduler_policy_namespace_gpus_held", key)] == 2
    assert samples[("gpu_scheduler_policy_gpus_max", (("policy", "shared"), ("product", "A100")))] == 2


def test_a_replica_admitted_without_its_variables_in_a_namespace_not_opted_in_waits() -> None:
    w = Tenants([], NODES, [policy("team-a", "a", "a")])
    selector = parse_selector({"matchLabels": {"gpu-scheduling": "enabled"}})
    w.sched.scope = InjectionScope(selector, w.namespaces.get, w.sched.queue.add)
    key = w.add(replica("ta", "w-0", "0=a1:0", injected=False))
    w.sched.process(key)
    assert w.writer.deleted == [] and w.writer.binds == []
    (note,) = w.notes(R.NAMESPACE_NOT_OPTED_IN)
    assert "kubectl label namespace ta gpu-scheduling=enabled" in note
    # Opted in: tried again at once, and (still without its variables) deleted to be recreated.
    w.sched.queue._due.clear()
    old = w.namespaces.objs["ta"]
    w.namespaces.objs["ta"] = ns("ta", team="a", **{"gpu-scheduling": "enabled"})
    w.sched.scope.namespace_changed(old, w.namespaces.objs["ta"])
    assert w.sched.queue.get(timeout=0) == key
    w.sched.process(key)
    assert w.events.reasons()[-1] == R.NOT_INJECTED
    assert "it will be deleted so that StatefulSet w recreates it" in w.events.sent[-1][3]


def test_a_gang_is_counted_whole_against_a_limit_each_of_its_replicas_would_fit() -> None:
    """A gang (gpu-scheduler.io/gang) of three replicas of 2 GPUs under maxGPUs 4: each alone
    fits, all three do not. Nothing is reserved (no half-placed gang holding a team's quota);
    every member waits with GangWaiting naming the limit; raising it binds the gang."""
    smap = "0=s1:0,1\n1=s1:2,3\n2=s2:0,1"
    members = []
    for i in range(3):
        p = replica("ta", f"w-{i}", smap)
        p["metadata"]["annotations"][GANG_ANNOTATION] = "true"
        members.append(p)
    old = policy("shared", "a", "shared", maxGPUs=4)
    w = Tenants([], NODES, [old])
    keys = [w.add(p) for p in members]
    for p in members:
        w.sched.gangs.observe(p)
    for key in keys:
        w.sched.process(key)
    assert w.writer.binds == []
    assert all(w.holders(n, g) == [] for n, g in (("s1", 0), ("s1", 2), ("s2", 0)))  # nothing reserved
    notes = w.notes(GANG_WAITING)
    assert len(notes) == 3, w.events.sent
    assert all(
        "replica 2 (2=s2:0,1): GPULimitReached: GPUPinningPolicy 'shared' allows 4 GPUs" in n for n in notes
    ), notes
    assert all("4 are held" in n and "ta/w-0 (this gang's, not bound yet)" in n for n in notes), notes
    # The admin raises the limit: the gang is tried again and bound whole.
    w.sched.queue._due.clear()
    w.policies.objs["shared"] = policy("shared", "a", "shared", maxGPUs=6)
    w.policies.objs["shared"]["metadata"]["generation"] = 2
    w.tenancy.policy_changed(old, w.policies.objs["shared"])
    while (key := w.sched.queue.get(timeout=0)) is not None:
        w.sched.process(key)
        w.sched.queue.done(key)
    assert sorted(w.writer.binds) == [(keys[0], "s1"), (keys[1], "s1"), (keys[2], "s2")]
