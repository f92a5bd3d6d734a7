"""Running sequences: :class:`Seq` (one job in one slot), how a job starts
in the slot it was given, and how a sequence ends (its result, its slot
released).

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

Only the scheduler thread runs this (the mean job time it updates is under
the wait list's lock).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .admission import WaitList
from .detok import IndentStop, StopMatcher, Utf8Stream
from .jobs import Job, cancelled_result, end_job
from .llama import LlamaModelFile
from .sampling import SamplerChain
from .slots import Slot, SlotStore, TaskView
from .speculative import NgramDrafter
from .types import (
    AdmissionError,
    EngineError,
    Progress,
    PromptProgress,
    RawDecodeResult,
    StopReason,
    TokenProb,
    TokenTimings,
)

log = logging.getLogger("turbospark.engine")


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
        "handed",
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
        "task_id",
        "rows",
        "encoded",
        "encode_seconds",
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
        #: how many of ``generated`` went out with a report (``config.token_ids``)
        self.handed = 0
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
        #: its task id (llama-server's ``id_task`` in ``/slots``)
        self.task_id = 0
        #: media chunks encoded and not yet wholly fed (chunk index -> rows)
        self.rows: dict[int, Any] = {}
        #: media chunks this run encoded, and the seconds that took
        self.encoded = 0
        self.encode_seconds = 0.0


@dataclass(slots=True)
class Feed:
    """One sequence's part of a step: the tokens it feeds, which outputs it
    wants (``all``: a decoder's token and its drafts; ``last``: a prompt's
    final chunk; ``none``: a chunk mid-prompt), the drafted tokens among
    them, where its first output lands in the batch (-1: none), and for a
    media chunk its rows (``mediasteps``)."""

    seq: Seq
    tokens: list[int]
    logits: str
    drafts: list[int] = field(default_factory=list)
    first: int = -1
    #: a media chunk's embedding rows, fed in place of ``tokens`` (its
    #: placeholders: what the slot's record then holds)
    rows: Any = None


def task_view(seq: Seq) -> TaskView:
    """Where ``seq`` stands, as ``/slots`` shows it (read off the engine
    thread too: each field is one read of a value the engine replaces)."""
    return TaskView(
        id=seq.task_id,
        config=seq.job.config,
        n_prompt=len(seq.job.prompt),
        n_decoded=seq.new_tokens,
        n_remain=max(0, seq.max_new - seq.new_tokens),
        has_next_token=not seq.finished,
        has_new_line=any("\n" in t for t in list(seq.text)),
        stopping_word=seq.stops.matched or "",
        n_processed=seq.fed,
        n_cached=seq.reused,
    )


def hand_out(seq: Seq, tokens: int) -> None:
    """The text and log-probabilities produced since the last Progress
    (after the timings so far, when asked for)."""
    opening = seq.chain.opening_state
    if seq.job.config.timings_per_token:
        first = seq.first_token_at or seq.last_token_at or seq.admitted_at
        seq.job.sink.put(
            TokenTimings(
                seq.reused,
                len(seq.job.prompt) - seq.reused,
                max(0.0, first - seq.admitted_at),
                seq.new_tokens,
                max(0.0, (seq.last_token_at or first) - first),
            )
        )
    ids: list[int] | tuple[()] = ()
    if seq.job.config.token_ids:
        ids, seq.handed = seq.generated[seq.handed :], len(seq.generated)
    if seq.probs_out:
        seq.job.sink.put(Progress("".join(seq.out), tokens, seq.probs_out, opening=opening, ids=ids))
        seq.probs_out = []
    else:
        seq.job.sink.put(Progress("".join(seq.out), tokens, opening=opening, ids=ids))
    seq.out.clear()


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


def _result(seq: Seq, reason: StopReason) -> RawDecodeResult:
    prefill_s, decode_s = _intervals(seq)
    media = seq.job.media
    return RawDecodeResult(
        media_items=len(media.spans) if media else 0,
        media_tokens=media.media_tokens if media else 0,
        media_encoded=seq.encoded,
        media_encode_seconds=seq.encode_seconds,
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
    )


class Running:
    """The sequences running now (``active``, in admission order): how a job
    starts in its slot and how a sequence ends."""

    def __init__(
        self, model: LlamaModelFile, slots: SlotStore, wait_list: WaitList, *, speculative: bool, draft_max: int
    ) -> None:
        self.model = model
        self.speculative = speculative
        self.draft_max = draft_max
        self.active: list[Seq] = []
        self._slots = slots
        self._wait_list = wait_list
        self._task_ids = itertools.count(1)

    # -------------------------------------------------------------- starts
    def start(self, job: Job, slot: Slot, extension: bool) -> None:
        """Run an admitted job in ``slot`` (``extension``: the slot holds the
        same conversation): its reusable prefix is put in the slot's KV and
        its sequence joins the next step; a job cancelled meanwhile, or
        whose sampler cannot be built, ends here."""
        if job.cancel.cancelled:
            slot.busy = False
            end_job(job, cancelled_result(job))
            return
        placed = self._slots.prepare(job, slot, extension)
        if job.media is not None and job.media.cut(placed.reused) < placed.reused:
            # (a record that ends inside a media chunk: the chunk is fed whole)
            placed = placed._replace(reused=self._slots.trim(slot, job.prompt, job.media.cut(placed.reused)))
        try:
            chain = SamplerChain(self.model, job.config)
        except Exception as exc:
            slot.busy = False
            end_job(job, exc if isinstance(exc, AdmissionError) else EngineError(str(exc)))
            return
        seq = self.add(job, slot, chain, placed.reused, placed.evicted, placed.reused_from, placed.miss_at)
        if job.config.return_progress:  # (llama-server's first report: before any prefill, processed == cache)
            took = time.perf_counter() - seq.admitted_at
            job.sink.put(PromptProgress(len(job.prompt), seq.reused, seq.reused, took))

    def add(
        self,
        job: Job,
        slot: Slot,
        chain: SamplerChain,
        reused: int,
        evicted: bool,
        reused_from: str,
        miss_at: int | None = None,
    ) -> Seq:
        """A sequence for ``job`` in ``slot`` (whose KV holds its first
        ``reused`` prompt tokens), drafting when speculative, now running."""
        seq = Seq(job, slot, chain, reused, evicted, reused_from)
        seq.miss_at = miss_at
        seq.task_id = next(self._task_ids)
        if self.speculative and job.config.speculative:
            # (a media chunk's placeholders are never drafted)
            history = [t for t in job.prompt if t >= 0] if job.media is not None else job.prompt
            seq.drafter = NgramDrafter(history, k_max=self.draft_max)
        self.active.append(seq)
        return seq

    # ------------------------------------------------------------- endings
    def drop_cancelled(self) -> None:
        """End the running sequences whose client left BEFORE admission, so
        a job submitted after the cancel (a client's retry) finds their slots
        free, each slot's record being exactly the part of the prompt (and
        output) that its sequence had put in the KV."""
        for seq in [s for s in self.active if s.job.cancel.cancelled]:
            self.finish(seq, StopReason.CANCELLED)

    def release(self, seq: Seq) -> None:
        self._wait_list.record_job_time(time.perf_counter() - seq.admitted_at)
        seq.finished = True
        seq.chain.close()
        seq.slot.busy = False
        seq.slot.last_used = time.time()
        seq.slot.task = task_view(seq).ended()
        if seq in self.active:
            self.active.remove(seq)

    def finish(self, seq: Seq, reason: StopReason, flush: bool = True) -> None:
        """End ``seq`` for ``reason``: hand out what it holds back (unless
        a stop cut it: ``flush`` False), release its slot, put its result."""
        if reason is StopReason.STOP_STRING and seq.probs:
            _drop_stop_probs(seq)
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
            hand_out(seq, 0)
        self.release(seq)
        check = seq.job.config.tool_call_check
        if check is not None and reason in (StopReason.END_OF_TURN, StopReason.EOS):
            try:
                if check("".join(seq.text)):
                    reason = StopReason.TOOL_CALLS
            except Exception:  # a parser bug must not fail the generation
                log.exception("tool-call check failed")
        end_job(seq.job, _result(seq, reason))

    def fail(self, seq: Seq, error: Exception) -> None:
        self.release(seq)
        end_job(seq.job, error)
