"""DRA mode: each node's GPU topology, published for admission (``GPU_SCHEDULER_DRA_TOPOLOGY``).

A ValidatingAdmissionPolicy reads no ResourceSlice, so the leader publishes what the slices say
of each node's GPUs into one ConfigMap (the chart's ``<fullname>-topology``): one key per node
that publishes a PCIe root or a NUMA node for its GPUs, its value
:func:`kube_gpu_scheduler.domain.dracount.topology_value` (``ROOT/NUMA/NAME`` per GPU in index
order). The ``<fullname>-map-topology`` policy takes it as its parameter and warns
(``GPUsSpanTopology``) when a named entry's GPUs span roots. Written by server-side apply, a
second after the slices last changed (a burst of slice updates is one write), only when its
content changes, when this process starts leading, and once a minute (a ConfigMap deleted by hand
comes back; an unchanged apply changes nothing on the server).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kube_gpu_scheduler.domain import dra, dracount
from kube_gpu_scheduler.kube.errors import short_error
from kube_gpu_scheduler.kube.informer import Handler, Obj

log = logging.getLogger(__name__)

DEBOUNCE_S = 1.0
RESYNC_S = 60.0


def topology_data(slices: Iterable[Mapping[str, Any]], driver: str = dra.DRIVER) -> dict[str, str]:
    """The ConfigMap's data: node -> its GPUs' topology, for each node of ``driver``'s slices that
    publishes any (nodes that publish neither attribute are left out: nothing to warn about)."""
    slices = [s for s in slices if (s.get("spec") or {}).get("driver") == driver]
    nodes = sorted({str(n) for s in slices if (n := (s.get("spec") or {}).get("nodeName"))})
    data = {}
    for node in nodes:
        value = dracount.topology_value(dra.node_devices(slices, node, driver))
        if value:
            data[node] = value
    return data


class Notifying:
    """The slices informer's handler (``inner``), which also tells ``changed`` of each event."""

    def __init__(self, inner: Handler, changed: Callable[[], None]) -> None:
        self._inner = inner
        self._changed = changed

    def on_add(self, obj: Obj) -> None:
        self._inner.on_add(obj)
        self._changed()

    def on_update(self, old: Obj, new: Obj) -> None:
        self._inner.on_update(old, new)
        if (old.get("spec") or {}) != (new.get("spec") or {}):
            self._changed()

    def on_delete(self, obj: Obj) -> None:
        self._inner.on_delete(obj)
        self._changed()


class TopologyPublisher:
    """On the leader: :func:`topology_data` of the slices cache into ``configmap`` (namespace,
    name) whenever :meth:`changed` was called (debounced), through ``publish``."""

    def __init__(
        self,
        configmap: tuple[str, str],
        slices: Callable[[], Iterable[Mapping[str, Any]]],
        publish: Callable[[str, str, Mapping[str, str]], None],
        leading: Callable[[], bool],
        driver: str = dra.DRIVER,
        debounce: float = DEBOUNCE_S,
    ) -> None:
        self.configmap = configmap
        self._debounce = debounce
        self._slices = slices
        self._publish = publish
        self._leading = leading
        self._driver = driver
        self._wake = threading.Event()
        self._published: dict[str, str] | None = None

    def changed(self) -> None:
        self._wake.set()

    def started_leading(self) -> None:
        self._published = None  # another leader may have written meanwhile
        self._wake.set()

    # -- a controller beside the placement loop (placing.interfaces.Controller) ------------------

    def caches(self) -> Mapping[str, Any]:
        return {}  # it reads the claim controller's slices cache

    def busy(self) -> bool:
        return False

    def shutdown(self) -> None:
        return None

    def start_workers(self, stop: threading.Event) -> list[threading.Thread]:
        thread = threading.Thread(target=self._run, args=(stop,), name="dra-topology", daemon=True)
        thread.start()
        return [thread]

    def _run(self, stop: threading.Event) -> None:
        last = time.monotonic()
        while not stop.is_set():
            if not self._wake.wait(1.0):
                if time.monotonic() - last < RESYNC_S:
                    continue
                self._published = None  # written again: a ConfigMap deleted by hand comes back
            # Debounce: publish once the slices have been still for DEBOUNCE_S.
            while self._wake.is_set() and not stop.is_set():
                self._wake.clear()
                stop.wait(self._debounce)
            if stop.is_set() or not self._leading():
                continue
            last = time.monotonic()
            try:
                self.publish()
            except Exception as err:
                log.warning("could not publish the GPU topology", extra={"error": short_error(err)})
                stop.wait(self._debounce)
                self._wake.set()

    def publish(self) -> bool:
        """Write the data when it differs from what this process last wrote; True when written."""
        data = topology_data(self._slices(), self._driver)
        if data == self._published:
            return False
        self._publish(*self.configmap, data)
        self._published = data
        log.info(
            "published the GPU topology",
            extra={"configmap": "/".join(self.configmap), "nodes": len(data)},
        )
        return True
