"""Where the local control plane listens and how its apiserver reaches Services: free loopback
ports, the apiserver's address flags (loopback, or the real node's bridge), and the egress
selector that sends its Service calls through localcluster.svcproxy."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml

from localcluster.pki import LocalPKI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
