"""What the scheduler's core asks of its informers and of the controllers beside its placement
loop (:mod:`kube_gpu_scheduler.scheduler.core`), and the handler it gives an informer."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from kube_gpu_scheduler.kube.informer import Obj


class Watched(Protocol):
    """An informer as the scheduler starts, waits for and reports it."""

    synced: threading.Event

    def alive(self) -> bool: ...
    def start(self, stop: threading.Event) -> threading.Thread: ...


class Cache(Watched, Protocol):
    """What the scheduler reads of an informer (``kube_gpu_scheduler.kube.informer.Informer``)."""

    def get(self, key: str) -> Obj | None: ...
    def items(self) -> list[Obj]: ...
    def view(self) -> Mapping[str, Obj]: ...
    def __len__(self) -> int: ...


class Controller(Protocol):
    """A controller beside the placement loop, on the same process's informers and leadership
    (DRA mode's :class:`kube_gpu_scheduler.scheduler.dra.ClaimController`)."""

    def caches(self) -> Mapping[str, Watched]: ...
    def busy(self) -> bool: ...
    def start_workers(self, stop: threading.Event) -> list[threading.Thread]: ...
    def started_leading(self) -> None: ...
    def shutdown(self) -> None: ...


class Handler:
    """An informer's add, update and delete callbacks."""

    def __init__(self, add: Any, update: Any, delete: Any) -> None:
        self.on_add = add
        self.on_update = update
        self.on_delete = delete
