"""NVIDIA's DRA driver on the real kubelet node, as a user installs it: its own Helm chart.

The chart shipped in ``sigs.k8s.io/dra-driver-nvidia-gpu`` (copied into the tool cache by
``tools/provision.sh nvidia``) runs the unmodified ``gpu-kubelet-plugin`` as a DaemonSet pod
on the node; here that pod sees the stand-in driver root (localcluster/nvidia.py) where a GPU
node has NVIDIA's driver. It registers with the kubelet, publishes the node's ResourceSlice
itself, and prepares each claim the kubelet hands it by writing a CDI spec that containerd
applies to the claim's containers. Nothing on that path is written by hand.

What is ours: the plugin's image, built like upstream's (their Dockerfile: a base with bash, the
plugin, ``nvidia-cdi-hook``, ``kubelet-plugin-prestart.sh`` and the CDI templates) from the
image's Debian base with buildah, and the chart's values for this node (the kubelet's folders,
the stand-in root, the control-plane taint, compute domains off).

The host: the plugin's socket folder is mounted with ``Bidirectional`` propagation, which runc
allows only on a shared mount, so the kubelet's root becomes a shared bind mount of itself
(given back by localcluster/node_host.py's cleanup like every mount under the node); its CDI
specs go to the host's ``/var/run/cdi`` (the chart's fixed path, in containerd's default
``cdi_spec_dirs``), from which the cleanup removes the driver's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localcluster import dra, image
from localcluster.node_host import CDI_ROOT
from localcluster.nvidia import DRIVER_NAME, DriverRoot, Machine, build_driver_root
from localcluster.toolcache import tool, versions

if TYPE_CHECKING:
    # The install needs the cluster's clients only (Cluster.start hands it the Cluster itself).
    from localcluster.clients import ClusterClients
    from localcluster.node import RealNode

RELEASE = "nvidia-dra-driver-gpu"
NAMESPACE = "nvidia-dra-driver-gpu"
REPOSITORY = "localhost/dra-driver-nvidia-gpu"
# The node label the chart's kubelet-plugin affinity asks for (GPU feature discovery sets it).
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
PRESTART = "hack/kubelet-plugin-prestart.sh"
# The real node's own label (localcluster/node.py, --node-labels).
REAL_NODE_LABEL = "gpu-scheduler.dev/localcluster-node"
# The GPU Operator's RuntimeClass (and containerd handler) for NVIDIA's runtime, in cdi mode.
RUNTIME_CLASS = "nvidia"
# The management CDI spec the operator's toolkit writes (one device, `all`).
MANAGEMENT_SPEC = "management.nvidia.com-gpu.yaml"


@dataclass(frozen=True)
class PluginImage:
    ref: str
    archive: Path


@dataclass(frozen=True)
class InstalledDriver:
    """What :func:`install` put on the node: the stand-in root and the GPUs it describes."""

    root: DriverRoot
    node: str

    @property
    def machine(self) -> Machine:
        return self.root.machine

    def gpus_in_bus_order(self) -> list[dra.Gpu]:
        return self.machine.in_bus_order()


def _module_dir() -> Path:
    v = versions()["DRA_DRIVER_NVIDIA_GPU_VERSION"]
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/dra-driver-nvidia-gpu@{v}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        cwd="/",
        env={**os.environ, "GOFLAGS": ""},
    )
    return Path(json.loads(out.stdout)["Dir"])


def chart_dir() -> Path:
    """NVIDIA's chart, as tools/provision.sh copied it beside the plugin."""
    chart = tool("gpu-kubelet-plugin").parent.parent / "chart"
    if not (chart / "Chart.yaml").is_file():
        raise FileNotFoundError(f"{chart}: NVIDIA's chart is missing: run `tools/provision.sh nvidia`")
    return chart


