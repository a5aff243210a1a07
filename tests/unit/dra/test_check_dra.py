"""The check in DRA mode: the in-pod env and NVML checks, and verify-release's claim checks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kube_gpu_scheduler.check import evaluate_release, map_results, nvml, nvml_results, passed
from kube_gpu_scheduler.check.release_dra import DraState
from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.schedmap import Entry
from localcluster import dra as slices
from tests.unit.check.test_check import by_check, fake_pynvml, settings, sts

MAP = "0=node1:0,1\n1=node2:2\n"
SLICES = [slices.resource_slice(n, slices.node_gpus(n, 4)) for n in ("node1", "node2")]


# --- in the pod ------------------------------------------------------------------------------------


def dra_settings(**over: Any) -> Any:
    return settings(**{"injection_mode": "dra", "cuda_visible_devices": None, **over})


def test_in_pod_dra_mode_needs_no_cuda_visible_devices() -> None:
    results, entry = map_results(dra_settings())
    assert entry == Entry(1, "node2", (2,))
    assert passed(results), [r.to_json() for r in results if r.ok is False]
    checks = by_check(results)
    assert checks["env:CUDA_DEVICE_ORDER"].ok is True
    assert checks["env:CUDA_VISIBLE_DEVICES"].ok is True and checks["env:CUDA_VISIBLE_DEVICES"].actual is None


def test_in_pod_dra_mode_refuses_a_cuda_visible_devices() -> None:
    # Over the claim's GPUs (numbered from 0) a physical index hides or reorders them.
    results, _ = map_results(dra_settings(cuda_visible_devices="2"))
    r = by_check(results)["env:CUDA_VISIBLE_DEVICES"]
    assert (r.expected, r.actual, r.ok) == (None, "2", False)
    results, _ = map_results(dra_settings(cuda_device_order=None))
    assert by_check(results)["env:CUDA_DEVICE_ORDER"].ok is False


def test_in_pod_dra_mode_nvml_sees_exactly_the_claims_gpus() -> None:
    entry = Entry(0, "node1", (0, 1))
    ok = by_check(nvml_results(dra_settings(), entry, nvml.query(fake_pynvml(2))))
    assert ok["nvml:count"].ok is True and "nvml:indices" not in ok
    bad = by_check(nvml_results(dra_settings(), entry, nvml.query(fake_pynvml(4))))
    assert (bad["nvml:count"].expected, bad["nvml:count"].actual, bad["nvml:count"].ok) == (2, 4, False)


# --- verify-release --------------------------------------------------------------------------------


def dra_pod(
    name: str, node: str | None, *, claim: str | None = "", containers_claim: bool = True
) -> dict[str, Any]:
    ordinal = name.rsplit("-", 1)[1]
    ref = dra.claim_name(name) if claim == "" else claim
    container: dict[str, Any] = {"name": "c0", "env": [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}]}
    if containers_claim:
        container["resources"] = {"claims": [{"name": dra.POD_CLAIM}]}
    spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
    if ref is not None:
        spec["resourceClaims"] = [{"name": dra.POD_CLAIM, "resourceClaimName": ref}]
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": {"apps.kubernetes.io/pod-index": ordinal, dra.POD_LABEL: "true"},
            "annotations": {"gpu-scheduling-map": MAP},
            "ownerReferences": [{"kind": "StatefulSet", "name": "w", "controller": True}],
        },
        "spec": spec,
        "status": {"phase": "Running"},
    }


def claim(pod_name: str, node: str, devices: list[str], reserved: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": dra.request_name(i), "driver": dra.DRIVER, "pool": node, "device": d}
                    for i, d in enumerate(devices)
                ]
            }
        }
    }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": pod_name, "uid": f"uid-{pod_name}"}]
    return {"metadata": {"name": dra.claim_name(pod_name), "namespace": "ns"}, "status": status}


def state(**claims: dict[str, Any] | None) -> DraState:
    return DraState(
        claims={dra.claim_name(k.replace("_", "-")): v for k, v in claims.items()}, slices=list(SLICES)
    )


def good() -> tuple[list[dict[str, Any]], DraState]:
    # node2's index 2 (PCI bus ID order) is its gpu-0: the minors are not in bus order there.
    return (
        [dra_pod("w-0", "node1"), dra_pod("w-1", "node2")],
        state(w_0=claim("w-0", "node1", ["gpu-0", "gpu-1"]), w_1=claim("w-1", "node2", ["gpu-0"])),
    )


def test_release_dra_good() -> None:
    pods, st = good()
    results, rows = evaluate_release(pods, {"w": sts("w", MAP)}, "ns", dra_state=st)
    assert passed(results), [r.to_json() for r in results if r.ok is False]
    assert [(r.name, r.node, r.devices, r.expected_devices, r.ok) for r in rows] == [
        ("w-0", "node1", "gpu-0,gpu-1", "gpu-0,gpu-1", True),
        ("w-1", "node2", "gpu-0", "gpu-0", True),
    ]
    checks = {(r.pod, r.check) for r in results}
    for check in ("dra:claim-ref", "dra:container-claims", "dra:allocation", "dra:reserved"):
        assert ("ns/w-1", check) in checks
    # Detected per pod in auto mode; --mode dra says the same.
    assert passed(evaluate_release(pods, {"w": sts("w", MAP)}, "ns", "dra", dra_state=st)[0])


def failing(pods: list[dict[str, Any]], st: DraState, mode: str = "auto") -> set[tuple[str, str]]:
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns", mode, dra_state=st)
    return {(r.pod, r.check) for r in results if r.ok is False}


def test_release_dra_wrong_device_is_refused() -> None:
    # gpu-2 is node2's minor 2, but index 2 in PCI bus ID order is gpu-0.
    pods, st = good()
    st.claims[dra.claim_name("w-1")] = claim("w-1", "node2", ["gpu-2"])
    assert failing(pods, st) == {("ns/w-1", "dra:allocation")}
    st.claims[dra.claim_name("w-1")] = claim("w-1", "node2", ["gpu-0", "gpu-1"])  # one too many
    assert failing(pods, st) == {("ns/w-1", "dra:allocation")}
    st.claims[dra.claim_name("w-1")] = claim("w-1", "node1", ["gpu-0"])  # another node's pool
    assert failing(pods, st) == {("ns/w-1", "dra:allocation")}


def test_release_dra_unallocated_unreserved_or_missing_claim() -> None:
    pods, st = good()
    st.claims[dra.claim_name("w-1")] = {"metadata": {"name": dra.claim_name("w-1")}, "status": {}}
    assert failing(pods, st) == {("ns/w-1", "dra:allocation"), ("ns/w-1", "dra:reserved")}
    st.claims[dra.claim_name("w-1")] = claim("w-1", "node2", ["gpu-0"], reserved=False)
    assert failing(pods, st) == {("ns/w-1", "dra:reserved")}
    st.claims[dra.claim_name("w-1")] = None
    st.claim_errors[dra.claim_name("w-1")] = "404 Not Found"
    assert failing(pods, st) == {("ns/w-1", "dra:claim")}


def test_release_dra_pod_without_its_claim() -> None:
    pods, st = good()
    pods[1] = dra_pod("w-1", "node2", containers_claim=False)
    assert failing(pods, st) == {("ns/w-1", "dra:container-claims")}
    pods[1] = dra_pod("w-1", "node2", claim="someone-elses-gpus")
    st.claims["someone-elses-gpus"] = claim("w-1", "node2", ["gpu-0"])
    assert ("ns/w-1", "dra:claim-ref") in failing(pods, st)
    # --mode dra: a pod with no claim at all is not taken for a cuda-mode pod.
    pods[1] = dra_pod("w-1", "node2", claim=None)
    assert ("ns/w-1", "dra:claim-ref") in failing(pods, st, "dra")


def test_release_dra_unresolvable_entry_and_unreadable_slices() -> None:
    pods, st = good()
    st.slices = [
        slices.changed(
            {**SLICES[1], "metadata": {**SLICES[1]["metadata"], "resourceVersion": "1"}}, remove=[0, 1, 2]
        )
    ]
    st.slices.append(SLICES[0])
    # node2 now publishes one GPU: index 2 does not resolve.
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns", dra_state=st)
    r = next(r for r in results if r.check == "dra:devices")
    assert r.ok is False and "GPU index 2 does not exist on node node2" in r.actual
    pods, st = good()
    st.slices, st.slices_error = [], "403 Forbidden: list resourceslices.resource.k8s.io"
    assert failing(pods, st) == {("ns/w-0", "dra:devices"), ("ns/w-1", "dra:devices")}


def test_release_dra_env_has_no_cuda_visible_devices() -> None:
    pods, st = good()
    pods[0]["spec"]["containers"][0]["env"].append({"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"})
    assert failing(pods, st) == {("ns/w-0", "env:CUDA_VISIBLE_DEVICES")}


# --- wait-ready ------------------------------------------------------------------------------------


def dry_run_answer(
    *, claim: bool = True, container_claim: bool = True, env: list[dict] | None = None
) -> dict:
    from kube_gpu_scheduler.check.wait_ready import probe_pod
    from tests.unit.check.test_check_wait_ready import target

    pod = probe_pod(target())
    c = pod["spec"]["containers"][0]
    c["env"] = [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}] if env is None else env
    if container_claim:
        c["resources"]["claims"] = [{"name": dra.POD_CLAIM}]
    if claim:
        pod["spec"]["resourceClaims"] = [{"name": dra.POD_CLAIM, "resourceClaimName": "probe-gpus"}]
    return pod


def test_wait_ready_in_dra_mode_waits_for_the_claim_reference() -> None:
    from kube_gpu_scheduler.check.cli import build_parser
    from kube_gpu_scheduler.check.wait_ready import build_target, injected_text, injection_problem

    t = build_target(build_parser().parse_args(["wait-ready", "-n", "ns", "--map", MAP, "--mode", "dra"]))
    assert t.dra
    e = t.entry
    assert injection_problem(dry_run_answer(), e, t.mode, 0, t.dra) is None
    assert "without its ResourceClaim" in str(
        injection_problem(dry_run_answer(claim=False), e, t.mode, 0, t.dra)
    )
    assert "not listing claim gpu-scheduler" in str(
        injection_problem(dry_run_answer(container_claim=False), e, t.mode, 0, t.dra)
    )
    assert "without CUDA_DEVICE_ORDER=PCI_BUS_ID" in str(
        injection_problem(dry_run_answer(env=[]), e, t.mode, 0, t.dra)
    )
    cuda = [
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"},
        {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
    ]
    assert "which DRA mode never sets" in str(
        injection_problem(dry_run_answer(env=cuda), e, t.mode, 0, t.dra)
    )
    # A cuda-mode answer does not satisfy DRA mode, nor a DRA answer cuda mode.
    assert injection_problem(dry_run_answer(claim=False, env=cuda), e, t.mode, 0, True) is not None
    assert injection_problem(dry_run_answer(), e, "cuda", 0, False) is not None
    assert "ResourceClaim reference" in injected_text(e, t.mode, True)
    # A probe whose GPUs its map shares comes back with its shared claim only: every container
    # must list it.
    shared = dry_run_answer()
    shared["spec"]["resourceClaims"] = [
        {"name": "gpu-scheduler-shared-0", "resourceClaimName": "p-0-shared-1"}
    ]
    for c in shared["spec"]["containers"]:
        c["resources"] = {"claims": [{"name": "gpu-scheduler-shared-0"}]}
    assert injection_problem(shared, e, t.mode, 0, t.dra) is None
    shared["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu-scheduler"}]}
    assert "not listing claim gpu-scheduler-shared-0" in str(injection_problem(shared, e, t.mode, 0, t.dra))


def test_wait_ready_in_dra_mode_names_its_probe_pod() -> None:
    # The injection policy in DRA mode mutates only a pod whose name is known at admission
    # (the claim is <pod>-gpus); generateName is filled in after admission.
    from kube_gpu_scheduler.check.wait_ready import probe_pod
    from tests.unit.check.test_check_wait_ready import target

    meta = probe_pod(replace(target(), dra=True))["metadata"]
    assert "generateName" not in meta and meta["name"].startswith("gpu-scheduler-wait-ready-probe-")
    assert probe_pod(replace(target(), dra=True))["metadata"]["name"] != meta["name"]
    assert "name" not in probe_pod(target())["metadata"]


def test_release_dra_replicas_that_share_a_gpu_check_the_one_shared_claim() -> None:
    """The task's replicas 3 and 4 on node2's index 2 (gpu-0), and a partial overlap: replica 0
    (index 0 alone, index 1 with replica 1) and replica 1 (index 1 shared, index 3 alone)."""
    shared_map = "0=node1:0,1\n1=node1:1,3\n3=node2:2\n4=node2:2\n"

    def pod(name: str, node: str, refs: dict[str, str]) -> dict[str, Any]:
        p = dra_pod(name, node)
        p["metadata"]["annotations"]["gpu-scheduling-map"] = shared_map
        p["spec"]["resourceClaims"] = [{"name": k, "resourceClaimName": v} for k, v in refs.items()]
        p["spec"]["containers"][0]["resources"] = {"claims": [{"name": k} for k in refs]}
        return p

    def shared(name: str, node: str, devices: list[str], users: list[str]) -> dict[str, Any]:
        c = claim(users[0], node, devices)
        c["metadata"]["name"] = name
        c["status"]["reservedFor"] = [{"resource": "pods", "name": u, "uid": f"uid-{u}"} for u in users]
        return c

    pods = [
        pod("w-0", "node1", {"gpu-scheduler": "w-0-gpus", "gpu-scheduler-shared-0": "w-0-shared-1"}),
        pod("w-1", "node1", {"gpu-scheduler": "w-1-gpus", "gpu-scheduler-shared-0": "w-0-shared-1"}),
        pod("w-3", "node2", {"gpu-scheduler-shared-0": "w-3-shared-2"}),
        pod("w-4", "node2", {"gpu-scheduler-shared-0": "w-3-shared-2"}),
    ]
    st = DraState(
        claims={
            "w-0-gpus": claim("w-0", "node1", ["gpu-0"]),
            "w-1-gpus": claim("w-1", "node1", ["gpu-3"]),
            "w-0-shared-1": shared("w-0-shared-1", "node1", ["gpu-1"], ["w-0", "w-1"]),
            "w-3-shared-2": shared("w-3-shared-2", "node2", ["gpu-0"], ["w-3", "w-4"]),
        },
        slices=list(SLICES),
    )
    results, rows = evaluate_release(pods, {"w": sts("w", shared_map)}, "ns", dra_state=st)
    bad = [r.to_json() for r in results if r.ok is False and r.check.startswith("dra:")]
    assert not bad, bad
    assert [(r.name, r.devices, r.expected_devices) for r in rows] == [
        ("w-0", "gpu-0,gpu-1", "gpu-0,gpu-1"),
        ("w-1", "gpu-1,gpu-3", "gpu-1,gpu-3"),
        ("w-3", "gpu-0", "gpu-0"),
        ("w-4", "gpu-0", "gpu-0"),
    ]
    # The shared claim not reserved for w-4, then allocated another GPU: w-4 fails, and both.
    st.claims["w-3-shared-2"] = shared("w-3-shared-2", "node2", ["gpu-0"], ["w-3"])
    results, _ = evaluate_release(pods, {"w": sts("w", shared_map)}, "ns", dra_state=st)
    assert {(r.pod, r.check) for r in results if r.ok is False and r.check.startswith("dra:")} == {
        ("ns/w-4", "dra:reserved")
    }
    st.claims["w-3-shared-2"] = shared("w-3-shared-2", "node2", ["gpu-1"], ["w-3", "w-4"])
    results, _ = evaluate_release(pods, {"w": sts("w", shared_map)}, "ns", dra_state=st)
    assert {(r.pod, r.check) for r in results if r.ok is False and r.check.startswith("dra:")} == {
        ("ns/w-3", "dra:allocation"),
        ("ns/w-4", "dra:allocation"),
    }
    # A sharer that references its own claim for the shared GPU (not the policy's layout).
    pods[3] = pod("w-4", "node2", {"gpu-scheduler": "w-4-gpus"})
    results, _ = evaluate_release(pods, {"w": sts("w", shared_map)}, "ns", dra_state=st)
    assert ("ns/w-4", "dra:claim-ref") in {(r.pod, r.check) for r in results if r.ok is False}


# --- count entries (NODE:auto(N)): the number of GPUs, never which ---------------------------------

COUNTED = "0=node1:auto(2)\n1=node2:0\n"


def test_in_pod_a_count_entry_checks_how_many_gpus_not_which() -> None:
    at = dra_settings(map_text=COUNTED, pod_name="w-0", pod_index="0", node_name="node1")
    results, entry = map_results(at)
    assert entry is not None and entry.count == 2
    assert passed(results), [r.to_json() for r in results if r.ok is False]
    two = nvml.DeviceNodes(("/dev/nvidia3", "/dev/nvidia5"), True)
    ok = by_check(nvml_results(at, entry, nvml.query(fake_pynvml(2)), two))
    assert (ok["nvml:count"].expected, ok["nvml:count"].ok, ok["dev"].expected, ok["dev"].ok) == (
        2,
        True,
        2,
        True,
    )
    assert "nvml:indices" not in ok and "nvml:uuids" not in ok
    three = nvml.DeviceNodes(("/dev/nvidia3", "/dev/nvidia5", "/dev/nvidia6"), True)
    bad = by_check(nvml_results(at, entry, nvml.query(fake_pynvml(3)), three))
    assert (bad["nvml:count"].actual, bad["nvml:count"].ok, bad["dev"].ok) == (3, False, False)


def test_in_pod_a_count_entry_outside_dra_mode_fails_and_says_dra() -> None:
    at = settings(
        map_text=COUNTED, pod_name="w-0", pod_index="0", node_name="node1", cuda_visible_devices=None
    )
    results, _ = map_results(at)
    mode = by_check(results)["mode"]
    assert (mode.expected, mode.actual, mode.ok) == ("dra", "cuda", False)
    assert "only DRA mode" in mode.extra["why"]
    assert not [r for r in results if r.check.startswith("env:")]


def counted_pods() -> list[dict[str, Any]]:
    pods = [dra_pod("w-0", "node1"), dra_pod("w-1", "node2")]
    for p in pods:
        p["metadata"]["annotations"]["gpu-scheduling-map"] = COUNTED
    return pods


def test_release_a_count_entrys_claim_holds_n_devices_of_its_node() -> None:
    # node2's index 0 is its gpu-2 (bus order); w-0's two GPUs are whichever kube-scheduler chose.
    st = state(w_0=claim("w-0", "node1", ["gpu-3", "gpu-1"]), w_1=claim("w-1", "node2", ["gpu-2"]))
    results, rows = evaluate_release(counted_pods(), {"w": sts("w", COUNTED)}, "ns", dra_state=st)
    assert passed(results), [r.to_json() for r in results if r.ok is False]
    assert [(r.name, r.devices, r.expected_devices, r.ok) for r in rows] == [
        ("w-0", "gpu-3,gpu-1", "auto(2)", True),
        ("w-1", "gpu-2", "gpu-2", True),
    ]
    alloc = next(r for r in results if r.pod == "ns/w-0" and r.check == "dra:allocation")
    assert alloc.expected == "2 devices of node node1" and alloc.extra["count"] == 2


def test_release_a_count_entrys_claim_with_too_few_or_foreign_devices_fails() -> None:
    for devices, pool in ((["gpu-3"], "node1"), (["gpu-3", "gpu-3"], "node1"), (["gpu-0", "gpu-1"], "node2")):
        st = state(w_0=claim("w-0", pool, devices), w_1=claim("w-1", "node2", ["gpu-2"]))
        results, rows = evaluate_release(counted_pods(), {"w": sts("w", COUNTED)}, "ns", dra_state=st)
        alloc = next(r for r in results if r.pod == "ns/w-0" and r.check == "dra:allocation")
        assert alloc.ok is False and not rows[0].ok, (devices, pool, alloc.to_json())
        if pool == "node2":
            assert alloc.extra["notOnNode"] == ["node2/gpu-0", "node2/gpu-1"]


def test_release_a_count_entry_outside_dra_mode_fails_and_says_dra() -> None:
    from tests.unit.check.test_check import pod

    pods = [pod("w-0", "node1", {"CUDA_VISIBLE_DEVICES": "auto(2)"}, text=COUNTED)]
    results, rows = evaluate_release(pods, {"w": sts("w", COUNTED, replicas=1)}, "ns", mode="cuda")
    mode = next(r for r in results if r.check == "mode")
    assert (mode.expected, mode.ok) == ("dra", False) and "only DRA mode" in mode.extra["why"]
    assert not rows[0].ok
