"""Per-sequence sampler chains, built inside llama.cpp.

Sampling in llama.cpp's own chain is what keeps the decode loop free of
per-token logits copies into Python (the reason ``Llama.generate`` is slower
than llama.cpp's server).

A grammar (llguidance, see tools/grammar.py) is kept out of the chain:
masking the whole vocabulary costs far more than asking about one token, so,
as llama.cpp's own server does, the token is picked without it and only that
one token is checked against the grammar; the full-vocabulary mask is computed
only when the pick is refused.
"""

from __future__ import annotations

import ctypes
import random
import re
from collections import deque
from typing import Any

import numpy as np

from .llama import LlamaModelFile, lib
from .types import OPENING_HELD, OPENING_OFF, OPENING_WATCHED, AdmissionError, GenerationConfig

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def lazy_grammar(grammar: str, trigger: str | None) -> str:
    """What the engine compiles for ``grammar`` switched on by ``trigger``:
    the grammar behind any text without the trigger's first character (what
    the token that began the trigger may hold before it); ``grammar`` itself
    without a trigger."""
    if not trigger:
        return grammar
    first = trigger[0]
    body = re.sub(r"(?m)^start\s*:", "lazy_call:", grammar, count=1)
    ch = "\\" + first if first in "[]^-\\/" else first
    return f"start: LAZY_LEAD lazy_call\nLAZY_LEAD: /[^{ch}]*/\n{body}"


class Constraint:
    """One sequence's grammar: an llguidance matcher over the model's
    vocabulary. ``allows`` asks about one token (cheap), ``mask`` the whole
    vocabulary (a bitmask, used only when the pick was refused)."""

    def __init__(self, model: LlamaModelFile, grammar: str) -> None:
        self.n_vocab = model.n_vocab
        self.eog = model.eog_tokens
        self.m = model.grammar_matcher(grammar)

    def allows(self, token: int) -> bool:
        if self.m.is_stopped():  # the grammar is complete: only the end
            return token in self.eog
        return bool(self.m.validate_tokens([token]) == 1)

    def accept(self, tokens: list[int]) -> bool:
        """Advance over ``tokens``; False (and the matcher spent) if refused."""
        if self.m.is_stopped():
            return all(t in self.eog for t in tokens)
        return bool(self.m.consume_tokens(tokens))

    def mask(self) -> np.ndarray:
        if self.m.is_stopped():
            allowed = np.zeros(self.n_vocab, dtype=bool)
            allowed[list(self.eog)] = True
            return allowed
        bits = np.frombuffer(self.m.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.n_vocab].astype(bool)


