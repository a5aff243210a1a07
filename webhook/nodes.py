"""Node look-ups for ``/validate``'s warnings, through the Kubernetes API when the webhook has access.

Access is optional: without a kubeconfig or in-cluster service account (or when
the API refuses), :class:`NodeLookupUnavailable` is raised and the caller skips
the node warnings. Nothing here may make an admission fail.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpu_scheduling.resources import GPU_RESOURCE, quantity_int

log = logging.getLogger("webhook.nodes")

# Keep well inside the apiserver's webhook timeout (10 s by default).
REQUEST_TIMEOUT = (2.0, 3.0)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    # Allocatable nvidia.com/gpu; None when the node does not advertise the resource.
    gpus: int | None


class NodeLookupUnavailable(Exception):
    """The webhook cannot ask the API about nodes right now; the message says why."""


class NodeLookup(Protocol):
    def get(self, name: str) -> NodeInfo | None:
        """The node, ``None`` when it does not exist; raises NodeLookupUnavailable."""
        ...


def gpus_of(allocatable: dict[str, Any] | None) -> int | None:
    """``nvidia.com/gpu`` from a node's allocatable map, as an integer."""
    return quantity_int((allocatable or {}).get(GPU_RESOURCE))


class KubeNodeLookup:
    """Reads nodes with the kubernetes client; the client is made on first use (after gunicorn forks)."""

    def __init__(self, kubeconfig: str | None):
        self._kubeconfig = kubeconfig
        self._lock = threading.Lock()
        self._api: Any = None
        self._unavailable: str | None = None

    def _core(self) -> Any:
        with self._lock:
            if self._api is None and self._unavailable is None:
                try:
                    self._api = self._connect()
                except Exception as exc:  # any config problem means "no API access"
                    self._unavailable = f"no Kubernetes API access ({type(exc).__name__}: {exc})"
            if self._api is None:
                raise NodeLookupUnavailable(self._unavailable or "no Kubernetes API access")
            return self._api

    def _connect(self) -> Any:
        configuration = client.Configuration()
        if self._kubeconfig:
            config.load_kube_config(config_file=self._kubeconfig, client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            raise NodeLookupUnavailable("neither KUBECONFIG nor an in-cluster service account is available")
        return client.CoreV1Api(client.ApiClient(configuration))

    def get(self, name: str) -> NodeInfo | None:
        api = self._core()
        try:
            # A list filtered to the one name, not a GET: the webhook's RBAC grants nodes
            # list/watch only (gpu-scheduler-chart/templates/rbac.yaml).
            items = api.list_node(
                field_selector=f"metadata.name={name}", _request_timeout=REQUEST_TIMEOUT
            ).items
        except ApiException as exc:
            raise NodeLookupUnavailable(f"reading node {name!r}: HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:  # connection refused, timeout, TLS: the API is not reachable now
            raise NodeLookupUnavailable(f"reading node {name!r}: {type(exc).__name__}: {exc}") from exc
        if not items:
            return None
        node = items[0]
        allocatable = node.status.allocatable if node.status else None
        return NodeInfo(name=name, gpus=gpus_of(allocatable))
