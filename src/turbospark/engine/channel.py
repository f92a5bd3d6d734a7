"""The one hand-off from an engine to the event loop, and the run it feeds.

The scheduler thread appends items to a :class:`Channel` and wakes the event
loop at most once per batch of items (``call_soon_threadsafe`` writes to the
loop's self-pipe, a syscall), so a fast decode does not cost one loop wake-up
per token when the loop is busy. A :class:`Run` is what the caller holds: an
async iterator of progress items ending in the result, and a future of that
result that resolves even when nobody iterates any more (the request's
reporter waits on it). No task and no second queue sit in between.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .types import Progress, PromptProgress, RawDecodeResult, TokenTimings


def _terminal(item: Any) -> bool:
    return isinstance(item, (RawDecodeResult, BaseException))


class Channel:
    """Items from one producer (a scheduler thread, or a task on the loop)
    to one consumer on the loop. The last item of a run is its
    :class:`RawDecodeResult` or the exception that ended it."""

    __slots__ = ("_loop", "_items", "_waiter", "_scheduled", "_lock", "closed", "done", "limit", "on_overflow")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limit: int = 0,
        on_overflow: Callable[[int], None] | None = None,
    ) -> None:
        self._loop = loop
        #: the most items left unread before ``on_overflow(unread)`` is called,
        #: once (0: no bound): a reader that stops reading must not make the
        #: producer buffer without end
        self.limit = limit
        self.on_overflow = on_overflow
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._scheduled = False
        self._lock = threading.Lock()
        self.closed = False
        #: the run's result (or its exception), set on the loop when it arrives
        self.done: asyncio.Future[RawDecodeResult] = loop.create_future()
        self.done.add_done_callback(_retrieve)

    # -- producer side -------------------------------------------------------
    def put(self, item: Any) -> None:
        self._items.append(item)
        if self.limit and len(self._items) > self.limit and self.on_overflow is not None:
            overflow, self.on_overflow = self.on_overflow, None
            overflow(len(self._items))
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.closed = True

    # -- consumer side (event loop) -------------------------------------------
    def _wake(self) -> None:
        with self._lock:
            self._scheduled = False
        if self._items:
            self._settle(self._items[-1])
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _settle(self, item: Any) -> None:
        if self.done.done() or not _terminal(item):
            return
        if isinstance(item, BaseException):
            self.done.set_exception(item)
        else:
            self.done.set_result(item)

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
        self._settle(items[-1])
        return items


def _retrieve(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()  # an abandoned run's error is reported elsewhere, never logged as unretrieved


#: what a run hands out beside its progress when the request asked for it
SIDE_ITEMS = (PromptProgress, TokenTimings)


class Run:
    """One engine run: ``async for item in run`` yields :class:`Progress`
    items, then the :class:`RawDecodeResult` (an engine error is raised
    instead); ``run.done`` is the result's future."""

    __slots__ = ("channel", "_buffer", "_ended")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._buffer: deque[Any] = deque()
        self._ended = False

    @property
    def done(self) -> asyncio.Future[RawDecodeResult]:
        return self.channel.done

    def __aiter__(self) -> Run:
        return self

    async def __anext__(self) -> Progress | PromptProgress | TokenTimings | RawDecodeResult:
        if not self._buffer:
            if self._ended:
                raise StopAsyncIteration
            self._buffer.extend(await self.channel.get())
        item: Progress | PromptProgress | TokenTimings | RawDecodeResult | BaseException = self._buffer.popleft()
        if isinstance(item, Progress):  # the hot path: one check a token
            return item
        if isinstance(item, SIDE_ITEMS):  # (asked for: a prompt's progress, timings so far)
            return item
        self._ended = True  # the terminal item: the result, or the error
        self._buffer.clear()
        if isinstance(item, BaseException):
            raise item
        return item

    async def result(self, on_progress: Any = None) -> RawDecodeResult:
        """Iterate to the end (``on_progress`` sees each progress item)."""
        async for item in self:
            if isinstance(item, RawDecodeResult):
                return item
            if on_progress is not None:
                on_progress(item)
        raise RuntimeError("the run ended without a result")  # pragma: no cover
