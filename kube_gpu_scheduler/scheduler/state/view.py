"""Who holds which GPU, as the scheduler's ledger says, in the words of the metrics and ``status``.

``gpu_scheduler_gpu_holder_info`` has one sample per held GPU: its node and GPU, the holder's
namespace and name, its StatefulSet and ordinal, and ``mode``: ``env`` (bound, the GPUs read
from its containers' injected variables), ``map`` (bound, no variables: its map entry on the
node it is bound to) or ``reserved`` (decided, its Binding not yet seen; a committed gang's
member). Read from the ledger and the pods cache at scrape time, never from an annotation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kube_gpu_scheduler.domain.injection import held_devices
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import ordinal_of
from kube_gpu_scheduler.scheduler.state.ledger import Ledger

ENV, MAP, RESERVED = "env", "map", "reserved"


def holding_mode(pod: Mapping[str, Any] | None) -> str:
    """How a pod holds its GPUs: ``env``, ``map`` or ``reserved`` (not bound yet)."""
    view = Pod(pod)
    if pod is None or view.node_name is None:
        return RESERVED
    return ENV if held_devices(view.spec) else MAP


def holder_labels(ledger: Ledger, pod_of: Callable[[str], Mapping[str, Any] | None]) -> list[dict[str, str]]:
    out = []
    for where, keys in ledger.snapshot().items():
        node, _, gpu = where.partition(":")
        for key in keys:
            pod = pod_of(key)
            view = Pod(pod)
            namespace, _, name = key.partition("/")
            ordinal = ordinal_of(name, view.labels) if pod is not None else None
            out.append(
                {
                    "node": node,
                    "gpu": gpu,
                    "namespace": namespace,
                    "pod": name,
                    "statefulset": view.owner_of_kind("StatefulSet") or "",
                    "ordinal": "" if ordinal is None else str(ordinal),
                    "mode": holding_mode(pod),
                }
            )
    return out
