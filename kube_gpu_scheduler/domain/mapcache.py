"""The map's answers remembered: :func:`parse_cached` parses each distinct text once.

Every pod of a StatefulSet carries its template's map, so the scheduler, the webhook and the
check program see the same text again and again; they call :func:`parse_cached` (or
:func:`shared_text`, the one copy of a text the cache keeps) instead of
:func:`kube_gpu_scheduler.domain.schedmap.parse`. Bounded in count and in memory.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

from kube_gpu_scheduler.domain.schedmap import MAX_MAP_BYTES, MapError, Problem, SchedulingMap, parse

# --- parse_cached: the same text parsed once -------------------------------------------------------

# Bounds of the cache: entries, and an estimate of the memory they hold (the text, which is the key,
# plus the parsed entries): 32 MiB holds ~50,000 parsed entries, e.g. fifteen 3,000-entry maps. A parsed entry costs about _ENTRY_COST bytes (measured with tracemalloc,
# rounded up); a refusal keeps at most MAX_PROBLEMS_LISTED small problems.
PARSE_CACHE_ENTRIES = 1024
PARSE_CACHE_BYTES = 32 * 1024 * 1024
_ENTRY_COST = 600
_REFUSAL_COST = 8 * 1024


@dataclass(frozen=True)
class _Refusal:
    problems: tuple[Problem, ...]
    more: int


class _ParseCache:
    """Least recently used answers of :func:`parse`, bounded in count and in estimated bytes."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        # text -> (answer, estimated bytes, the text object itself: see shared())
        self._items: OrderedDict[str, tuple[SchedulingMap | _Refusal, int, str]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def parse(self, text: str) -> SchedulingMap:
        if not isinstance(text, str) or len(text) > MAX_MAP_BYTES:
            return parse(text)  # refused at once; not worth keeping such a text alive
        with self._lock:
            hit = self._items.get(text)
            if hit is not None:
                self._items.move_to_end(text)
        if hit is None:
            hit = self._remember(text)
        outcome = hit[0]
        if isinstance(outcome, _Refusal):
            raise MapError(outcome.problems, outcome.more)
        return outcome

    def shared(self, text: str) -> str:
        """The one copy of ``text`` this cache keeps (parsing it if new), else ``text`` itself."""
        if not isinstance(text, str) or len(text) > MAX_MAP_BYTES:
            return text
        with self._lock:
            hit = self._items.get(text)
        if hit is None:
            hit = self._remember(text)
        return hit[2]

    def _remember(self, text: str) -> tuple[SchedulingMap | _Refusal, int, str]:
        outcome: SchedulingMap | _Refusal
        try:
            outcome = parse(text)
            cost = sys.getsizeof(text) + _ENTRY_COST * len(outcome)
        except MapError as err:
            outcome = _Refusal(tuple(err.problems), err.more)
            cost = sys.getsizeof(text) + _REFUSAL_COST
        with self._lock:
            kept = self._items.get(text)
            if kept is not None:
                return kept
            if cost <= self.max_bytes:
                self._items[text] = (outcome, cost, text)
                self._bytes += cost
                while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                    _, (_, old, _) = self._items.popitem(last=False)
                    self._bytes -= old
        return outcome, cost, text

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def size(self) -> tuple[int, int]:
        with self._lock:
            return len(self._items), self._bytes


_CACHE = _ParseCache(PARSE_CACHE_ENTRIES, PARSE_CACHE_BYTES)


def parse_cached(text: str) -> SchedulingMap:
    """:func:`parse`, remembering the answer (map or refusal) for the last texts seen.

    For callers that see the same annotation again and again (every pod of a
    StatefulSet carries its template's map). Bounded: at most
    PARSE_CACHE_ENTRIES texts and about PARSE_CACHE_BYTES of memory, least
    recently used first out; thread-safe. A refusal is raised as a fresh
    MapError each time (never the same exception object twice). The maps
    returned are shared: treat them as read-only.
    """
    return _CACHE.parse(text)


def shared_text(text: str) -> str:
    """One string object for every equal map text while :func:`parse_cached` remembers it.

    Every pod of a StatefulSet carries its template's map: a cache of 3,000 pods with a
    60 KB map would otherwise hold 3,000 copies of it. The scheduler's pod cache keeps
    this copy instead of the one each watch event decoded.
    """
    return _CACHE.shared(text)


def parse_cache_clear() -> None:
    """Forget every remembered answer (tests, or to give the memory back)."""
    _CACHE.clear()


def parse_cache_size() -> tuple[int, int]:
    """``(texts, estimated bytes)`` held by :func:`parse_cached`."""
    return _CACHE.size()
