"""The step: one ``llama_decode`` over every running sequence, then sampling.

Each step builds ONE batch holding the next token of every decoding sequence
(and its drafts, when speculative) plus prefill chunks of newly admitted
ones (decoders first, so a long prompt never starves them), runs
``llama_decode`` once, and samples every sequence that produced logits with
its own sampler chain (each sequence's part of the step is a :class:`Feed`).
A sampled token ends its sequence at an end-of-generation token, a stop
string, the editors' stops (``n_indent``, ``max_predict_seconds`` as a line
ends) or its token budget. When an ``n`` > 1 job's prompt is in the KV its
other choices are forked from it (:meth:`Stepper._fork`). While idle, the
step-cost table is timed (:meth:`Stepper.calibrate`).

Only the scheduler thread runs this: it owns the context.
"""

from __future__ import annotations

import time

from .admission import WaitList
from .jobs import Job, end_job
from .llama import Batch, LlamaContext, LlamaModelFile
from .media import Span
from .mediasteps import MediaFeeds, media_span, text_room
from .sampling import SamplerChain
from .sequences import Feed, Running, Seq, hand_out
from .slots import Slot, SlotStore
from .speculative import TIMING_LOCK, Calibration, StepCosts
from .types import AdmissionError, EngineError, PromptProgress, StepCounts, StopReason, TokenProb


