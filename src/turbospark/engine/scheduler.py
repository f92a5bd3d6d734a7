"""The scheduler: the one thread that touches a model's llama context.

:class:`Scheduler` composes the parts and runs their loop: the wait list
(``admission.WaitList``: reservations, the ``max_queue`` bound, FIFO
admission, withdrawal of cancelled waiting jobs), the session slots and the
prefix store behind them (``slots.SlotStore``: slot choice, prefix reuse from
the own slot, another slot or the host tier), the running sequences
(``sequences.Running``: how a job starts in its slot, how a sequence ends)
and the step (``steps.Stepper``: one ``llama_decode`` over every running
sequence, sampling, forks of ``n`` > 1 jobs, idle calibration). Each turn of
the loop, under the wait list's lock, drops cancelled jobs and sequences and
admits the head of the wait list; then it starts the admitted jobs and runs
one step.

It also answers the registry's watchdog (``failure``: an exception escaped
the loop and every job failed with it; ``stalled_for``) and offers a test
hook (``inject``: the next step sleeps and/or raises, on the real model's
thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from .admission import Reservation, WaitList
from .hostcache import HostCache
from .jobs import Job, end_job
from .llama import LlamaContext, LlamaModelFile
from .sequences import Running, task_view
from .slots import COPY_MIN_SHARE, COPY_MIN_TOKENS, Slot, SlotStore, TaskView
from .speculative import Calibration, StepCosts
from .steps import Stepper
from .types import EngineError, StepCounts

log = logging.getLogger("turbospark.engine")
T = TypeVar("T")


class Scheduler:
    """Owns a llama context and runs every generation of one model."""

    def __init__(
        self,
        model: LlamaModelFile,
        ctx: LlamaContext,
        *,
        parallel: int = 1,
        prefix_reuse: bool = True,
        max_queue: int = 0,
        prefill_chunk: int = 256,
        end_turn_tokens: frozenset[int] = frozenset(),
        speculative: bool = False,
        draft_max: int = 16,
        name: str = "model",
        on_step: Callable[[], None] | None = None,
        kv_copy: bool = True,
        copy_min_tokens: int = COPY_MIN_TOKENS,
        copy_min_share: float = COPY_MIN_SHARE,
        host_cache_bytes: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        self.name = name
        self._slots = SlotStore(
            ctx,
            name=name,
            prefix_reuse=prefix_reuse,
            kv_copy=kv_copy,
            copy_min_tokens=copy_min_tokens,
            copy_min_share=copy_min_share,
            host_cache_bytes=host_cache_bytes,
            cache_dir=cache_dir,
        )
        self._wait_list = WaitList(self._slots, max(1, parallel), max_queue)
        self._running = Running(model, self._slots, self._wait_list, speculative=speculative, draft_max=draft_max)
        step_costs = StepCosts(min(64, ctx.opts.n_batch))
        # batch sizes still to time while idle (see Stepper.calibrate)
        sizes = list(range(1, min(step_costs.limit, draft_max + 1) + 1))
        key = (model.path, ctx.threads, ctx.opts.n_batch, ctx.opts.flash_attn, len(sizes))
        self._calibration = Calibration(step_costs, key, sizes, speculative)
        self._steps = Stepper(
            model,
            ctx,
            self._running,
            self._slots,
            self._wait_list,
            step_costs=step_costs,
            prefill_chunk=prefill_chunk,
            end_turn_tokens=end_turn_tokens,
        )
        #: the session slots (llama.cpp sequence ids) and their records
        self.slots: list[Slot] = self._slots.slots
        #: the one lock: the wait list's (the loop waits on it for work)
        self._cond = self._wait_list.cond
        #: the running sequences (only the engine thread changes the list)
        self._active = self._running.active
        #: when the loop last began a step (or woke up for work): the
        #: watchdog's measure of progress (see :meth:`stalled_for`)
        self._progress_at = time.monotonic()
        #: test hooks (:meth:`inject`): the next step raises / sleeps first
        self._fault: Exception | None = None
        self._pause = 0.0
        self._on_step = on_step
        #: control operations to run on this thread between steps (:meth:`call`)
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._thread = threading.Thread(target=self._run, name=f"turbospark-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ settings
    @property
    def parallel(self) -> int:
        """How many sequences run at once."""
        return self._wait_list.parallel

    @property
    def max_queue(self) -> int:
        return self._wait_list.max_queue

    @property
    def speculative(self) -> bool:
        return self._running.speculative

    @property
    def prefix_reuse(self) -> bool:
        return self._slots.prefix_reuse

    @prefix_reuse.setter
    def prefix_reuse(self, on: bool) -> None:
        self._slots.prefix_reuse = on

    @property
    def kv_copy(self) -> bool:
        """Whether a long prefix shared with another slot's record is copied."""
        return self._slots.kv_copy

    @kv_copy.setter
    def kv_copy(self, on: bool) -> None:
        self._slots.kv_copy = on

    @property
    def counts(self) -> StepCounts:
        """What the steps did so far (``llama_decode`` calls, ... : llama-server's /metrics)."""
        return self._steps.counts

    @property
    def step_costs(self) -> StepCosts:
        """The step-cost table the draft-length choice reads."""
        return self._steps.step_costs

    @step_costs.setter
    def step_costs(self, costs: StepCosts) -> None:
        self._steps.step_costs = costs

    @property
    def host(self) -> HostCache:
        """The host-memory tier of evicted slots' states (--cache-ram)."""
        return self._slots.host

    @property
    def cache_dir(self) -> str | None:
        """Where the host tier is kept across restarts (--cache-dir), if anywhere."""
        return self._slots.cache_dir

    @property
    def failure(self) -> str | None:
        """Why the thread died, if an exception escaped its loop (the model
        is then failed: ``registry`` takes it out and reloads it)."""
        return self._wait_list.failure

    # ------------------------------------------------------------------ API
    def reserve(self) -> Reservation:
        """Hold a place for a request about to be submitted, or refuse it
        now (:class:`Overloaded`, with a Retry-After estimate): admission
        happens before any response byte, streams included."""
        return self._wait_list.reserve()

    def submit(self, job: Job) -> None:
        self._wait_list.submit(job)

    @property
    def waiting(self) -> int:
        return len(self._wait_list.jobs)

    @property
    def running(self) -> int:
        return len(self._active)

    def slot_view(self) -> list[dict[str, Any]]:
        return self._slots.view()

    @property
    def store(self) -> SlotStore:
        """The slots and their records (touch their KV only through :meth:`call`)."""
        return self._slots

    def tasks(self) -> list[TaskView | None]:
        """Per slot, the job it runs now (live), else the last one it ran,
        else None (read from any thread: a view, not a lock-step copy)."""
        running = {seq.slot.seq_id: seq for seq in list(self._active)}
        out: list[TaskView | None] = []
        for slot in self._slots.slots:
            seq = running.get(slot.seq_id)
            out.append(task_view(seq) if seq is not None else slot.task)
        return out

    def call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``fn`` on the engine thread between two steps (it may touch the
        KV and the slots' records) and return what it returns, or raise what
        it raises; :class:`EngineError` when the model stops first or the
        thread does not get to it within ``timeout`` seconds (it then never
        runs)."""
        future: Future[T] = Future()
        with self._cond:
            if self._wait_list.stopping:
                raise EngineError("the model is unloading")
            self._calls.append((fn, future))
            self._cond.notify()
        try:
            return future.result(timeout)
        except FutureTimeout:
            if future.cancel():
                raise EngineError(f"the engine did not get to it within {timeout:g}s") from None
            return future.result()

    def stalled_for(self) -> float:
        """Seconds since the loop last began a step while work is waiting or
        running (0 when there is none): a scheduler stuck inside the engine
        shows here (the registry's watchdog reads it)."""
        if not (self._wait_list.jobs or self._active) or self.failure is not None:
            return 0.0
        return max(0.0, time.monotonic() - self._progress_at)

    def inject(self, fault: Exception | None = None, pause: float = 0.0) -> None:
        """Test hook: the next engine step first sleeps ``pause`` seconds
        (a stuck engine) and then raises ``fault`` (an engine failure), on
        the real model's own thread."""
        with self._cond:
            self._fault, self._pause = fault, pause
            self._cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread (failing what is still queued or running) and
        wait until it has ended, so the context may be freed: a thread still
        inside ``llama_decode`` (a long prefill on a slow machine) is waited
        for, with a warning every ``timeout`` seconds, since freeing the
        context under it would crash the process."""
        with self._cond:
            self._wait_list.stopping = True
            self._cond.notify()
        self._slots.mark_closing()  # a next load of this model waits for its records
        self._thread.join(timeout)
        while self._thread.is_alive():
            log.warning("%s: the engine thread is still busy; waiting for it before freeing its context", self.name)
            self._thread.join(timeout)

    # ----------------------------------------------------------------- loop
    def _run(self) -> None:
        wait_list, slots, running = self._wait_list, self._slots, self._running
        try:
            if slots.cache_dir is not None:
                slots.load_host(slots.cache_dir)
            while True:
                with self._cond:
                    while not (
                        wait_list.stopping or wait_list.jobs or self._active or self._calibration or self._calls
                    ):
                        self._cond.wait()
                    if wait_list.stopping:
                        break
                    self._progress_at = time.monotonic()
                    calls = list(self._calls)
                    self._calls.clear()
                    wait_list.drop_cancelled_locked()
                    running.drop_cancelled()
                    admitted = wait_list.admit_locked(len(self._active))
                for fn, future in calls:
                    _answer(fn, future)
                if not admitted and not self._active and self._calibration:
                    self._steps.calibrate(self._calibration)
                    continue
                for job, slot, extension in admitted:
                    self._start(job, slot, extension)
                if self._active:
                    self._injected()
                    self._steps.step()
                    if self._on_step is not None:
                        self._on_step()
        except Exception as exc:  # never die silently: the model is marked failed
            log.exception("%s: the engine thread failed", self.name)
            wait_list.failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            for seq in list(self._active):
                running.fail(seq, EngineError(f"engine failure: {wait_list.failure}"))
        finally:
            self._stop()

    def _stop(self) -> None:
        """The loop's end: fail what still waits or runs, keep the host tier."""
        self._steps.counts.closed = True  # (no step runs any more)
        with self._cond:
            self._wait_list.stopping = True
            waiting = self._wait_list.take_all_locked()
            calls = list(self._calls)
            self._calls.clear()
        failure = self._wait_list.failure
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineError("the model was unloaded before this ran"))
        for job in waiting:
            end_job(
                job,
                EngineError(
                    f"engine failure: {failure}" if failure else "the model was unloaded before this request ran"
                ),
            )
        for seq in list(self._active):
            self._running.fail(seq, EngineError("the model was unloaded during this request"))
        if self._slots.cache_dir is not None:
            self._slots.persist_host(self._slots.cache_dir)

    def _start(self, job: Job, slot: Slot, extension: bool) -> None:
        """Start an admitted job in its slot (off the lock)."""
        self._running.start(job, slot, extension)

    def _injected(self) -> None:
        if not (self._fault or self._pause):
            return
        with self._cond:
            fault, pause = self._fault, self._pause
            self._fault, self._pause = None, 0.0
        if pause:
            time.sleep(pause)
        if fault is not None:
            raise fault


def _answer(fn: Callable[[], T], future: Future[T]) -> None:
    """Run a :meth:`Scheduler.call` (unless its caller gave up) and hand back
    its result or its exception."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except Exception as exc:  # noqa: BLE001 - the caller's to handle
        future.set_exception(exc)
