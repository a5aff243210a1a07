"""The fit arithmetic (kube_gpu_scheduler/domain/fit.py) and the node usage index (kube_gpu_scheduler/scheduler/state/usage.py).

The cases follow kube-scheduler's own tests of PodRequests, NodeAffinity and NodePorts:
each expectation is computed by hand from the Kubernetes rules, written next to it.
"""

from __future__ import annotations

from typing import Any

import pytest

from kube_gpu_scheduler.domain import fit
from kube_gpu_scheduler.domain.fit import HostPort, NodeTotals, PodFootprint
from kube_gpu_scheduler.domain.rules import INSUFFICIENT_RESOURCES, NODE_AFFINITY, check_fit
from kube_gpu_scheduler.domain.schedmap import parse
from kube_gpu_scheduler.scheduler.state.usage import NodeUsage, compact, footprint

GI = 1 << 30


def c(
    name: str, restart: str | None = None, ports: list[dict[str, Any]] | None = None, **requests: str
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "resources": {"requests": {k.replace("_", "-"): v for k, v in requests.items()}},
    }
    if restart:
        out["restartPolicy"] = restart
    if ports:
        out["ports"] = ports
    return out


def test_app_containers_are_summed_and_units_are_kube_schedulers() -> None:
    spec = {"containers": [c("a", cpu="500m", memory="1Gi"), c("b", cpu="1.5", memory="512Mi")]}
    assert fit.pod_requests(spec) == {"cpu": 2000, "memory": GI + GI // 2}
    # Rounded up as kube-scheduler's MilliValue/Value do.
    assert fit.pod_requests({"containers": [c("a", cpu="0.0001")]}) == {"cpu": 1}


def test_the_biggest_init_container_wins_when_it_is_bigger_than_the_app() -> None:
    spec = {
        "initContainers": [c("i1", cpu="4"), c("i2", cpu="1", memory="8Gi")],
        "containers": [c("a", cpu="2", memory="1Gi")],
    }
    # max(init) per resource: cpu 4 vs app 2 -> 4; memory 8Gi vs app 1Gi -> 8Gi.
    assert fit.pod_requests(spec) == {"cpu": 4000, "memory": 8 * GI}


def test_sidecars_run_beside_later_init_containers_and_the_app() -> None:
    spec = {
        "initContainers": [c("side", restart="Always", cpu="1"), c("init", cpu="3")],
        "containers": [c("a", cpu="2")],
    }
    # app + sidecar = 3; init step = 3 + sidecar 1 = 4 -> 4.
    assert fit.pod_requests(spec) == {"cpu": 4000}
    spec["containers"] = [c("a", cpu="5")]
    # app + sidecar = 6 beats 4.
    assert fit.pod_requests(spec) == {"cpu": 6000}


def test_pod_level_requests_replace_cpu_and_memory_and_overhead_is_added() -> None:
    spec = {
        "containers": [c("a", cpu="1", memory="1Gi", ephemeral_storage="1Gi")],
        "resources": {"requests": {"cpu": "3", "memory": "2Gi"}},
        "overhead": {"cpu": "250m"},
    }
    assert fit.pod_requests(spec) == {"cpu": 3250, "memory": 2 * GI, "ephemeral-storage": GI}


def test_amounts_read_as_people_write_them() -> None:
    assert fit.show("cpu", 2500) == "2.5" and fit.show("cpu", 8000) == "8" and fit.show("cpu", 100) == "0.1"
    assert fit.show("memory", 4 * GI) == "4Gi" and fit.show("memory", GI + GI // 2) == "1.5Gi"
    assert fit.show("hugepages-2Mi", 2 << 20) == "2Mi" and fit.show("example.com/dongle", 3) == "3"


def node(name: str = "n1", labels: dict[str, str] | None = None, **allocatable: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "status": {"allocatable": allocatable}}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


@pytest.mark.parametrize(
    ("spec", "matches"),
    [
        ({"nodeSelector": {"zone": "a"}}, True),
        ({"nodeSelector": {"zone": "b"}}, False),
        ({"nodeSelector": {"disk": "ssd"}}, False),
        (affinity(expr("zone", "In", "a", "b")), True),
        (affinity(expr("zone", "NotIn", "a")), False),
        (affinity(expr("rack", "NotIn", "x")), True),  # an absent label is "not in"
        (affinity(expr("zone", "Exists")), True),
        (affinity(expr("zone", "DoesNotExist")), False),
        (affinity(expr("gen", "Gt", "3")), True),
        (affinity(expr("gen", "Lt", "3")), False),
        (affinity(expr("gen", "Gt", "x")), False),  # not a number: no match
        (affinity(expr("zone", "In", "b"), expr("zone", "In", "a")), True),  # terms are ORed
        (
            affinity(
                {
                    "matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a"]},
                        {"key": "gen", "operator": "Lt", "values": ["4"]},
                    ]
                }
            ),
            False,
        ),  # ANDed
        (affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}), True),
        (affinity({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}), False),
        (affinity({}), False),  # an empty term matches nothing
        ({**affinity(expr("zone", "In", "a")), "nodeSelector": {"zone": "b"}}, False),  # both must hold
    ],
)
def test_node_affinity_follows_kubernetes(spec: dict[str, Any], matches: bool) -> None:
    n = node(labels={"zone": "a", "gen": "5"})
    assert (fit.affinity_mismatch(spec, n) is None) is matches


