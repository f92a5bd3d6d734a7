"""The scheduler thread: the only code that touches a model's llama context.

Each step builds ONE batch holding the next token of every decoding sequence
plus prefill chunks of newly admitted ones (decoders first, so a long prompt
never starves them), runs ``llama_decode`` once, and samples every sequence
that produced logits with its own sampler chain.

Sequences live in session slots (llama.cpp sequence ids). A slot keeps a
record of the exact token ids in its KV after its turn ends, so the next
request that extends that conversation prefills only what is new.

Time attribution (CONTRACT §2): each request's timings are its own
wall-clock intervals, stamped with ``time.perf_counter`` on its job and
sequence, never shares of a batch step: queue = submitted
(``Job.submitted_at``) → given a slot (``Job.admitted_at``);
prefill = admitted → first token sampled (``Seq.first_token_at``); decode =
first token → last token sampled (``Seq.last_token_at``), 0 for one token.
Under batching the intervals of concurrent requests overlap, so a request's
``new_tokens / decode_seconds`` is the rate its client really saw. (The
draft-length choice needs the cost of a whole step, which ``StepCosts``
times per step, not per sequence.)

Session slots (CONTRACT §7): a slot holds the same conversation only when
the request carries the slot's session key, or its prompt starts with the
slot's whole previous prompt (a next turn, or a regenerate). Serving
anything else into a slot that held usable state is an eviction, even when
the common part (a shared system prompt) is still reused within the tenant.

KV shared across conversations (issue 13): when another slot's record of the
same owner (parked, or a running sequence's record: exactly what its KV holds
so far) shares a long prefix with a new prompt (``copy_min_tokens`` and
``copy_min_share`` of the prompt) and longer than the request's own slot
does, that prefix's KV is copied into the request's slot instead of
prefilled, and the source keeps its own. A cancelled sequence's record is
what it had put in the KV when it stopped, and cancelled sequences are
released before admission, so a client's retry continues where it stopped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .detok import IndentStop, StopMatcher, Utf8Stream
from .hostcache import FolderLock, HostCache, common_prefix, folder_problem
from .llama import Batch, LlamaContext, LlamaModelFile
from .sampling import SamplerChain
from .speculative import TIMING_LOCK, Calibration, NgramDrafter, StepCosts
from .types import (
    AdmissionError,
    CancelFlag,
    EngineError,
    GenerationConfig,
    Overloaded,
    Progress,
    RawDecodeResult,
    StopReason,
    TokenProb,
)

log = logging.getLogger("turbospark.engine")


class JobOutput(Protocol):
    """Where a job's progress and result go (:class:`channel.Channel`)."""

    def put(self, item: Any) -> None: ...


@dataclass(eq=False)
class Job:
    prompt: list[int]
    config: GenerationConfig
    cancel: CancelFlag
    sink: JobOutput
    submitted_at: float = field(default_factory=time.perf_counter)
    #: when it was given a slot (perf_counter; 0 until then)
    admitted_at: float = 0.0
    #: the other choices of an ``n`` > 1 request (same prompt): they start
    #: when this job's prompt is in the KV, each in a slot of its own with
    #: a copy of that KV, sampling its first token from the same logits
    siblings: list[Job] = field(default_factory=list)


