"""The check says why a container's GPUs are not its entry's (kube_gpu_scheduler/check/diagnose.py),
lists the NVIDIA device nodes it has (``dev``, the ``devices`` of ``devices seen``) and, in the
isolating modes, counts them; nvidia-cdi mode's variables; PCI bus IDs compared in DRA mode.

Each case is what a container sees on one cluster set-up (tests/node/test_env_modes.py shows the
first three on the real node, under NVIDIA's runtime):

| the container sees | mode | cause |
|---|---|---|
| no /dev/nvidia*, NVML library not found | cuda, nvidia, nvidia-cdi, dra | no-gpu-from-runtime (plain runc, or the accept-envvar setting off) |
| exactly its GPUs' nodes, NVML counts them | nvidia-cdi, dra | nothing to say |
| /dev/nvidia* but no NVML | any | devices-without-nvml |
| /dev/nvidiactl alone | any | no-gpu-device-node |
| every GPU of the node | nvidia, nvidia-cdi, dra | more-gpus-than-the-entry |
| fewer GPUs than indices named | cuda | cuda-mode-sees-too-few |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kube_gpu_scheduler.check import env_results, map_results, nvml, nvml_results, passed, run_checks
from kube_gpu_scheduler.check.diagnose import (
    CONTROL_ONLY,
    CUDA_ISOLATED,
    NO_GPU,
    NO_LIBRARY,
    NOT_ISOLATED,
    TOO_FEW,
    diagnose,
)
from kube_gpu_scheduler.check.podcheck import diagnosis_of
from kube_gpu_scheduler.check.seen import seen, termination_message
from kube_gpu_scheduler.domain.schedmap import Entry, parse
from tests.unit.check.test_check import by_check, fake_pynvml, settings

CDI = "runtime.nvidia.com/gpu="
LIBRARY_NOT_FOUND = nvml.NvmlReport(
    False, reason="NVML not available: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
)
ENTRY = Entry(1, "node2", (2,))
TWO = Entry(1, "node2", (1, 3))


def nodes(*minors: int, control: bool = True) -> nvml.DeviceNodes:
    return nvml.DeviceNodes(tuple(f"/dev/nvidia{m}" for m in minors), control)


NONE = nvml.DeviceNodes()


def mode_settings(mode: str, entry: Entry = ENTRY, **over: Any) -> Any:
    """A replica of ``entry`` injected as ``mode`` injects it."""
    devices = ",".join(map(str, entry.gpus))
    renumbered = ",".join(str(i) for i in range(len(entry.gpus)))
    env: dict[str, Any] = {
        "cuda": {"cuda_visible_devices": devices},
        "nvidia": {"nvidia_visible_devices": devices, "cuda_visible_devices": renumbered},
        "nvidia-cdi": {
            "nvidia_visible_devices": ",".join(CDI + str(g) for g in entry.gpus),
            "cuda_visible_devices": renumbered,
        },
        "dra": {"cuda_visible_devices": None},
    }[mode]
    text = f"0=node1:0\n{entry.ordinal}=node2:{devices}\n"
    return settings(**{"injection_mode": mode, "map_text": text, **env, **over})


# --- device nodes ---------------------------------------------------------------------------------


def test_device_nodes_are_the_gpus_and_the_control_device(tmp_path: Path) -> None:
    for name in ("nvidia3", "nvidia10", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"):
        (tmp_path / name).touch()
    (tmp_path / "nvidia-caps").mkdir()
    found = nvml.device_nodes(tmp_path)
    assert found.gpus == tuple(f"{tmp_path}/nvidia{m}" for m in (1, 3, 10))
    assert found.control and not found.empty
    assert found.to_json() == {"gpus": list(found.gpus), "nvidiactl": True}
    assert nvml.device_nodes(tmp_path / "missing") == nvml.DeviceNodes()


def test_run_checks_lists_the_dev_dir_it_is_given(tmp_path: Path) -> None:
    for name in ("nvidia2", "nvidiactl"):
        (tmp_path / name).touch()
    s = mode_settings("nvidia-cdi", dev_dir=str(tmp_path))
    results = run_checks(s, lambda: nvml.query(fake_pynvml(1)))
    assert passed(results), [r.to_json() for r in results if r.ok is False]
    dev = by_check(results)["dev"]
    assert (dev.expected, dev.actual) == (1, {"gpus": [f"{tmp_path}/nvidia2"], "nvidiactl": True})
    assert seen(s, results)["devices"] == dev.actual
    assert "cause" not in seen(s, results)


# --- nvidia-cdi mode's variables -----------------------------------------------------------------


def test_nvidia_cdi_mode_expects_the_cdi_devices_and_renumbered_cuda() -> None:
    s = mode_settings("nvidia-cdi", TWO)
    results, entry = map_results(s)
    assert entry == TWO and passed(results), [r.to_json() for r in results if r.ok is False]
    assert by_check(results)["env:NVIDIA_VISIBLE_DEVICES"].expected == f"{CDI}1,{CDI}3"
    # nvidia mode's bare indices are not nvidia-cdi mode's (under its RuntimeClass they fail the container).
    bare, _ = map_results(mode_settings("nvidia-cdi", TWO, nvidia_visible_devices="1,3"))
    assert [r.check for r in bare if r.ok is False] == ["env:NVIDIA_VISIBLE_DEVICES"]


@pytest.mark.parametrize("mode", ["nvidia", "nvidia-cdi"])
def test_in_the_container_nvidia_visible_devices_may_read_void_once_the_runtime_applied_it(mode: str) -> None:
    """NVIDIA's runtime in CDI mode replaces the variable with void in the container it creates
    (its generated spec's edit; seen on the real node): the request was acted on, and dev and
    NVML check the GPUs. In the pod spec (verify-release) void asks for no GPU: a mismatch."""
    results, _ = map_results(mode_settings(mode, TWO, nvidia_visible_devices="void"))
    r = by_check(results)["env:NVIDIA_VISIBLE_DEVICES"]
    assert r.ok is True and r.actual == "void" and "applied the CDI devices" in r.extra["note"]
    assert passed(results)
    (api,) = [
        x for x in env_results(TWO, mode, {"NVIDIA_VISIBLE_DEVICES": "void"}, "ns/p") if "NVIDIA" in x.check
    ]
    assert api.ok is False
    # Any other value is still compared exactly.
    results, _ = map_results(mode_settings(mode, TWO, nvidia_visible_devices="all"))
    assert by_check(results)["env:NVIDIA_VISIBLE_DEVICES"].ok is False


def test_nvidia_cdi_mode_counts_the_isolated_gpus_and_their_nodes() -> None:
    s = mode_settings("nvidia-cdi", TWO)
    good = by_check(nvml_results(s, TWO, nvml.query(fake_pynvml(2)), nodes(0, 5)))
    assert good["nvml:count"].ok is True and good["dev"].ok is True and good["dev"].expected == 2
    assert "nvml:indices" not in good


# --- the diagnoses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["cuda", "nvidia", "nvidia-cdi", "dra"])
def test_no_gpu_at_all_says_the_runtime_gave_none_and_what_to_look_at(mode: str) -> None:
    """What tests/node/test_env_modes.py shows: no runtimeClassName on a CDI-default GPU Operator."""
    s = mode_settings(mode)
    results = nvml_results(s, ENTRY, LIBRARY_NOT_FOUND, NONE)
    failing = [r for r in results if r.ok is False]
    assert [r.check for r in failing] == ["nvml", "dev"]
    assert {r.extra["cause"] for r in failing} == {NO_GPU}
    why = failing[0].extra["diagnosis"]
    assert why.startswith(
        "the container runtime gave this container no GPU (no /dev/nvidiactl, no /dev/nvidia<N>; NVML not "
        "available: NVMLError_LibraryNotFound"
    )
    assert by_check(results)["dev"].expected == (1 if mode != "cuda" else "at least 1")
    if mode == "cuda":
        assert "cuda mode only sets CUDA_VISIBLE_DEVICES" in why
        assert "a pod without runtimeClassName runs under plain runc" in why
        assert why.endswith(
            "use injection.deviceMode nvidia-cdi (it sets the pod's runtimeClassName) or DRA mode"
        )
    elif mode == "nvidia":
        assert "NVIDIA_VISIBLE_DEVICES=2 was not acted on" in why
        assert "unresolvable CDI devices management.nvidia.com/gpu=N" in why
        assert "accept-nvidia-visible-devices-envvar-when-unprivileged = false" in why
    elif mode == "nvidia-cdi":
        assert f"NVIDIA_VISIBLE_DEVICES={CDI}2 was not acted on" in why
        assert "the pod's RuntimeClass (the scheduler chart's injection.runtimeClassName" in why
        assert "accept-nvidia-visible-devices-envvar-when-unprivileged = false" in why
        assert "then only DRA mode gives a pod its GPUs" in why
    else:
        assert "its ResourceClaim's devices were not applied" in why and "cdi_spec_dirs" in why
    record = seen(s, results)
    assert (record["cause"], record["diagnosis"]) == (NO_GPU, why)
    assert record["devices"] == {"gpus": [], "nvidiactl": False}
    assert diagnosis_of(results) is not None and diagnosis_of(results).why == why  # type: ignore[union-attr]


def test_an_uninjected_pod_is_told_so() -> None:
    s = mode_settings("nvidia-cdi", nvidia_visible_devices=None)
    why = diagnose(s, ENTRY, LIBRARY_NOT_FOUND, NONE)
    assert why is not None and "NVIDIA_VISIBLE_DEVICES is not set (the pod was not injected" in why.why


def test_nodes_without_gpus_declared_or_without_nvml_bindings_are_no_diagnosis() -> None:
    s = mode_settings("nvidia-cdi", expect_no_gpu=True)
    results = nvml_results(s, ENTRY, LIBRARY_NOT_FOUND, NONE)
    assert [(r.check, r.ok) for r in results] == [("nvml", None), ("dev", None)]
    assert "cause" not in seen(s, results)
    missing = nvml.NvmlReport(False, reason="NVML not available: pynvml is not installed (x)")
    assert diagnose(mode_settings("cuda"), ENTRY, missing, NONE) is None


def test_device_nodes_without_nvml_point_at_the_driver_libraries() -> None:
    why = diagnose(mode_settings("nvidia-cdi"), ENTRY, LIBRARY_NOT_FOUND, nodes(2))
    assert why is not None and why.cause == NO_LIBRARY
    assert why.why.startswith(
        "the container has GPU device nodes (/dev/nvidia2) but no NVML (NVML not available"
    )


def test_the_control_device_alone_means_no_gpu_was_resolved() -> None:
    for report in (LIBRARY_NOT_FOUND, nvml.query(fake_pynvml(0))):
        why = diagnose(mode_settings("nvidia"), ENTRY, report, nodes())
        assert why is not None and why.cause == CONTROL_ONLY, report
        assert "NVIDIA_VISIBLE_DEVICES=void or none" in why.why


@pytest.mark.parametrize("mode", ["nvidia", "nvidia-cdi"])
def test_every_gpu_visible_where_the_mode_isolates_says_the_variable_limited_nothing(mode: str) -> None:
    s = mode_settings(mode)
    results = nvml_results(s, ENTRY, nvml.query(fake_pynvml(4)), nodes(0, 1, 2, 3))
    failing = by_check([r for r in results if r.ok is False])
    assert set(failing) == {"nvml:count", "dev"}
    assert failing["dev"].expected == 1 and len(failing["dev"].actual["gpus"]) == 4
    why = failing["dev"].extra["diagnosis"]
    assert failing["dev"].extra["cause"] == NOT_ISOLATED
    assert why.startswith(
        f"the container sees 4 GPUs (/dev/nvidia0, /dev/nvidia1, /dev/nvidia2, /dev/nvidia3), more than the 1 "
        f"of its entry, which {mode} mode gives it alone: NVIDIA_VISIBLE_DEVICES did not limit it"
    )
    assert "a privileged container or a hostPath /dev" in why
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged = false" in why


def test_every_gpu_visible_in_dra_mode_points_at_the_images_nvidia_visible_devices() -> None:
    s = mode_settings("dra", nvidia_visible_devices="all")
    why = diagnose(s, ENTRY, nvml.query(fake_pynvml(4)), nodes(0, 1, 2, 3))
    assert why is not None and why.cause == NOT_ISOLATED
    assert "the DRA driver's CDI spec holds only the claim's GPUs" in why.why
    assert "the image's NVIDIA_VISIBLE_DEVICES=all (CUDA images set `all`" in why.why


def test_fewer_gpus_than_the_entry() -> None:
    why = diagnose(mode_settings("dra", TWO), TWO, nvml.query(fake_pynvml(1)), nodes(4))
    assert why is not None and why.cause == TOO_FEW
    assert why.why.startswith("the container sees 1 of its entry's 2 GPUs (/dev/nvidia4)")


def test_cuda_mode_on_isolated_gpus_says_its_indices_point_past_them() -> None:
    s = mode_settings("cuda", TWO)
    results = nvml_results(s, TWO, nvml.query(fake_pynvml(2)), nodes(0, 1))
    failing = [r for r in results if r.ok is False]
    assert [r.check for r in failing] == ["nvml:indices"]
    assert failing[0].extra["cause"] == CUDA_ISOLATED
    assert (
        failing[0]
        .extra["diagnosis"]
        .startswith(
            "cuda mode names the node's own indices (1,3), but the container sees only 2 GPUs, numbered 0..1"
        )
    )
    # Seeing the whole node (4 GPUs, 4 nodes): nothing to say.
    assert passed(nvml_results(s, TWO, nvml.query(fake_pynvml(4)), nodes(0, 1, 2, 3)))


def test_a_stand_in_nvml_without_device_nodes_skips_the_dev_check() -> None:
    """The check chart's tests load a fake NVML with no device node: not a failure of the runtime."""
    results = nvml_results(mode_settings("nvidia"), ENTRY, nvml.query(fake_pynvml(1)), NONE)
    dev = by_check(results)["dev"]
    assert dev.ok is None and dev.extra["skipped"].startswith(
        "NVML counts 1 GPUs without any NVIDIA device node"
    )
    assert passed(results)


def test_the_termination_message_keeps_the_diagnosis() -> None:
    s = mode_settings("cuda")
    record = seen(s, nvml_results(s, ENTRY, LIBRARY_NOT_FOUND, NONE))
    text = termination_message(record)
    assert len(text.encode()) <= 4096 and '"cause":"no-gpu-from-runtime"' in text


# --- PCI bus IDs in DRA mode ----------------------------------------------------------------------


def test_dra_mode_compares_nvmls_pci_bus_ids_with_an_entry_naming_them() -> None:
    """fake_pynvml's GPU i is on bus 0x18+i, reported as NVML writes it: 00000000:1A:00.0."""
    entry = parse("1=node2:0000:1a:00.0,00000000:1B:00.0").get(1)
    assert entry is not None and entry.kind == "pci"
    s = mode_settings("dra", map_text="1=node2:0000:1a:00.0,00000000:1B:00.0")
    # The claim's two GPUs, numbered 0 and 1 in the container: here the fake's first two are other buses.
    report = nvml.query(fake_pynvml(4))
    isolated = nvml.NvmlReport(True, driver_version="x", count=2, devices=report.devices[2:4])
    ok = by_check(nvml_results(s, entry, isolated, nodes(7, 9)))
    assert ok["nvml:pci_bus_ids"].ok is True and ok["dev"].ok is True and ok["nvml:count"].ok is True
    assert [d["pci_bus_id"] for d in ok["nvml:pci_bus_ids"].extra["devices"]] == [
        "00000000:1A:00.0",
        "00000000:1B:00.0",
    ]
    wrong = nvml.NvmlReport(True, driver_version="x", count=2, devices=report.devices[0:2])
    bad = by_check(nvml_results(s, entry, wrong, nodes(7, 9)))["nvml:pci_bus_ids"]
    assert bad.ok is False and bad.actual == {"count": 2, "missing": ["0000:1a:00.0", "0000:1b:00.0"]}
