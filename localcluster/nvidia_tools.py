"""NVIDIA's programs over a stand-in driver root (localcluster/nvidia.py), outside a cluster.

The ``gpu-kubelet-plugin`` command line that runs NVIDIA's DRA plugin as a host process
(:func:`kubelet_plugin`, for a kwok node: tests/integration/test_nvidia_dra_plugin.py),
``nvidia-ctk cdi generate`` over the root (:func:`cdi_generate`), and the toolkit's config for
``nvidia-container-runtime`` in ``cdi`` mode (:func:`runtime_config`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localcluster.nvidia import DRIVER_NAME, PLUGIN_BINARY, DriverRoot
from localcluster.procs import ManagedProcess

# ------------------------------------------------------------------------ the DRA plugin


@dataclass(frozen=True)
class PluginDirs:
    """Where the kubelet plugin keeps its sockets, state and CDI specs.

    On a real node: ``registrar`` is the kubelet's ``/var/lib/kubelet/plugins_registry``,
    ``plugins`` its ``/var/lib/kubelet/plugins`` (the plugin's socket and checkpoint go to
    ``plugins/gpu.nvidia.com``), ``cdi`` a folder in containerd's ``cdi_spec_dirs``.
    """

    registrar: Path
    plugins: Path
    cdi: Path

    @classmethod
    def under(cls, base: Path) -> PluginDirs:
        return cls(base / "plugins_registry", base / "plugins", base / "cdi")

    @property
    def plugin_data(self) -> Path:
        return self.plugins / DRIVER_NAME

    def create(self) -> PluginDirs:
        """Make the folders (the plugin makes its own data folder, not the registrar's: a
        kubelet makes that one)."""
        for d in (self.registrar, self.plugins, self.cdi):
            d.mkdir(parents=True, exist_ok=True)
        return self


@dataclass(frozen=True)
class PluginCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def kubelet_plugin_command(
    binary: Path,
    root: DriverRoot,
    *,
    node_name: str,
    kubeconfig: Path,
    dirs: PluginDirs,
    cdi_hook: Path,
    verbosity: int = 4,
    feature_gates: Mapping[str, bool] | None = None,
) -> PluginCommand:
    """The unmodified ``gpu-kubelet-plugin`` run as a host process over the stand-in root.

    Upstream runs it in a container with the host's driver root mounted at ``/driver-root``
    (``--container-driver-root``) and the host path given as ``--nvidia-driver-root`` (the
    CDI specs it writes name host paths): on the host the two are the same folder. The
    ``nvidia-cdi-hook`` it names in its CDI specs is the toolkit's, from the tool cache.
    """
    argv = [
        str(binary),
        f"--node-name={node_name}",
        f"--kubeconfig={kubeconfig}",
        f"--nvidia-driver-root={root.path}",
        f"--container-driver-root={root.path}",
        f"--cdi-root={dirs.cdi}",
        f"--kubelet-registrar-directory-path={dirs.registrar}",
        f"--kubelet-plugins-directory-path={dirs.plugins}",
        f"--nvidia-cdi-hook-path={cdi_hook}",
        # Used only to render MPS control daemons (the MPSSupport gate, off); required anyway.
        "--image-name=registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:unused",
        "--healthcheck-port=-1",
        f"-v={verbosity}",
    ]
    if feature_gates:
        argv.append("--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in feature_gates.items()))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # As the chart sets it: the plugin's own container must not get GPUs from a runtime.
        "NVIDIA_VISIBLE_DEVICES": "void",
    }
    return PluginCommand(argv, env)


def kubelet_plugin(command: PluginCommand, log_path: Path) -> ManagedProcess:
    """A :class:`ManagedProcess` (not started) for :func:`kubelet_plugin_command`."""
    return ManagedProcess(PLUGIN_BINARY, command.argv, env=command.env, log_path=log_path)


# ------------------------------------------------------------------------ the toolkit


def cdi_generate(
    nvidia_ctk: Path, root: DriverRoot, cdi_hook: Path, output: Path
) -> subprocess.CompletedProcess[str]:
    """``nvidia-ctk cdi generate`` over the stand-in root (NVML mode, the GPU Operator's
    ``nvidia.com/gpu`` kind, device names by index and UUID) into ``output`` (YAML)."""
    return subprocess.run(
        [
            str(nvidia_ctk),
            "cdi",
            "generate",
            f"--driver-root={root.path}",
            f"--dev-root={root.path}",
            f"--nvidia-cdi-hook-path={cdi_hook}",
            "--mode=nvml",
            "--device-name-strategy=index",
            "--device-name-strategy=uuid",
            f"--output={output}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def runtime_config(
    root: DriverRoot,
    *,
    nvidia_ctk: Path,
    low_level_runtime: str,
    spec_dirs: Sequence[Path],
    log_file: Path | None = None,
    accept_envvar_when_unprivileged: bool = True,
) -> str:
    """``nvidia-container-runtime/config.toml`` for the runtime in ``cdi`` mode over the root.

    As the GPU Operator >= 25.10 configures it with CDI on: ``mode = "cdi"``, the management
    kind as the default (a bare ``NVIDIA_VISIBLE_DEVICES=0`` then names
    ``management.nvidia.com/gpu=0``); ``runtime.nvidia.com/gpu=<UUID or index>`` makes the
    runtime generate the GPU's spec itself, from NVML under ``nvidia-container-cli.root``.
    The runtime reads it from ``$XDG_CONFIG_HOME/nvidia-container-runtime/config.toml``.
    """
    dirs = ", ".join(json.dumps(str(d)) for d in spec_dirs)
    log = json.dumps(str(log_file)) if log_file else '""'
    return "\n".join(
        [
            f"accept-nvidia-visible-devices-envvar-when-unprivileged = {str(accept_envvar_when_unprivileged).lower()}",
            "accept-nvidia-visible-devices-as-volume-mounts = false",
            "",
            "[nvidia-container-cli]",
            f"root = {json.dumps(str(root.path))}",
            "",
            "[nvidia-container-runtime]",
            'mode = "cdi"',
            'log-level = "debug"',
            f"debug = {log}",
            f"runtimes = [{json.dumps(low_level_runtime)}]",
            "",
            "[nvidia-container-runtime.modes.cdi]",
            'default-kind = "management.nvidia.com/gpu"',
            'annotation-prefixes = ["cdi.k8s.io/"]',
            f"spec-dirs = [{dirs}]",
            "",
            "[nvidia-ctk]",
            f"path = {json.dumps(str(nvidia_ctk))}",
            "",
        ]
    )
