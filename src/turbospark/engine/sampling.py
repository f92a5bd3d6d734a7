"""Per-sequence sampler chains, built inside llama.cpp.

Sampling in llama.cpp's own chain is what keeps the decode loop free of
per-token logits copies into Python (the reason ``Llama.generate`` is slower
than llama.cpp's server).
"""

from __future__ import annotations

import random

from .llama import LlamaModelFile, lib
from .types import AdmissionError, GenerationConfig


class SamplerChain:
    """Owns one ``llama_sampler`` chain; free it with :meth:`close`."""

    def __init__(self, model: LlamaModelFile, config: GenerationConfig) -> None:
        L = lib()
        self.ptr = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        add = lambda s: L.llama_sampler_chain_add(self.ptr, s)  # noqa: E731
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
            add(L.llama_sampler_init_logit_bias(model.n_vocab, len(bias), arr))
        if config.grammar:
            g = L.llama_sampler_init_grammar(model.vocab, config.grammar.encode(), b"root")
            if not g:
                self.close()
                raise AdmissionError("the grammar could not be parsed by llama.cpp", "grammar")
            add(g)
        if (
            config.repeat_penalty != 1.0
            or config.presence_penalty != 0.0
            or config.frequency_penalty != 0.0
        ):
            add(
                L.llama_sampler_init_penalties(
                    model.n_vocab,
                    config.penalty_last_n,
                    config.repeat_penalty,
                    config.frequency_penalty,
                    config.presence_penalty,
                )
            )
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

    def sample(self, ctx_ptr, index: int) -> int:
        return lib().llama_sampler_sample(self.ptr, ctx_ptr, index)

    def accept(self, token: int) -> None:
        lib().llama_sampler_accept(self.ptr, token)

    def close(self) -> None:
        if self.ptr:
            lib().llama_sampler_free(self.ptr)
            self.ptr = None