@dataclass(eq=False)
class Slot:
    """One llama.cpp sequence id and the record of what its KV holds."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    owner: str = ""
    session_key: str | None = None
    last_used: float = 0.0
    busy: bool = False
    #: how many of ``tokens`` are the previous job's prompt (the rest is what
    #: it generated): the part a next turn of the same conversation repeats
    prompt_len: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "id": self.seq_id,
            "state": "busy" if self.busy else ("parked" if self.tokens else "empty"),
            "owner": self.owner,
            "session_key": self.session_key,
            "tokens_cached": len(self.tokens),
            "last_used": self.last_used,
        }


def _miss_at(records: dict[Slot, int], prompt: list[int]) -> int | None:
    """Where the prompt first differs from the record that shares the most
    with it (``records``: record -> shared prefix); None when there is none
    or the prompt extends it whole (all it holds is reused)."""
    if not records:
        return None
    best = max(records, key=lambda s: records[s])
    n = records[best]
    return None if n >= len(best.tokens) or n >= len(prompt) else n


def _runs(ids: set[int]) -> int:
    """How many runs of consecutive integers ``ids`` forms."""
    return sum(1 for i in ids if i - 1 not in ids)


def _holds_prefix_of(slot: Slot, prompt: list[int]) -> bool:
    """Whether ``prompt`` starts with the slot's whole previous prompt (as
    far as its record holds it: a prefill cut short keeps only a part)."""
    n = min(slot.prompt_len, len(slot.tokens))
    return n > 0 and len(prompt) >= n and prompt[:n] == slot.tokens[:n]


class Reservation:
    """A place on a scheduler's wait list, held from admission (before any
    response byte) until the job that takes it is submitted, or released.
    Releasing twice, or after the job took it, does nothing."""

    __slots__ = ("_scheduler", "held")

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self.held = True

    def release(self) -> None:
        self._scheduler._unreserve(self)


#: weight of the newest job in the mean job time behind Retry-After
JOB_TIME_WEIGHT = 0.2

#: A prompt's prefix shared with ANOTHER slot's record (same owner) is copied
#: from that slot's KV instead of prefilled when it is at least this many
#: tokens ...
COPY_MIN_TOKENS = 256
#: ... and at least this share of the prompt (and longer than what the
#: request's own slot already shares with it).
COPY_MIN_SHARE = 0.5
#: a state saved in the host tier is restored when it offers at least this
#: many more prompt tokens than the slots do (loading a state costs little
#: next to prefilling: ~40 ms for 2,000 tokens of SmolLM2 here)
HOST_MIN_TOKENS = 64


class Seq:
    """A running sequence: one job in one slot."""

    __slots__ = (
        "job",
        "slot",
        "chain",
        "pending",
        "fed",
        "n_past",
        "last_token",
        "decoding",
        "new_tokens",
        "generated",
        "utf8",
        "stops",
        "text",
        "out",
        "reused",
        "evicted",
        "admitted_at",
        "first_token_at",
        "last_token_at",
        "max_new",
        "finished",
        "drafter",
        "drafted",
        "accepted",
        "reused_from",
        "probs",
        "probs_out",
        "miss_at",
        "indent",
    )

    def __init__(
        self, job: Job, slot: Slot, chain: SamplerChain, reused: int, evicted: bool, reused_from: str | None = None
    ):
        self.job = job
        self.slot = slot
        self.chain = chain
        self.pending = job.prompt[reused:]
        self.fed = 0  # how many of `pending` are in the KV
        self.n_past = reused
        self.last_token = -1
        self.decoding = False
        self.new_tokens = 0
        self.generated: list[int] = []
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(job.config.stop)
        self.indent = IndentStop(job.config.n_indent) if job.config.n_indent > 0 else None
        self.text: list[str] = []
        self.out: list[str] = []
        self.reused = reused
        #: "slot" (the slot's own KV), "copy" (another slot's), None
        self.reused_from = reused_from if reused else None
        self.evicted = evicted
        # wall-clock stamps (perf_counter) behind the reported timings
        self.admitted_at = job.admitted_at or time.perf_counter()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.max_new = job.config.max_new_tokens
        self.finished = False
        self.drafter: NgramDrafter | None = None
        self.drafted = 0
        self.accepted = 0
        #: the sampled tokens' log-probabilities (when asked for), and those
        #: not yet handed out with a Progress
        self.probs: list[TokenProb] = []
        self.probs_out: list[TokenProb] = []
        self.miss_at: int | None = None


@dataclass(slots=True)
class Feed:
    """One sequence's part of a step: the tokens it feeds, which outputs it
    wants (``all``: a decoder's token and its drafts; ``last``: a prompt's
    final chunk; ``none``: a chunk mid-prompt), the drafted tokens among
    them, and where its first output lands in the batch (-1: none)."""

    seq: Seq
    tokens: list[int]
    logits: str
    drafts: list[int] = field(default_factory=list)
    first: int = -1


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
        self.model = model
        self.ctx = ctx
        self.name = name
        self.parallel = max(1, parallel)
        self.prefix_reuse = prefix_reuse
        #: copy a long prefix shared with another slot's record (see _copy_source)
        self.kv_copy = kv_copy
        self.copy_min_tokens = copy_min_tokens
        self.copy_min_share = copy_min_share
        #: the second tier: evicted slots' states in host memory (--cache-ram)
        self.host = HostCache(host_cache_bytes if prefix_reuse else 0)
        #: where the host tier is kept across restarts (--cache-dir), if anywhere
        self.cache_dir = cache_dir if self.host.enabled else None
        self._folder_lock: FolderLock | None = None
        self.max_queue = max_queue
        self.prefill_chunk = max(1, prefill_chunk)
        self.end_turn_tokens = end_turn_tokens
        self.speculative = speculative
        self.draft_max = draft_max
        self.step_costs = StepCosts(min(64, ctx.opts.n_batch))
        # batch sizes still to time while idle (see _calibrate)
        sizes = list(range(1, min(self.step_costs.limit, draft_max + 1) + 1))
        key = (model.path, ctx.threads, ctx.opts.n_batch, ctx.opts.flash_attn, len(sizes))
        self._calibration = Calibration(self.step_costs, key, sizes, speculative)
        self.slots = [Slot(i) for i in range(ctx.opts.n_seq_max)]
        self._batch = Batch(ctx.opts.n_batch)
        self._waiting: deque[Job] = deque()
        self._active: list[Seq] = []
        #: places held on the wait list by admitted requests not yet submitted
        self._reserved = 0
        #: decayed mean of admitted → finished seconds, for Retry-After
        self._job_seconds = 0.0
        self._cond = threading.Condition()
        self._stopping = False
        #: why the thread died, if an exception escaped its loop (the model
        #: is then failed: ``registry`` takes it out and reloads it)
        self.failure: str | None = None
        #: when the loop last began a step (or woke up for work): the
        #: watchdog's measure of progress (see :meth:`stalled_for`)
        self._progress_at = time.monotonic()
        #: test hooks (:meth:`inject`): the next step raises / sleeps first
        self._fault: Exception | None = None
        self._pause = 0.0
        self._on_step = on_step
        self._pieces = model.pieces
        self._eog = model.eog_tokens
        self._thread = threading.Thread(target=self._run, name=f"turbospark-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ API
    def reserve(self) -> Reservation:
        """Hold a place for a request about to be submitted, or refuse it
        now (:class:`Overloaded`, with a Retry-After estimate): admission
        happens before any response byte, streams included."""
        with self._cond:
            self._check_room_locked()
            self._reserved += 1
            return Reservation(self)

    def _unreserve(self, reservation: Reservation) -> None:
        with self._cond:
            if reservation.held:
                reservation.held = False
                self._reserved -= 1

    def _check_room_locked(self) -> None:
        if self._stopping:
            raise EngineError(f"engine failure: {self.failure}" if self.failure else "the model is shutting down")
        if not self.max_queue:
            return
        # free sequences take submitted jobs at once: they are no wait (a job
        # being started, its slot taken but not yet running, is not free)
        free = max(0, self.parallel - sum(1 for s in self.slots if s.busy))
        if len(self._waiting) + self._reserved >= self.max_queue + free:
            raise Overloaded(
                f"the wait list is full ({self.max_queue} requests waiting); try again shortly",
                retry_after=self.retry_after_locked(),
            )

    def retry_after_locked(self) -> int:
        """Seconds until a place is likely free: the jobs ahead times the
        recent mean job time, over the sequences that run them (≥ 1)."""
        ahead = len(self._waiting) + self._reserved
        return max(1, math.ceil(ahead * self._job_seconds / self.parallel))

    def submit(self, job: Job) -> None:
        with self._cond:
            held = job.config.reservation
            if isinstance(held, Reservation) and held._scheduler is self:
                # an admitted request: its first run takes the place it held;
                # its guardrail re-ask (same reservation) is never refused
                if held.held:
                    held.held = False
                    self._reserved -= 1
                if self._stopping:
                    raise EngineError("the model is shutting down")
            else:
                self._check_room_locked()
            self._waiting.append(job)
            self._cond.notify()
        # a client that leaves while its job waits gives its place back at
        # once (the engine may be inside a long step; the next request in
        # line, or one refused by a full wait list, need not wait for it)
        job.cancel.on_cancel(lambda: self._withdraw(job))

    def _withdraw(self, job: Job) -> None:
        """End a cancelled job that is still waiting (any thread)."""
        with self._cond:
            try:
                self._waiting.remove(job)
            except ValueError:
                return  # admitted (the engine ends it at its next step) or ended
            self._cond.notify()
        self._end(job, self._cancelled_result(job))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

    def slot_view(self) -> list[dict[str, Any]]:
        return [s.snapshot() for s in self.slots]

    def stalled_for(self) -> float:
        """Seconds since the loop last began a step while work is waiting or
        running (0 when there is none): a scheduler stuck inside the engine
        shows here (the registry's watchdog reads it)."""
        if not (self._waiting or self._active) or self.failure is not None:
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
            self._stopping = True
            self._cond.notify()
        if self._folder_lock is not None:
            self._folder_lock.closing = True  # a next load of this model waits for its records
        self._thread.join(timeout)
        while self._thread.is_alive():
            log.warning("%s: the engine thread is still busy; waiting for it before freeing its context", self.name)
            self._thread.join(timeout)

    # ----------------------------------------------------------------- loop
    def _run(self) -> None:
        try:
            if self.cache_dir is not None:
                self._load_host(self.cache_dir)
            while True:
                with self._cond:
                    while not self._stopping and not self._waiting and not self._active and not self._calibration:
                        self._cond.wait()
                    if self._stopping:
                        break
                    self._progress_at = time.monotonic()
                    self._drop_cancelled_waiting()
                    self._drop_cancelled_running()
                    admitted = self._admit_locked()
                if not admitted and not self._active and self._calibration:
                    self._calibrate(self._calibration.next_size())
                    continue
                for job, slot, extension in admitted:
                    self._start(job, slot, extension)
                if self._active:
                    self._injected()
                    self._step()
                    if self._on_step is not None:
                        self._on_step()
        except Exception as exc:  # never die silently: the model is marked failed
            log.exception("%s: the engine thread failed", self.name)
            self.failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            for seq in list(self._active):
                self._fail(seq, EngineError(f"engine failure: {self.failure}"))
        finally:
            with self._cond:
                self._stopping = True
                waiting, self._waiting = list(self._waiting), deque()
            for job in waiting:
                self._end(
                    job,
                    EngineError(
                        f"engine failure: {self.failure}"
                        if self.failure
                        else "the model was unloaded before this request ran"
                    ),
                )
            for seq in list(self._active):
                self._fail(seq, EngineError("the model was unloaded during this request"))
            if self.cache_dir is not None:
                self._persist_host(self.cache_dir)

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

    def _load_host(self, folder: str) -> None:
        """Take the folder (one server at a time) and read its records; a
        folder that cannot keep them, or another server's, leaves the tier in
        memory only, with a warning (never a reason to fail the model)."""
        problem = folder_problem(folder)
        lock = FolderLock(folder)
        if problem is None:
            problem = lock.acquire()
        if problem is not None:
            log.warning("%s: KV cache folder %s: %s; the host tier is kept in memory only", self.name, folder, problem)
            self.cache_dir = None
            return
        self._folder_lock = lock
        try:
            n = self.host.load(folder)
        except Exception:  # noqa: BLE001 - the second tier never fails the model
            log.exception("%s: reading the KV records in %s failed", self.name, folder)
            return
        if n:
            log.info("%s: %d saved KV record(s) loaded from %s", self.name, n, folder)

    def _persist_host(self, folder: str) -> None:
        """Park every slot's record in the host tier, then write the tier to
        ``folder`` (the scheduler thread, on its way out: it owns the KV)."""
        if self._folder_lock is not None:
            self._folder_lock.closing = True  # a next load of this model waits for it
        try:
            for slot in self.slots:
                if slot.tokens:
                    self._save_to_host(slot)
            n = self.host.persist(folder)
            log.info("%s: %d KV record(s) kept in %s", self.name, n, folder)
        except Exception:  # never fail a shutdown over the second tier
            log.exception("keeping the KV records in %s failed", folder)
        finally:
            if self._folder_lock is not None:
                self._folder_lock.release()

    def _calibrate(self, n: int) -> None:
        """Time one decode step of ``n`` tokens on an idle slot (after its
        cached tokens, removed again at once), so the draft-length choice
        knows this machine's step costs before requests need them. Runs only
        while nothing waits; what is timed and how the table is made is
        ``speculative.Calibration``'s."""
        slot = max(self.slots, key=lambda s: self.ctx.n_ctx_seq - len(s.tokens))
        p0 = len(slot.tokens)
        if slot.busy or p0 + max(n, 1) > self.ctx.n_ctx_seq:
            self._calibration.abandon()
            return
        batch = self._batch
        batch.clear()
        for j in range(max(n, 1)):
            batch.add(self.model.bos if self.model.bos >= 0 else 0, p0 + j, slot.seq_id, True)
        with TIMING_LOCK:
            t0 = time.perf_counter()
            rc = self.ctx.decode(batch)
            dt = time.perf_counter() - t0
        self.ctx.seq_rm(slot.seq_id, p0, -1)
        if rc != 0:
            self._calibration.abandon()
            return
        self._calibration.record(n, dt)

    def _drop_cancelled_waiting(self) -> None:
        if not any(j.cancel.cancelled for j in self._waiting):
            return
        keep: deque[Job] = deque()
        for job in self._waiting:
            if job.cancel.cancelled:
                self._end(job, self._cancelled_result(job))
            else:
                keep.append(job)
        self._waiting = keep

    def _drop_cancelled_running(self) -> None:
        """End the running sequences whose client left BEFORE admission, so
        a job submitted after the cancel (a client's retry) finds their slots
        free, each slot's record being exactly the part of the prompt (and
        output) that its sequence had put in the KV."""
        for seq in [s for s in self._active if s.job.cancel.cancelled]:
            self._finish(seq, StopReason.CANCELLED)

    def _cancelled_result(self, job: Job) -> RawDecodeResult:
        return RawDecodeResult(
            prompt_tokens=len(job.prompt),
            new_tokens=0,
            prefill_seconds=0.0,
            decode_seconds=0.0,
            reason=StopReason.CANCELLED,
            queue_seconds=time.perf_counter() - job.submitted_at,
        )

    # ------------------------------------------------------------ admission
    def _admit_locked(self) -> list[tuple[Job, Slot, bool]]:
        """FIFO: the head of the wait list gets the next free slot. Every slot
        has its own KV stream of the per-request context, which admission
        (``LlamaChatModel.check_admission``) already checked the job fits."""
        admitted: list[tuple[Job, Slot, bool]] = []
        while self._waiting and len(self._active) + len(admitted) < self.parallel:
            job = self._waiting[0]
            choice = self._choose_slot(job, taken={s for _, s, _ in admitted})
            if choice is None:
                break
            slot, extension = choice
            self._waiting.popleft()
            job.admitted_at = time.perf_counter()
            slot.busy = True
            admitted.append((job, slot, extension))
        return admitted

    def _choose_slot(self, job: Job, taken: set[Slot]) -> tuple[Slot, bool] | None:
        """The slot holding this conversation (its session key, else a
        record whose whole previous prompt the new prompt starts with), else
        an empty one, else the least recently used. Returns (slot,
        is_same_conversation)."""
        free = [s for s in self.slots if not s.busy and s not in taken]
        if not free:
            return None
        cfg = job.config
        mine = [s for s in free if s.owner == cfg.owner and s.tokens]
        if cfg.session_key is not None:
            for s in mine:
                if s.session_key == cfg.session_key:
                    return s, True
            mine = [s for s in mine if s.session_key is None]
        if self.prefix_reuse and mine:
            # The same conversation: the prompt starts with the slot's WHOLE
            # previous prompt (a next turn re-renders the previous prompt,
            # then the answer, which may not match the generated tokens
            # exactly; a regenerate repeats it). A prompt that merely shares
            # a system prompt with a parked conversation is another one: it
            # takes an empty slot, so both keep their state, else evicts.
            same = [s for s in mine if _holds_prefix_of(s, job.prompt)]
            if same:
                # the record sharing the longest prefix (a cancelled prefill's
                # partial record included), then the most recent
                best = max(same, key=lambda s: (common_prefix(s.tokens, job.prompt), s.last_used))
                return best, True
        empty = [s for s in free if not s.tokens]
        if empty:
            # keep running sequences on consecutive ids: llama.cpp batches
            # only runs of consecutive ids in one pass (see _step)
            busy = {s.seq_id for s in self.slots if s.busy} | {s.seq_id for s in taken}
            return min(empty, key=lambda s: (_runs(busy | {s.seq_id}), s.seq_id)), False
        return min(free, key=lambda s: s.last_used), False

    def _start(self, job: Job, slot: Slot, extension: bool) -> None:
        cfg = job.config
        if job.cancel.cancelled:
            slot.busy = False
            self._end(job, self._cancelled_result(job))
            return
        records = self._records_shared(job)
        miss_at = _miss_at(records, job.prompt)
        evicted = bool(slot.tokens) and not extension
        if evicted and self.host.enabled:
            self._save_to_host(slot)  # the conversation it held moves to the host tier
        reuse = 0
        if self.prefix_reuse and slot in records:
            reuse = min(records[slot], len(job.prompt) - 1)
        reused_from = "slot"
        source, shared = self._copy_source(job, slot, reuse, records)
        saved, restore = self._host_source(job, max(reuse, shared))
        if saved >= 0:
            reuse = self._restore_from_host(saved, slot, restore)
            reused_from = "host"
        elif source is not None:
            reuse = self._copy_prefix(source, slot, shared)
            reused_from = "copy"
        elif reuse < len(slot.tokens):
            if not self.ctx.seq_rm(slot.seq_id, reuse, -1):
                self.ctx.seq_rm(slot.seq_id)
                reuse = 0
        slot.tokens = job.prompt[:reuse]
        slot.prompt_len = len(job.prompt)
        slot.owner = cfg.owner
        slot.session_key = cfg.session_key
        try:
            chain = SamplerChain(self.model, cfg)
        except Exception as exc:
            slot.busy = False
            self._end(job, exc if isinstance(exc, AdmissionError) else EngineError(str(exc)))
            return
        seq = Seq(job, slot, chain, reuse, evicted, reused_from)
        seq.miss_at = miss_at
        if self.speculative and cfg.speculative:
            seq.drafter = NgramDrafter(job.prompt, k_max=self.draft_max)
        self._active.append(seq)

    def _records_shared(self, job: Job) -> dict[Slot, int]:
        """How much of the prompt each record of the job's owner shares with
        it (every slot holding tokens), computed once per admission: the own
        slot's reuse, the copy source and ``prefixMissAt`` all read it."""
        owner, prompt = job.config.owner, job.prompt
        return {s: common_prefix(s.tokens, prompt) for s in self.slots if s.owner == owner and s.tokens}

    def _copy_source(self, job: Job, dst: Slot, own: int, records: dict[Slot, int]) -> tuple[Slot | None, int]:
        """The other slot of the job's owner whose record shares the longest
        prefix with the prompt (a parked conversation, or a running one's
        record: exactly what its KV holds so far), with that prefix's length
        (capped at prompt length - 1), when copying it is worth it: at least
        ``copy_min_tokens``, at least ``copy_min_share`` of the prompt, and
        longer than the ``own`` tokens ``dst`` already shares. Else (None, 0)."""
        if not (self.prefix_reuse and self.kv_copy):
            return None, 0
        prompt = job.prompt
        limit = len(prompt) - 1
        need = max(self.copy_min_tokens, math.ceil(self.copy_min_share * len(prompt)), own + 1, 1)
        if need > limit:
            return None, 0
        best: Slot | None = None
        best_n = 0
        for s, shared in records.items():
            if s is dst or len(s.tokens) < need:
                continue
            n = min(shared, limit)
            # ties: the smaller record (less to copy)
            if n >= need and (n > best_n or (best is not None and n == best_n and len(s.tokens) < len(best.tokens))):
                best, best_n = s, n
        return best, best_n

    def _fork(self, seq: Seq, idx: int) -> None:
        """Start the other choices of ``seq``'s request now that its prompt
        is in the KV: each takes a free slot, gets a copy of that KV, and
        samples its first token from the logits at ``idx`` (with its own
        sampler), so the prompt is prefilled once for all of them. A choice
        that finds no free slot waits at the head of the list; when it
        starts it copies the prompt's KV like any same-owner prefix."""
        siblings, seq.job.siblings = seq.job.siblings, []
        waiting: list[Job] = []
        for job in siblings:
            choice = None
            if len(self._active) < self.parallel and not job.cancel.cancelled:
                choice = self._choose_slot(job, set())
            if choice is None or not self._fork_into(seq, job, *choice, idx):
                waiting.append(job)
        if waiting:
            with self._cond:
                self._waiting.extendleft(reversed(waiting))  # in choice order, ahead of the rest

    def _fork_into(self, seq: Seq, job: Job, slot: Slot, extension: bool, idx: int) -> bool:
        evicted = bool(slot.tokens) and not extension
        if evicted and self.host.enabled:
            self._save_to_host(slot)  # the conversation it held moves to the host tier
        n = seq.n_past
        if self._copy_prefix(seq.slot, slot, n) != n:
            slot.tokens, slot.prompt_len = [], 0  # its KV was emptied
            return False
        try:
            chain = SamplerChain(self.model, job.config)
        except Exception as exc:
            self._end(job, exc if isinstance(exc, AdmissionError) else EngineError(str(exc)))
            return True
        job.admitted_at = time.perf_counter()
        slot.busy = True
        slot.tokens = list(job.prompt)
        slot.prompt_len = len(job.prompt)
        slot.owner = job.config.owner
        slot.session_key = job.config.session_key
        fork = Seq(job, slot, chain, n, evicted, "copy")
        if self.speculative and job.config.speculative:
            fork.drafter = NgramDrafter(job.prompt, k_max=self.draft_max)
        self._active.append(fork)
        self._sample(fork, idx)
        return True

    def _save_to_host(self, slot: Slot) -> None:
        """Keep a slot's state in the host tier before another conversation
        takes the slot (a state larger than the whole budget is dropped)."""
        try:
            state = self.ctx.seq_state(slot.seq_id)
        except Exception:  # never fail a request over the second tier
            log.exception("saving slot %d to the host tier failed", slot.seq_id)
            return
        self.host.put(slot.owner, slot.tokens, state, slot.prompt_len)

    def _host_source(self, job: Job, have: int) -> tuple[int, int]:
        """(key, prefix) of the job owner's saved state sharing the longest
        prefix with the prompt, when it beats the ``have`` tokens a slot
        offers by at least ``HOST_MIN_TOKENS``; else (-1, 0)."""
        if not self.host.enabled or not len(self.host):
            return -1, 0
        key, n = self.host.best(job.config.owner, job.prompt)
        n = min(n, len(job.prompt) - 1)
        if key < 0 or n < have + HOST_MIN_TOKENS:
            return -1, 0
        return key, n

    def _restore_from_host(self, key: int, dst: Slot, n: int) -> int:
        """Load a saved state into ``dst`` and keep its first ``n``
        positions; returns the tokens ``dst`` holds (0 if that failed)."""
        ctx = self.ctx
        ctx.seq_rm(dst.seq_id)
        entry = self.host.get(key)
        # the state must end where its tokens say: the next decode continues
        # there (one that does not fails llama_decode for every sequence in
        # the step). (Its first position is not checked: a sliding-window
        # cache reports the window's.)
        if ctx.set_seq_state(dst.seq_id, entry.state) and ctx.seq_pos_max(dst.seq_id) == len(entry.tokens) - 1:
            if ctx.seq_rm(dst.seq_id, n, -1):
                log.debug("restored %d tokens of KV from the host tier into slot %d", n, dst.seq_id)
                return n
            ctx.seq_rm(dst.seq_id)  # a memory that cannot keep a part: the record stays for a whole match
            return 0
        log.warning("%s: a saved KV record would not restore; dropped", self.name)
        self.host.discard(key)  # never tried again, nor kept on disk
        ctx.seq_rm(dst.seq_id)
        return 0

    def _copy_prefix(self, src: Slot, dst: Slot, n: int) -> int:
        """Make ``dst``'s KV hold ``src``'s first ``n`` positions; ``src``
        keeps all of its own. With one KV stream per sequence llama.cpp
        copies whole streams only (the data moves at the start of the next
        decode, before anything is written, so it is what ``src.tokens``
        says now): copy the whole sequence, then drop ``dst``'s part past
        ``n``. Returns the tokens ``dst`` now holds: ``n``, or 0 when the
        memory cannot drop a partial sequence (``dst`` is then emptied)."""
        ctx = self.ctx
        ctx.seq_rm(dst.seq_id)
        ctx.seq_cp(src.seq_id, dst.seq_id)
        if ctx.seq_rm(dst.seq_id, n, -1):
            log.debug("copied %d tokens of KV from slot %d into slot %d", n, src.seq_id, dst.seq_id)
            return n
        ctx.seq_rm(dst.seq_id)
        return 0

    # ----------------------------------------------------------------- step
    def _step(self) -> None:
        batch = self._batch
        batch.clear()
        for seq in list(self._active):
            if seq.job.cancel.cancelled:
                self._finish(seq, StopReason.CANCELLED)
        if not self._active:
            return
        # Choose the tokens: decoders first (one token each, plus drafts), so
        # a long prompt never starves them; then prefill chunks in the room
        # left.
        room = batch.capacity
        chosen: list[Feed] = []
        decoders = sum(1 for seq in self._active if seq.decoding)
        base = decoders - 1  # other tokens in the step, for the draft-length choice
        # Drafts are priced for everyone: beside other sequences (decoding or
        # prefilling, they all wait for this step), all drafts together may
        # slow the step by at most NEIGHBOUR_TAX over the same step without.
        spare = room
        if len(self._active) > 1:
            plain = min(
                room,
                decoders + sum(min(len(s.pending) - s.fed, self.prefill_chunk) for s in self._active if not s.decoding),
            )
            spare = self.step_costs.affordable(plain) - plain
        for seq in self._active:
            if seq.decoding:
                drafts: list[int] = []
                if seq.drafter is not None:
                    cap = min(room - 1, spare)
                    drafts = seq.drafter.draft(seq.max_new - seq.new_tokens - 1)[: max(0, cap)]
                    drafts = seq.drafter.choose(self.step_costs, base, drafts)
                    base += len(drafts)
                    spare -= len(drafts)
                chosen.append(Feed(seq, [seq.last_token, *drafts], "all", drafts))
                room -= 1 + len(drafts)
        pure_decode = True
        # Beside decoders a prompt goes in prefill_chunk pieces, so their next
        # token never waits long; with nobody decoding, the prompts share the
        # whole batch (fewer, larger steps: each step reads the KV so far once,
        # which dominates a long prompt's prefill)
        prefilling = len(self._active) - decoders
        chunk_limit = self.prefill_chunk if decoders else max(self.prefill_chunk, room // max(1, prefilling))
        for seq in self._active:
            if seq.decoding or room <= 0:
                continue
            remaining = len(seq.pending) - seq.fed
            take = min(remaining, room, chunk_limit)
            chunk = seq.pending[seq.fed : seq.fed + take]
            chosen.append(Feed(seq, chunk, "last" if take == remaining else "none"))
            room -= take
            pure_decode = False
        # Write them in sequence-id order: with one KV stream per sequence,
        # llama.cpp computes a batch in one pass only over runs of
        # consecutive sequence ids (its "sequential equal split").
        chosen.sort(key=lambda f: f.seq.slot.seq_id)
        for feed in chosen:
            seq, sid = feed.seq, feed.seq.slot.seq_id
            if feed.logits == "all":
                feed.first = batch.n
                for j, t in enumerate(feed.tokens):
                    batch.add(t, seq.n_past + j, sid, True)
            else:
                idx = batch.add_run(feed.tokens, seq.n_past, sid, feed.logits == "last")
                feed.first = idx if feed.logits == "last" else -1
        if not chosen:
            return
        t0 = time.perf_counter()
        rc = self.ctx.decode(batch)
        dt = time.perf_counter() - t0
        if pure_decode and rc == 0:
            self.step_costs.observe(batch.n, dt)
        if rc != 0:
            err = EngineError(f"llama_decode failed (code {rc})")
            for feed in chosen:
                seq = feed.seq
                self.ctx.seq_rm(seq.slot.seq_id)
                seq.slot.tokens = []
                seq.slot.prompt_len = 0
                self._fail(seq, err)
            return
        for feed in chosen:
            seq, k, idx = feed.seq, len(feed.tokens), feed.first
            if seq.decoding:
                seq.slot.tokens.append(seq.last_token)
                seq.n_past += 1
                self._sample(seq, idx)
                if feed.drafts:
                    self._verify(seq, idx, feed.drafts)
                continue
            seq.slot.tokens.extend(seq.pending[seq.fed : seq.fed + k])
            seq.fed += k
            seq.n_past += k
            if idx >= 0:
                if seq.job.siblings:
                    self._fork(seq, idx)
                self._sample(seq, idx)
        for feed in chosen:
            seq = feed.seq
            if (seq.out or seq.probs_out) and not seq.finished:
                self._hand_out(seq, 1)

    def _verify(self, seq: Seq, idx: int, drafts: list[int]) -> None:
        """Keep the drafts the model agrees with; roll the KV back past the
        first one it rejects. ``_sample`` at ``idx`` already ran."""
        j = 0
        seq.drafted += len(drafts)
        while not seq.finished and j < len(drafts) and seq.last_token == drafts[j]:
            # drafts[j] is already in the KV at position n_past: accept it
            seq.slot.tokens.append(drafts[j])
            seq.n_past += 1
            seq.accepted += 1
            j += 1
            self._sample(seq, idx + j)
        if seq.drafter is not None:
            seq.drafter.feedback(len(drafts), j)
        if j < len(drafts):
            self.ctx.seq_rm(seq.slot.seq_id, seq.n_past, -1)

    def _sample(self, seq: Seq, idx: int) -> None:
        token = seq.chain.sample(self.ctx.ptr, idx)
        seq.last_token_at = time.perf_counter()
        if not seq.decoding:
            seq.first_token_at = seq.last_token_at
            seq.decoding = True
        seq.new_tokens += 1
        if token in self._eog:
            self._finish(seq, StopReason.END_OF_TURN if token in self.end_turn_tokens else StopReason.EOS)
            return
        seq.generated.append(token)
        if seq.chain.probs is not None:
            self._record_probs(seq, token, *seq.chain.probs)
        text = seq.utf8.feed(self._pieces[token])
        if text:
            emit, hit = seq.stops.feed(text)
            cut = False
            if seq.indent is not None and emit:
                emit, cut = seq.indent.feed(emit)
            if emit:
                seq.out.append(emit)
                seq.text.append(emit)
            if cut:  # (at or before any stop string; what the matcher holds comes after it)
                self._finish(seq, StopReason.MAX_TOKENS, flush=False)
                return
            if hit:
                self._finish(seq, StopReason.STOP_STRING, flush=False)
                return
            # llama.cpp's t_max_predict_ms: judged only as a line ends, so a line is never cut
            limit = seq.job.config.max_predict_seconds
            if limit and "\n" in emit and seq.last_token_at - (seq.first_token_at or seq.last_token_at) > limit:
                self._finish(seq, StopReason.MAX_TOKENS)
                return
        if seq.new_tokens >= seq.max_new:
            self._finish(seq, StopReason.MAX_TOKENS)
            return
        seq.last_token = token
        if seq.drafter is not None:
            seq.drafter.push(token)

    def _record_probs(self, seq: Seq, token: int, logprob: float, top: list[tuple[int, float]]) -> None:
        pieces = self._pieces
        alternatives = tuple(TokenProb(t, pieces[t], lp) for t, lp in top)
        prob = TokenProb(token, pieces[token], logprob, alternatives)
        seq.probs.append(prob)
        seq.probs_out.append(prob)

    @staticmethod
    def _hand_out(seq: Seq, tokens: int) -> None:
        """The text and log-probabilities produced since the last Progress."""
        opening = seq.chain.opening_state
        if seq.probs_out:
            seq.job.sink.put(Progress("".join(seq.out), tokens, seq.probs_out, opening=opening))
            seq.probs_out = []
        else:
            seq.job.sink.put(Progress("".join(seq.out), tokens, opening=opening))
        seq.out.clear()

    # -------------------------------------------------------------- endings
    def _release(self, seq: Seq) -> None:
        took = time.perf_counter() - seq.admitted_at
        with self._cond:
            self._job_seconds += JOB_TIME_WEIGHT * (took - self._job_seconds) if self._job_seconds else took
        seq.finished = True
        seq.chain.close()
        seq.slot.busy = False
        seq.slot.last_used = time.time()
        if seq in self._active:
            self._active.remove(seq)

    def _finish(self, seq: Seq, reason: StopReason, flush: bool = True) -> None:
        if reason is StopReason.STOP_STRING and seq.probs:
            self._drop_stop_probs(seq)
        if flush:
            cut = reason in (StopReason.MAX_TOKENS, StopReason.CANCELLED)
            tail, _ = seq.stops.feed(seq.utf8.flush(cut))
            tail += seq.stops.flush()
            if tail and seq.indent is not None:
                tail, _ = seq.indent.feed(tail)
            if tail:
                seq.out.append(tail)
                seq.text.append(tail)
        if seq.out or seq.probs_out:
            self._hand_out(seq, 0)
        self._release(seq)
        check = seq.job.config.tool_call_check
        if check is not None and reason in (StopReason.END_OF_TURN, StopReason.EOS):
            try:
                if check("".join(seq.text)):
                    reason = StopReason.TOOL_CALLS
            except Exception:  # a parser bug must not fail the generation
                log.exception("tool-call check failed")
        prefill_s, decode_s = self._intervals(seq)
        self._end(
            seq.job,
            RawDecodeResult(
                prompt_tokens=len(seq.job.prompt),
                new_tokens=seq.new_tokens,
                prefill_seconds=prefill_s,
                decode_seconds=decode_s,
                reason=reason,
                reused_prefix_tokens=seq.reused,
                session_slot_evicted=seq.evicted,
                queue_seconds=seq.admitted_at - seq.job.submitted_at,
                text="".join(seq.text),
                token_ids=seq.generated,
                logprobs=seq.probs,
                slot=seq.slot.seq_id,
                drafted_tokens=seq.drafted,
                accepted_tokens=seq.accepted,
                stop_string=seq.stops.matched if reason is StopReason.STOP_STRING else None,
                reused_from=seq.reused_from,
                prefix_miss_at=seq.miss_at,
            ),
        )

    @staticmethod
    def _drop_stop_probs(seq: Seq) -> None:
        """The stop string is not part of the answer: neither are the
        log-probabilities of tokens wholly inside it (those not yet handed
        out; a stream has already seen the rest, with held-back text)."""
        keep, n = len("".join(seq.text).encode()), 0
        for p in seq.probs:
            if keep <= 0:
                break
            keep -= len(p.piece)
            n += 1
        cut = len(seq.probs) - n
        del seq.probs[n:]
        if cut:
            del seq.probs_out[max(0, len(seq.probs_out) - cut) :]

    @staticmethod
    def _intervals(seq: Seq) -> tuple[float, float]:
        """(prefill, decode) wall-clock seconds: admitted → first token, and
        first → last token. A sequence that never sampled (cancelled while
        prefilling) spent all its time since admission in prefill."""
        if seq.first_token_at is None or seq.last_token_at is None:
            return max(0.0, time.perf_counter() - seq.admitted_at), 0.0
        return (
            max(0.0, seq.first_token_at - seq.admitted_at),
            max(0.0, seq.last_token_at - seq.first_token_at),
        )

    def _fail(self, seq: Seq, error: Exception) -> None:
        self._release(seq)
        self._end(seq.job, error)

    def _end(self, job: Job, last: RawDecodeResult | Exception) -> None:
        """Put a job's last item; choices of its request that never started
        (it ended before its prompt was in the KV) end with it: cancelled,
        or with the same error."""
        job.sink.put(last)
        for sibling in job.siblings:
            sibling.sink.put(last if isinstance(last, Exception) else self._cancelled_result(sibling))
        job.siblings = []
