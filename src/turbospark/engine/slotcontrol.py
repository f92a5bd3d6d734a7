"""Slot control: what llama-server's ``/slots`` routes ask of a model that
runs here. :class:`SlotControl` shows each session slot (is it processing,
the job it runs or ran last) and saves a slot to a file, restores a file
into a slot, or erases a slot, each on the engine thread between two steps
(``Scheduler.call``); the files are the host tier's verified records
(``hostcache.write_record`` / ``read_record``: tokens, owner and state, with
a checksum), written and read off the engine thread.

``owner``: the caller's tenant, or None for one who may act on any slot
(an admin, or a server without keys). A tenant acts only on its own slots
or empty ones, and restores only the records it saved (another's is
answered as a missing file). Which path a caller
may name is the route's business: this module takes the path it is given.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .hostcache import read_record, write_record
from .scheduler import Scheduler
from .slots import TaskView
from .types import SlotActionError, StepCounts

#: how long an action waits for the engine thread to get to it
ACTION_TIMEOUT = 60.0


@dataclass(frozen=True)
class SlotState:
    """One session slot as ``GET /slots`` shows it."""

    id: int
    owner: str
    processing: bool
    tokens_cached: int
    #: the job it runs now, else the last one it ran (None: never ran one)
    task: TaskView | None


@dataclass(frozen=True)
class SlotAction:
    """What a save, restore or erase did: the tokens saved, restored or
    erased, the bytes written or read, and how long it took."""

    slot: int
    tokens: int
    bytes: int = 0
    ms: float = 0.0


class SlotControl:
    """A local model's session slots, for llama-server's ``/slots`` routes."""

    def __init__(self, scheduler: Scheduler, n_ctx: int) -> None:
        self._scheduler = scheduler
        #: the context each slot holds (``n_ctx`` in ``/slots``)
        self.n_ctx = n_ctx

    @property
    def speculative(self) -> bool:
        return self._scheduler.speculative

    @property
    def counts(self) -> StepCounts:
        """What its engine's steps did so far (llama-server's ``/metrics``)."""
        return self._scheduler.counts

    def idle(self) -> bool:
        """Whether a job submitted now would start at once: fewer than
        ``parallel`` slots run one (more session slots than ``parallel``
        do not run more at once)."""
        return self._scheduler.store.busy_count() < self._scheduler.parallel

    def states(self) -> list[SlotState]:
        """Every slot, from any thread (a view, not a lock-step copy)."""
        tasks = self._scheduler.tasks()
        return [
            SlotState(s.seq_id, s.owner, s.busy, len(s.tokens), task)
            for s, task in zip(self._scheduler.store.slots, tasks)
        ]

    def save(self, slot_id: int, path: str, owner: str | None) -> SlotAction:
        """Write what ``slot_id`` holds to ``path`` (blocking: call it off the
        event loop)."""
        started = time.perf_counter()
        if owner is not None and os.path.lexists(path):
            kept = read_record(path)
            if kept is None or kept.owner != owner:
                raise SlotActionError(f"{os.path.basename(path)!r} is another tenant's file", "forbidden")
        store = self._scheduler.store
        entry = self._scheduler.call(lambda: store.save_slot(slot_id, owner), ACTION_TIMEOUT)
        try:
            written = write_record(path, entry)
        except OSError as exc:
            raise SlotActionError(f"cannot write {os.path.basename(path)}: {exc.strerror or exc}") from None
        return SlotAction(slot_id, len(entry.tokens), written, _ms(started))

    def restore(self, slot_id: int, path: str, owner: str | None) -> SlotAction:
        """Load the record in ``path`` into ``slot_id`` (blocking)."""
        started = time.perf_counter()
        name = os.path.basename(path)
        missing = SlotActionError(f"there is no saved slot named {name!r}")
        if not os.path.isfile(path):
            raise missing
        entry = read_record(path)
        if owner is not None and (entry is None or entry.owner != owner):
            raise missing  # (another tenant's file: as a missing one, no oracle of what exists)
        if entry is None:
            raise SlotActionError(f"{name!r} is not a slot record this server can read (damaged or another format)")
        size = os.path.getsize(path)
        store = self._scheduler.store
        n = self._scheduler.call(lambda: store.restore_slot(slot_id, entry, owner), ACTION_TIMEOUT)
        return SlotAction(slot_id, n, size, _ms(started))

    def erase(self, slot_id: int, owner: str | None) -> SlotAction:
        """Empty ``slot_id`` (its KV and its record)."""
        store = self._scheduler.store
        return SlotAction(slot_id, self._scheduler.call(lambda: store.erase_slot(slot_id, owner), ACTION_TIMEOUT))


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)
