"""Background runs (the Responses API's ``background: true``): generations
the server owns rather than a client connection. Each is an asyncio task on
the server's loop, kept here by its response id with the cancel flag its
engine run obeys, so ``POST /v1/responses/{id}/cancel`` can stop it and a
graceful drain counts it as a request in flight (``Drain.entered``: the
drain waits for it, then cuts it as any other). Each keeps its stream events
in a :class:`RunLog` while it runs, so a reader joining mid-run gets the
events so far, then the rest as they come. No HTTP types."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from ..engine.types import CancelFlag

log = logging.getLogger("turbospark.responses")

#: the cancel flag's reason when a client cancels a background run
CANCELLED = "cancelled by the client (POST /v1/responses/{id}/cancel)"


class RunLog:
    """A run's events in order (event ``n`` is the run's ``sequence_number``
    ``n``), and how many of them the store keeps already (``kept``)."""

    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.kept = 0
        self.ended = False
        self._changed = asyncio.Event()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def add(self, events: Iterable[bytes]) -> None:
        self.events.extend(events)
        self._wake()

    def end(self) -> None:
        """Nothing more comes: every reader ends after the last event."""
        self.ended = True
        self._wake()

    async def follow(self, after: int = -1, every: float = 0.0, beat: bytes = b"") -> AsyncIterator[bytes]:
        """The events after number ``after``: those so far, then each as it
        comes, until the run ends (none missed, none twice); ``beat`` each
        time none has come for ``every`` seconds (a stream's keep-alive while
        the run waits in the queue or prefills; 0: never)."""
        n = max(after + 1, 0)
        while True:
            if n < len(self.events):
                n += 1
                yield self.events[n - 1]
            elif self.ended:
                return
            elif every > 0 and beat:
                try:
                    await asyncio.wait_for(self._changed.wait(), every)
                except TimeoutError:
                    yield beat
            else:
                await self._changed.wait()


@dataclass
class Run:
    task: asyncio.Task[None]
    cancel: CancelFlag
    log: RunLog


class BackgroundRuns:
    """The background runs going on, by response id."""

    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def start(self, rid: str, cancel: CancelFlag, work: Coroutine[Any, Any, None], log: RunLog) -> None:
        """Run ``work`` on the running loop, owned by the server (a client
        leaving cancels nothing); it is forgotten when it ends (its events
        kept by then: readers go to the store after)."""
        task = asyncio.get_running_loop().create_task(work, name=f"background {rid}")
        self._runs[rid] = Run(task, cancel, log)
        task.add_done_callback(lambda t: self._ended(rid, t))

    def _ended(self, rid: str, task: asyncio.Task[None]) -> None:
        self._runs.pop(rid, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("background run %s failed", rid, exc_info=task.exception())

    def running(self, rid: str) -> bool:
        return rid in self._runs

    def log(self, rid: str) -> RunLog | None:
        """The events of run ``rid`` while it runs here (None: it does not)."""
        run = self._runs.get(rid)
        return run.log if run is not None else None

    async def cancel(self, rid: str, wait: float = 30.0) -> bool:
        """Stop run ``rid`` (its engine run ends at its next step) and wait
        up to ``wait`` seconds for it to keep its end; False: no such run."""
        run = self._runs.get(rid)
        if run is None:
            return False
        run.cancel.cancel(CANCELLED)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(run.task), wait)
        return True
