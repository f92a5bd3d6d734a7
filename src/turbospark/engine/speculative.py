"""Prompt-lookup drafting (n-gram speculation).

Copy-heavy output (edits, refactors, quoting) repeats spans of the prompt. The
drafter finds the most recent EARLIER occurrence of the last n tokens of the
sequence (prompt + output) and proposes the tokens that followed it. The
scheduler feeds the drafts in the same batch step as the real next token and
keeps the longest prefix the model agrees with.

Acceptance rule: at each drafted position the sequence's own sampler chain
samples from the true distribution (its prefix is verified), and the draft is
accepted iff the sample equals it. That is exact for greedy and for sampled
requests alike (a sample x ~ p that equals the draft is kept; otherwise x
itself is the next token), and it consumes the random stream exactly as
plain decoding does, so a seeded request gives the same text either way.
"""

from __future__ import annotations


class NgramDrafter:
    __slots__ = ("hist", "sizes", "index", "k_max", "k")

    def __init__(self, tokens: list[int], sizes: tuple[int, ...] = (4, 3, 2), k_max: int = 8) -> None:
        self.hist: list[int] = list(tokens)
        self.sizes = sizes
        #: per n-gram size: n-gram -> end (exclusive) of its latest occurrence
        #: that is NOT the current suffix
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        self.k_max = k_max
        self.k = k_max
        for end in range(1, len(self.hist)):
            self._register(end)

    def _register(self, end: int) -> None:
        h = self.hist
        for n in self.sizes:
            if end >= n:
                self.index[n][tuple(h[end - n : end])] = end

    def push(self, token: int) -> None:
        """A token joined the sequence (sampled; maybe not yet in the KV)."""
        self.hist.append(token)
        self._register(len(self.hist) - 1)

    def draft(self, budget: int) -> list[int]:
        """Up to ``min(k, budget)`` tokens predicted to follow, or []."""
        k = min(self.k, budget)
        if k <= 0:
            return []
        h = self.hist
        for n in self.sizes:
            if len(h) < n:
                continue
            end = self.index[n].get(tuple(h[-n:]))
            if end is not None:
                return h[end : end + k]
        return []

    def feedback(self, drafted: int, accepted: int) -> None:
        """Adapt the draft length: halve it after a miss, grow it after a
        full hit, so a sequence that stops copying stops paying for drafts."""
        if drafted == 0:
            return
        if accepted == 0:
            self.k = max(1, self.k // 2)
        elif accepted == drafted:
            self.k = min(self.k_max, self.k * 2)