def test_affinity_refusal_says_which_requirement_and_what_the_node_has() -> None:
    entry = parse("0=n1:0\n")[0]
    pod = {"metadata": {"uid": "u"}, "spec": {"nodeSelector": {"disk": "ssd"}, "containers": []}}
    [refusal] = check_fit(pod, entry, node(labels={"disk": "hdd"}, pods="10"), NodeUsage())
    assert refusal.reason == NODE_AFFINITY
    assert "nodeSelector disk=ssd (node has disk=hdd)" in refusal.message and "'n1'" in refusal.message


def test_host_ports_conflict_on_the_same_port_protocol_and_address() -> None:
    any_ip = HostPort("0.0.0.0", 80, "TCP")
    assert any_ip.conflicts(HostPort("10.0.0.1", 80, "TCP"))
    assert not any_ip.conflicts(HostPort("0.0.0.0", 80, "UDP"))
    assert not HostPort("10.0.0.1", 80, "TCP").conflicts(HostPort("10.0.0.2", 80, "TCP"))
    spec = {
        "initContainers": [
            c("side", restart="Always", ports=[{"containerPort": 1, "hostPort": 9000}]),
            c("init", ports=[{"containerPort": 1, "hostPort": 9001}]),
        ],
        "containers": [
            c("a", ports=[{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}, {"containerPort": 81}])
        ],
    }
    assert {str(p) for p in fit.host_ports(spec)} == {"9000/TCP", "8080/UDP"}


def test_shortfalls_name_every_resource_and_the_pod_slot() -> None:
    totals = NodeTotals.of(
        [PodFootprint.of("x/a", "n1", {"containers": [c("a", cpu="5.5", example_com_x="1")]})]
    )
    offered = fit.allocatable(node(cpu="8", pods="1", memory="1Gi"))
    short = fit.shortfalls({"cpu": 4000, "memory": 2 * GI, "example.com/y": 1}, offered, totals)
    by = {s.resource: s for s in short}
    assert set(by) == {"pods", "cpu", "memory", "example.com/y"}
    assert (by["cpu"].free, by["cpu"].allocatable, by["cpu"].used) == (2500, 8000, 5500)
    assert by["example.com/y"].allocatable == 0  # a resource the node does not offer


def test_insufficient_message_names_the_numbers() -> None:
    entry = parse("0=node1:0\n")[0]
    usage = NodeUsage()
    usage.observe("other", PodFootprint.of("x/a", "node1", {"containers": [c("a", cpu="5.5")]}))
    pod = {"metadata": {"uid": "u"}, "spec": {"containers": [c("main", cpu="4")]}}
    [refusal] = check_fit(pod, entry, node("node1", cpu="8", pods="110"), usage)
    assert refusal.reason == INSUFFICIENT_RESOURCES
    assert refusal.message.startswith("Insufficient cpu: the pod requests 4, node 'node1' has 2.5 of 8 free")


def test_usage_reservation_is_atomic_and_generations_count_releases() -> None:
    usage = NodeUsage()
    a = PodFootprint.of("x/a", "n1", {"containers": [c("a", cpu="6")]})
    b = PodFootprint.of("x/b", "n1", {"containers": [c("b", cpu="6")]})
    offered = {"cpu": 8000, "pods": 10}

    def room(want: PodFootprint) -> Any:
        return lambda totals: fit.shortfalls(dict(want.requests), offered, totals)

    assert usage.reserve("a", a, room(a)) == []
    assert [s.resource for s in usage.reserve("b", b, room(b))] == ["cpu"]  # a took the room
    assert usage.generation("n1") == 0
    # The watch shows a bound: the reservation becomes the pod's own record, nothing released.
    assert usage.observe("a", a) == set() and usage.generation("n1") == 0
    assert usage.cancel("a") == set()  # not a reservation any more: a cancel cannot drop it
    assert usage.totals("n1").requested == {"cpu": 6000}
    assert usage.forget("a") == {"n1"} and usage.generation("n1") == 1
    assert usage.reserve("b", b, room(b)) == []
    assert usage.cancel("b") == {"n1"} and usage.totals("n1").pods == 0


def test_the_watch_keeps_a_small_record_of_pods_that_are_not_ours() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "7",
            "labels": {"a": "b"},
            "annotations": {"big": "x" * 10000},
        },
        "spec": {"nodeName": "n1", "containers": [c("a", cpu="1")]},
        "status": {"phase": "Running"},
    }
    small = compact(pod)
    assert small["footprint"] == PodFootprint("ns/p", "n1", (("cpu", 1000),), ())
    assert len(repr(small)) < 500
    assert footprint({**pod, "status": {"phase": "Succeeded"}}) is None
    assert footprint({**pod, "spec": {"containers": []}}) is None
