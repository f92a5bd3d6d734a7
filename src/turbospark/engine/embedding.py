"""Embeddings from a loaded GGUF, in a llama.cpp context of their own.

Why a separate context: the chat scheduler thread owns the chat context, so
an embedding request that went through it would wait behind every running
generation. This context belongs to the :class:`Embedder` alone (guarded by a
lock) and runs in the caller's thread, next to the scheduler.

Why one ubatch per sequence: llama.cpp pools per ubatch (a sequence split
over two ubatches is pooled over the last part only), so the context is
created with ``n_ctx == n_batch == n_ubatch`` and a sequence longer than that
is refused (a 400 with the numbers) unless the caller asks for truncation
(Ollama's ``truncate``, on by default there).
"""

from __future__ import annotations

import threading

import numpy as np

from .llama import Batch, ContextOptions, LlamaContext, LlamaModelFile, default_threads, lib
from .types import AdmissionError, Embeddings, EngineError

POOLING_NONE = 0
POOLING_MEAN = 1
POOLING_CLS = 2
POOLING_LAST = 3
POOLING_NAMES = {POOLING_MEAN: "mean", POOLING_CLS: "cls", POOLING_LAST: "last"}

#: Default embedding context: long enough for ordinary chunks, while the
#: worst-case llama.cpp buffers (it computes logits for every token in
#: embedding mode) stay well under a gigabyte for small models.
DEFAULT_EMBED_CTX = 2048
DEFAULT_EMBED_SEQS = 64  # sequences per decode (llama.cpp allows up to 256)