def plugin_image() -> PluginImage:
    """The plugin's image (built once per plugin, toolkit and base; an OCI archive in the cache)."""
    v = versions()
    plugin, hook = tool("gpu-kubelet-plugin"), tool("nvidia-cdi-hook")
    module = _module_dir()
    prestart = module / PRESTART
    h = hashlib.sha256()
    for f in (plugin, hook, prestart):
        h.update(f.read_bytes())
    tag = f"{v['DRA_DRIVER_NVIDIA_GPU_VERSION']}-{h.hexdigest()[:10]}"
    ref = f"{REPOSITORY}:{tag}"
    archive = plugin.parent.parent / "image" / f"dra-driver-nvidia-gpu-{tag}.oci.tar"
    if archive.exists():
        return PluginImage(ref, archive)
    start = time.monotonic()
    base = image.base_image()
    image.say(f"building {ref} (the DRA plugin's image) from {base}")
    ctr = image.buildah("from", base).stdout.strip()
    try:
        for src, dest in ((plugin, "/usr/bin/"), (hook, "/usr/bin/"), (prestart, "/usr/bin/")):
            image.buildah("copy", "--chmod", "0755", ctr, str(src), dest)
        image.buildah("copy", ctr, str(module / "templates"), "/templates")
        image.buildah("copy", ctr, str(module / "LICENSE"), "/LICENSE")
        image.buildah(
            "config",
            "--env",
            "NVIDIA_DISABLE_REQUIRE=true",
            "--env",
            "NVIDIA_VISIBLE_DEVICES=all",
            "--env",
            "NVIDIA_DRIVER_CAPABILITIES=utility",
            "--cmd",
            "[]",
            "--user",
            "root:root",
            ctr,
        )
        image.buildah("commit", "-q", ctr, ref)
    finally:
        image.buildah("rm", ctr, check=False)
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".tmp")
    image.buildah("push", "-q", ref, f"oci-archive:{tmp}:{ref}")
    tmp.replace(archive)
    image.say(f"built {ref} in {time.monotonic() - start:.0f}s")
    return PluginImage(ref, archive)


def chart_values(plugin: PluginImage, root: DriverRoot, kubelet_root: Path) -> dict[str, Any]:
    """The chart's values for the real node: everything else is the chart's default."""
    repository, tag = plugin.ref.rsplit(":", 1)
    return {
        "nvidiaDriverRoot": str(root.path),
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        # Whole GPUs only: compute domains (IMEX, NVLink) need hardware the stand-in has not.
        "resources": {"computeDomains": {"enabled": False}, "gpus": {"enabled": True}},
        "gpuResourcesEnabledOverride": True,
        "kubeletPlugin": {
            "kubeletRegistrarDirectoryPath": str(kubelet_root / "plugins_registry"),
            "kubeletPluginsDirectoryPath": str(kubelet_root / "plugins"),
            # The real node only (the kwok GPU nodes carry the GPU label too, and run nothing),
            # which is the control-plane node (its NoSchedule taint).
            "nodeSelector": {REAL_NODE_LABEL: "real"},
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
        },
    }


def _share_mount(path: Path) -> None:
    """``path`` as a shared bind mount of itself (Bidirectional propagation needs one)."""
    path.mkdir(parents=True, exist_ok=True)
    for args in (["mount", "--bind", str(path), str(path)], ["mount", "--make-rshared", str(path)]):
        subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


def toolkit_dir(node: RealNode) -> Path:
    return node.dir / "nvidia" / "toolkit"


def runtime_handlers(node: RealNode) -> dict[str, Path]:
    """containerd's runtime handlers for the node (localcluster/node.py): ``nvidia``, NVIDIA's
    runtime through a wrapper that names its config, as the GPU Operator's toolkit installs it."""
    return {RUNTIME_CLASS: toolkit_dir(node) / "nvidia-container-runtime"}


