"""The one accumulator of engine numbers: a request's, a model's or the
server's tokens, times, reuse, drafts and media, summed over ``generated`` events
(a guardrail re-ask is a second one). The fold (views, report) and the OTel
sink use it, so every view derives rates and overhead the same way. A
rerank's numbers (``ranked``) are summed apart, in :class:`Reranks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


@dataclass(slots=True)
class Usage:
    generations: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    queue_seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    reused_tokens: int = 0
    evictions: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    #: media in the prompts (their tokens are in ``prompt_tokens``), the
    #: items the projector encoded (not taken from a reused prefix) and the
    #: seconds that took
    media_items: int = 0
    media_tokens: int = 0
    media_encoded: int = 0
    media_encode_seconds: float = 0.0
    #: the first generation's ``prefixMissAt`` (where its prompt left the cache)
    prefix_miss_at: int | None = None
    #: (queue, prefill, decode) seconds of the choices after the first
    #: (OpenAI ``n``; the first's are the sums less these): a request's
    #: choices run side by side, so its own times are its longest choice's
    choice_seconds: dict[int, tuple[float, float, float]] = field(default_factory=dict)

    def add(self, e: Mapping[str, Any]) -> None:
        """Add one ``generated`` event (its ``to_dict()`` shape)."""
        if not self.generations:
            miss = e.get("prefixMissAt")
            self.prefix_miss_at = int(miss) if miss is not None else None
        self.generations += 1
        self.prompt_tokens += int(e.get("promptTokens", 0))
        self.new_tokens += int(e.get("newTokens", 0))
        queue, prefill, decode = (float(e.get(k, 0.0)) for k in ("queueSeconds", "prefillSeconds", "decodeSeconds"))
        self.queue_seconds += queue
        self.prefill_seconds += prefill
        self.decode_seconds += decode
        choice = e.get("choice")
        if choice:  # (most requests have one choice: nothing more to keep)
            q, p, d = self.choice_seconds.get(choice, (0.0, 0.0, 0.0))
            self.choice_seconds[choice] = (q + queue, p + prefill, d + decode)
        self.reused_tokens += int(e.get("reusedPrefixTokens", 0))
        self.evictions += bool(e.get("sessionSlotEvicted", False))
        self.drafted_tokens += int(e.get("draftedTokens", 0))
        self.accepted_tokens += int(e.get("acceptedTokens", 0))
        if e.get("mediaItems"):
            self.media_items += int(e["mediaItems"])
            self.media_tokens += int(e.get("mediaTokens", 0))
            self.media_encoded += int(e.get("mediaEncoded", 0))
            self.media_encode_seconds += float(e.get("mediaEncodeSeconds", 0.0))

    @property
    def engine_seconds(self) -> float:
        """Queue + prefill + decode: the engine's share of a request's time."""
        return self.queue_seconds + self.prefill_seconds + self.decode_seconds

    @property
    def decode_tok_per_sec(self) -> float | None:
        """Summed tokens over summed decode time (re-asks included)."""
        return ratio(self.new_tokens, self.decode_seconds)

    @property
    def media_encode_ms(self) -> float:
        return self.media_encode_seconds * 1000.0

    def media_dict(self) -> dict[str, Any]:
        """The media numbers as the views' JSON names them (encode in ms)."""
        return {
            "mediaItems": self.media_items,
            "mediaTokens": self.media_tokens,
            "mediaEncoded": self.media_encoded,
            "mediaEncodeMs": self.media_encode_ms,
        }

    @property
    def reuse_ratio(self) -> float | None:
        return ratio(self.reused_tokens, self.prompt_tokens)

    @property
    def request_seconds(self) -> tuple[float, float, float]:
        """A request's own (queue, prefill, decode) seconds: its longest
        choice's (its choices run side by side; a re-ask adds to its
        choice's). The sums above are the engine's work."""
        others = list(self.choice_seconds.values())
        first = (
            self.queue_seconds - sum(c[0] for c in others),
            self.prefill_seconds - sum(c[1] for c in others),
            self.decode_seconds - sum(c[2] for c in others),
        )
        return max((first, *others), key=sum)

    def overhead_ms(self, duration_ms: float | None) -> float | None:
        """What the request's wall time spent outside the engine (HTTP,
        parsing, templating): ``durationMs − 1000 × (queue + prefill +
        decode)`` of :attr:`request_seconds`; None until the request is over
        or if it never generated."""
        if duration_ms is None or not self.generations:
            return None
        return max(0.0, duration_ms - 1000.0 * sum(self.request_seconds))

    def to_dict(self) -> dict[str, Any]:
        return {
            "generations": self.generations,
            "promptTokens": self.prompt_tokens,
            "newTokens": self.new_tokens,
            "queueSeconds": self.queue_seconds,
            "prefillSeconds": self.prefill_seconds,
            "decodeSeconds": self.decode_seconds,
            "decodeTokPerSec": self.decode_tok_per_sec,
            "reusedTokens": self.reused_tokens,
            "evictions": self.evictions,
            "draftedTokens": self.drafted_tokens,
            "acceptedTokens": self.accepted_tokens,
            **self.media_dict(),
        }


@dataclass(slots=True)
class Reranks:
    """Reranks summed over ``ranked`` events (a request's one, a model's or
    the server's): their (query, document) pairs, the pairs' tokens, and
    their queue and compute seconds on the reranker's engine thread."""

    requests: int = 0
    pairs: int = 0
    tokens: int = 0
    queue_seconds: float = 0.0
    compute_seconds: float = 0.0
    truncated: int = 0

    def add(self, e: Mapping[str, Any]) -> None:
        """Add one ``ranked`` event (its ``to_dict()`` shape)."""
        self.requests += 1
        self.pairs += int(e.get("pairs", 0))
        self.tokens += int(e.get("promptTokens", 0))
        self.queue_seconds += float(e.get("queueSeconds", 0.0))
        self.compute_seconds += float(e.get("computeSeconds", 0.0))
        self.truncated += int(e.get("truncated", 0))

    @property
    def pairs_per_sec(self) -> float | None:
        """Summed pairs over summed compute time."""
        return ratio(self.pairs, self.compute_seconds)

    def overhead_ms(self, duration_ms: float | None) -> float | None:
        """A rerank's wall time outside the engine (as :meth:`Usage.overhead_ms`)."""
        if duration_ms is None or not self.requests:
            return None
        return max(0.0, duration_ms - 1000.0 * (self.queue_seconds + self.compute_seconds))

    def to_dict(self) -> dict[str, Any]:
        return {
            "reranks": self.requests,
            "rerankPairs": self.pairs,
            "rerankTokens": self.tokens,
            "rerankComputeSeconds": self.compute_seconds,
            "rerankPairsPerSec": self.pairs_per_sec,
        }
