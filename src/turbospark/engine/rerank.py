"""Reranking: (query, document) pairs scored by a rank-pooling model on an
engine thread of its own.

A reranker (a GGUF whose pooling is ``rank``: a cross-encoder's classifier
over its ``[CLS]`` row, or a causal reranker's last token) gives one number
a pair. Its context is created as the embedder's is, ``n_ctx == n_batch ==
n_ubatch`` (llama.cpp pools per micro-batch: a pair split over two would
be scored on its last part), with one KV stream for every sequence; it is
no chat context, so nothing of a rerank ever enters a chat prefix cache.

The thread batches continuously: each step is one ``llama_decode`` of the
next pairs of the requests waiting, in the order they came (one request's
remaining pairs, then the next request's), up to :data:`PACK_TOKENS` tokens
and :data:`MAX_SEQS` pairs a step (a pair longer than that goes alone), so
two requests' pairs share decodes and a short request is not held behind a
long one for more than a step. A cancelled request's remaining pairs are
dropped before the next step; its future fails with :class:`RankCancelled`,
which carries what it had scored (for its ``ranked`` event).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from .gguf import POOLING_RANK
from .llama import Batch, ContextOptions, LlamaContext, LlamaModelFile, default_threads, lib
from .rankpairs import PairFormat
from .types import CancelFlag, EngineError, RankCancelled, Ranking

log = logging.getLogger("turbospark.engine")

#: tokens one step packs at most (llama-server's default micro-batch): the
#: attention of a packed micro-batch is quadratic in its length, masked or not
PACK_TOKENS = 512
#: pairs one step packs at most
MAX_SEQS = 64
#: architectures whose rank head llama.cpp ends in a softmax (llama-graph.cpp)
SOFTMAX_ARCHS = ("qwen3", "qwen3vl")
#: the reranker's context when neither the model nor ``--ctx`` says less
DEFAULT_RANK_CTX = 8192


@dataclass(eq=False)
class RankJob:
    """One request's pairs on the engine thread."""

    pairs: list[list[int]]
    cancel: CancelFlag
    #: documents cut to fit (told by the caller, for its ranking)
    truncated: int = 0
    future: Future[Ranking] = field(default_factory=Future)
    scores: list[float] = field(default_factory=list)
    #: the next pair to put in a step, and how many were scored
    next: int = 0
    done: int = 0
    steps: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None

    def __post_init__(self) -> None:
        self.scores = [0.0] * len(self.pairs)