def _install_toolkit(cluster: ClusterClients, node: RealNode, root: DriverRoot) -> None:
    """NVIDIA's container runtime as the GPU Operator >= 25.10 sets it up with CDI on: the runtime
    in ``cdi`` mode behind the ``nvidia`` handler and RuntimeClass (never the default runtime),
    a management CDI spec with the one device ``all``, the accept-envvar setting on."""
    import shutil

    from localcluster.nvidia_tools import runtime_config

    folder = toolkit_dir(node)
    config = folder / ".config" / "nvidia-container-runtime" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    runc = shutil.which("runc") or "runc"
    config.write_text(
        runtime_config(
            root,
            nvidia_ctk=tool("nvidia-ctk"),
            low_level_runtime=runc,
            spec_dirs=[CDI_ROOT, Path("/etc/cdi")],
            log_file=folder / "nvidia-container-runtime.log",
        )
    )
    wrapper = runtime_handlers(node)[RUNTIME_CLASS]
    wrapper.write_text(
        "#!/bin/sh\n# NVIDIA's runtime with its config (the GPU Operator's toolkit installs it so).\n"
        f'XDG_CONFIG_HOME="{config.parent.parent}" exec "{tool("nvidia-container-runtime")}" "$@"\n'
    )
    wrapper.chmod(0o755)
    CDI_ROOT.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            str(tool("nvidia-ctk")),
            "cdi",
            "generate",
            "--mode=management",
            f"--driver-root={root.path}",
            f"--dev-root={root.path}",
            f"--nvidia-cdi-hook-path={tool('nvidia-cdi-hook')}",
            f"--output={CDI_ROOT / MANAGEMENT_SPEC}",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    cluster.apply(
        [
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": RUNTIME_CLASS},
                "handler": RUNTIME_CLASS,
            }
        ]
    )


def install(cluster: ClusterClients, gpus: int, timeout: float = 300) -> InstalledDriver:
    """Install NVIDIA's DRA driver on the cluster's real node over ``gpus`` stand-in GPUs, and wait
    until the plugin has published the node's ResourceSlice with every one of them."""
    node = cluster.node
    if node is None:
        raise RuntimeError("NVIDIA's DRA driver runs on the real node: Cluster.start(real_node=True)")
    name = node.name
    # The chart mounts the root's parent and the kubelet's plugin folder with mount propagation,
    # which runc allows only from a shared mount: each is a shared bind mount of itself.
    parent = node.dir / "nvidia"
    _share_mount(parent)
    kubelet_root = node.sock_dir / "kubelet"
    _share_mount(kubelet_root)
    # Minors not in PCI bus order (shift 1), as on many machines: an index is resolved by bus order.
    root = build_driver_root(parent / "root", Machine.for_node(name, gpus, shift=1))
    _install_toolkit(cluster, node, root)
    plugin = plugin_image()
    node.import_image(plugin.archive)
    cluster.kubectl("label", "node", name, f"{GPU_PRESENT_LABEL}=true", "--overwrite")
    values = cluster.workdir / "nvidia-dra-driver-values.json"
    values.write_text(json.dumps(chart_values(plugin, root, kubelet_root), indent=2))
    cluster.helm(
        "install",
        RELEASE,
        str(chart_dir()),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--values",
        str(values),
        "--wait",
        f"--timeout={int(timeout)}s",
    )
    want = {g.uuid for g in root.machine.gpus}

    def published() -> bool:
        res = cluster.kubectl("get", "resourceslices", "-o", "json", check=False)
        if res.returncode != 0:
            return False
        for item in json.loads(res.stdout)["items"]:
            spec = item.get("spec") or {}
            if spec.get("nodeName") == name and spec.get("driver") == DRIVER_NAME:
                got = {d["attributes"]["uuid"]["string"] for d in spec.get("devices") or []}
                return got == want
        return False

    cluster.wait_until(published, timeout, f"NVIDIA's plugin to publish {name}'s {gpus} GPUs")
    return InstalledDriver(root, name)