class Stepper:
    """Runs the steps of a context's running sequences (``running.active``)."""

    def __init__(
        self,
        model: LlamaModelFile,
        ctx: LlamaContext,
        running: Running,
        slots: SlotStore,
        wait_list: WaitList,
        *,
        step_costs: StepCosts,
        prefill_chunk: int,
        end_turn_tokens: frozenset[int],
    ) -> None:
        self.model = model
        self.ctx = ctx
        #: what a step of n tokens costs (observed on pure decode steps)
        self.step_costs = step_costs
        self.prefill_chunk = max(1, prefill_chunk)
        self.end_turn_tokens = end_turn_tokens
        self._running = running
        self._active = running.active
        self._slots = slots
        self._wait_list = wait_list
        self._batch = Batch(ctx.opts.n_batch)
        self._media = MediaFeeds(ctx, running)
        self._pieces = model.pieces
        self._eog = model.eog_tokens
        #: what the steps did so far (llama-server's /metrics)
        self.counts = StepCounts()

    # ----------------------------------------------------------------- step
    def step(self) -> None:
        batch = self._batch
        batch.clear()
        self._running.drop_cancelled()
        if not self._active:
            return
        chosen: list[Feed] = []
        room = self._add_decoders(chosen, batch.capacity)
        decoders = len(chosen)
        reached: list[tuple[Seq, Span]] = []
        pure_decode = self._add_prefills(chosen, room, reached)
        media = self._media.choose(reached, decoders, self.prefill_chunk) if reached else []
        self._write(chosen)
        if chosen:
            t0 = time.perf_counter()
            rc = self.ctx.decode(batch)
            dt = time.perf_counter() - t0
            if pure_decode and not media and rc == 0:
                self.step_costs.observe(batch.n, dt)
            if rc != 0:
                self._failed(chosen, rc)
                chosen = []
            else:
                self._count(chosen)
                self._advance(chosen)
        self._media.decode(media, self._advance, self._failed)
        for feed in chosen + media:
            seq = feed.seq
            if (seq.out or seq.probs_out) and not seq.finished:
                hand_out(seq, 1)

    def _count(self, chosen: list[Feed]) -> None:
        counts = self.counts
        counts.decodes += 1
        counts.busy += len(self._active)
        counts.draft_steps += sum(1 for feed in chosen if feed.drafts)

    def _add_decoders(self, chosen: list[Feed], room: int) -> int:
        """Choose the decoders' tokens first (one token each, plus drafts),
        so a long prompt never starves them; returns the room left."""
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
        return room

    def _add_prefills(self, chosen: list[Feed], room: int, reached: list[tuple[Seq, Span]]) -> bool:
        """Then prefill chunks in the ``room`` left (``chosen`` holds one
        feed per decoder so far); a sequence whose next position is a media
        chunk goes to ``reached`` instead (``mediasteps``). Returns whether
        the step is pure decode."""
        pure_decode = True
        decoders = len(chosen)
        # Beside decoders a prompt goes in prefill_chunk pieces, so their next
        # token never waits long; with nobody decoding, the prompts share the
        # whole batch (fewer, larger steps: each step reads the KV so far once,
        # which dominates a long prompt's prefill)
        prefilling = len(self._active) - decoders
        chunk_limit = self.prefill_chunk if decoders else max(self.prefill_chunk, room // max(1, prefilling))
        for seq in self._active:
            if seq.decoding:
                continue
            span = media_span(seq)
            if span is not None:
                reached.append((seq, span))
                pure_decode = False
                continue
            if room <= 0:
                continue
            remaining = len(seq.pending) - seq.fed
            take = min(text_room(seq), room, chunk_limit)
            chunk = seq.pending[seq.fed : seq.fed + take]
            chosen.append(Feed(seq, chunk, "last" if take == remaining else "none"))
            room -= take
            pure_decode = False
        return pure_decode

    def _write(self, chosen: list[Feed]) -> None:
        """Write the feeds into the batch in sequence-id order: with one KV
        stream per sequence, llama.cpp computes a batch in one pass only over
        runs of consecutive sequence ids (its "sequential equal split")."""
        batch = self._batch
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

    def _failed(self, chosen: list[Feed], rc: int) -> None:
        """A failed decode fails every sequence in it, their records emptied."""
        err = EngineError(f"llama_decode failed (code {rc})")
        for feed in chosen:
            seq = feed.seq
            self.ctx.seq_rm(seq.slot.seq_id)
            seq.slot.tokens = []
            seq.slot.prompt_len = 0
            self._running.fail(seq, err)

    def _advance(self, chosen: list[Feed]) -> None:
        """Record what the step put in each KV, and sample where it has logits."""
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
            if seq.job.config.return_progress:
                took = time.perf_counter() - seq.admitted_at
                seq.job.sink.put(PromptProgress(len(seq.job.prompt), seq.reused, seq.n_past, took))
            if idx >= 0:
                if seq.job.siblings:
                    self._fork(seq, idx)
                self._sample(seq, idx)

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

    # --------------------------------------------------------------- sample
    def _sample(self, seq: Seq, idx: int) -> None:
        token = seq.chain.sample(self.ctx.ptr, idx)
        seq.last_token_at = time.perf_counter()
        if not seq.decoding:
            seq.first_token_at = seq.last_token_at
            seq.decoding = True
        seq.new_tokens += 1
        if token in self._eog:
            self._running.finish(seq, StopReason.END_OF_TURN if token in self.end_turn_tokens else StopReason.EOS)
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
                self._running.finish(seq, StopReason.MAX_TOKENS, flush=False)
                return
            if hit:
                self._running.finish(seq, StopReason.STOP_STRING, flush=False)
                return
            # llama.cpp's t_max_predict_ms: judged only as a line ends, so a line is never cut
            limit = seq.job.config.max_predict_seconds
            if limit and "\n" in emit and seq.last_token_at - (seq.first_token_at or seq.last_token_at) > limit:
                self._running.finish(seq, StopReason.MAX_TOKENS)
                return
        if seq.new_tokens >= seq.max_new:
            self._running.finish(seq, StopReason.MAX_TOKENS)
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

    # ----------------------------------------------------------------- fork
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
            if len(self._active) < self._wait_list.parallel and not job.cancel.cancelled:
                choice = self._slots.choose(job, set())
            if choice is None or not self._fork_into(seq, job, *choice, idx):
                waiting.append(job)
        if waiting:
            self._wait_list.put_first(waiting)  # in choice order, ahead of the rest

    def _fork_into(self, seq: Seq, job: Job, slot: Slot, extension: bool, idx: int) -> bool:
        evicted = self._slots.evict(slot, extension)
        n = seq.n_past
        if self._slots.copy_prefix(seq.slot, slot, n) != n:
            slot.tokens, slot.prompt_len = [], 0  # its KV was emptied
            return False
        try:
            chain = SamplerChain(self.model, job.config)
        except Exception as exc:
            end_job(job, exc if isinstance(exc, AdmissionError) else EngineError(str(exc)))
            return True
        job.admitted_at = time.perf_counter()
        job.config.slot_used = slot.seq_id
        slot.busy = True
        slot.tokens = list(job.prompt)
        slot.prompt_len = len(job.prompt)
        slot.owner = job.config.owner
        slot.session_key = job.config.session_key
        fork = self._running.add(job, slot, chain, n, evicted, "copy")
        self._sample(fork, idx)
        return True

    # ------------------------------------------------------------ calibrate
    def calibrate(self, calibration: Calibration) -> None:
        """Time one decode step of the next size ``calibration`` wants on an
        idle slot (after its cached tokens, removed again at once), so the
        draft-length choice knows this machine's step costs before requests
        need them. Runs only while nothing waits; what is timed and how the
        table is made is ``speculative.Calibration``'s."""
        n = calibration.next_size()
        slots = self._slots.slots
        slot = max(slots, key=lambda s: self.ctx.n_ctx_seq - len(s.tokens))
        p0 = len(slot.tokens)
        if slot.busy or p0 + max(n, 1) > self.ctx.n_ctx_seq:
            calibration.abandon()
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
            calibration.abandon()
            return
        calibration.record(n, dt)
