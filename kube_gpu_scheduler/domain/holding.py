"""What a pod holds: its node and GPUs, read only from what its owner cannot change.

The one reading of "who holds a GPU", for the scheduler's ledger
(:mod:`kube_gpu_scheduler.scheduler.state.ledger`), ``gpu-scheduler-map status`` and ``plan``:

* a pod holds GPUs while it is bound (``spec.nodeName``, set once, by the Binding) and
  active (not Succeeded or Failed; a terminating pod still holds them);
* on that node, the GPUs its containers were set up with: the variables injected into the
  container spec (``NVIDIA_VISIBLE_DEVICES``, else ``CUDA_VISIBLE_DEVICES``), which are
  immutable;
* a bound pod whose containers carry no such variable holds its map entry when the entry
  names the node it is bound to (the admission policy keeps the map from changing).

No annotation a tenant may write is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube_gpu_scheduler.domain.injection import held_devices
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import entry_for
from kube_gpu_scheduler.domain.schedmap import GPU, MapError, gpu_sort_key

FINISHED_PHASES = ("Succeeded", "Failed")


def is_active(pod: Mapping[str, Any]) -> bool:
    """Not finished. Terminating pods are active: they hold their GPUs until deleted."""
    return Pod(pod).phase not in FINISHED_PHASES


def pod_holds(pod: Mapping[str, Any]) -> tuple[str, tuple[GPU, ...]] | None:
    """``(node, gpus)`` the pod holds (sorted, no duplicates), or None."""
    view = Pod(pod)
    node = view.node_name
    if not is_active(pod) or node is None:
        return None
    devices = held_devices(view.spec)
    if devices:
        return node, tuple(sorted(set(devices), key=gpu_sort_key))
    try:
        _, entry = entry_for(view.meta)
    except MapError:
        return None
    if entry is None or entry.node != node:
        return None
    return node, tuple(sorted(set(entry.gpus), key=gpu_sort_key))
