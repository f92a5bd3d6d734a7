"""Prompt-lookup drafting (n-gram speculation).

Copy-heavy output (edits, refactors, quoting) repeats spans of the prompt. The
drafter finds the most recent EARLIER occurrence of the last n tokens of the
sequence (prompt + output) and proposes the tokens that followed it; from
then on it keeps copying from that source position for as long as the
sequence agrees with it (in a list of similar lines, a fresh lookup would
jump to the line just written, not the one being copied). The scheduler
feeds the drafts in the same batch step as the real next token and keeps the
longest prefix the model agrees with.

Acceptance rule: at each drafted position the sequence's own sampler chain
samples from the true distribution (its prefix is verified), and the draft is
accepted iff the sample equals it. That is exact for greedy and for sampled
requests alike (a sample x ~ p that equals the draft is kept; otherwise x
itself is the next token), and it consumes the random stream exactly as
plain decoding does, so a seeded request gives the same text either way.

How many drafts to verify is a cost question. On a CPU a decode step of n
tokens does not cost n single steps, but neither is it flat: the quantised
matmul kernels work on tiles of columns, so (on the machine this was tuned
on) 2 tokens cost twice 1 token, 4 tokens 2.4x, 8 tokens 4x and 9 tokens as
much as 12. :class:`StepCosts` holds the step time per batch size, timed by
the scheduler while idle after loading and refined by its own decode steps;
each drafter keeps an estimate of how likely
its next draft token is to be accepted, and :func:`best_draft_length` picks
the length with the most expected tokens per second of step time. On a GPU,
where extra tokens are nearly free, the same rule drafts the whole match.

Drafts are priced for everyone in the step: every other sequence in it
(decoding, or prefilling its prompt) waits for the verification tokens too.
With other sequences in the step, the drafts of all sequences together may
make it at most :data:`NEIGHBOUR_TAX` slower than the same step without
drafts (:meth:`StepCosts.affordable`), and without cost data nobody drafts
beside a neighbour; a sequence alone keeps the throughput rule.
"""

from __future__ import annotations

import statistics
import threading

#: how much slower a step with drafts may be than the same step without them
#: when other sequences decode in it (they pay for every verification token).
#: The step table prices only llama_decode; verifying drafts also costs
#: sampling and trimming rejected KV, which bench/agents.py (d) measured at
#: about 5 % more (a neighbour ran at 0.88 of its rate with 0.08 here), so the
#: tax leaves room for it: a neighbour keeps >= ~0.9 of its rate.
NEIGHBOUR_TAX = 0.04


class StepCosts:
    """Seconds per pure-decode step by batch size 1..limit: a dense table,
    filled once by calibration (sizes not timed are interpolated between
    timed neighbours, or extrapolated at the per-token cost of the nearest
    timed size), then kept as a moving average of real steps. Looking a size
    up on the decode path is an index."""

    __slots__ = ("seconds", "limit", "ready")

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self.seconds: list[float] = [0.0] * (limit + 1)
        #: False until a calibration filled the table: a few online samples
        #: alone would extrapolate linearly and never draft
        self.ready = False

    def calibrate(self, table: dict[int, float]) -> None:
        timed = sorted(n for n in table if 0 < n <= self.limit)
        if not timed:
            return
        for n in range(1, self.limit + 1):
            lo = max((t for t in timed if t <= n), default=None)
            hi = min((t for t in timed if t >= n), default=None)
            if lo is not None and hi is not None and lo != hi:
                self.seconds[n] = table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
            elif lo is not None:
                self.seconds[n] = table[lo] * n / lo
            else:
                assert hi is not None  # timed is not empty
                self.seconds[n] = table[hi] * n / hi
        self.ready = True

    def observe(self, n: int, dt: float) -> None:
        if self.ready and 0 < n <= self.limit:
            self.seconds[n] += 0.2 * (dt - self.seconds[n])

    def affordable(self, n: int, tax: float = NEIGHBOUR_TAX) -> int:
        """The most tokens a step whose plain form has ``n`` tokens (one per
        decoder) may carry, drafts included, and cost at most ``1 + tax``
        times the plain step: ``n`` (no drafts) before calibration."""
        plain = self.estimate(n)
        if plain is None:
            return n
        most = n
        while most < self.limit and self.seconds[most + 1] <= plain * (1.0 + tax):
            most += 1
        return most

    def estimate(self, n: int) -> float | None:
        """None before calibration; past the limit, at the limit's per-token cost."""
        if not self.ready:
            return None
        if n > self.limit:
            return self.seconds[self.limit] * n / self.limit
        return self.seconds[n]


def best_draft_length(costs: StepCosts, base: int, available: int, accept: float) -> int:
    """Drafts to verify for one sequence joining a step of ``base`` other
    tokens: maximise (base + expected accepted run + 1) / step seconds, where
    each draft token is accepted with probability ``accept`` given the ones
    before it. Without cost data yet, verify everything available (the
    caller caps ``available`` when neighbours would pay)."""
    if available <= 0:
        return 0
    best, best_rate = 0, -1.0
    expected, p = float(base + 1), 1.0
    for d in range(available + 1):
        if d:
            p *= accept
            expected += p
        cost = costs.estimate(base + 1 + d)
        if cost is None:
            return available
        rate = expected / max(cost, 1e-9)
        if rate > best_rate:
            best, best_rate = d, rate
    return best


