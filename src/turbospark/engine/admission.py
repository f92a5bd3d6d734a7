"""The wait list: reservations, the ``max_queue`` bound, FIFO admission and
the withdrawal of cancelled waiting jobs.

A request is admitted before any response byte (``reserve``: a refusal is a
503 with a Retry-After estimate, streams included); its job then takes the
place it held (``submit``). The engine thread takes jobs off the head of the
list as sequences free up (``admit_locked``). A client that leaves while its
job waits gives its place back at once (``withdraw``, from any thread).

Everything here is under one lock, ``WaitList.cond``: the scheduler thread
waits on it for work, and it also guards ``stopping`` (no more jobs) and
the mean job time behind Retry-After.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from .jobs import Job, cancelled_result, end_job
from .slots import Slot, SlotStore
from .types import EngineError, Overloaded

#: weight of the newest job in the mean job time behind Retry-After
JOB_TIME_WEIGHT = 0.2


class Reservation:
    """A place on a scheduler's wait list, held from admission (before any
    response byte) until the job that takes it is submitted, or released.
    Releasing twice, or after the job took it, does nothing."""

    __slots__ = ("_wait_list", "held")

    def __init__(self, wait_list: WaitList) -> None:
        self._wait_list = wait_list
        self.held = True

    def release(self) -> None:
        self._wait_list.unreserve(self)


class WaitList:
    """Jobs waiting for a sequence (FIFO) and the places reserved for
    admitted requests not yet submitted, bounded by ``max_queue`` beyond the
    free sequences; ``stopping`` and ``failure`` say why it takes no more."""

    def __init__(self, slots: SlotStore, parallel: int, max_queue: int) -> None:
        self._slots = slots
        self.parallel = parallel
        self.max_queue = max_queue
        self.cond = threading.Condition()
        self.jobs: deque[Job] = deque()
        #: places held on the wait list by admitted requests not yet submitted
        self.reserved = 0
        #: decayed mean of admitted → finished seconds, for Retry-After
        self.job_seconds = 0.0
        self.stopping = False
        #: why the engine thread died, if an exception escaped its loop
        self.failure: str | None = None

    # ------------------------------------------------------------ any thread
    def reserve(self) -> Reservation:
        """Hold a place for a request about to be submitted, or refuse it
        now (:class:`Overloaded`, with a Retry-After estimate)."""
        with self.cond:
            self.check_room_locked()
            self.reserved += 1
            return Reservation(self)

    def unreserve(self, reservation: Reservation) -> None:
        with self.cond:
            if reservation.held:
                reservation.held = False
                self.reserved -= 1

    def check_room_locked(self) -> None:
        if self.stopping:
            raise EngineError(f"engine failure: {self.failure}" if self.failure else "the model is shutting down")
        if not self.max_queue:
            return
        # free sequences take submitted jobs at once: they are no wait (a job
        # being started, its slot taken but not yet running, is not free)
        free = max(0, self.parallel - self._slots.busy_count())
        if len(self.jobs) + self.reserved >= self.max_queue + free:
            raise Overloaded(
                f"the wait list is full ({self.max_queue} requests waiting); try again shortly",
                retry_after=self.retry_after_locked(),
            )

    def retry_after_locked(self) -> int:
        """Seconds until a place is likely free: the jobs ahead times the
        recent mean job time, over the sequences that run them (≥ 1)."""
        ahead = len(self.jobs) + self.reserved
        return max(1, math.ceil(ahead * self.job_seconds / self.parallel))

    def submit(self, job: Job) -> None:
        with self.cond:
            held = job.config.reservation
            if isinstance(held, Reservation) and held._wait_list is self:
                # an admitted request: its first run takes the place it held;
                # its guardrail re-ask (same reservation) is never refused
                if held.held:
                    held.held = False
                    self.reserved -= 1
                if self.stopping:
                    raise EngineError("the model is shutting down")
            else:
                self.check_room_locked()
            self.jobs.append(job)
            self.cond.notify()
        # a client that leaves while its job waits gives its place back at
        # once (the engine may be inside a long step; the next request in
        # line, or one refused by a full wait list, need not wait for it)
        job.cancel.on_cancel(lambda: self.withdraw(job))

    def withdraw(self, job: Job) -> None:
        """End a cancelled job that is still waiting (any thread)."""
        with self.cond:
            try:
                self.jobs.remove(job)
            except ValueError:
                return  # admitted (the engine ends it at its next step) or ended
            self.cond.notify()
        end_job(job, cancelled_result(job))

    def record_job_time(self, seconds: float) -> None:
        """Fold a finished job's admitted → finished time into the mean."""
        with self.cond:
            self.job_seconds += JOB_TIME_WEIGHT * (seconds - self.job_seconds) if self.job_seconds else seconds

    # ------------------------------------------------------- engine thread
    def drop_cancelled_locked(self) -> None:
        if not any(j.cancel.cancelled for j in self.jobs):
            return
        keep: deque[Job] = deque()
        for job in self.jobs:
            if job.cancel.cancelled:
                end_job(job, cancelled_result(job))
            else:
                keep.append(job)
        self.jobs = keep

    def admit_locked(self, running: int) -> list[tuple[Job, Slot, bool]]:
        """FIFO: the head of the wait list gets the next free slot, while
        fewer than ``parallel`` sequences run (``running`` now); a job that
        names a busy slot (``id_slot``) keeps its place and the jobs behind
        it go first, as llama-server defers it. Every slot
        has its own KV stream of the per-request context, which admission
        (``LlamaChatModel.check_admission``) already checked the job fits."""
        admitted: list[tuple[Job, Slot, bool]] = []
        i = 0
        while i < len(self.jobs) and running + len(admitted) < self.parallel:
            job = self.jobs[i]
            choice = self._slots.choose(job, taken={s for _, s, _ in admitted})
            if choice is None:
                if job.config.slot is None:
                    break
                i += 1
                continue
            slot, extension = choice
            del self.jobs[i]
            job.admitted_at = time.perf_counter()
            job.config.slot_used = slot.seq_id
            slot.busy = True
            admitted.append((job, slot, extension))
        return admitted

    def put_first(self, jobs: list[Job]) -> None:
        """Put ``jobs`` back at the head of the list, in their order."""
        with self.cond:
            self.jobs.extendleft(reversed(jobs))

    def take_all_locked(self) -> list[Job]:
        """Empty the list (the engine is stopping): the jobs it held."""
        waiting, self.jobs = list(self.jobs), deque()
        return waiting
