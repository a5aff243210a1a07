"""Install the project's Helm charts into the local control plane.

The scheduler and the webhook run as host processes in the tests and the demo, so
a typical install of ``gpu-scheduler-chart`` there is::

    install_chart(cluster, "gpu-scheduler", "gpu-scheduler-system", {
        "replicaCount": 0,                       # no in-cluster scheduler pod
        "webhook": {"enabled": True,
                    "url": "https://127.0.0.1:PORT",   # the host-process webhook
                    "caBundle": "<base64 PEM CA>"},
    })

which renders the scheduler's and the webhook's ServiceAccounts with their RBAC, the
ValidatingAdmissionPolicy and the two webhook configurations (``webhook_host_values``
builds that dictionary); ``release_service_account(cluster, release, ns, component)``
names the ServiceAccount each host process runs as.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

REPO = Path(__file__).resolve().parent.parent
SCHEDULER_CHART = "gpu-scheduler-chart"
CHECK_CHART = "gpu-scheduler-check-chart"


class _Helm(Protocol):
    def helm(self, *args: str, check: bool = True) -> Any: ...


def chart_path(chart: str | Path) -> Path:
    """A chart folder: a name relative to the repository root, or a path."""
    path = Path(chart)
    if not path.is_absolute():
        path = REPO / path
    if not (path / "Chart.yaml").is_file():
        raise FileNotFoundError(f"no Helm chart at {path}")
    return path


def install_chart(
    cluster: _Helm,
    release: str,
    namespace: str,
    values: Mapping[str, Any] | None = None,
    chart: str | Path = SCHEDULER_CHART,
    *,
    wait: bool = False,
    timeout: str = "120s",
    create_namespace: bool = True,
    hooks: bool = True,
) -> None:
    """``helm upgrade --install`` ``chart`` as ``release`` in ``namespace`` with ``values``.

    The values go through a file (never ``--set``), so nested dictionaries, lists and
    multi-line strings (PEM, maps) arrive unchanged. With ``wait`` helm waits for the
    workloads to be ready (up to ``timeout``). ``hooks=False`` is ``--no-hooks``: helm
    neither runs nor waits for the chart's hooks (they stay recorded in the release, for
    ``helm get hooks``); the check chart's pre-install wait-ready Pod would never finish on a
    kwok node, which runs nothing. Raises ``subprocess.CalledProcessError``
    with helm's stderr when helm fails.
    """
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-values-") as tmp:
        values_file = Path(tmp) / "values.yaml"
        values_file.write_text(yaml.safe_dump(dict(values or {}), sort_keys=False))
        args = [
            "upgrade",
            "--install",
            release,
            str(chart_path(chart)),
            "--namespace",
            namespace,
            "--values",
            str(values_file),
        ]
        if create_namespace:
            args.append("--create-namespace")
        if wait:
            args += ["--wait", "--timeout", timeout]
        if not hooks:
            args.append("--no-hooks")
        cluster.helm(*args)


def uninstall(cluster: _Helm, release: str, namespace: str, wait: bool = False) -> None:
    """``helm uninstall``; a release that is not installed is not an error."""
    args = ["uninstall", release, "--namespace", namespace, "--ignore-not-found"]
    if wait:
        args.append("--wait")
    cluster.helm(*args)


def release_status(cluster: _Helm, release: str, namespace: str) -> dict[str, Any] | None:
    """``helm status -o json`` as a dictionary, or None when the release does not exist."""
    res = cluster.helm("status", release, "--namespace", namespace, "-o", "json", check=False)
    if res.returncode != 0:
        return None
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def release_service_account(cluster: Any, release: str, namespace: str, component: str = "scheduler") -> str:
    """The name of the ServiceAccount a release created for ``component`` (``scheduler``
    or ``webhook``: each has its own), found by its instance and component labels."""
    names = str(
        cluster.kubectl(
            "get",
            "serviceaccount",
            "-n",
            namespace,
            "-l",
            f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ).stdout
    ).split()
    if len(names) != 1:
        raise RuntimeError(
            f"release {release} created {len(names)} ServiceAccounts for the {component} in {namespace}, not one"
        )
    return names[0]


def webhook_host_values(url: str, ca_bundle: str, **webhook: Any) -> dict[str, Any]:
    """Values for a webhook running outside the cluster at ``url`` (https) whose serving
    certificate is signed by the CA in ``ca_bundle`` (base64 PEM); no scheduler pod.
    Extra keyword arguments go under ``webhook`` (e.g. ``failurePolicy="Fail"``)."""
    return {
        "replicaCount": 0,
        "webhook": {"enabled": True, "url": url, "caBundle": ca_bundle, **webhook},
    }


# The local control plane's kwok nodes run nothing: the pods that must really run (the
# scheduler, the webhook, the charts' hook and test pods) go to its one real node, the
# control-plane node. The charts only prefer control-plane nodes (preferControlPlane, never a
# requirement, for managed clusters); here the preference is made a requirement, as a kubeadm
# cluster's user may, so kube-scheduler never puts one of them on a kwok node.
CONTROL_PLANE_SELECTOR = {"node-role.kubernetes.io/control-plane": ""}
# The same for each chart: where its values say it.
REAL_NODE_PLACEMENT: dict[str, dict[str, Any]] = {
    SCHEDULER_CHART: {"nodeSelector": CONTROL_PLANE_SELECTOR},
    CHECK_CHART: {"hookPods": {"nodeSelector": CONTROL_PLANE_SELECTOR}},
}


def product_values(image_ref: str, certs: Path | None = None, **webhook: Any) -> dict[str, Any]:
    """Values for the product as a user installs it, on the real node (localcluster/node.py):
    the image built here (never pulled: ``pullPolicy: Never``), on the control-plane node
    (``REAL_NODE_PLACEMENT``); with ``certs`` (a folder from generate-webhook-certs.py) also the
    webhook, in the cluster behind its Service, its TLS Secret created by the chart. Extra
    keyword arguments go under ``webhook``."""
    repository, _, tag = image_ref.rpartition(":")
    values: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        **REAL_NODE_PLACEMENT[SCHEDULER_CHART],
    }
    if certs is not None:
        import base64

        values["webhook"] = {
            "enabled": True,
            "caBundle": base64.b64encode((certs / "ca.crt").read_bytes()).decode(),
            "tls": {"crt": (certs / "tls.crt").read_text(), "key": (certs / "tls.key").read_text()},
            **webhook,
        }
    return values


__all__ = [
    "CHECK_CHART",
    "CONTROL_PLANE_SELECTOR",
    "REAL_NODE_PLACEMENT",
    "SCHEDULER_CHART",
    "chart_path",
    "install_chart",
    "product_values",
    "release_service_account",
    "release_status",
    "uninstall",
    "webhook_host_values",
]
