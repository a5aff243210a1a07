"""Everything the in-pod check reads from the environment (the check chart's downward API), read once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kube_gpu_scheduler.base import config
from kube_gpu_scheduler.base.config import Setting, SettingsError
from kube_gpu_scheduler.domain.injection import INJECTION_MODES

__all__ = ["DRA_MODE", "MODES", "TABLE", "Settings", "SettingsError"]

# DRA mode (the scheduler chart's dra.enabled): the admission policy gives each replica a
# ResourceClaim instead of a device list; the env carries CUDA_DEVICE_ORDER alone.
DRA_MODE = "dra"
MODES = (*INJECTION_MODES, DRA_MODE)


@dataclass(frozen=True)
class Settings:
    """Everything the check reads from the environment, read once."""

    pod_name: str | None = None
    pod_namespace: str | None = None
    node_name: str | None = None
    pod_index: str | None = None
    map_text: str | None = None
    cuda_visible_devices: str | None = None
    cuda_device_order: str | None = None
    nvidia_visible_devices: str | None = None
    injection_mode: str = "cuda"
    expect_no_gpu: bool = False
    dev_dir: str = "/dev"
    termination_message_path: str = "/dev/termination-log"
    interval_seconds: float = 30.0
    port: int = 8080
    log_level: str = "INFO"

    @property
    def pod(self) -> str:
        return f"{self.pod_namespace or '-'}/{self.pod_name or '-'}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Raises SettingsError (a ValueError) naming the variable when a value is malformed."""
        values = config.read_env(TABLE, env)
        if "interval_seconds" in values:
            values["interval_seconds"] = max(1.0, values["interval_seconds"])
        return cls(**values)


def _mode(_source: str, raw: str) -> str:
    # Checked by the run (the "mode" check reports an unknown one), not refused here.
    return raw.strip().lower() or "cuda"


TABLE: tuple[Setting, ...] = (
    Setting("pod_name", "POD_NAME", config.text, "`metadata.name`", doc_default="unset", keep_empty=True),
    Setting("pod_namespace", "POD_NAMESPACE", config.text, "`metadata.namespace`", keep_empty=True),
    Setting("node_name", "NODE_NAME", config.text, "`spec.nodeName`", keep_empty=True),
    Setting(
        "pod_index",
        "POD_INDEX",
        config.text,
        "`metadata.labels['apps.kubernetes.io/pod-index']`",
        keep_empty=True,
    ),
    Setting(
        "map_text",
        "GPU_SCHEDULING_MAP",
        config.text,
        "`metadata.annotations['gpu-scheduling-map']`",
        keep_empty=True,
    ),
    Setting(
        "cuda_visible_devices",
        "CUDA_VISIBLE_DEVICES",
        config.text,
        "as the webhook injected it",
        keep_empty=True,
    ),
    Setting(
        "cuda_device_order", "CUDA_DEVICE_ORDER", config.text, "as the webhook injected it", keep_empty=True
    ),
    Setting(
        "nvidia_visible_devices",
        "NVIDIA_VISIBLE_DEVICES",
        config.text,
        "as the webhook injected it",
        keep_empty=True,
    ),
    Setting(
        "injection_mode",
        "GPU_INJECTION_MODE",
        _mode,
        "`cuda`, `nvidia` or `nvidia-cdi`, as the webhook's device mode; `dra` in DRA mode",
    ),
    Setting(
        "expect_no_gpu",
        "CHECK_EXPECT_NO_GPU",
        config.boolean,
        "`true`: the nodes have no GPUs (check chart `check.expectNoGPU`), so NVML being unavailable "
        "skips the device checks; `false`: it fails them (cannot verify devices)",
    ),
    Setting(
        "dev_dir",
        "CHECK_DEV_DIR",
        config.text,
        "where the container's NVIDIA device nodes (`nvidiactl`, `nvidia<N>`) are looked for (tests point "
        "it elsewhere)",
    ),
    Setting(
        "termination_message_path",
        "CHECK_TERMINATION_MESSAGE_PATH",
        config.text,
        "`once`, `serve`: on exit, what the check saw (JSON) goes here when the file exists "
        "(the kubelet creates it: the container's `terminationMessagePath`)",
    ),
    Setting(
        "interval_seconds",
        "CHECK_INTERVAL_SECONDS",
        config.number(float, 0, what="a number"),
        "`serve`: seconds between runs (at least 1)",
    ),
    Setting("port", "CHECK_PORT", config.number(int, 0, what="a number"), "`serve`: HTTP port of `/readyz`"),
    Setting("log_level", "CHECK_LOG_LEVEL", config.log_level, "DEBUG, INFO, WARNING, ERROR"),
)
