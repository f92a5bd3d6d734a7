"""The registry's watchdog, twice a second and at every acquire: a model
whose engine thread died is taken out of memory at once (``modelDetached``
with the reason; its requests in flight already got their error) and
reloaded on demand after a backoff (see :mod:`.failures`); one whose engine
has made no step for ``stall_timeout`` seconds while work waits is
``stalled`` (``modelHealth``, a log line) until it steps again; a lone
remote model whose last request got no answer is ``down`` until one does.
Either makes ``/health`` answer 503 ``degraded``. The same loop ticks the
replica groups and unloads models idle past their keep-alive."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..observe import ModelDetached, ModelHealth, Observer, now_ms, record
from .entry import Entry
from .failures import forgive, note_failure
from .lifecycle import Lifecycle
from .replicas import Replica

log = logging.getLogger("turbospark.registry")  # (the registry's log, as before its split)

#: the watchdog's default: seconds without an engine step while work waits
STALL_TIMEOUT = 60.0


class Watchdog:
    """Health checks of the models of one registry, and the loop that runs them."""

    def __init__(
        self,
        entries: Callable[[], list[Entry]],
        lifecycle: Lifecycle,
        observer: Observer | None,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self._entries = entries
        self.lifecycle = lifecycle
        self.observer = observer
        self.stall_timeout = stall_timeout
        self._loop: asyncio.Task[None] | None = None

    def check(self, entry: Entry) -> None:
        """Take a model whose engine died out of memory (reloaded on demand),
        note a stalled one, and forget old failures of one that has run well
        for a while. Call on the event loop."""
        model = entry.model
        if model is None:
            return
        health = model.health()
        if entry.replica is None:  # a lone remote model: what its requests found (passive)
            unreachable = health.unreachable
            if unreachable != entry.unreachable:
                entry.unreachable = unreachable
                state, why = ("down", unreachable) if unreachable else ("ok", "answering again")
                record(self.observer, lambda: ModelHealth(at_ms=now_ms(), model=entry.id, state=state, reason=why))
        failure = health.failure
        if failure:
            entry.model = None
            note_failure(entry, f"engine failure: {failure}")
            record(self.observer, lambda: ModelDetached(at_ms=now_ms(), model=entry.id, reason=entry.failure))
            self.lifecycle.close_later(model)
            return
        forgive(entry, time.monotonic())
        seconds = health.stalled_seconds
        if seconds >= self.stall_timeout and not entry.stalled:
            entry.stalled = True
            why = entry.stall_reason = f"no engine step for {seconds:.0f} s while requests wait"
            log.error("%s is stalled: %s", entry.id, why)
            record(self.observer, lambda: ModelHealth(at_ms=now_ms(), model=entry.id, state="stalled", reason=why))
        elif entry.stalled and seconds < self.stall_timeout:
            entry.stalled = False
            log.warning("%s is making progress again", entry.id)
            record(self.observer, lambda: ModelHealth(at_ms=now_ms(), model=entry.id, state="ok"))

    def replica_changed(self, replica: Replica, state: str, reason: str) -> None:
        """A replica group's finding about one of its replicas, as an event."""
        member = replica.entry.id
        record(self.observer, lambda: ModelHealth(at_ms=now_ms(), model=member, state=state, reason=reason))

    def start(self) -> None:
        """Run the loop (call on the event loop); idempotent."""
        if self._loop is None or self._loop.done():
            self._loop = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()

    async def _run(self, every: float = 0.5) -> None:
        """Health checks and idle unloads, twice a second."""
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for e in self._entries():
                if e.group is not None:
                    e.group.tick()
                try:
                    self.check(e)
                except Exception:  # pragma: no cover - the watchdog never dies
                    log.exception("checking %s failed", e.id)
                await self.lifecycle.expire(e, now)
