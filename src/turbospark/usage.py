"""The one accumulator of engine numbers: a request's, a model's or the
server's tokens, times, reuse and drafts, summed over ``generated`` events
(a guardrail re-ask is a second one). The fold (views, report) and the OTel
sink use it, so every view derives rates and overhead the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
    #: the first generation's ``prefixMissAt`` (where its prompt left the cache)
    prefix_miss_at: int | None = None

    def add(self, e: Mapping[str, Any]) -> None:
        """Add one ``generated`` event (its ``to_dict()`` shape)."""
        if not self.generations:
            miss = e.get("prefixMissAt")
            self.prefix_miss_at = int(miss) if miss is not None else None
        self.generations += 1
        self.prompt_tokens += int(e.get("promptTokens", 0))
        self.new_tokens += int(e.get("newTokens", 0))
        self.queue_seconds += float(e.get("queueSeconds", 0.0))
        self.prefill_seconds += float(e.get("prefillSeconds", 0.0))
        self.decode_seconds += float(e.get("decodeSeconds", 0.0))
        self.reused_tokens += int(e.get("reusedPrefixTokens", 0))
        self.evictions += bool(e.get("sessionSlotEvicted", False))
        self.drafted_tokens += int(e.get("draftedTokens", 0))
        self.accepted_tokens += int(e.get("acceptedTokens", 0))

    @property
    def engine_seconds(self) -> float:
        """Queue + prefill + decode: the engine's share of a request's time."""
        return self.queue_seconds + self.prefill_seconds + self.decode_seconds

    @property
    def decode_tok_per_sec(self) -> float | None:
        """Summed tokens over summed decode time (re-asks included)."""
        return ratio(self.new_tokens, self.decode_seconds)

    @property
    def reuse_ratio(self) -> float | None:
        return ratio(self.reused_tokens, self.prompt_tokens)

    def overhead_ms(self, duration_ms: float | None) -> float | None:
        """What the request's wall time spent outside the engine (HTTP,
        parsing, templating): ``durationMs − 1000 × (queue + prefill +
        decode)``; None until the request is over or if it never generated."""
        if duration_ms is None or not self.generations:
            return None
        return max(0.0, duration_ms - 1000.0 * self.engine_seconds)

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
        }
