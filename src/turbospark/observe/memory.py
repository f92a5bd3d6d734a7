"""Observers that keep events in memory: a bounded ring for embedding hosts
and a plain list for tests and short scripts."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from .events import RequestId, ServerEvent


@dataclass
class Drained:
    events: list[dict[str, Any]]
    dropped: int


class RingObserver:
    """A bounded ring for embedding hosts: by count and by serialized bytes.

    The oldest events are evicted first; :meth:`drain` hands each event out
    once and reports how many were dropped since the previous drain.
    """

    def __init__(self, max_events: int = 2000, max_bytes: int = 1 << 20) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("ring limits must be positive")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._ring: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self._dropped = 0
        self._lock = threading.Lock()

    def record(self, event: ServerEvent) -> None:
        data = event.to_dict()
        size = len(orjson.dumps(data))
        with self._lock:
            self._ring.append((data, size))
            self._bytes += size
            while len(self._ring) > self.max_events or (self._bytes > self.max_bytes and len(self._ring) > 1):
                _, old = self._ring.popleft()
                self._bytes -= old
                self._dropped += 1

    def drain(self, max_events: int | None = None) -> Drained:
        with self._lock:
            n = len(self._ring) if max_events is None else min(max_events, len(self._ring))
            items = [self._ring.popleft() for _ in range(n)]
            self._bytes -= sum(size for _, size in items)
            dropped, self._dropped = self._dropped, 0
        return Drained([data for data, _ in items], dropped)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ring)


@dataclass
class ListObserver:
    """Keeps every event in memory; for tests and short scripts."""

    events: list[ServerEvent] = field(default_factory=list)

    def record(self, event: ServerEvent) -> None:
        self.events.append(event)

    def of(self, request_id: RequestId) -> list[ServerEvent]:
        return [e for e in list(self.events) if getattr(e, "id", None) == request_id]
