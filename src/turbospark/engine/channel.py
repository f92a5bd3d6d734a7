"""The bridge from the scheduler thread to one waiting asyncio task.

The scheduler appends items and wakes the event loop at most once per batch of
items (``call_soon_threadsafe`` writes to the loop's self-pipe, a syscall), so
a fast decode does not cost one loop wake-up per token when the loop is busy.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any


class Channel:
    __slots__ = ("_loop", "_items", "_waiter", "_scheduled", "_lock", "closed")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._scheduled = False
        self._lock = threading.Lock()
        self.closed = False

    # -- producer side (scheduler thread) ---------------------------------
    def put(self, item: Any) -> None:
        self._items.append(item)
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.closed = True

    # -- consumer side (event loop) ---------------------------------------
    def _wake(self) -> None:
        with self._lock:
            self._scheduled = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> list[Any]:
        """Everything produced since the last call (at least one item)."""
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self._items)
        for _ in range(len(items)):
            self._items.popleft()
        return items
