"""The GPU ledger: who holds which node:GPU, from the pods' immutable fields as the API shows them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kube_gpu_scheduler.domain.injection import CDI_GPU_PREFIX, held_devices, parse_devices
from kube_gpu_scheduler.scheduler.state.ledger import Claim, Ledger, claim_of, is_active

FORGED = "gpu-scheduler/assigned"


def pod(
    name: str = "w-0",
    uid: str | None = None,
    devices: str | None = None,
    node: str | None = None,
    phase: str = "Pending",
    smap: str | None = None,
    deleting: bool = False,
    nvidia: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod whose container carries CUDA_VISIBLE_DEVICES=devices (and NVIDIA_VISIBLE_DEVICES=nvidia)."""
    ann = dict(annotations or {})
    if smap is not None:
        ann["gpu-scheduling-map"] = smap
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "annotations": ann}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    env = []
    if nvidia is not None:
        env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": nvidia})
    if devices is not None:
        env.append({"name": "CUDA_VISIBLE_DEVICES", "value": devices})
    spec: dict[str, Any] = {"containers": [{"name": "c", "env": env}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


# -- what a pod holds --------------------------------------------------------------------------


def test_a_bound_pod_holds_the_devices_in_its_container_spec() -> None:
    assert claim_of(pod(devices="1,0", node="node1", phase="Running")) == Claim("node1", (0, 1))
    # nvidia mode: NVIDIA_VISIBLE_DEVICES holds the physical indices, CUDA's are renumbered.
    assert claim_of(pod(nvidia="5,7", devices="0,1", node="node1", phase="Running")) == Claim("node1", (5, 7))


def test_a_pending_pod_holds_nothing_whatever_it_carries() -> None:
    assert claim_of(pod(devices="0,1", smap="0=node1:0,1")) is None
    # The old annotation is a claim anyone could forge: it means nothing now.
    assert claim_of(pod(annotations={FORGED: "node4:0"})) is None
    assert claim_of(
        pod(annotations={FORGED: "node4:0"}, devices="3", node="node4", phase="Running")
    ) == Claim("node4", (3,))


def test_containers_union_and_init_containers_count() -> None:
    p = pod(devices="0", node="n", phase="Running")
    p["spec"]["initContainers"] = [{"name": "i", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "2"}]}]
    p["spec"]["containers"].append({"name": "d", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}]})
    assert claim_of(p) == Claim("n", (0, 1, 2))


def test_bound_pod_without_variables_holds_its_map_entry_on_that_node() -> None:
    smap = "0=node1:0,1\n1=node2:2"
    assert claim_of(pod(node="node1", phase="Running", smap=smap)) == Claim("node1", (0, 1))
    assert claim_of(pod(node="node9", phase="Running", smap=smap)) is None  # bound elsewhere
    assert claim_of(pod(node="node1", phase="Running", smap="0=node1:x")) is None  # bad map
    # Once the containers carry devices, the (mutable) map is not read at all.
    assert claim_of(pod(node="node1", phase="Running", smap=smap, devices="3")) == Claim("node1", (3,))


def test_finished_pods_hold_nothing_terminating_pods_still_hold() -> None:
    for phase in ("Succeeded", "Failed"):
        assert not is_active(pod(phase=phase))
        assert claim_of(pod(devices="0", node="node1", phase=phase)) is None
    terminating = pod(devices="0", node="node1", phase="Running", deleting=True)
    assert is_active(terminating)
    assert claim_of(terminating) == Claim("node1", (0,))


