"""Which pods wait on which node: the index that turns a change into a retry.

A pod refused for node N (a GPU held there, the node cordoned, no room) is
retried at once when something about N changes, rather than at its next
backoff: kube-scheduler's "queueing hints", reduced to one key, the node. A pod
whose map is the problem waits on ``""`` (only its own update requeues it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class WaitingIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_node: dict[str, set[str]] = {}  # node -> keys of pods refused for it
        self._node_of: dict[str, str] = {}  # pod key -> node ("" when the map is the problem)

    def wait(self, key: str, node: str) -> None:
        """``key`` waits on ``node`` (and on no other node any more)."""
        with self._lock:
            previous = self._node_of.get(key)
            if previous is not None and previous != node:
                self._unwait_locked(key)
            self._node_of[key] = node
            self._by_node.setdefault(node, set()).add(key)

    def unwait(self, key: str) -> None:
        with self._lock:
            self._unwait_locked(key)

    def waits(self, key: str) -> bool:
        """``key`` was refused and waits for a retry."""
        with self._lock:
            return key in self._node_of

    def waiting_on(self, nodes: Iterable[str]) -> list[str]:
        """The keys of the pods waiting on any of ``nodes``."""
        with self._lock:
            return [k for n in nodes for k in self._by_node.get(n, ())]

    def __len__(self) -> int:
        return len(self._node_of)

    def _unwait_locked(self, key: str) -> None:
        node = self._node_of.pop(key, None)
        if node is not None:
            keys = self._by_node.get(node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_node[node]
