"""The pinned upstream versions (tools/versions.env) and the tool cache tools/provision.sh builds into."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localcluster.node import NodeBinaries

REPO = Path(__file__).resolve().parent.parent
VERSIONS_FILE = REPO / "tools" / "versions.env"


def versions() -> dict[str, str]:
    """The pinned upstream versions (tools/versions.env)."""
    out: dict[str, str] = {}
    for raw in VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def bin_dirs() -> list[Path]:
    """The cache folders tools/provision.sh builds into (same layout, same keys)."""
    return list(_bin_dirs(os.environ.get("GPU_SCHEDULER_CACHE"), os.environ.get("XDG_CACHE_HOME")))


@functools.lru_cache(maxsize=4)
def _bin_dirs(cache: str | None, xdg_cache: str | None) -> tuple[Path, ...]:
    # Asked once per cache setting: every kubectl and helm call looks its binary up here.
    res = subprocess.run(
        [str(REPO / "tools" / "provision.sh"), "--print-bin-dirs"],
        capture_output=True,
        text=True,
        check=True,
    )
    return tuple(Path(p) for p in res.stdout.split())


def tool(name: str) -> Path:
    for d in bin_dirs():
        if (d / name).is_file() and (d.parent / ".done").exists():
            return d / name
    raise FileNotFoundError(f"{name} is not built yet: run `make tools` (tools/provision.sh)")


def node_binaries() -> NodeBinaries:
    """The real node's binaries from the tool cache (tools/provision.sh node)."""
    from localcluster.node import NodeBinaries

    v = versions()
    containerd = tool("containerd")
    cache = containerd.parent.parent.parent
    pause_dir = cache / f"pause-{v['PAUSE_VERSION']}"
    if not (pause_dir / ".done").exists():
        raise FileNotFoundError(
            "the pause image is not built yet: run `make tools` (tools/provision.sh node)"
        )
    return NodeBinaries(
        kubelet=tool("kubelet"),
        kube_proxy=tool("kube-proxy"),
        containerd=containerd,
        shim_dir=containerd.parent,
        ctr=tool("ctr"),
        pause_archive=pause_dir / "pause.oci.tar",
        pause_ref=f"localhost/gpu-scheduler/pause:{v['PAUSE_VERSION']}",
        coredns=tool("coredns"),
    )
