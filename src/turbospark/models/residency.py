"""Room for models in memory under ``--max-resident``: a place is reserved
for each load (two loads at once must not both take the last one), the
least recently used idle model is evicted to make room, and while every
resident model is busy a load waits for one to go idle (as Ollama's
scheduler waits) or gives up with a 503 and a Retry-After."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..observe import ModelDetached, Observer, now_ms, record
from .entry import Entry, RoutingError

log = logging.getLogger("turbospark.registry")  # (the registry's log, as before its split)

#: the Retry-After of a load refused for want of room, and how often a load
#: waiting for room looks again
ROOM_RETRY_AFTER = 5
ROOM_POLL_SECONDS = 0.1
#: the codes of a load refused for want of room (or at shutdown), not a failure of the model
ROOM_CODES = ("max_resident", "shutting_down")


class Residency:
    """Which models may be in memory: ``max_resident`` (0: no cap), the
    places reserved by loads in progress, and eviction."""

    def __init__(self, entries: Callable[[], list[Entry]], observer: Observer | None, max_resident: int = 0) -> None:
        self._entries = entries
        self.observer = observer
        self.max_resident = max_resident
        #: models being loaded past :meth:`make_room` (counted as resident:
        #: two loads at once must not both take the last place)
        self._reserved = 0
        self._room_lock = asyncio.Lock()
        #: a shutdown's deadline passed: loads no longer wait for room
        self.stopping = False

    async def reserve(self, exclude: Entry | None = None, wait: float = 0.0) -> bool:
        """A place for one more resident model, held until :meth:`unreserve`
        (call it once the model is loaded, or failed to). While every
        resident model is busy, waits up to ``wait`` seconds for one to go
        idle (as Ollama's scheduler waits); False if none did."""
        deadline = time.monotonic() + wait
        while True:
            if self.stopping:
                return False
            async with self._room_lock:
                if await self.make_room(exclude):
                    self._reserved += 1
                    return True
            if time.monotonic() >= deadline:
                log.warning("max resident models reached and every resident model is busy")
                return False
            await asyncio.sleep(ROOM_POLL_SECONDS)

    def unreserve(self) -> None:
        self._reserved -= 1

    def has_room(self) -> bool:
        """A place under ``max_resident`` now, without evicting anything
        (loads in progress count as resident)."""
        if not self.max_resident:
            return True
        resident = [e for e in self._entries() if e.model is not None and e.model.capabilities.resident]
        return len(resident) + self._reserved < self.max_resident

    def refusal(self, entry: Entry, waited: float) -> RoutingError:
        """The 503 of a load that :meth:`reserve` found no room for."""
        if self.stopping:
            return RoutingError(
                503, "the server is shutting down; try again shortly", "shutting_down", retry_after=ROOM_RETRY_AFTER
            )
        return RoutingError(
            503,
            f"model {entry.id!r} is not loaded, {self.max_resident} model(s) are resident (max resident "
            f"models) and every one has stayed busy for {waited:g} s; try again later",
            "max_resident",
            retry_after=ROOM_RETRY_AFTER,
        )

    async def make_room(self, exclude: Entry | None = None) -> bool:
        """Room for one more resident model under ``max_resident`` (loads in
        progress count as resident): evicts least-recently-used idle,
        reloadable models past the cap. False when the cap is reached and
        every resident model is busy."""
        if not self.max_resident:
            return True
        resident = [
            e for e in self._entries() if e.model is not None and e is not exclude and e.model.capabilities.resident
        ]  # a remote model holds no memory here
        while len(resident) + self._reserved >= self.max_resident:
            idle = [e for e in resident if e.leases == 0 and e.spec is not None]
            if not idle:
                return False
            victim = min(idle, key=lambda e: e.last_used)
            await self.unload(victim, "evicted (max resident models)")
            resident.remove(victim)
        return True

    async def unload(self, entry: Entry, why: str) -> None:
        """Take a model out of memory now (it stays known, reloaded on demand)."""
        model, entry.model = entry.model, None
        if model is None:
            return
        log.info("unloading %s: %s", entry.id, why)
        record(self.observer, lambda: ModelDetached(at_ms=now_ms(), model=entry.id, reason=why))
        await asyncio.to_thread(model.close)
