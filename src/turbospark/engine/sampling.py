"""Per-sequence sampler chains, built inside llama.cpp.

Sampling in llama.cpp's own chain is what keeps the decode loop free of
per-token logits copies into Python (the reason ``Llama.generate`` is slower
than llama.cpp's server).

A grammar is kept out of the chain: applying it to the whole vocabulary costs
several milliseconds a token (as much as the decode itself on a small model),
so, as llama.cpp's own server does, the token is picked without it and only
that one token is checked against the grammar; the full-vocabulary pass runs
only when the pick is rejected.
"""

from __future__ import annotations

import ctypes
import random
from collections import deque
from typing import Any

import numpy as np

from .llama import LlamaModelFile, lib
from .types import AdmissionError, GenerationConfig

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def _lead_in(grammar: str, first: str) -> str:
    """``grammar`` behind any text without ``first`` (the trigger's first
    character): what the token that began the trigger may hold before it."""
    body = grammar.replace("root ::=", "lazy-call ::=", 1)
    ch = "\\" + first if first in "[]^-\\" else first
    return f"root ::= lazy-lead lazy-call\nlazy-lead ::= [^{ch}]*\n{body}"


class SamplerChain:
    """Owns one ``llama_sampler`` chain; free it with :meth:`close`."""

    def __init__(self, model: LlamaModelFile, config: GenerationConfig) -> None:
        L = lib()
        self.ptr = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self.grammar = None
        #: with logprobs asked for, the constraints (logit bias, penalties)
        #: are a chain of their own, so the distribution can be read between
        #: them and the selection (top-k/p, temperature, the pick)
        self.pre = None
        self.n_vocab = model.n_vocab
        self.top_n = config.logprobs
        #: (the pick's logprob, [(token, logprob) most likely first]) of the
        #: last :meth:`sample`, when logprobs are asked for
        self.probs: tuple[float, list[tuple[int, float]]] | None = None
        if self.top_n is not None:
            self.pre = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self._constraints(model, config, self.pre or self.ptr)
        self._selection(config, self.ptr)
        #: a lazy grammar's trigger, until the output has written it; the
        #: grammar is then fed the tokens that wrote it (``_watch``)
        self.trigger: bytes | None = None
        self._seen = b""
        self._recent: deque[int] = deque(maxlen=32)
        self._special = model.special_pieces
        if config.grammar:
            g = self._grammar(model, config.grammar, config.grammar_trigger)
            if not g:
                self.close()
                raise AdmissionError("the grammar could not be parsed by llama.cpp", "grammar")
            self.grammar = g
        if self.grammar is not None or self.pre is not None:
            self._data = np.zeros(model.n_vocab, dtype=_TOKEN_DATA)
            self._ids = np.arange(model.n_vocab, dtype=np.int32)
            self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def _grammar(self, model: LlamaModelFile, grammar: str, trigger: str | None) -> Any:
        """The grammar sampler. With a trigger it is lazy: it constrains the
        output from the trigger's first appearance on (the grammar's text
        starts with the trigger). The watching is done here, not by
        llama.cpp's lazy grammar, which matches a regex over the whole output
        at every token (16 % of Qwen's decode rate); the grammar only ever
        sees the tokens from the one that began the trigger, whatever that
        token held before it (``lead``)."""
        L = lib()
        if trigger:
            self.trigger = trigger.encode()
            grammar = _lead_in(grammar, trigger[0])
        return L.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")

    def _watch(self, token: int) -> None:
        """Follow the output for the lazy grammar's trigger; once it is
        written, feed the grammar the tokens that wrote it (if it refuses
        them, the output stays free: its calls are validated afterwards)."""
        trigger = self.trigger
        assert trigger is not None
        self._seen = (self._seen + self._special[token])[-4 * len(trigger) :]
        self._recent.append(token)
        if trigger not in self._seen:
            return
        self.trigger = None
        recent = list(self._recent)
        k = 1
        while k < len(recent) and trigger not in b"".join(self._special[t] for t in recent[-k:]):
            k += 1
        L = lib()
        for t in recent[-k:]:
            one = self._one
            one["id"][0], one["logit"][0], one["p"][0] = t, 1.0, 0.0
            single = self._array(one)
            L.llama_sampler_apply(self.grammar, ctypes.byref(single))
            if not np.isfinite(one["logit"][0]):
                L.llama_sampler_free(self.grammar)
                self.grammar = None
                return
            L.llama_sampler_accept(self.grammar, t)

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
        elif self.grammar is None:
            return int(lib().llama_sampler_sample(self.ptr, ctx_ptr, index))
        elif self.trigger is not None:
            # a lazy grammar not yet triggered constrains nothing: the fast
            # path, the output only watched for the trigger
            token = int(lib().llama_sampler_sample(self.ptr, ctx_ptr, index))
        else:
            return self._sample_constrained(ctx_ptr, index)
        if self.trigger is not None:
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
        one = self._one
        one["id"][0], one["logit"][0], one["p"][0] = token, 1.0, 0.0
        single = self._array(one)
        L.llama_sampler_apply(self.grammar, ctypes.byref(single))
        if not np.isfinite(one["logit"][0]):  # the grammar forbids it: full pass
            arr = self._candidates(ctx_ptr, index)
            L.llama_sampler_apply(self.grammar, ctypes.byref(arr))
            L.llama_sampler_apply(self.ptr, ctypes.byref(arr))
            token = int(arr.data[arr.selected].id)
        L.llama_sampler_accept(self.grammar, token)
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
        constrained = self.grammar is not None and self.trigger is None
        if constrained:
            L.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        raw = ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_byte))  # samplers may re-point data
        view = np.ctypeslib.as_array(raw, shape=(arr.size * _TOKEN_DATA.itemsize,)).view(_TOKEN_DATA)
        logits = view["logit"].astype(np.float64)
        top = float(logits.max())
        logprobs = logits - (top + np.log(np.exp(logits - top).sum()))
        ids = view["id"].copy()
        L.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        token = int(arr.data[arr.selected].id)
        if constrained:
            L.llama_sampler_accept(self.grammar, token)
        L.llama_sampler_accept(self.pre, token)
        L.llama_sampler_accept(self.ptr, token)
        n = min(self.top_n or 0, len(ids))
        best: list[tuple[int, float]] = []
        if n:
            cut = np.argpartition(-logprobs, n - 1)[:n]
            cut = cut[np.argsort(-logprobs[cut], kind="stable")]
            best = [(int(ids[i]), float(logprobs[i])) for i in cut]
        where = np.flatnonzero(ids == token)
        self.probs = (float(logprobs[where[0]]) if len(where) else float("-inf"), best)
        return token

    def close(self) -> None:
        if getattr(self, "grammar", None):
            lib().llama_sampler_free(self.grammar)
            self.grammar = None
        if getattr(self, "pre", None):
            lib().llama_sampler_free(self.pre)
            self.pre = None
        if self.ptr:
            lib().llama_sampler_free(self.ptr)
            self.ptr = None
