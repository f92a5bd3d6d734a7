"""Graceful drain: what a SIGTERM or SIGINT (``turbospark serve``) or
``Server.stop()`` does before the process lets go of its models.

1. :meth:`Drain.start`: from now on new requests are refused (503 with
   ``Retry-After``, in their dialect's shape: ``middleware.DrainMiddleware``)
   and ``/health`` answers 503 ``draining``, so a load balancer moves on.
2. The requests already in flight finish on their own, for up to the drain
   timeout (``--drain-timeout``, default 30 s).
3. The rest are cut: each generation's cancel flag fails with
   :class:`ShuttingDown`, so the engine stops it at its next step, its
   ``generated`` is still reported, and the client gets its dialect's error
   frame (streams) or a 503 body, and ``requestFinished`` names the error.
4. Then the HTTP server stops, the models close and the event log is flushed.

Nothing here knows HTTP: the middleware counts requests through
:meth:`Drain.entered`, the generating routes register their cancel flags
with :meth:`Drain.watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from ..engine.types import CancelFlag

log = logging.getLogger("turbospark.server")

#: the drain timeout when none is given
DEFAULT_DRAIN_SECONDS = 30.0
#: how long requests that were cut get to send their error frame
CUT_GRACE_SECONDS = 10.0
#: what a refused client is told to wait before trying again (seconds)
RETRY_AFTER = 5


class ShuttingDown(Exception):
    """A request refused or ended because the server is shutting down (503)."""

    retry_after = RETRY_AFTER

    def __init__(self, message: str = "the server is shutting down; try again shortly") -> None:
        super().__init__(message)


class Drain:
    """The requests in flight, and whether new ones are still taken."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        #: the deadline passed: generations are failed as they are watched
        self.cutting = False
        self._flags: set[CancelFlag] = set()
        #: waits on a client (``middleware.ClientTimeouts``) that the cut ends
        self._timers: set[tuple[asyncio.Timeout, asyncio.AbstractEventLoop]] = set()
        #: other waits the cut ends (a load waiting for room: ``Registry.stop_waiting``)
        self._on_cut: list[Callable[[], None]] = []

    def on_cut(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (on the server's loop) when the deadline cuts."""
        self._on_cut.append(fn)

    def start(self) -> None:
        self.draining = True

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """One request in flight for the length of the block."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    @contextlib.contextmanager
    def watch(self, cancel: CancelFlag) -> Iterator[CancelFlag]:
        """A generation :meth:`cut` may stop; cut at once if the drain's
        deadline has already passed (it was still being prepared then)."""
        if self.cutting:
            cancel.fail(ShuttingDown())
        self._flags.add(cancel)
        try:
            yield cancel
        finally:
            self._flags.discard(cancel)

    @contextlib.contextmanager
    def until_cut(self, timer: asyncio.Timeout) -> Iterator[None]:
        """A wait on the client (a response write it does not take, a request
        body that stops coming) that the cut ends at once, as if its own
        timeout ran out: a request stuck so could neither end with its error
        frame nor let the process exit."""
        loop = asyncio.get_running_loop()
        if self.cutting:
            timer.reschedule(loop.time())
        entry = (timer, loop)
        self._timers.add(entry)
        try:
            yield
        finally:
            self._timers.discard(entry)

    def cut(self) -> int:
        """Fail every watched generation with :class:`ShuttingDown`, and
        every one watched from now on, and end the waits on clients; how many
        generations were running."""
        self.cutting = True
        flags = [f for f in self._flags if not f.cancelled]
        for flag in flags:
            flag.fail(ShuttingDown())
        for timer, loop in list(self._timers):
            if not loop.is_closed():
                loop.call_soon_threadsafe(_expire, timer, loop)
        for fn in self._on_cut:
            fn()
        return len(flags)

    async def _settle(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.in_flight == 0

    async def run(self, timeout: float = DEFAULT_DRAIN_SECONDS) -> int:
        """Stop taking requests, wait up to ``timeout`` seconds for those in
        flight, then cut the rest and give them a moment to send their error
        frames. Returns how many were cut."""
        self.start()
        if self.in_flight:
            log.warning(
                "draining %d request(s) for up to %.0f s (a second signal exits now)",
                self.in_flight,
                timeout,
            )
        if await self._settle(timeout):
            self.cut()  # nothing generates; a client taking nothing (an event watcher) lets go now
            return 0
        cut = self.cut()
        log.warning("drain timeout: ending %d generation(s) with an error", cut)
        await self._settle(CUT_GRACE_SECONDS)
        return cut


def _expire(timer: asyncio.Timeout, loop: asyncio.AbstractEventLoop) -> None:
    with contextlib.suppress(RuntimeError):  # (its wait ended meanwhile)
        timer.reschedule(loop.time())