def _after_selection(arr: ctypes.Structure, token: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, log-probabilities) of the candidates the selection chain left
    (top-k, top-p, min-p, temperature, then the draw's softmax); a greedy
    pick, which sets no probabilities, is certain."""
    raw = ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_byte))
    view = np.ctypeslib.as_array(raw, shape=(arr.size * _TOKEN_DATA.itemsize,)).view(_TOKEN_DATA)
    p = view["p"].astype(np.float64)
    if not p.sum() > 0:
        return np.array([token]), np.array([0.0])
    with np.errstate(divide="ignore"):
        return view["id"].copy(), np.log(p / p.sum())


class SamplerChain:
    """Owns one ``llama_sampler`` chain; free it with :meth:`close`."""

    def __init__(self, model: LlamaModelFile, config: GenerationConfig) -> None:
        L = lib()
        self.ptr = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self.grammar: Constraint | None = None
        #: with logprobs asked for, the constraints (logit bias, penalties)
        #: are a chain of their own, so the distribution can be read between
        #: them and the selection (top-k/p, temperature, the pick)
        self.pre = None
        self.n_vocab = model.n_vocab
        self.top_n = config.logprobs
        #: report the distribution after the selection chain (``post_sampling_probs``)
        self.post = config.post_sampling_probs
        #: (the pick's logprob, [(token, logprob) most likely first]) of the
        #: last :meth:`sample`, when logprobs are asked for
        self.probs: tuple[float, list[tuple[int, float]]] | None = None
        if self.top_n is not None:
            self.pre = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self._constraints(model, config, self.pre or self.ptr)
        self._selection(config, self.ptr)
        #: a lazy grammar's trigger, until the output has written it; the
        #: grammar (``_lazy`` until then) is fed the tokens that wrote it
        self.trigger: bytes | None = None
        self._lazy: Constraint | None = None
        self._seen = b""
        self._recent: deque[int] = deque(maxlen=32)
        self._special = model.special_pieces
        #: the opening grammar and its trigger (matched at the output's
        #: start), until the output has matched it or can no longer
        self._opening: tuple[re.Pattern[bytes], Constraint] | None = None
        self._head = b""  # the output so far, while the opening is watched
        #: where the opening grammar stands (``Progress.opening`` tells the router)
        self.opening_state = OPENING_OFF
        try:
            if config.grammar:
                self._grammar(model, config.grammar, config.grammar_trigger)
            if config.opening_grammar and config.opening_trigger and self.grammar is None:  # a lazy one beside
                pattern = re.compile(config.opening_trigger.encode())
                self._opening = (pattern, Constraint(model, config.opening_grammar))
                self.opening_state = OPENING_WATCHED
        except AdmissionError:
            self.close()
            raise
        if self.grammar is not None or self.watching or self.pre is not None:
            self._data = np.zeros(model.n_vocab, dtype=_TOKEN_DATA)
            self._ids = np.arange(model.n_vocab, dtype=np.int32)

    @property
    def watching(self) -> bool:
        """A lazy grammar waits for its trigger: the output is free and watched."""
        return self.trigger is not None or self._opening is not None

    def _grammar(self, model: LlamaModelFile, grammar: str, trigger: str | None) -> None:
        """The grammar. With a trigger it is lazy: it constrains the output
        from the trigger's first appearance on (the grammar's text starts
        with the trigger). The watching is done here, not by the grammar (a
        grammar over the whole output would be asked about every token); the
        grammar only ever sees the tokens from the one that began the
        trigger, whatever that token held before it (``lazy_grammar``)."""
        constraint = Constraint(model, lazy_grammar(grammar, trigger))
        if trigger:
            self.trigger, self._lazy = trigger.encode(), constraint
        else:
            self.grammar = constraint

    def _watch(self, token: int) -> None:
        """Follow the output for the lazy grammars' triggers; once one is
        written, feed its grammar the tokens that wrote it (if it refuses
        them, the output stays free: its calls are validated afterwards)."""
        piece = self._special[token]
        if self._opening is not None:
            # the opening grammar itself says whether a call of its shape can
            # still begin so (it is fed as the output comes); its trigger,
            # whether the name is out
            pattern, opening = self._opening
            self._head += piece
            if not opening.accept([token]):
                self._opening, self._head, self.opening_state = None, b"", OPENING_OFF
            elif pattern.match(self._head):  # it holds the output; nothing else is watched
                self._opening, self._head = None, b""
                self.grammar, self.opening_state = opening, OPENING_HELD
                self.trigger = self._lazy = None
                return
        trigger = self.trigger
        if trigger is None:
            return
        self._seen = (self._seen + piece)[-4 * len(trigger) :]
        self._recent.append(token)
        if trigger not in self._seen:
            return
        recent = list(self._recent)
        k = 1
        while k < len(recent) and trigger not in b"".join(self._special[t] for t in recent[-k:]):
            k += 1
        assert self._lazy is not None
        self._switch_on(self._lazy, recent[-k:])

    def _switch_on(self, grammar: Constraint, tokens: list[int]) -> None:
        """A trigger was written: ``grammar`` holds the output from here (if
        it takes ``tokens``), and nothing is watched any more."""
        self.grammar = grammar if grammar.accept(tokens) else None
        self.trigger = self._lazy = self._opening = None
        self._head, self.opening_state = b"", OPENING_OFF

    def _constraints(self, model: LlamaModelFile, config: GenerationConfig, chain: Any) -> None:
        """Logit bias (``ignore_eos`` included) and repetition penalties."""
        L = lib()
        bias = dict(config.logit_bias)
        if config.ignore_eos:
            bias.update({t: float("-inf") for t in model.eog_tokens})
        if bias:
            arr = (L.llama_logit_bias * len(bias))()
            for i, (tok, b) in enumerate(bias.items()):
                if not 0 <= tok < model.n_vocab:
                    self.close()
                    raise AdmissionError(f"logit_bias names token {tok}, outside the vocabulary", "logit_bias")
                arr[i].token = tok
                arr[i].bias = b
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(model.n_vocab, len(bias), arr))
        if config.repeat_penalty != 1.0 or config.presence_penalty != 0.0 or config.frequency_penalty != 0.0:
            L.llama_sampler_chain_add(
                chain,
                L.llama_sampler_init_penalties(
                    model.n_vocab,
                    config.penalty_last_n,
                    config.repeat_penalty,
                    config.frequency_penalty,
                    config.presence_penalty,
                ),
            )

    @staticmethod
    def _selection(config: GenerationConfig, chain: Any) -> None:
        """Greedy, or top-k / top-p / min-p, temperature and a seeded pick."""
        L = lib()

        def add(s: Any) -> None:
            L.llama_sampler_chain_add(chain, s)

        if config.greedy:
            add(L.llama_sampler_init_greedy())
            return
        if config.top_k > 0:
            add(L.llama_sampler_init_top_k(config.top_k))
        if config.top_p < 1.0:
            add(L.llama_sampler_init_top_p(config.top_p, 1))
        if config.min_p > 0.0:
            add(L.llama_sampler_init_min_p(config.min_p, 1))
        add(L.llama_sampler_init_temp(config.temperature))
        seed = config.seed if config.seed is not None else random.getrandbits(32)
        add(L.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, ctx_ptr: Any, index: int) -> int:
        if self.pre is not None:
            token = self._sample_with_probs(ctx_ptr, index)
        elif self.trigger is None and self._opening is None:  # nothing watched: the plain paths
            if self.grammar is None:
                return int(lib().llama_sampler_sample(self.ptr, ctx_ptr, index))
            return self._sample_constrained(ctx_ptr, index)
        else:
            # a lazy grammar not yet triggered constrains nothing: the fast
            # path, the output only watched for the trigger
            token = int(lib().llama_sampler_sample(self.ptr, ctx_ptr, index))
        if self.watching:
            self._watch(token)
        return token

    def _array(self, data: np.ndarray) -> ctypes.Structure:
        L = lib()
        arr: ctypes.Structure = L.llama_token_data_array()
        arr.data = data.ctypes.data_as(L.llama_token_data_p)
        arr.size = len(data)
        arr.selected = -1
        arr.sorted = False
        return arr

    def _candidates(self, ctx_ptr: Any, index: int) -> ctypes.Structure:
        row = lib().llama_get_logits_ith(ctx_ptr, index)
        data = self._data
        data["id"] = self._ids
        data["logit"] = np.ctypeslib.as_array(row, shape=(self.n_vocab,))
        data["p"] = 0.0
        return self._array(data)

    def _sample_constrained(self, ctx_ptr: Any, index: int) -> int:
        L = lib()
        arr = self._candidates(ctx_ptr, index)
        L.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        token = int(arr.data[arr.selected].id)  # samplers may re-point data
        grammar = self.grammar
        assert grammar is not None
        if not grammar.allows(token):  # the grammar forbids it: mask the vocabulary
            arr = self._candidates(ctx_ptr, index)
            self._data["logit"][~grammar.mask()] = -np.inf
            L.llama_sampler_apply(self.ptr, ctypes.byref(arr))
            token = int(arr.data[arr.selected].id)
        if not grammar.accept([token]):  # nothing allowed (a dead end): free from here
            self.grammar = None
        L.llama_sampler_accept(self.ptr, token)
        return token

    def _sample_with_probs(self, ctx_ptr: Any, index: int) -> int:
        """The pick, with the log-probabilities of the distribution the
        constraints leave (logit bias, penalties, the grammar over the whole
        vocabulary), before truncation and temperature: what the model gives
        each token here, so the greedy pick is always the most likely."""
        L = lib()
        arr = self._candidates(ctx_ptr, index)
        L.llama_sampler_apply(self.pre, ctypes.byref(arr))
        grammar = self.grammar  # None while a lazy grammar waits
        raw = ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_byte))  # samplers may re-point data
        view = np.ctypeslib.as_array(raw, shape=(arr.size * _TOKEN_DATA.itemsize,)).view(_TOKEN_DATA)
        if grammar is not None:
            view["logit"][~grammar.mask()[view["id"]]] = -np.inf
        logits = view["logit"].astype(np.float64)
        top = float(logits.max())
        logprobs = logits - (top + np.log(np.exp(logits - top).sum()))
        ids = view["id"].copy()
        L.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        token = int(arr.data[arr.selected].id)
        if self.post:  # what the selection left: the candidates and their probabilities
            ids, logprobs = _after_selection(arr, token)
        if grammar is not None and not grammar.accept([token]):
            self.grammar = None
        L.llama_sampler_accept(self.pre, token)
        L.llama_sampler_accept(self.ptr, token)
        n = min(self.top_n or 0, len(ids))
        best: list[tuple[int, float]] = []
        if n:
            cut = np.argpartition(-logprobs, n - 1)[:n]
            cut = cut[np.argsort(-logprobs[cut], kind="stable")]
            best = [(int(ids[i]), float(logprobs[i])) for i in cut if np.isfinite(logprobs[i])]
        where = np.flatnonzero(ids == token)
        self.probs = (float(logprobs[where[0]]) if len(where) else float("-inf"), best)
        return token

    def close(self) -> None:
        self.grammar = self._lazy = self._opening = None
        if getattr(self, "pre", None):
            lib().llama_sampler_free(self.pre)
            self.pre = None
        if self.ptr:
            lib().llama_sampler_free(self.ptr)
            self.ptr = None