def test_device_lists_are_read_strictly() -> None:
    assert parse_devices("0, 2,2") == (0, 2)
    for bad in (None, "", "all", "GPU-1234", "0,,1", "-1", "1024", "٣", "0;1", "9" * 5000):
        assert parse_devices(bad) is None, bad
    spec = {"containers": [{"env": [{"name": "CUDA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {}}}]}]}
    assert held_devices(spec) == ()


@given(st.lists(st.integers(0, 1023), min_size=1, max_size=8, unique=True))
def test_any_device_list_round_trips(gpus: list[int]) -> None:
    assert parse_devices(",".join(map(str, gpus))) == tuple(gpus)


# -- the index ---------------------------------------------------------------------------------


def test_holders_and_release() -> None:
    ledger = Ledger()
    a = pod("a-0", devices="0,1", node="node1", phase="Running")
    assert ledger.observe(a) == set()
    assert ledger.holders("node1", [1, 2]) == [(1, "ns/a-0")]
    assert ledger.holders("node1", [0, 1], exclude_uid="uid-a-0") == []
    assert ledger.snapshot() == {"node1:0": ["ns/a-0"], "node1:1": ["ns/a-0"]}
    assert len(ledger) == 1

    finished = pod("a-0", devices="0,1", node="node1", phase="Succeeded")
    assert ledger.observe(finished) == {"node1"}
    assert ledger.holders("node1", [0, 1]) == []
    assert len(ledger) == 0


def test_editing_annotations_of_a_running_pod_frees_nothing() -> None:
    ledger = Ledger()
    running = pod("a-0", devices="0", node="node4", phase="Running", smap="0=node4:0")
    ledger.observe(running)
    tampered = pod(
        "a-0", devices="0", node="node4", phase="Running", smap="0=node9:5", annotations={FORGED: "node9:5"}
    )
    assert ledger.observe(tampered) == set()
    assert ledger.holders("node4", [0]) == [(0, "ns/a-0")]
    assert ledger.holders("node9", [5]) == []


def test_forget_releases_and_is_idempotent() -> None:
    ledger = Ledger()
    a = pod("a-0", devices="2", node="node2", phase="Running")
    ledger.observe(a)
    assert ledger.forget(a) == {"node2"}
    assert ledger.forget(a) == set()
    assert ledger.snapshot() == {}


def test_same_name_new_uid_is_another_pod() -> None:
    ledger = Ledger()
    old = pod("w-0", uid="old", devices="0", node="node1", phase="Running", deleting=True)
    new = pod("w-0", uid="new", devices="0", node="node1", phase="Pending")
    ledger.observe(old)
    assert ledger.reserve(new, Claim("node1", (0,))) == [(0, "ns/w-0")]  # the old one still holds it
    ledger.observe(new)  # bound by someone else meanwhile: the ledger records both holders
    assert sorted(ledger.holders("node1", [0])) == [(0, "ns/w-0"), (0, "ns/w-0")]
    ledger.forget(old)  # (waiting pods are retried; the new pod still holds node1:0)
    assert ledger.holders("node1", [0], exclude_uid="new") == []
    assert ledger.holders("node1", [0]) == [(0, "ns/w-0")]


def test_reserve_is_exclusive() -> None:
    ledger = Ledger()
    a, b = pod("a-0"), pod("b-0")
    assert ledger.reserve(a, Claim("node1", (0, 1))) == []
    assert ledger.reserve(b, Claim("node1", (1, 2))) == [(1, "ns/a-0")]
    assert ledger.holders("node1", [2]) == []  # the refused reservation took nothing
    assert ledger.reserve(a, Claim("node1", (0, 1))) == []  # reserving again is fine


def test_reservation_survives_pending_copies_until_the_binding_is_seen() -> None:
    ledger = Ledger()
    before = pod("a-0", devices="0")
    ledger.reserve(before, Claim("node1", (0,)))
    ledger.observe(before)  # an older (or unchanged) pending copy arrives
    assert ledger.holders("node1", [0]) == [(0, "ns/a-0")]
    ledger.observe(pod("a-0", devices="0", node="node1", phase="Running"))  # the binding arrives
    assert ledger.claim("uid-a-0") == Claim("node1", (0,))
    # From now on the watch rules: a finished pod releases.
    assert ledger.observe(pod("a-0", devices="0", node="node1", phase="Failed")) == {"node1"}


def test_a_pod_bound_elsewhere_drops_the_reservation() -> None:
    ledger = Ledger()
    ledger.reserve(pod("a-0", devices="0"), Claim("node1", (0,)))
    assert ledger.observe(pod("a-0", devices="0", node="node2", phase="Running")) == {"node1"}
    assert ledger.claim("uid-a-0") == Claim("node2", (0,))


def test_reservation_is_dropped_when_the_pod_finishes_or_goes() -> None:
    ledger = Ledger()
    a = pod("a-0")
    ledger.reserve(a, Claim("node1", (0,)))
    assert ledger.observe(pod("a-0", phase="Failed")) == {"node1"}
    ledger.reserve(a, Claim("node1", (0,)))
    assert ledger.forget(a) == {"node1"}


def test_cancel_falls_back_to_the_api_object() -> None:
    ledger = Ledger()
    a = pod("a-0")
    ledger.reserve(a, Claim("node1", (0,)))
    assert ledger.cancel(a) == {"node1"}
    assert ledger.holders("node1", [0]) == []
    bound = pod("a-0", devices="1", node="node3", phase="Running")
    ledger.reserve(bound, Claim("node1", (0,)))
    ledger.cancel(bound)
    assert ledger.claim("uid-a-0") == Claim("node3", (1,))


U1 = "GPU-8a3c0d4e-1234-5678-9abc-def012345678"
U2 = "GPU-8a3c0d4e-1234-5678-9abc-def012345679"


def test_gpus_named_by_uuid_are_held_as_the_map_names_them() -> None:
    # The webhook writes the map's normal form; any case reads back as it.
    assert parse_devices(f"{U2}, {U1.upper()},{U2}") == (U2, U1)
    for bad in ("0000:3b:00.0", f"{U1},x", "GPU-8a3c0d4e", f"{U1}0"):
        assert parse_devices(bad) is None, bad
    cuda = pod(devices=f"{U2},{U1}", node="node1", phase="Running")
    assert claim_of(cuda) == Claim("node1", (U1, U2))
    # nvidia mode: NVIDIA_VISIBLE_DEVICES names the physical GPUs, CUDA_VISIBLE_DEVICES is 0..n-1.
    nvidia = pod(name="w-1", devices="0", nvidia=U2, node="node1", phase="Running")
    assert claim_of(nvidia) == Claim("node1", (U2,))
    # No variable: the map entry, by UUID.
    bare = pod(name="w-2", node="node1", phase="Running", smap=f"2=node1:{U1.upper()}")
    assert claim_of(bare) == Claim("node1", (U1,))


def test_nvidia_cdi_mode_holds_the_gpus_its_cdi_devices_name() -> None:
    """nvidia-cdi: NVIDIA_VISIBLE_DEVICES=runtime.nvidia.com/gpu=<GPU>,...; CUDA's are 0..n-1."""
    cdi = f"{CDI_GPU_PREFIX}3, {CDI_GPU_PREFIX}1"
    assert parse_devices(cdi, CDI_GPU_PREFIX) == (3, 1)
    assert parse_devices(cdi) is None
    for bad in (f"{CDI_GPU_PREFIX}3,1", "nvidia.com/gpu=3", f"{CDI_GPU_PREFIX}all", f"{CDI_GPU_PREFIX}"):
        assert parse_devices(bad, CDI_GPU_PREFIX) is None, bad
    assert claim_of(pod(nvidia=cdi, devices="0,1", node="node1", phase="Running")) == Claim("node1", (1, 3))
    by_uuid = pod(nvidia=f"{CDI_GPU_PREFIX}{U2.upper()}", devices="0", node="node1", phase="Running")
    assert claim_of(by_uuid) == Claim("node1", (U2,))
    # 64 GPUs by UUID fit (each item 23 characters longer than in nvidia mode).
    many = [f"GPU-8a3c0d4e-1234-5678-9abc-{i:012x}" for i in range(64)]
    assert held_devices(pod(nvidia=",".join(CDI_GPU_PREFIX + u for u in many), devices="0")["spec"]) == tuple(
        sorted(many)
    )


def test_a_ledger_holds_indices_and_uuids_side_by_side() -> None:
    ledger = Ledger()
    ledger.observe(pod(name="a-0", devices=f"{U1}", node="node1", phase="Running"))
    ledger.observe(pod(name="b-0", devices="3,1", node="node1", phase="Running"))
    assert ledger.snapshot() == {"node1:1": ["ns/b-0"], "node1:3": ["ns/b-0"], f"node1:{U1}": ["ns/a-0"]}
    assert ledger.holders("node1", [U1, U2]) == [(U1, "ns/a-0")]
    assert Claim.of("n", [U2, 2, U1, 0]) == Claim("n", (0, 2, U1, U2))
