"""Gang placement (``gpu-scheduler.io/gang: "true"``) on the real apiserver, kwok running the pods.

* one blocked entry holds back every replica; the leader changes while the gang waits; the
  blocker's release binds them all (the new leader does it);
* a restart after a crash between a gang's Bindings: the new scheduler gives the rest of the
  gang its GPUs, not to another workload's pod that wants one of them;
* two gangs racing for one GPU: one binds whole, the other holds nothing; when the winner
  goes, the other binds whole.

A sampler reads the pods about every 20 ms and records every state the tests assert on: no
moment with a member of a blocked gang bound, or with both racing gangs holding a GPU.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION
from kube_gpu_scheduler.domain.rules import GANG_WAITING, GPU_IN_USE
from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import statefulset
from tests.support.kubeapi import failed_scheduling
from tests.support.waiting import wait_for


def gang(name: str, sched_map: str, replicas: int) -> dict[str, Any]:
    sts = statefulset(name, sched_map, replicas)
    sts["spec"]["template"]["metadata"]["annotations"][GANG_ANNOTATION] = "true"
    return sts


class Sampler:
    """Every ~20 ms: which pods of the namespace are bound (name -> node)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.states: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        api = self.cluster.api_client()
        try:
            core = client.CoreV1Api(api)
            while not self._stop.wait(0.02):
                items = json.loads(core.list_namespaced_pod(self.namespace, _preload_content=False).data)[
                    "items"
                ]
                self.states.append(
                    {p["metadata"]["name"]: p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName")}
                )
        finally:
            api.close()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def bound_now(self) -> dict[str, str]:
        return dict(self.states[-1]) if self.states else {}


@pytest.fixture
def sampler(cluster: Cluster, namespace: str) -> Iterator[Sampler]:
    with Sampler(cluster, namespace) as s:
        yield s


def bound(kube: Any, ns: str, names: list[str]) -> dict[str, str]:
    from tests.support.kubeapi import read_pod

    out = {}
    for name in names:
        pod = read_pod(kube, ns, name)
        if pod and pod["spec"].get("nodeName"):
            out[name] = pod["spec"]["nodeName"]
    return out


def test_one_blocked_entry_holds_back_all_and_its_release_binds_all_after_a_leader_change(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    own_node: Callable[..., str],
    start_scheduler: Callable[..., ManagedProcess],
    sampler: Sampler,
) -> None:
    a, b = own_node("a", gpus=2), own_node("b", gpus=2)
    leader = start_scheduler("replica-a")
    blocker = statefulset("x", f"0={b}:1", 1)
    blocker["metadata"]["namespace"] = namespace
    cluster.apply([blocker])
    wait_for(lambda: bound(kube, namespace, ["x-0"]), 30, what="the blocker x-0 bound")
    members = ["w-0", "w-1", "w-2"]
    sts = gang("w", f"0={a}:0\n1={a}:1\n2={b}:1", 3)
    sts["metadata"]["namespace"] = namespace
    cluster.apply([sts])
    for name in members:
        wait_for(
            lambda name=name: failed_scheduling(
                kube, namespace, name, GANG_WAITING, f"replica 2 (2={b}:1)", f"held by pod {namespace}/x-0"
            ),
            30,
            what=f"{GANG_WAITING} on {name} naming replica 2 and its holder",
        )
    assert bound(kube, namespace, members) == {}

    standby = start_scheduler("replica-b")
    leader.stop()  # releases the Lease: replica-b leads and re-evaluates the gang
    wait_for(lambda: "became leader" in standby.log_text(200), 30, what="replica-b leading")
    assert bound(kube, namespace, members) == {}
    cluster.kubectl("delete", "statefulset", "x", "-n", namespace, "--wait=false")
    placed = wait_for(
        lambda: len(bound(kube, namespace, members)) == 3 and bound(kube, namespace, members), 60
    )
    assert placed == {"w-0": a, "w-1": a, "w-2": b}
    assert "gang admitted" in standby.log_text(400)
    # Never a member bound while x-0 still held replica 2's GPU.
    assert not [s for s in sampler.states if "x-0" in s and set(s) & set(members)]


def test_a_restart_after_a_crash_between_bindings_gives_the_gang_its_gpus_first(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    own_node: Callable[..., str],
    start_scheduler: Callable[..., ManagedProcess],
) -> None:
    """A leader bound w-0 and died before w-1's Binding. Another workload's replica o-0 wants
    w-1's GPU. The next scheduler's caches say the gang is committed: w-1 gets its GPU."""
    a, b = own_node("a", gpus=1), own_node("b", gpus=1)
    sts = gang("w", f"0={a}:0\n1={b}:0", 2)
    other = statefulset("o", f"0={b}:0", 1)
    for obj in (sts, other):
        obj["metadata"]["namespace"] = namespace
    cluster.apply([sts, other])
    wait_for(lambda: all(_exists(kube, namespace, n) for n in ("w-0", "w-1", "o-0")), 30, what="pods created")
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "w-0"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": a},
    }
    cluster.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/w-0/binding",
        "-f",
        "-",
        input=json.dumps(binding),
    )
    start_scheduler()
    wait_for(lambda: bound(kube, namespace, ["w-1"]), 30, what="w-1 bound: the committed gang's GPU")
    ev = wait_for(lambda: failed_scheduling(kube, namespace, "o-0", GPU_IN_USE, f"{namespace}/w-1"), 30)
    assert ev["type"] == "Warning"
    assert bound(kube, namespace, ["o-0"]) == {}


def _exists(kube: Any, ns: str, name: str) -> bool:
    from tests.support.kubeapi import read_pod

    return read_pod(kube, ns, name) is not None


def test_two_gangs_racing_for_one_gpu_never_hold_half_each(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    own_node: Callable[..., str],
    start_scheduler: Callable[..., ManagedProcess],
    sampler: Sampler,
) -> None:
    a, b = own_node("a", gpus=2), own_node("b", gpus=1)
    start_scheduler()
    first, second = gang("p", f"0={a}:0\n1={b}:0", 2), gang("q", f"0={a}:1\n1={b}:0", 2)
    for obj in (first, second):
        obj["metadata"]["namespace"] = namespace
    cluster.apply([first, second])
    everyone = ["p-0", "p-1", "q-0", "q-1"]
    winners = wait_for(
        lambda: next(
            (g for g in ("p", "q") if set(bound(kube, namespace, everyone)) == {f"{g}-0", f"{g}-1"}), None
        ),
        60,
        what="one gang bound whole",
    )
    loser = "q" if winners == "p" else "p"
    raced = len(sampler.states)
    wait_for(
        lambda: failed_scheduling(kube, namespace, f"{loser}-0", GANG_WAITING, f"{namespace}/{winners}-1"),
        30,
        what=f"{loser}-0 waiting for {winners}-1's GPU",
    )
    cluster.kubectl("delete", "statefulset", winners, "-n", namespace, "--wait=false")
    wait_for(
        lambda: set(bound(kube, namespace, [f"{loser}-0", f"{loser}-1"])) == {f"{loser}-0", f"{loser}-1"},
        60,
        what=f"gang {loser} bound whole once {winners} is gone",
    )
    # Never both gangs holding a GPU at once while they raced.
    both = [s for s in sampler.states[:raced] if {n[0] for n in s} >= {"p", "q"}]
    assert not both, both[:3]