class Ranker:
    """A reranker's context and the thread that owns it (module docstring)."""

    def __init__(
        self, file: LlamaModelFile, n_ctx: int, threads: int = 0, flash_attn: int = -1, name: str = "reranker"
    ) -> None:
        self.file = file
        n_ctx = max(8, min(n_ctx, file.n_ctx_train or n_ctx))
        self.ctx = LlamaContext(
            file,
            ContextOptions(
                n_ctx=n_ctx,
                n_batch=n_ctx,
                n_ubatch=n_ctx,
                n_seq_max=min(MAX_SEQS, n_ctx),
                n_threads=threads or default_threads(),
                embeddings=True,
                pooling=POOLING_RANK,
                flash_attn=flash_attn,
                kv_unified=True,  # every sequence may use the whole context
            ),
        )
        L = lib()
        #: the longest pair: one micro-batch (llama.cpp may pad n_ctx up, never the batch sizes)
        self.max_tokens = min(self.ctx.n_ctx, L.llama_n_batch(self.ctx.ptr), L.llama_n_ubatch(self.ctx.ptr))
        self.max_seqs = min(MAX_SEQS, self.max_tokens)
        self.pack_tokens = min(PACK_TOKENS, self.max_tokens)
        self.format = PairFormat(file, self.max_tokens)
        #: llama.cpp ends a Qwen3 reranker's head in a softmax: its scores are probabilities
        self.probabilities = file.metadata.get("general.architecture", "") in SOFTMAX_ARCHS
        self._batch = Batch(self.max_tokens)
        self._jobs: collections.deque[RankJob] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"rerank-{name}", daemon=True)
        self._thread.start()

    # -- the caller's side ---------------------------------------------------------
    def submit(self, pairs: list[list[int]], cancel: CancelFlag, truncated: int = 0) -> Future[Ranking]:
        """Queue a request's pairs (``truncated``: how many of its documents
        were cut, for its ranking); its future resolves with their scores in
        order, or fails (cancelled: :class:`RankCancelled` naming why)."""
        job = RankJob(pairs, cancel, truncated)
        with self._cond:
            if self._closing or self.failure is not None:
                raise EngineError(self.failure or "the reranker is closed")
            self._jobs.append(job)
            self._cond.notify()
        cancel.on_cancel(self._wake)
        return job.future

    @property
    def waiting(self) -> int:
        """Requests with pairs not yet scored."""
        return len(self._jobs)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self.ctx.close()

    # -- the engine thread -------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._drop_cancelled()
                    while not self._jobs and not self._closing:
                        self._cond.wait()
                        self._drop_cancelled()
                    if self._closing:
                        break
                    plan = self._plan()
                self._step(plan)
        except BaseException as exc:  # the thread is dead: say so to everyone waiting
            self.failure = f"the reranker's engine thread failed: {exc}"
            log.exception("reranker thread failed")
        with self._cond:
            jobs, self._jobs = list(self._jobs), collections.deque()
        for job in jobs:
            job.future.set_exception(EngineError(self.failure or "the reranker is closed"))

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._jobs if j.cancel.cancelled]:
            self._jobs.remove(job)
            # (a step's pairs are scored together, a job's in order: its first ``done`` are scored)
            done = job.pairs[: job.done]
            partial = self._ranking(job, job.scores[: job.done], [len(p) for p in done], cancelled=True)
            job.future.set_exception(RankCancelled(f"cancelled: {job.cancel.reason}", partial))

    def _plan(self) -> list[tuple[RankJob, int]]:
        """The next pairs, in order, as one step packs them."""
        plan: list[tuple[RankJob, int]] = []
        used = 0
        for job in self._jobs:
            while job.next < len(job.pairs):
                n = len(job.pairs[job.next])
                if plan and (len(plan) >= self.max_seqs or used + n > self.pack_tokens):
                    return plan
                plan.append((job, job.next))
                job.next += 1
                used += n
        return plan

    def _step(self, plan: list[tuple[RankJob, int]]) -> None:
        """One decode of the planned pairs; each pair's score is its
        sequence's pooled output (the classifier's first label)."""
        now = time.perf_counter()
        for job, _ in plan:
            job.started = job.started if job.started is not None else now
        try:
            scores = self._decode([job.pairs[i] for job, i in plan])
        except EngineError as exc:
            for job in dict.fromkeys(job for job, _ in plan):
                self._finish(job, exc)
            return
        for job in dict.fromkeys(job for job, _ in plan):
            job.steps += 1
        for (job, i), score in zip(plan, scores):
            job.scores[i] = score
            job.done += 1
            if job.done == len(job.pairs):
                self._finish(job)

    def _decode(self, seqs: list[list[int]]) -> list[float]:
        ctx, batch = self.ctx, self._batch
        ctx.clear()  # nothing of a previous step may be attended to (a causal reranker keeps KV)
        batch.clear()
        for seq, ids in enumerate(seqs):
            batch.add_run(ids, 0, seq, True)
        batch.logits[: batch.n] = 1  # pooled: every token is an output
        rc = ctx.decode(batch)
        if rc != 0:
            raise EngineError(f"llama_decode failed with status {rc} while reranking")
        L = lib()
        out: list[float] = []
        for seq in range(len(seqs)):
            ptr = L.llama_get_embeddings_seq(ctx.ptr, seq)
            if not ptr:
                raise EngineError("llama.cpp returned no rank score")
            out.append(float(ptr[0]))
        return out

    def _finish(self, job: RankJob, error: BaseException | None = None) -> None:
        with self._cond:
            if job in self._jobs:
                self._jobs.remove(job)
        if error is not None:
            job.future.set_exception(error)
            return
        job.future.set_result(self._ranking(job, job.scores, [len(p) for p in job.pairs]))

    def _ranking(self, job: RankJob, scores: list[float], tokens: list[int], cancelled: bool = False) -> Ranking:
        """``job``'s ranking now: its queue and compute times until this moment."""
        end = time.perf_counter()
        started = job.started if job.started is not None else end
        return Ranking(
            scores=scores,
            token_counts=tokens,
            queue_seconds=started - job.submitted,
            compute_seconds=end - started,
            steps=job.steps,
            truncated=job.truncated,
            probabilities=self.probabilities,
            cancelled=cancelled,
        )

    def info(self) -> dict[str, object]:
        return {
            "context": self.max_tokens,
            "pooling": "rank",
            "pairs_per_step": self.max_seqs,
            "tokens_per_step": self.pack_tokens,
            "rerank_template": self.format.template is not None,
        }
