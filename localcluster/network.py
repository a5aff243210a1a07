"""Where the local control plane listens and how its apiserver reaches Services: free loopback
ports, the apiserver's address flags (loopback, or the real node's bridge), and the egress
selector that sends its Service calls through localcluster.svcproxy."""

from __future__ import annotations

import fcntl
import random
import socket
import tempfile
from pathlib import Path

import yaml

from localcluster.pki import LocalPKI

# Ports handed out by free_port: below the kernel's ephemeral range, so that no outgoing
# connection (every client of every cluster the tests run side by side) can take a port between
# the moment it is chosen and the moment its server binds it. Seen in CI with bind(0): a
# controller-manager's --secure-port went to another worker's outgoing connection first
# ("bind: address already in use").
_LOW = 15000
_POOL_LOCK = Path(tempfile.gettempdir()) / "gpu-scheduler-ports.lock"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _pool() -> range | None:
    """The ports free_port cycles through, or None when the ephemeral range leaves no room."""
    low, high = _ephemeral_range()
    if low - _LOW >= 2000:
        return range(_LOW, low)
    if 65535 - high >= 2000:
        return range(high + 1, 65536)
    return None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))  # noqa: S104 - a probe, closed at once: free on every address
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on every address, for a server about to start.

    Ports come from one pool shared by every process on the machine (a counter under a file
    lock), so two callers — two pytest workers, two clusters — are never handed the same port
    until the pool has gone round, and the pool lies outside the ephemeral range, so no client
    connection takes the port in the meantime."""
    pool = _pool()
    if pool is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    with open(_POOL_LOCK, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        start = int(text) if text.isdigit() else random.randrange(len(pool))
        for step in range(len(pool)):
            index = (start + step) % len(pool)
            port = pool[index]
            if _bindable(port):
                f.seek(0)
                f.truncate()
                f.write(str((index + 1) % len(pool)))
                f.flush()
                return port
    raise OSError(f"no free TCP port in {pool.start}-{pool.stop - 1}")


def apiserver_address_flags(pki: LocalPKI, real_node: bool) -> list[str]:
    """Where the apiserver listens, what it advertises, and how it authorizes."""
    if not real_node:
        return [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            "--authorization-mode=RBAC",
        ]
    from localcluster.node import GATEWAY

    kubelet_crt, kubelet_key = pki.issue(
        "apiserver-kubelet-client", "kube-apiserver-kubelet-client", org="system:masters"
    )
    return [
        # Host processes use 127.0.0.1, pods the bridge's gateway (the `kubernetes` Service's
        # endpoint, kept by the lease reconciler).
        "--bind-address=0.0.0.0",
        f"--advertise-address={GATEWAY}",
        "--endpoint-reconciler-type=lease",
        "--authorization-mode=Node,RBAC",
        f"--kubelet-client-certificate={kubelet_crt}",
        f"--kubelet-client-key={kubelet_key}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


def egress_selector_file(workdir: Path) -> Path:
    return workdir / "egress-selector.yaml"


def write_egress_selector(workdir: Path, sock: Path) -> Path:
    """The apiserver's EgressSelectorConfiguration: its calls to the cluster (Service webhooks)
    go through the HTTP CONNECT proxy on Unix socket ``sock``."""
    config = egress_selector_file(workdir)
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.k8s.io/v1beta1",
                "kind": "EgressSelectorConfiguration",
                "egressSelections": [
                    {
                        "name": "cluster",
                        "connection": {
                            "proxyProtocol": "HTTPConnect",
                            "transport": {"uds": {"udsName": str(sock)}},
                        },
                    }
                ],
            },
            sort_keys=False,
        )
    )
    return config


def egress_flags(workdir: Path) -> list[str]:
    config = egress_selector_file(workdir)
    return [f"--egress-selector-config-file={config}"] if config.exists() else []
