"""The check program's logic: env in, results out (no subprocess, no GPU)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kube_gpu_scheduler.check import (
    Result,
    Settings,
    env_results,
    evaluate_release,
    expected_env,
    map_results,
    nvml,
    nvml_results,
    passed,
    run_checks,
)
from kube_gpu_scheduler.domain.schedmap import Entry, parse

MAP = "0=node1:0,1\n1=node2:2\n2=node3:1,3"


def settings(**over: Any) -> Settings:
    base: dict[str, Any] = {
        "pod_name": "w-1",
        "pod_namespace": "ns",
        "node_name": "node2",
        "pod_index": "1",
        "map_text": MAP,
        "cuda_visible_devices": "2",
        "cuda_device_order": "PCI_BUS_ID",
        "nvidia_visible_devices": None,
        "injection_mode": "cuda",
        "dev_dir": "/nonexistent/dev",  # no NVIDIA device node (tests/unit/check/test_check_diagnose.py lists some)
    }
    base.update(over)
    return Settings(**base)


def by_check(results: list[Result]) -> dict[str, Result]:
    return {r.check: r for r in results}


def no_nvml() -> nvml.NvmlReport:
    return nvml.NvmlReport(False, reason="NVML not available: test")


# --- settings ------------------------------------------------------------------------------------


def test_settings_from_env_defaults() -> None:
    s = Settings.from_env({})
    assert s.injection_mode == "cuda"
    assert s.interval_seconds == 30.0
    assert s.port == 8080
    assert s.pod == "-/-"


def test_settings_from_env_reads_the_documented_variables() -> None:
    env = {
        "POD_NAME": "w-2",
        "POD_NAMESPACE": "team",
        "NODE_NAME": "n",
        "POD_INDEX": "2",
        "GPU_SCHEDULING_MAP": "2=n:0",
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "GPU_INJECTION_MODE": " NVIDIA ",
        "CHECK_INTERVAL_SECONDS": "5",
        "CHECK_PORT": "9090",
    }
    s = Settings.from_env(env)
    assert (s.pod, s.node_name, s.pod_index, s.map_text) == ("team/w-2", "n", "2", "2=n:0")
    assert (s.cuda_visible_devices, s.cuda_device_order, s.nvidia_visible_devices) == (
        "0",
        "PCI_BUS_ID",
        "all",
    )
    assert s.injection_mode == "nvidia"
    assert (s.interval_seconds, s.port) == (5.0, 9090)


@pytest.mark.parametrize(
    "env",
    [
        {"CHECK_PORT": "http"},
        {"CHECK_INTERVAL_SECONDS": "soon"},
        {"CHECK_PORT": "-1"},
        {"CHECK_LOG_LEVEL": "loud"},
    ],
)
def test_settings_reject_bad_numbers(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=next(iter(env))):
        Settings.from_env(env)


# --- map, ordinal, node, env ---------------------------------------------------------------------


def test_all_good_in_cuda_mode() -> None:
    results, entry = map_results(settings())
    assert entry == Entry(1, "node2", (2,))
    assert [r.check for r in results] == [
        "map",
        "ordinal",
        "node",
        "env:CUDA_VISIBLE_DEVICES",
        "env:CUDA_DEVICE_ORDER",
    ]
    assert all(r.ok for r in results)
    assert all(r.pod == "ns/w-1" for r in results)
    node = by_check(results)["node"].to_json()
    assert node == {"check": "node", "expected": "node2", "actual": "node2", "ok": True, "pod": "ns/w-1"}


def test_wrong_node() -> None:
    results, _ = map_results(settings(node_name="node9"))
    r = by_check(results)["node"]
    assert (r.expected, r.actual, r.ok) == ("node2", "node9", False)
    assert not passed(results)


def test_missing_node_name() -> None:
    r = by_check(map_results(settings(node_name=None))[0])["node"]
    assert r.ok is False and r.actual is None


@pytest.mark.parametrize(
    ("over", "failing"),
    [
        ({"cuda_visible_devices": "0"}, "env:CUDA_VISIBLE_DEVICES"),
        ({"cuda_visible_devices": None}, "env:CUDA_VISIBLE_DEVICES"),
        ({"cuda_visible_devices": " 2"}, "env:CUDA_VISIBLE_DEVICES"),
        ({"cuda_device_order": None}, "env:CUDA_DEVICE_ORDER"),
        ({"cuda_device_order": "FASTEST_FIRST"}, "env:CUDA_DEVICE_ORDER"),
    ],
)
def test_cuda_env_mismatch(over: dict[str, Any], failing: str) -> None:
    results, _ = map_results(settings(**over))
    assert [r.check for r in results if r.ok is False] == [failing]


def test_multi_gpu_entry_keeps_map_order() -> None:
    s = settings(pod_name="w-2", pod_index="2", node_name="node3", cuda_visible_devices="1,3")
    assert passed(map_results(s)[0])
    assert not passed(map_results(settings(**{**s.__dict__, "cuda_visible_devices": "3,1"}))[0])


def test_nvidia_mode() -> None:
    s = settings(
        pod_name="w-2",
        pod_index="2",
        node_name="node3",
        injection_mode="nvidia",
        nvidia_visible_devices="1,3",
        cuda_visible_devices="0,1",
        cuda_device_order="PCI_BUS_ID",
    )
    results, _ = map_results(s)
    assert [r.check for r in results][-3:] == [
        "env:NVIDIA_VISIBLE_DEVICES",
        "env:CUDA_VISIBLE_DEVICES",
        "env:CUDA_DEVICE_ORDER",
    ]
    assert passed(results)
    # What the webhook writes and the scheduler requires (kube_gpu_scheduler.domain.injection): the order too.
    unordered = map_results(Settings(**{**s.__dict__, "cuda_device_order": None}))[0]
    assert by_check(unordered)["env:CUDA_DEVICE_ORDER"].ok is False
    # Physical indices in CUDA_VISIBLE_DEVICES are wrong in nvidia mode.
    bad = map_results(Settings(**{**s.__dict__, "cuda_visible_devices": "1,3"}))[0]
    r = by_check(bad)["env:CUDA_VISIBLE_DEVICES"]
    assert (r.expected, r.actual, r.ok) == ("0,1", "1,3", False)
    bad = map_results(Settings(**{**s.__dict__, "nvidia_visible_devices": "all"}))[0]
    assert by_check(bad)["env:NVIDIA_VISIBLE_DEVICES"].ok is False


def test_expected_env() -> None:
    e = Entry(0, "n", (4, 2, 7))
    assert expected_env(e, "cuda") == {"CUDA_VISIBLE_DEVICES": "4,2,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert expected_env(e, "nvidia") == {
        "NVIDIA_VISIBLE_DEVICES": "4,2,7",
        "CUDA_VISIBLE_DEVICES": "0,1,2",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert expected_env(e, "nvidia-cdi") == {
        "NVIDIA_VISIBLE_DEVICES": "runtime.nvidia.com/gpu=4,runtime.nvidia.com/gpu=2,runtime.nvidia.com/gpu=7",
        "CUDA_VISIBLE_DEVICES": "0,1,2",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    results = env_results(e, "cuda", {"CUDA_VISIBLE_DEVICES": "4,2,7"}, "ns/p")
    assert [(r.check, r.ok) for r in results] == [
        ("env:CUDA_VISIBLE_DEVICES", True),
        ("env:CUDA_DEVICE_ORDER", False),
    ]


def test_unknown_mode_fails() -> None:
    results, _ = map_results(settings(injection_mode="rocm"))
    r = by_check(results)["mode"]
    assert r.ok is False and r.actual == "rocm"
    assert not any(r.check.startswith("env:") for r in results)


def test_map_missing() -> None:
    results, entry = map_results(settings(map_text=None))
    assert entry is None
    assert [(r.check, r.ok) for r in results] == [("map", False)]


def test_map_invalid_lists_problems() -> None:
    results, entry = map_results(settings(map_text="0=node1:0\n0=node2:1\nx"))
    assert entry is None
    (r,) = results
    assert r.check == "map" and r.ok is False
    assert len(r.extra["problems"]) == 2
    assert r.extra["problems"][0].startswith("line 2: ordinal 0 is already mapped on line 1")


def test_ordinal_without_entry() -> None:
    results, entry = map_results(settings(pod_name="w-7", pod_index="7"))
    assert entry is None
    r = by_check(results)["ordinal"]
    assert r.ok is False and r.actual == {"ordinal": 7, "entry": None}
    assert "node" not in by_check(results)


def test_ordinal_from_name_when_index_missing_or_bad() -> None:
    assert by_check(map_results(settings(pod_index=None))[0])["ordinal"].ok is True
    # "" is what the downward API gives when the label is absent (older Kubernetes).
    assert by_check(map_results(settings(pod_index=""))[0])["ordinal"].actual["ordinal"] == 1
    r = by_check(map_results(settings(pod_index=None, pod_name="solo"))[0])["ordinal"]
    assert r.ok is False and r.actual["ordinal"] is None


def test_pod_index_wins_over_name() -> None:
    _, entry = map_results(settings(pod_name="w-0", pod_index="1"))
    assert entry is not None and entry.ordinal == 1


# --- NVML reporting (fake pynvml module: the reporting logic only) -------------------------------


class FakeNVMLError(Exception):
    pass


def fake_pynvml(gpus: int, *, init_error: Exception | None = None, broken: int | None = None) -> Any:
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error:
            raise init_error

    def handle(i: int) -> int:
        if i == broken:
            raise FakeNVMLError("GPU is lost")
        return i

    return SimpleNamespace(
        calls=calls,
        NVMLError=FakeNVMLError,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda h: f"NVIDIA H100 #{h}".encode(),  # older bindings return bytes
        nvmlDeviceGetUUID=lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd",
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode()),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * 2**30),
    )


def test_query_reports_every_device() -> None:
    module = fake_pynvml(2)
    report = nvml.query(module)
    assert report.available and report.count == 2
    assert report.driver_version == "550.54.15"
    assert report.devices[1] == nvml.Gpu(
        1, "NVIDIA H100 #1", "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", "00000000:19:00.0", 80 * 2**30
    )
    assert module.calls == ["init", "shutdown"]


def test_query_init_failure_is_not_available() -> None:
    report = nvml.query(fake_pynvml(0, init_error=FakeNVMLError("NVML Shared Library Not Found")))
    assert not report.available
    assert report.reason == "NVML not available: FakeNVMLError: NVML Shared Library Not Found"


def test_query_device_error_is_reported() -> None:
    module = fake_pynvml(3, broken=1)
    report = nvml.query(module)
    assert report.available and report.count == 3
    assert [d.index for d in report.devices] == [0, 2]
    assert report.errors == ("GPU 1: FakeNVMLError: GPU is lost",)
    assert module.calls[-1] == "shutdown"


def test_query_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml, "_load", missing)
    report = nvml.query()
    assert not report.available and "pynvml is not installed" in (report.reason or "")


def test_nvml_unavailable_fails_unless_no_gpu_is_declared() -> None:
    # The check cannot pass by not looking: no NVML means the devices are not verified.
    (r,) = nvml_results(settings(), Entry(1, "node2", (2,)), no_nvml())
    assert (r.check, r.expected, r.actual, r.ok) == (
        "nvml",
        "NVML available",
        "NVML not available: test",
        False,
    )
    assert "check.expectNoGPU" in r.extra["why"]
    # Declared explicitly (check chart check.expectNoGPU): one skipped line that says so.
    (r,) = nvml_results(settings(expect_no_gpu=True), Entry(1, "node2", (2,)), no_nvml())
    assert r.to_json() == {
        "check": "nvml",
        "expected": None,
        "actual": None,
        "ok": None,
        "pod": "ns/w-1",
        "skipped": "NVML not available: test; CHECK_EXPECT_NO_GPU=true declares nodes without GPUs",
    }


def test_expect_no_gpu_still_checks_the_gpus_nvml_sees() -> None:
    # Declaring no GPU does not switch NVML off: where it answers, its devices are checked.
    s = settings(expect_no_gpu=True)
    checks = by_check(nvml_results(s, Entry(1, "node2", (2,)), nvml.query(fake_pynvml(2))))
    assert checks["nvml:indices"].ok is False


def test_run_checks_without_nvml_still_checks_node_and_env() -> None:
    results = run_checks(settings(), no_nvml)
    assert [r.check for r in results][-2:] == ["nvml", "dev"]
    assert not passed(results)
    # No NVML and no device node: the container got no GPU, and both say why.
    assert [r.check for r in results if r.ok is False] == ["nvml", "dev"]
    assert {r.extra["cause"] for r in results if r.ok is False} == {"no-gpu-from-runtime"}
    assert passed(run_checks(settings(expect_no_gpu=True), no_nvml))
    assert not passed(run_checks(settings(node_name="node1", expect_no_gpu=True), no_nvml))


def test_cuda_mode_indices_exist() -> None:
    report = nvml.query(fake_pynvml(4))
    results = nvml_results(settings(), Entry(1, "node2", (2,)), report)
    checks = by_check(results)
    assert checks["nvml"].ok is True and checks["nvml"].actual["count"] == 4
    r = checks["nvml:indices"]
    assert r.ok is True and r.actual == {"count": 4, "missing": []}
    assert [d["index"] for d in r.extra["devices"]] == [2]
    assert r.extra["devices"][0]["pci_bus_id"] == "00000000:1A:00.0"
    assert "nvml:count" not in checks  # not isolated: NVML sees every GPU of the node


def test_cuda_mode_index_beyond_count_fails() -> None:
    report = nvml.query(fake_pynvml(2))
    r = by_check(nvml_results(settings(), Entry(1, "node2", (1, 3)), report))["nvml:indices"]
    assert r.ok is False and r.actual == {"count": 2, "missing": [3]}


def test_nvidia_mode_counts_isolated_gpus() -> None:
    s = settings(injection_mode="nvidia", nvidia_visible_devices="2", cuda_visible_devices="0")
    ok = by_check(nvml_results(s, Entry(1, "node2", (2,)), nvml.query(fake_pynvml(1))))
    assert ok["nvml:count"].ok is True and "nvml:indices" not in ok
    bad = by_check(nvml_results(s, Entry(1, "node2", (2,)), nvml.query(fake_pynvml(8))))
    assert (bad["nvml:count"].expected, bad["nvml:count"].actual, bad["nvml:count"].ok) == (1, 8, False)


def test_cuda_mode_with_isolating_runtime_checks_both() -> None:
    # NVIDIA_VISIBLE_DEVICES=2 exposes one GPU, numbered 0 inside: CUDA_VISIBLE_DEVICES=2 points nowhere.
    s = settings(nvidia_visible_devices="2")
    checks = by_check(nvml_results(s, Entry(1, "node2", (2,)), nvml.query(fake_pynvml(1))))
    assert checks["nvml:count"].ok is True
    assert checks["nvml:indices"].ok is False


def test_nvml_device_errors_fail_the_report() -> None:
    checks = by_check(nvml_results(settings(), Entry(1, "node2", (2,)), nvml.query(fake_pynvml(3, broken=2))))
    assert checks["nvml"].ok is False
    assert checks["nvml:indices"].ok is False  # index 2 exists but could not be read


def test_nvml_without_entry_only_reports() -> None:
    results = nvml_results(settings(), None, nvml.query(fake_pynvml(1)))
    assert [r.check for r in results] == ["nvml"]


def test_crashing_nvml_query_is_a_failed_check() -> None:
    def boom() -> nvml.NvmlReport:
        raise RuntimeError("segfault averted")

    checks = by_check(run_checks(settings(), boom))
    assert checks["nvml"].ok is False
    assert "RuntimeError: segfault averted" in checks["nvml"].actual["errors"][0]


def test_passed() -> None:
    assert not passed([])
    assert passed([Result("a", 1, 1, True, "p"), Result("nvml", None, None, None, "p")])
    assert not passed([Result("a", 1, 2, False, "p")])


# --- verify-release logic on API-shaped objects --------------------------------------------------


def sts(name: str, text: str, replicas: int = 2, start: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "template": {"metadata": {"annotations": {"gpu-scheduling-map": text}}},
    }
    if start is not None:
        spec["ordinals"] = {"start": start}
    return {"metadata": {"name": name}, "spec": spec}


def pod(
    name: str,
    node: str | None,
    env: dict[str, str] | None,
    *,
    text: str = MAP,
    owner: str | None = "w",
    phase: str = "Running",
    extra_containers: int = 0,
) -> dict[str, Any]:
    env_list = [{"name": k, "value": v} for k, v in (env or {}).items()]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": {"apps.kubernetes.io/pod-index": name.rsplit("-", 1)[1]},
        "annotations": {"gpu-scheduling-map": text},
    }
    if owner:
        meta["ownerReferences"] = [{"kind": "StatefulSet", "name": owner, "controller": True}]
    containers = [{"name": f"c{i}", "env": [dict(v) for v in env_list]} for i in range(1 + extra_containers)]
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": containers},
        "status": {"phase": phase},
    }


CUDA = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def good_pods() -> list[dict[str, Any]]:
    return [
        pod("w-0", "node1", {"CUDA_VISIBLE_DEVICES": "0,1", **CUDA}, extra_containers=1),
        pod("w-1", "node2", {"CUDA_VISIBLE_DEVICES": "2", **CUDA}),
    ]


def test_release_good() -> None:
    results, rows = evaluate_release(good_pods(), {"w": sts("w", MAP)}, "ns")
    assert passed(results), [r.to_json() for r in results if r.ok is False]
    assert [(r.name, r.node, r.expected_node, r.devices, r.ok) for r in rows] == [
        ("w-0", "node1", "node1", "0,1", True),
        ("w-1", "node2", "node2", "2", True),
    ]
    env_checks = [r for r in results if r.check.startswith("env:") and r.pod == "ns/w-0"]
    assert {r.extra["container"] for r in env_checks} == {"c0", "c1"}
    replicas = by_check(results)["replicas"]
    assert (replicas.expected, replicas.actual) == ([0, 1], [0, 1])


def test_release_wrong_node_and_env() -> None:
    pods = good_pods()
    pods[1]["spec"]["nodeName"] = "node1"
    pods[0]["spec"]["containers"][1]["env"][0]["value"] = "1,0"
    results, rows = evaluate_release(pods, {"w": sts("w", MAP)}, "ns")
    failed = [(r.pod, r.check, r.extra.get("container")) for r in results if r.ok is False]
    assert failed == [("ns/w-0", "env:CUDA_VISIBLE_DEVICES", "c1"), ("ns/w-1", "node", None)]
    assert [r.ok for r in rows] == [False, False]


def test_release_missing_replica_and_pending() -> None:
    pods = good_pods()
    pods[1]["status"]["phase"] = "Pending"
    results, _ = evaluate_release(pods, {"w": sts("w", MAP, replicas=3)}, "ns")
    failed = {r.check: r for r in results if r.ok is False}
    assert set(failed) == {"phase", "replicas"}
    assert failed["replicas"].expected == [0, 1, 2] and failed["replicas"].actual == [0, 1]


def test_release_terminating_pod_is_not_converged() -> None:
    pods = good_pods()
    pods[0]["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns")
    assert {r.check for r in results if r.ok is False} == {"phase", "replicas"}


def test_release_old_revision_map() -> None:
    new_map = MAP.replace("1=node2:2", "1=node2:3")
    results, _ = evaluate_release(good_pods(), {"w": sts("w", new_map)}, "ns")
    failed = [(r.pod, r.check) for r in results if r.ok is False]
    # Both pods carry the old annotation; w-1 was also placed for the old map.
    assert ("ns/w-0", "pod:map") in failed and ("ns/w-1", "pod:map") in failed
    assert ("ns/w-1", "env:CUDA_VISIBLE_DEVICES") in failed


def rolled(owner: dict[str, Any], update: str, *, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    owner["metadata"]["generation"] = generation
    owner["status"] = {"observedGeneration": observed, "updateRevision": update, "currentRevision": "w-old"}
    return owner


def at_revision(pods: list[dict[str, Any]], *revisions: str) -> list[dict[str, Any]]:
    for p, rev in zip(pods, revisions, strict=True):
        p["metadata"]["labels"]["controller-revision-hash"] = rev
    return pods


def test_release_a_pod_of_the_previous_revision_with_the_same_map_is_not_converged() -> None:
    """A release that changes anything but the map (an image, an env): the old pods carry the
    same map, so only their controller-revision-hash tells them apart."""
    owner = rolled(sts("w", MAP), "w-new")
    results, _ = evaluate_release(at_revision(good_pods(), "w-new", "w-old"), {"w": owner}, "ns")
    failed = [(r.pod, r.check, r.expected, r.actual) for r in results if r.ok is False]
    assert failed == [("ns/w-1", "pod:revision", "w-new", "w-old")]
    results, _ = evaluate_release(at_revision(good_pods(), "w-new", "w-new"), {"w": owner}, "ns")
    assert passed(results), [r.to_json() for r in results if r.ok is False]


def test_release_waits_for_the_controller_to_observe_the_new_generation() -> None:
    owner = rolled(sts("w", MAP), "w-old", generation=3, observed=2)  # updateRevision not yet recomputed
    results, _ = evaluate_release(at_revision(good_pods(), "w-old", "w-old"), {"w": owner}, "ns")
    assert {(r.pod, r.check) for r in results if r.ok is False} == {
        ("ns/w-0", "pod:revision"),
        ("ns/w-1", "pod:revision"),
    }


def test_release_old_revisions_the_strategy_keeps_are_expected() -> None:
    partitioned = rolled(sts("w", MAP), "w-new")
    partitioned["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    results, _ = evaluate_release(at_revision(good_pods(), "w-old", "w-new"), {"w": partitioned}, "ns")
    assert passed(results), [r.to_json() for r in results if r.ok is False]
    on_delete = rolled(sts("w", MAP), "w-new")
    on_delete["spec"]["updateStrategy"] = {"type": "OnDelete"}
    results, _ = evaluate_release(at_revision(good_pods(), "w-old", "w-old"), {"w": on_delete}, "ns")
    assert passed(results), [r.to_json() for r in results if r.ok is False]


ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_release_nvidia_mode_detected_per_container() -> None:
    pods = [
        pod("w-0", "node1", {"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1", **ORDER}),
        pod("w-1", "node2", {"NVIDIA_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "0", **ORDER}),
    ]
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns")
    assert passed(results)
    assert {r.extra["mode"] for r in results if r.check.startswith("env:")} == {"nvidia"}
    # Forced cuda mode: the renumbered CUDA_VISIBLE_DEVICES no longer matches.
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns", mode="cuda")
    assert not passed(results)


def test_release_nvidia_cdi_mode_detected_per_container() -> None:
    cdi = "runtime.nvidia.com/gpu="
    pods = [
        pod(
            "w-0",
            "node1",
            {"NVIDIA_VISIBLE_DEVICES": f"{cdi}0,{cdi}1", "CUDA_VISIBLE_DEVICES": "0,1", **ORDER},
        ),
        pod("w-1", "node2", {"NVIDIA_VISIBLE_DEVICES": f"{cdi}2", "CUDA_VISIBLE_DEVICES": "0", **ORDER}),
    ]
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns")
    assert passed(results), [r.to_json() for r in results if r.ok is False]
    assert {r.extra["mode"] for r in results if r.check.startswith("env:")} == {"nvidia-cdi"}
    # Checked as nvidia mode, the CDI names are not the bare indices nvidia mode writes.
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns", mode="nvidia")
    assert {r.check for r in results if r.ok is False} == {"env:NVIDIA_VISIBLE_DEVICES"}


def test_release_value_from_is_a_mismatch() -> None:
    pods = good_pods()
    pods[1]["spec"]["containers"][0]["env"][0] = {"name": "CUDA_VISIBLE_DEVICES", "valueFrom": {"x": 1}}
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns")
    assert [(r.pod, r.check) for r in results if r.ok is False] == [("ns/w-1", "env:CUDA_VISIBLE_DEVICES")]


def test_release_no_pods() -> None:
    results, rows = evaluate_release([], {}, "ns")
    assert [(r.check, r.ok) for r in results] == [("pods", False)] and rows == []


def test_release_ignores_the_helm_test_pod() -> None:
    # The helm test pod carries the release's labels but no map and no StatefulSet owner.
    test_pod = pod("w-test-0", None, None, owner=None)
    del test_pod["metadata"]["annotations"]
    results, rows = evaluate_release([*good_pods(), test_pod], {"w": sts("w", MAP)}, "ns")
    assert passed(results) and [r.name for r in rows] == ["w-0", "w-1"]
    results, _ = evaluate_release([test_pod], {}, "ns")
    assert [(r.check, r.ok) for r in results] == [("pods", False)]


def test_release_owned_pod_without_annotation_fails() -> None:
    pods = good_pods()
    del pods[1]["metadata"]["annotations"]
    results, _ = evaluate_release(pods, {"w": sts("w", MAP)}, "ns")
    assert [(r.pod, r.check) for r in results if r.ok is False] == [("ns/w-1", "pod:map")]


def test_release_unreadable_owner_and_bad_map() -> None:
    results, _ = evaluate_release(
        good_pods(), {"w": None}, "ns", owner_errors={"w": "403 Forbidden: get ..."}
    )
    r = by_check(results)["statefulset"]
    assert r.ok is False and r.actual == "403 Forbidden: get ..."
    # Without the StatefulSet the pods' own annotations are used.
    assert all(r.ok for r in results if r.check in ("node", "env:CUDA_VISIBLE_DEVICES"))
    results, _ = evaluate_release(good_pods(), {"w": sts("w", "garbage")}, "ns")
    assert {r.check for r in results if r.ok is False} == {"map"}


def test_release_ordinals_start() -> None:
    text = "1=node1:0\n2=node2:0"
    pods = [
        pod("w-1", "node1", {"CUDA_VISIBLE_DEVICES": "0", **CUDA}, text=text),
        pod("w-2", "node2", {"CUDA_VISIBLE_DEVICES": "0", **CUDA}, text=text),
    ]
    results, _ = evaluate_release(pods, {"w": sts("w", text, replicas=2, start=1)}, "ns")
    assert passed(results)


def test_release_pod_without_owner_uses_its_annotation() -> None:
    p = pod("solo-0", "node1", {"CUDA_VISIBLE_DEVICES": "0,1", **CUDA}, owner=None)
    results, _ = evaluate_release([p], {}, "ns")
    assert passed(results) and "replicas" not in by_check(results)


def test_log_result_survives_reserved_keys(caplog: pytest.LogCaptureFixture) -> None:
    from kube_gpu_scheduler.check import log_result

    with caplog.at_level("INFO"):
        log_result(Result("x", 1, 2, False, "ns/p", {"message": "m", "name": "n"}))
    (rec,) = caplog.records
    assert rec.__dict__["message_"] == "m" and rec.__dict__["name_"] == "n"
    assert rec.__dict__["check"] == "x" and rec.levelname == "WARNING"


def nvml_uuid(h: int) -> str:
    """The UUID fake_pynvml gives GPU ``h``."""
    return f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd"


def test_gpus_named_by_uuid_are_among_nvmls() -> None:
    text = f"1=node2:{nvml_uuid(3).upper()},{nvml_uuid(1)}"
    entry = parse(text)[1]
    assert entry.devices == f"{nvml_uuid(3)},{nvml_uuid(1)}"
    s = settings(map_text=text, cuda_visible_devices=entry.devices)
    assert all(r.ok for r in map_results(s)[0])
    checks = by_check(nvml_results(s, entry, nvml.query(fake_pynvml(4))))
    r = checks["nvml:uuids"]
    assert r.ok is True and r.expected == [nvml_uuid(3), nvml_uuid(1)]
    assert r.actual == {"count": 4, "missing": []}
    assert [d["index"] for d in r.extra["devices"]] == [3, 1]
    assert "nvml:indices" not in checks  # CUDA_VISIBLE_DEVICES holds no index
    lost = by_check(nvml_results(s, entry, nvml.query(fake_pynvml(2))))["nvml:uuids"]
    assert lost.ok is False and lost.actual == {"count": 2, "missing": [nvml_uuid(3)]}


def test_nvidia_mode_sees_exactly_the_uuids_mapped() -> None:
    text = f"1=node2:{nvml_uuid(0)},{nvml_uuid(1)}"
    entry = parse(text)[1]
    s = settings(
        map_text=text,
        injection_mode="nvidia",
        nvidia_visible_devices=entry.devices,
        cuda_visible_devices="0,1",
    )
    assert all(r.ok for r in map_results(s)[0])
    checks = by_check(nvml_results(s, entry, nvml.query(fake_pynvml(2))))
    assert checks["nvml:count"].ok is True and checks["nvml:uuids"].ok is True
    other = parse(f"1=node2:{nvml_uuid(0)},{nvml_uuid(5)}")[1]
    s = settings(injection_mode="nvidia", nvidia_visible_devices=other.devices, cuda_visible_devices="0,1")
    r = by_check(nvml_results(s, other, nvml.query(fake_pynvml(2))))["nvml:uuids"]
    assert r.ok is False and r.actual["missing"] == [nvml_uuid(5)]
