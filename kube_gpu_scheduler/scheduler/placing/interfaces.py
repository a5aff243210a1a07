"""What the scheduler's core asks of its informers and of the controllers beside its placement
loop (:mod:`kube_gpu_scheduler.scheduler.placing.core`); the handler it gives an informer is
:class:`kube_gpu_scheduler.kube.informer.Callbacks`."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from kube_gpu_scheduler.kube.informer import Cache, Watched

__all__ = ["Cache", "Controller", "Watched"]


class Controller(Protocol):
    """A controller beside the placement loop, on the same process's informers and leadership
    (DRA mode's :class:`kube_gpu_scheduler.scheduler.dra.controller.ClaimController`)."""

    def caches(self) -> Mapping[str, Watched]: ...
    def busy(self) -> bool: ...
    def start_workers(self, stop: threading.Event) -> list[threading.Thread]: ...
    def started_leading(self) -> None: ...
    def shutdown(self) -> None: ...
