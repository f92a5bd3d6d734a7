"""The server's live event feed: a bounded ring of recent events numbered by
a server-assigned sequence, a :class:`~turbospark.fold.Fold` kept current,
and subscribers (``GET /v1/events`` streams) that each get a bounded queue.

Always installed in the server's observer fan-out (``Server``, ``turbospark
serve``, or ``build_app`` itself), so ``/v1/events``, ``/v1/stats`` and the
dashboard work on every server.

``record`` is called from request handlers AND the engine's scheduler
thread, so it only does O(1) work under one short lock: number the event,
fold it, append it to the ring and to each subscriber's queue. A slow
subscriber never blocks it: its queue drops the OLDEST events on overflow
and the stream says so with a gap marker. Subscribers are woken with
``call_soon_threadsafe`` at most once per batch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from ..fold import Fold
from ..observe import ServerEvent

log = logging.getLogger("turbospark.sinks")


@dataclass(frozen=True, slots=True)
class Numbered:
    """One event as the ring keeps it: sequence number, kind, JSON."""

    seq: int
    kind: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Gap:
    """Events ``first..last`` (sequence numbers) a subscriber will not see."""

    missed: int
    first: int
    last: int

    def to_dict(self) -> dict[str, int]:
        return {"missed": self.missed, "from": self.first, "to": self.last}


class Subscriber:
    """One live stream's bounded queue. Filled under :class:`LiveEvents`'
    lock by any thread; drained by its stream on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_queue: int) -> None:
        self.loop = loop
        self.max_queue = max_queue
        self.items: deque[Numbered] = deque()
        self.gap: Gap | None = None
        self.wake = asyncio.Event()
        self.closed = False
        self._notified = False

    def _push(self, item: Numbered) -> bool:
        """Queue an item (dropping the oldest on overflow); True when the
        stream must be woken."""
        if len(self.items) >= self.max_queue:
            old = self.items.popleft()
            g = self.gap
            self.gap = Gap(g.missed + 1, g.first, old.seq) if g else Gap(1, old.seq, old.seq)
        self.items.append(item)
        if self._notified:
            return False
        self._notified = True
        return True

    def _take(self) -> tuple[Gap | None, list[Numbered]]:
        gap, self.gap = self.gap, None
        items = list(self.items)
        self.items.clear()
        self._notified = False
        return gap, items

    def _wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.wake.set)
        except RuntimeError:  # the loop is closed: the stream is gone anyway
            pass


class LiveEvents:
    """Ring + fold + subscribers. An :class:`~turbospark.observe.Observer`."""

    def __init__(
        self,
        max_events: int = 4096,
        max_bytes: int = 4 << 20,
        max_queue: int = 1024,
        keepalive_s: float = 15.0,
    ) -> None:
        if max_events < 1 or max_bytes < 1 or max_queue < 1:
            raise ValueError("ring and queue limits must be positive")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.max_queue = max_queue
        self.keepalive_s = keepalive_s
        self.fold = Fold()
        self._ring: deque[Numbered] = deque()
        self._bytes = 0
        self._seq = 0
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self.closed = False

    # -- the observer side ----------------------------------------------
    def record(self, event: ServerEvent) -> None:
        data = event.to_dict()
        body = orjson.dumps(data)
        wake: list[Subscriber] = []
        with self._lock:
            self._seq += 1
            item = Numbered(self._seq, event.kind, body)
            try:
                self.fold.feed(data)
            except Exception:  # a fold bug must not cost the stream its events
                log.exception("folding %s failed", event.kind)
            self._ring.append(item)
            self._bytes += len(body)
            while len(self._ring) > self.max_events or (self._bytes > self.max_bytes and len(self._ring) > 1):
                self._bytes -= len(self._ring.popleft().data)
            for sub in self._subscribers:
                if sub._push(item):
                    wake.append(sub)
        for sub in wake:
            sub._wake()

    # -- the reader side -------------------------------------------------
    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    def subscribe(self, since: int | None) -> tuple[Subscriber, Gap | None, list[Numbered]]:
        """Register a live subscriber and, atomically with it, take what the
        ring holds after ``since`` (nothing when None) and the gap before it
        if the ring no longer reaches back that far. A ``since`` beyond the
        last sequence number (a client of a previous server run) replays the
        whole ring."""
        sub = Subscriber(asyncio.get_running_loop(), self.max_queue)
        with self._lock:
            sub.closed = self.closed  # shutting down: the stream ends after its replay
            self._subscribers.append(sub)
            if since is None:
                return sub, None, []
            if since > self._seq or since < 0:
                since = 0
            oldest = self._ring[0].seq if self._ring else self._seq + 1
            gap = Gap(oldest - 1 - since, since + 1, oldest - 1) if since + 1 < oldest else None
            replay = [item for item in self._ring if item.seq > since]
        return sub, gap, replay

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def take(self, sub: Subscriber) -> tuple[Gap | None, list[Numbered]]:
        with self._lock:
            return sub._take()

    def summary(self, max_requests: int | None = None) -> dict[str, Any]:
        """The fold's summary plus ``seq``, the last event folded into it:
        a client that then streams ``/v1/events?since=seq`` misses nothing
        and sees nothing twice."""
        with self._lock:
            out = self.fold.summary(max_requests)
            out["seq"] = self._seq
        return out

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def close(self) -> None:
        """End every live stream (server shutdown)."""
        with self._lock:
            self.closed = True
            subs = list(self._subscribers)
        for sub in subs:
            sub.closed = True
            sub._wake()