class NgramDrafter:
    __slots__ = ("hist", "sizes", "index", "k_max", "k", "hits", "misses", "idle", "src")

    def __init__(self, tokens: list[int], sizes: tuple[int, ...] = (4, 3, 2), k_max: int = 16) -> None:
        self.hist: list[int] = list(tokens)
        self.sizes = sizes
        #: per n-gram size: n-gram -> end (exclusive) of its latest occurrence
        #: that is NOT the current suffix
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        self.k_max = k_max
        self.k = k_max
        # acceptance estimate: decayed counts of accepted draft tokens and of
        # rejections, seeded optimistic so a fresh sequence tries drafting
        self.hits, self.misses = 9.0, 1.0
        self.idle = 0  # steps a match was available but not drafted
        #: where the sequence is copying from: the index in ``hist`` of the
        #: token predicted next, while every token since the match agreed
        self.src: int | None = None
        for end in range(1, len(self.hist)):
            self._register(end)

    def _register(self, end: int) -> None:
        h = self.hist
        for n in self.sizes:
            if end >= n:
                self.index[n][tuple(h[end - n : end])] = end

    def push(self, token: int) -> None:
        """A token joined the sequence (sampled; maybe not yet in the KV)."""
        src = self.src
        if src is not None:
            self.src = src + 1 if src < len(self.hist) and self.hist[src] == token else None
        self.hist.append(token)
        self._register(len(self.hist) - 1)

    def draft(self, budget: int) -> list[int]:
        """Up to ``min(k, budget)`` tokens predicted to follow, or []."""
        k = min(self.k, budget)
        if k <= 0:
            return []
        h = self.hist
        # Keep copying from where the last tokens came from: a fresh n-gram
        # lookup would jump to the LATEST occurrence, which in repetitive text
        # (a list of similar lines) is often the wrong one.
        if self.src is None or self.src >= len(h):
            self.src = None
            for n in self.sizes:
                if len(h) >= n:
                    end = self.index[n].get(tuple(h[-n:]))
                    if end is not None:
                        self.src = end
                        break
            if self.src is None:
                return []
        out = h[self.src : self.src + k]
        # A source close behind the end means the text repeats with that
        # period: continue the draft from its own tokens.
        period = len(h) - self.src
        while len(out) < k:
            out.append(out[len(out) - period])
        return out

    @property
    def accept(self) -> float:
        """Estimated probability that the next draft token is accepted."""
        return self.hits / (self.hits + self.misses)

    def choose(self, costs: StepCosts, base: int, drafts: list[int]) -> list[int]:
        """The prefix of ``drafts`` worth verifying in a step with ``base``
        other tokens; now and then the whole of it, so a sequence whose
        estimate fell can find out that it is copying again."""
        if not drafts:
            return drafts
        d = best_draft_length(costs, base, len(drafts), self.accept)
        if d == 0:
            self.idle += 1
            if self.idle < 8:
                return []
            # probe at the length that would pay off if copying resumed
            d = max(1, best_draft_length(costs, base, len(drafts), 0.9))
        self.idle = 0
        return drafts[:d]

    def feedback(self, drafted: int, accepted: int) -> None:
        """Update the acceptance estimate (recent steps weigh most) and the
        draft length: halve it after a miss, grow it after a full hit, so a
        sequence that stops copying stops paying for drafts."""
        if drafted == 0:
            return
        self.hits = 0.9 * self.hits + accepted
        self.misses = 0.9 * self.misses + (1 if accepted < drafted else 0)
        if accepted == 0:
            self.k = max(1, self.k // 2)
        elif accepted == drafted:
            self.k = min(self.k_max, self.k * 2)


#: step-cost tables already measured in this process, by model file and
#: compute settings, so reloading a model does not time it again
_MEASURED: dict[tuple[object, ...], dict[int, float]] = {}
#: one timed step at a time in the process: two models timing their steps at
#: once would each measure the other
TIMING_LOCK = threading.Lock()
#: how many times each size is timed (the median is kept)
CALIBRATION_PASSES = 3


class Calibration:
    """The step sizes still to be timed while the engine is idle after a
    load, and the table they make for ``costs``: size 0 first (an untimed
    warm-up), then every size ``CALIBRATION_PASSES`` times; the table keeps
    each size's median, made non-decreasing (more tokens never cost less, so
    a noisy size is capped by a larger one). A table measured before under
    the same ``key`` (model file, threads, batch, flash attention, sizes) is
    reused at once. The scheduler does the timing: it owns the context."""

    def __init__(self, costs: StepCosts, key: tuple[object, ...], sizes: list[int], wanted: bool) -> None:
        self.costs = costs
        self.key = key
        known = _MEASURED.get(key)
        if known is not None:
            costs.calibrate(known)
        self.pending: list[int] = [0, *sizes * CALIBRATION_PASSES] if wanted and known is None else []
        self._samples: dict[int, list[float]] = {}

    def __bool__(self) -> bool:
        return bool(self.pending)

    def next_size(self) -> int:
        return self.pending.pop(0)

    def abandon(self) -> None:
        """No more timing (the context is busy or too full, or a step failed)."""
        self.pending.clear()

    def record(self, n: int, seconds: float) -> None:
        """One timed step of ``n`` tokens; the last one completes the table."""
        if n:
            self._samples.setdefault(n, []).append(seconds)
        if not self.pending and self._samples:
            table = {size: statistics.median(ts) for size, ts in self._samples.items()}
            low = float("inf")
            for size in sorted(table, reverse=True):
                low = table[size] = min(table[size], low)
            self.costs.calibrate(table)
            _MEASURED[self.key] = table
