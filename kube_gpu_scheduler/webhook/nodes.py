"""Node look-ups for ``/validate``'s warnings, answered from a watch cache of the nodes.

:class:`NodeCache` runs an :class:`~kube_gpu_scheduler.kube.informer.Informer` of the
nodes (list, then watch from the list's resourceVersion, relisting on ``410 Gone``,
retrying with a capped, jittered backoff) in a daemon thread of the worker process.
Its transform keeps only what the warnings need: a node's name and its GPU count
(:func:`kube_gpu_scheduler.domain.resources.node_gpus`, as the scheduler reads it). A look-up
reads memory and never waits on the API: until the first list has arrived, or when
the webhook has no API access, :class:`NodeLookupUnavailable` is raised and the
caller skips the node warnings. Nothing here may make an admission fail.

RBAC: ``list`` and ``watch`` on nodes (no ``get``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client

from kube_gpu_scheduler.domain.objects import Node
from kube_gpu_scheduler.domain.resources import node_gpus
from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.client import KubeConfigError, load_client
from kube_gpu_scheduler.kube.errors import short_error
from kube_gpu_scheduler.kube.informer import IGNORE, Informer, Obj
from kube_gpu_scheduler.webhook.perprocess import PerProcessWatch

log = logging.getLogger("webhook.nodes")

# A list call may take this long (connect, read); a page holds this many nodes.
LIST_TIMEOUT = (5.0, 30.0)
LIST_PAGE = 500
# The apiserver ends a watch after about this long (randomised so workers do not reconnect together).
WATCH_TIMEOUT_S = 300
# Retry delays after a failure: doubling from the first to the cap, each spread by this fraction.
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
JITTER = 0.2
# The key of the node's GPU count in the cached (transformed) object.
GPUS = "gpus"


@dataclass(frozen=True)
class NodeInfo:
    name: str
    # GPUs the node reports (resources.node_gpus: allocatable, else capacity); None when it reports none.
    gpus: int | None


class NodeLookupUnavailable(Exception):
    """The webhook cannot tell about nodes right now; the message says why."""


class NodeLookup(Protocol):
    def get(self, name: str) -> NodeInfo | None:
        """The node, ``None`` when it does not exist; raises NodeLookupUnavailable. Must not block."""
        ...


class NodeCache(PerProcessWatch):
    """Nodes from a list-then-watch of the API, kept in memory for :meth:`get`.

    The thread starts on the first :meth:`start` or :meth:`get` in a process, so a
    gunicorn worker starts its own after the fork (threads do not survive one).
    """

    thread_name = "webhook-node-cache"

    def __init__(
        self,
        kubeconfig: str | None,
        *,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        backoff_max_s: float = BACKOFF_MAX_S,
    ):
        super().__init__("the node cache has not listed the nodes yet")
        self._kubeconfig = kubeconfig
        self._watch_timeout_s = watch_timeout_s
        self._backoff_max_s = backoff_max_s
        self.lists = 0  # completed lists (the first one and every relist), for tests and logs

    @property
    def synced(self) -> bool:
        informer = self._informer
        return informer is not None and informer.synced.is_set()

    def get(self, name: str) -> NodeInfo | None:
        self.start()
        informer = self._informer
        if informer is None or not informer.synced.is_set():
            with self._lock:
                raise NodeLookupUnavailable(self._why)
        node = informer.get(name)
        if node is None:
            return None
        return NodeInfo(name, node[GPUS])

    # ------------------------------------------------------------------ the thread
    def _connect(self) -> Any:
        # The settings read KUBECONFIG already; without it and outside a pod, no API access
        # (never a developer's ~/.kube/config).
        return client.CoreV1Api(
            load_client(self._kubeconfig, fallbacks=False, user_agent="gpu-scheduler-webhook")
        )

    def _unavailable(self, why: str) -> None:
        with self._lock:
            if not self.synced:
                self._why = why

    def _listed(self, _resource: str) -> None:
        self.lists += 1
        informer = self._informer
        if informer is not None:
            extra = {"nodes": len(informer), "resource_version": informer.resource_version}
            log.info("node cache synced", extra=extra)

    def _run(self) -> None:
        try:
            api = self._connect()
        except Exception as exc:  # any config problem means "no API access", for good
            why = str(exc) if isinstance(exc, KubeConfigError) else f"{type(exc).__name__}: {exc}"
            self._unavailable(f"no Kubernetes API access ({why})")
            log.info("node checks disabled: no Kubernetes API access (%s)", why)
            return
        informer = Informer(
            "nodes",
            api.list_node,
            IGNORE,
            page_size=LIST_PAGE,
            watch_timeout=self._watch_timeout_s,
            backoff=Backoff(BACKOFF_FIRST_S, self._backoff_max_s),
            on_relist=self._listed,
            transform=_slim,
            # API down, refused (RBAC), TLS, a malformed answer: unavailable until a list succeeds
            on_error=lambda exc: self._unavailable(f"cannot list nodes: {short_error(exc)}"),
            jitter=JITTER,
            list_timeout=LIST_TIMEOUT,
        )
        self._informer = informer
        informer.run(self._stop)


def _slim(obj: Obj) -> Obj:
    """What the cache keeps of a node: its identity and its GPU count."""
    node = Node(obj)
    name, gpus = _entry(obj)
    meta = {"name": name, "uid": node.uid, "resourceVersion": node.resource_version}
    return {"metadata": {k: v for k, v in meta.items() if v}, GPUS: gpus}


def _entry(obj: dict[str, Any]) -> tuple[str, int | None]:
    node = Node(obj)
    return str(node.name), node_gpus(node.status)
