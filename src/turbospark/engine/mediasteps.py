"""Media chunks in the step: their embeddings fed through the scheduler's
own batches.

A prompt with media (``Job.media``, ``engine/media.py``) holds one
placeholder id per media token. When a prefilling sequence reaches a media
chunk, the step encodes the chunk with the projector (on the engine thread,
once: the rows are kept until the chunk is wholly fed) and feeds its rows as
embeddings. llama.cpp takes either token ids or embeddings in one batch, so
the media rows of every sequence that reached one go in a second
``llama_decode`` of the same step, after the token batch (decoders and text
prefills): a request with an image runs beside text requests, step by step,
and a cancel takes effect at the next step like any other.

A chunk that needs non-causal attention (Gemma 3's images) is decoded whole,
alone, with causal attention off for that decode.

Only the scheduler thread runs this (it owns the context).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from .llama import EmbdBatch, LlamaContext
from .media import Span
from .sequences import Feed, Running, Seq
from .types import AdmissionError, EngineError


def media_span(seq: Seq) -> Span | None:
    """The media chunk a prefilling sequence reaches next, if its next
    position is one."""
    media = seq.job.media
    return media.span_at(seq.n_past) if media is not None else None


def text_room(seq: Seq) -> int:
    """How many of a prefilling sequence's next positions are text: up to
    the next media chunk, else to the prompt's end."""
    end = len(seq.job.prompt)
    media = seq.job.media
    if media is not None:
        end = min((s.start for s in media.spans if s.start >= seq.n_past), default=end)
    return end - seq.n_past


class MediaFeeds:
    """The media half of a step: which sequences feed media rows, their
    encoding, and the embeddings decode."""

    def __init__(self, ctx: LlamaContext, running: Running) -> None:
        self.ctx = ctx
        self._running = running
        self._batch: EmbdBatch | None = None

    def choose(self, seqs: Sequence[tuple[Seq, Span]], decoders: int, chunk: int) -> list[Feed]:
        """The media feeds of this step: each sequence's next rows of its
        chunk (encoded now if not yet), as many as the embeddings batch
        holds; beside decoders at most ``chunk`` rows each (a causal chunk
        goes in pieces, like a text prompt). A chunk that fails to encode
        fails its sequence."""
        room = self.ctx.opts.n_batch
        feeds: list[Feed] = []
        for seq, span in seqs:
            if seq.job.cancel.cancelled:
                continue  # (dropped at the next step, before anything is encoded)
            whole = span.end - seq.n_past
            take = whole if span.non_causal else min(whole, room, chunk if decoders else whole)
            if take > room or take <= 0:
                continue  # next step
            rows = self._rows(seq, span)
            if rows is None or seq.job.cancel.cancelled:
                continue  # (a cancel during the encode: nothing more is fed)
            offset = seq.n_past - span.start
            last = seq.n_past + take == len(seq.job.prompt)
            tokens = seq.pending[seq.fed : seq.fed + take]
            feeds.append(Feed(seq, tokens, "last" if last else "none", rows=rows[offset : offset + take]))
            room -= take
            if take == whole:
                seq.rows.pop(span.chunk, None)  # (its rows are in the batch now)
        return feeds

    def _rows(self, seq: Seq, span: Span) -> np.ndarray | None:
        kept = seq.rows.get(span.chunk)
        if kept is not None:
            return np.asarray(kept)
        media = seq.job.media
        assert media is not None
        t0 = time.perf_counter()
        try:
            rows = media.encode(span.chunk)
        except Exception as exc:  # noqa: BLE001 - it fails its own request only
            seq.slot.tokens = seq.slot.tokens[: seq.n_past]
            self._running.fail(seq, exc if isinstance(exc, AdmissionError) else EngineError(str(exc)))
            return None
        seq.encode_seconds += time.perf_counter() - t0
        seq.encoded += 1
        seq.rows[span.chunk] = rows
        return rows

    def decode(
        self, feeds: list[Feed], advance: Callable[[list[Feed]], None], failed: Callable[[list[Feed], int], None]
    ) -> None:
        """Decode the feeds' rows: in one batch, or one decode per
        non-causal chunk with causal attention off; then ``advance`` (what
        the KV now holds, sampling where a prompt ended) or ``failed``."""
        if not feeds:
            return
        whole = {id(f) for f in feeds if (span := media_span(f.seq)) is not None and span.non_causal}
        causal = [f for f in feeds if id(f) not in whole]
        groups = ([causal] if causal else []) + [[f] for f in feeds if id(f) in whole]
        for group in groups:
            batch = self._batch_for(group)
            group.sort(key=lambda f: f.seq.slot.seq_id)
            for feed in group:
                assert feed.rows is not None
                idx = batch.add_rows(feed.rows, feed.seq.n_past, feed.seq.slot.seq_id, feed.logits == "last")
                feed.first = idx if feed.logits == "last" else -1
            alone = id(group[0]) in whole
            if alone:
                self.ctx.set_causal(False)
            try:
                rc = self.ctx.decode(batch)
            finally:
                if alone:
                    self.ctx.set_causal(True)
            if rc != 0:
                failed(group, rc)
                continue
            advance(group)

    def _batch_for(self, group: list[Feed]) -> EmbdBatch:
        assert group[0].rows is not None
        width = int(group[0].rows.shape[1])
        if self._batch is None or self._batch.embd.shape[1] != width:
            self._batch = EmbdBatch(self.ctx.opts.n_batch, width)
        self._batch.clear()
        return self._batch