def embed_threads(chat_threads: int) -> int:
    """Half the chat context's threads: the two contexts run at the same
    time by design, and oversubscribed cores make ggml's spinning thread
    barriers collapse (a 16-token decode went from 0.2 s to 2 s)."""
    return max(1, (chat_threads or default_threads()) // 2)


def declared_pooling(file: LlamaModelFile) -> int | None:
    """The pooling type the GGUF declares (``<arch>.pooling_type``), if any."""
    arch = file.metadata.get("general.architecture", "")
    raw = file.metadata.get(f"{arch}.pooling_type")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def choose_pooling(file: LlamaModelFile) -> int:
    """The GGUF's own pooling when it declares a usable one; else MEAN (a
    causal LM such as SmolLM2 declares none, and the last token alone is a
    poor summary of a short text)."""
    declared = declared_pooling(file)
    return declared if declared in POOLING_NAMES else POOLING_MEAN


class Embedder:
    """Encodes texts into unit-norm vectors; thread-safe, blocking."""

    def __init__(
        self,
        file: LlamaModelFile,
        n_ctx: int = DEFAULT_EMBED_CTX,
        n_seq_max: int = DEFAULT_EMBED_SEQS,
        threads: int = 0,
        pooling: int | None = None,
    ) -> None:
        self.file = file
        self.pooling = choose_pooling(file) if pooling is None else pooling
        n_ctx = max(8, min(n_ctx, file.n_ctx_train or n_ctx))
        # llama.cpp aborts (not errors) unless n_seq_max <= n_batch; 256 is
        # its LLAMA_MAX_SEQ.
        n_seq_max = max(1, min(n_seq_max, n_ctx, 256))
        self.ctx = LlamaContext(
            file,
            ContextOptions(
                n_ctx=n_ctx,
                n_batch=n_ctx,
                n_ubatch=n_ctx,
                n_seq_max=n_seq_max,
                n_threads=threads or default_threads(),
                embeddings=True,
                pooling=self.pooling,
                kv_unified=True,  # every sequence may use the whole context
            ),
        )
        # One sequence must fit one ubatch (see the module docstring);
        # llama.cpp may pad n_ctx up, but never the batch sizes.
        L = lib()
        self.max_tokens = min(
            self.ctx.n_ctx, self.ctx.n_ctx_seq, L.llama_n_batch(self.ctx.ptr), L.llama_n_ubatch(self.ctx.ptr)
        )
        self.max_seqs = n_seq_max
        # a tokenizer that appends EOS / SEP keeps it when an input is cut
        self.appends_end = bool(L.llama_vocab_get_add_eos(file.vocab)) or bool(L.llama_vocab_get_add_sep(file.vocab))
        self.dim = file.n_embd
        self._batch = Batch(self.max_tokens)
        self._lock = threading.Lock()

    # -- tokens ----------------------------------------------------------------
    def tokens(self, text: str) -> list[int]:
        """The real tokenization: BOS, EOS / SEP exactly as the vocabulary
        asks (llama.cpp adds them under ``add_special`` only when the GGUF's
        ``add_bos`` / ``add_eos`` / ``add_sep`` flags say so)."""
        return self.file.tokenize(text, True, False)

    def admit(self, texts: list[str], truncate: bool = False) -> list[list[int]]:
        if not texts:
            raise AdmissionError("no input to embed", "input")
        out: list[list[int]] = []
        for i, text in enumerate(texts):
            toks = self.tokens(text)
            if not toks:
                raise AdmissionError(f"input[{i}] is empty (0 tokens)", "input")
            if len(toks) > self.max_tokens and truncate:
                keep = self.max_tokens - 1 if self.appends_end else self.max_tokens
                toks = toks[:keep] + (toks[-1:] if self.appends_end else [])
            if len(toks) > self.max_tokens:
                raise AdmissionError(
                    f"input[{i}] is {len(toks)} tokens, but the embedding context is {self.max_tokens} tokens",
                    "input",
                )
            out.append(toks)
        return out

    def plan(self, lengths: list[int]) -> list[list[int]]:
        """Group input indices, in order, into decodes of at most
        ``max_seqs`` sequences and ``max_tokens`` tokens."""
        groups: list[list[int]] = []
        cur: list[int] = []
        used = 0
        for i, n in enumerate(lengths):
            if cur and (len(cur) >= self.max_seqs or used + n > self.max_tokens):
                groups.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += n
        if cur:
            groups.append(cur)
        return groups

    # -- encode ------------------------------------------------------------------
    def encode(self, texts: list[str], truncate: bool = False) -> Embeddings:
        """Unit vectors for ``texts``; an input over the context is refused,
        or cut at the end when ``truncate`` (usage counts what was used)."""
        toks = self.admit(texts, truncate)
        vectors: list[list[float]] = [[] for _ in toks]
        groups = self.plan([len(t) for t in toks])
        with self._lock:
            if self.ctx.ptr is None:
                raise EngineError("the embedding context is closed")
            try:
                for group in groups:
                    for i, vec in zip(group, self._decode([toks[i] for i in group])):
                        vectors[i] = vec
            finally:
                self.ctx.clear()
        return Embeddings(vectors, [len(t) for t in toks])

    def _decode(self, seqs: list[list[int]]) -> list[list[float]]:
        """One llama_decode over several sequences (distinct sequence ids),
        then each one's pooled vector, L2-normalised."""
        ctx, batch = self.ctx, self._batch
        ctx.clear()  # nothing of a previous decode may be attended to
        batch.clear()
        for seq, ids in enumerate(seqs):
            batch.add_run(ids, 0, seq, True)
        batch.logits[: batch.n] = 1  # embedding mode outputs every token
        rc = ctx.decode(batch)
        if rc != 0:
            raise EngineError(f"llama_decode failed with status {rc} while embedding")
        out: list[list[float]] = []
        for seq in range(len(seqs)):
            vec = ctx.embeddings_seq(seq)
            if vec is None:
                raise EngineError("llama.cpp returned no pooled embedding")
            out.append(unit(vec).tolist())
        return out

    def info(self) -> dict[str, object]:
        return {
            "dimensions": self.dim,
            "context": self.max_tokens,
            "pooling": POOLING_NAMES.get(self.pooling, str(self.pooling)),
            "sequences_per_decode": self.max_seqs,
        }

    def close(self) -> None:
        with self._lock:
            self.ctx.close()


def unit(vec: np.ndarray) -> np.ndarray:
    """L2-normalise in float64 (an all-zero vector stays zero)."""
    v = np.asarray(vec, dtype=np.float64)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def pooling_of(ctx: LlamaContext) -> int:
    """The pooling llama.cpp actually applies in ``ctx``."""
    return int(lib().llama_pooling_type(ctx.ptr))
