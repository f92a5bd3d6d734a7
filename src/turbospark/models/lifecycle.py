"""A known model's way in and out of memory: loaded on demand by the
request that needs it (one load at a time, after a place under
``--max-resident``), leased by each request it serves, unloaded after its
keep-alive idle, and closed once no request holds it any more (a detached
or failed model finishes the requests it has first). No HTTP types in here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..core.backend import Backend
from ..engine.gguf import NotGGUF
from ..engine.media import ProjectorError
from ..observe import ModelAttached, Observer, now_ms, record
from .entry import Entry, ModelSpec, RoutingError, info_of
from .failures import note_failure, refuse_reload
from .residency import Residency

log = logging.getLogger("turbospark.registry")  # (the registry's log, as before its split)


class Lifecycle:
    """Loads, leases, idle unloads and closes of the models of one registry."""

    def __init__(
        self, residency: Residency, loader: Callable[[ModelSpec], Any] | None, observer: Observer | None
    ) -> None:
        self.residency = residency
        self.loader = loader
        self.observer = observer
        #: unloads and closes running in the background (awaited at close)
        self._closing: set[asyncio.Task[Any]] = set()
        #: requests holding each loaded model object (by id): a failed model
        #: is freed only once none does (one may still be templating with it)
        self._in_use: dict[int, int] = {}

    # -- leases ------------------------------------------------------------------
    async def lease(self, entry: Entry, room_wait: float) -> tuple[float, Callable[[], None]]:
        """Load the model on demand (waiting up to ``room_wait`` seconds for
        room) and lease it for one request: the seconds spent loading (0:
        it was resident) and the release to call exactly once when done."""
        if entry.model is None and entry.failure is not None:
            refuse_reload(entry)
        entry.leases += 1  # leased before any await, so nothing unloads it
        if entry.spec is not None:  # a request without its own keep-alive gets the operator's
            entry.keep_alive = entry.spec.keep_alive
        load_seconds = 0.0
        try:
            if entry.model is None:
                t0 = time.perf_counter()
                await self._load(entry, room_wait)
                load_seconds = time.perf_counter() - t0
        except BaseException:
            entry.leases -= 1
            raise
        model = entry.model
        self._in_use[id(model)] = self._in_use.get(id(model), 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                entry.leases -= 1
                entry.last_used = time.monotonic()
                left = self._in_use.get(id(model), 1) - 1
                if left:
                    self._in_use[id(model)] = left
                else:
                    self._in_use.pop(id(model), None)

        entry.last_used = time.monotonic()
        return load_seconds, release

    # -- loads -------------------------------------------------------------------
    async def _load(self, entry: Entry, room_wait: float) -> None:
        if entry.spec is None or self.loader is None:
            raise RoutingError(503, f"model {entry.id!r} is not loaded and cannot be reloaded", "model_not_available")
        if entry._loading is None:
            entry._loading = asyncio.ensure_future(self._do_load(entry, room_wait))
        try:
            await asyncio.shield(entry._loading)
        finally:
            if entry._loading is not None and entry._loading.done():
                entry._loading = None

    async def _do_load(self, entry: Entry, room_wait: float) -> None:
        if not await self.residency.reserve(exclude=entry, wait=room_wait):
            raise self.residency.refusal(entry, room_wait)
        try:
            model = await asyncio.to_thread(self.loader, entry.spec)  # type: ignore[arg-type]
        except NotGGUF as exc:  # a truncated or damaged file: the server's trouble, told plainly
            if entry.failure is not None:
                note_failure(entry, f"reload failed: {exc}")
            raise RoutingError(503, f"model {entry.id!r} cannot be loaded: {exc}", "model_unloadable") from None
        except ProjectorError as exc:  # its projector: named by its file's name, no folder of the server's
            log.warning("%s cannot be loaded: %s", entry.id, exc)
            if entry.failure is not None:
                note_failure(entry, f"reload failed: {exc.public}")
            raise RoutingError(503, f"model {entry.id!r} cannot be loaded: {exc.public}", "model_unloadable") from None
        except Exception as exc:
            if entry.failure is not None:  # a failed model's reload failed too
                note_failure(entry, f"reload failed: {exc}")
            raise
        finally:
            self.residency.unreserve()
        entry.model = model
        entry.info = info_of(model)
        entry.stalled = False
        entry.healthy_since = time.monotonic()
        if entry.failure is not None:
            log.warning("%s reloaded after an engine failure (%s)", entry.id, entry.failure)
            entry.failure = None
        record(self.observer, lambda: ModelAttached(at_ms=now_ms(), model=entry.id))

    # -- keep-alive --------------------------------------------------------------
    @staticmethod
    def set_keep_alive(entry: Entry, seconds: float | None) -> bool:
        """A request's own keep-alive for its model (see
        :meth:`Registry.set_keep_alive`); False for a model that is not
        reloadable (it stays resident)."""
        if entry.spec is None:
            return False
        entry.keep_alive = seconds
        return True

    async def expire(self, entry: Entry, now: float) -> None:
        """Unload a model idle for its keep-alive."""
        ka = entry.keep_alive if entry.spec is not None else None
        if ka is not None and entry.model is not None and entry.leases == 0 and now - entry.last_used >= ka:
            await self.residency.unload(entry, f"idle for {ka:g}s (keep-alive)")

    # -- unloads and closes ------------------------------------------------------
    @staticmethod
    async def unload_when_idle(entry: Entry, poll: float = 0.05) -> None:
        while entry.leases > 0:
            await asyncio.sleep(poll)
        model, entry.model = entry.model, None
        if model is not None:
            await asyncio.to_thread(model.close)

    def unload_later(self, entry: Entry) -> None:
        """Unload a detached model in the background once idle (needs a loop)."""
        self._background(self.unload_when_idle(entry))

    def close_later(self, model: Backend) -> None:
        """Close a model taken out of its entry once no request holds it."""

        async def close() -> None:
            while self._in_use.get(id(model), 0) > 0:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(model.close)

        self._background(close())

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self, entries: list[Entry]) -> None:
        """At shutdown: close the groups and remote connections, then wait
        for the unloads and closes still running."""
        for e in entries:
            if e.group is not None:
                e.group.close()
            if e.model is not None:  # (a remote engine's connections)
                try:
                    await e.model.aclose()
                except Exception:  # noqa: BLE001 - shutting down goes on
                    log.exception("closing %s's connections failed", e.id)
        for task in list(self._closing):
            await task
