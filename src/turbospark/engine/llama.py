"""A thin, allocation-free layer over llama.cpp's C API (via llama-cpp-python's
ctypes bindings).

We use the low-level API rather than ``llama_cpp.Llama`` because the
high-level class copies the whole logits row into Python every token and owns
a single sequence; the scheduler needs batches over many sequences, KV memory
operations and llama.cpp's own sampler chains.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .gguf import check_model
from .types import AdmissionError

log = logging.getLogger("turbospark.engine")

_backend_lock = threading.Lock()
_backend_ready = False
_log_callback = None  # kept referenced: llama.cpp holds the raw pointer


def lib() -> Any:
    """Import llama_cpp lazily so that importing turbospark stays cheap."""
    import llama_cpp

    return llama_cpp


def init_backend(verbose: bool = False) -> None:
    """Initialise llama.cpp once per process and route its log to ours."""
    global _backend_ready, _log_callback
    with _backend_lock:
        if _backend_ready:
            return
        L = lib()
        L.llama_backend_init()
        llog = logging.getLogger("turbospark.llama")
        show = verbose or bool(os.environ.get("TURBOSPARK_LLAMA_LOG"))

        log_callback: Callable[[Callable[[int, bytes, object], None]], Any] = L.llama_log_callback

        @log_callback
        def _cb(level: int, text: bytes, _user: object) -> None:  # pragma: no cover - C callback
            # GGML_LOG_LEVEL_ERROR == 4; WARN == 3
            if show or level == 4:
                try:
                    msg = text.decode("utf-8", "replace").rstrip()
                except Exception:
                    return
                if msg:
                    llog.log(logging.ERROR if level == 4 else logging.DEBUG, "%s", msg)

        _log_callback = _cb
        L.llama_log_set(_cb, ctypes.c_void_p(0))
        _backend_ready = True


@dataclass(frozen=True)
class ContextOptions:
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_threads: int = 0  # 0 = all cores
    embeddings: bool = False
    pooling: int = -1  # LLAMA_POOLING_TYPE_UNSPECIFIED
    flash_attn: int = -1  # auto
    #: KV cache element type: "f16", or quantised "q8_0" / "q4_0" (less
    #: memory; llama.cpp quantises V only with flash attention, which "auto"
    #: turns on where the backend has it)
    cache_type: str = "f16"
    #: None = the process default (TURBOSPARK_KV_UNIFIED); the embedder needs
    #: True (one ubatch packs sequences of different lengths).
    kv_unified: bool | None = None


#: --cache-type values -> ggml types, and their bytes per element (q8_0: 34
#: bytes per block of 32, q4_0: 18)
CACHE_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}
#: compiled grammars a model file keeps (LlamaModelFile.grammar_matcher)
_GRAMMAR_CACHE = 32
#: flash attention settings (llama_flash_attn_type)
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
CACHE_TYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


class LlamaModelFile:
    """A loaded GGUF: weights, vocabulary, metadata, and a token piece table."""

    def __init__(
        self,
        path: str,
        n_gpu_layers: int = -1,
        progress: Callable[[float], None] | None = None,
        verbose: bool = False,
    ) -> None:
        init_backend(verbose)
        L = lib()
        self.path = path
        params = L.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 999
        self._progress_cb = None
        if progress is not None:
            progress_callback: Callable[[Callable[[float, object], bool]], Any] = L.llama_progress_callback

            @progress_callback
            def _p(frac: float, _user: object) -> bool:  # pragma: no cover - C callback
                try:
                    progress(float(frac))
                except Exception:
                    pass
                return True

            self._progress_cb = _p
            params.progress_callback = _p
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model file not found: {path}")
        check_model(path)  # a truncated or damaged file: a clear NotGGUF, not llama.cpp's failure
        self.ptr = L.llama_model_load_from_file(path.encode(), params)
        if not self.ptr:
            raise RuntimeError(f"llama.cpp could not load {path} (not a GGUF it understands?)")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab: int = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(self.ptr)
        self.n_embd = L.llama_model_n_embd(self.ptr)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.bos = L.llama_vocab_bos(self.vocab)
        self.eos = L.llama_vocab_eos(self.vocab)
        self.eot = L.llama_vocab_eot(self.vocab)
        #: fill-in-the-middle tokens (-1 where the vocabulary has none)
        self.fim = {
            name: int(getattr(L, f"llama_vocab_fim_{name}")(self.vocab))
            for name in ("pre", "suf", "mid", "pad", "rep", "sep")
        }
        self.metadata = self._read_metadata()
        self._build_piece_table()

    # -- metadata ---------------------------------------------------------
    def _read_metadata(self) -> dict[str, str]:
        L = lib()
        out: dict[str, str] = {}
        n = L.llama_model_meta_count(self.ptr)
        kbuf = ctypes.create_string_buffer(512)
        vsize = 1 << 16
        vbuf = ctypes.create_string_buffer(vsize)
        for i in range(n):
            if L.llama_model_meta_key_by_index(self.ptr, i, kbuf, 512) < 0:
                continue
            need = L.llama_model_meta_val_str_by_index(self.ptr, i, vbuf, vsize)
            if need >= vsize:
                big = ctypes.create_string_buffer(need + 1)
                L.llama_model_meta_val_str_by_index(self.ptr, i, big, need + 1)
                val = big.value
            else:
                val = vbuf.value
            out[kbuf.value.decode("utf-8", "replace")] = val.decode("utf-8", "replace")
        return out

    def describe(self) -> str:
        L = lib()
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.ptr, buf, 256)
        return buf.value.decode("utf-8", "replace")

    @property
    def size_bytes(self) -> int:
        return int(lib().llama_model_size(self.ptr))

    @property
    def n_params(self) -> int:
        return int(lib().llama_model_n_params(self.ptr))

    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    # -- tokens -------------------------------------------------------------
    def _build_piece_table(self) -> None:
        """Every token's bytes, rendered once, so the per-token detokenizer is
        a list lookup instead of a C call plus a buffer copy."""
        L = lib()
        buf = ctypes.create_string_buffer(256)
        plain: list[bytes] = []
        special: list[bytes] = []
        longest = 0
        eog: set[int] = set()
        control: set[int] = set()
        marked: dict[str, int] = {}
        user_defined = L.LLAMA_TOKEN_ATTR_USER_DEFINED
        for t in range(self.n_vocab):
            n = L.llama_token_to_piece(self.vocab, t, buf, 256, 0, False)
            plain.append(buf.raw[:n] if n > 0 else b"")
            longest = max(longest, abs(n))  # -n: a piece longer than the buffer
            n = L.llama_token_to_piece(self.vocab, t, buf, 256, 0, True)
            special.append(buf.raw[:n] if n > 0 else b"")
            longest = max(longest, abs(n))
            if L.llama_vocab_is_eog(self.vocab, t):
                eog.add(t)
            if L.llama_vocab_is_control(self.vocab, t):
                control.add(t)
                marked[special[-1].decode("utf-8", "replace")] = t
            elif (
                L.llama_vocab_get_attr(self.vocab, t) & user_defined
                and special[-1][:1] == b"<"
                and special[-1][-1:] == b">"
            ):
                marked[special[-1].decode("utf-8", "replace")] = t
        #: the text of every token a grammar names by id rather than as text
        #: (control tokens, and added ones like Qwen's ``<tool_call>``)
        self.marked_tokens = marked
        self._grammar_tokenizer: Any = None
        self._grammar_lock = threading.Lock()
        #: compiled grammars by text, most recent last (agents send the same
        #: tools with every request): a sequence takes a copy
        self._grammars: OrderedDict[str, Any] = OrderedDict()
        self.pieces = plain
        self.special_pieces = special
        #: the most bytes one token stands for (a bound for prompt lengths)
        self.longest_piece = longest
        self.eog_tokens = frozenset(eog)
        self.control_tokens = frozenset(control)

    def grammar_tokenizer(self) -> Any:
        """llguidance's view of the vocabulary (built once, ~1 s on a 150k
        vocabulary: call it off the engine thread first): every token's bytes,
        the marked ones behind a 0xFF byte so that grammar text never matches
        them, and the end-of-generation tokens as its EOS."""
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                from llguidance import LLTokenizer

                ids = set(self.marked_tokens.values())
                tokens = [b"\xff" + p if t in ids else p for t, p in enumerate(self.special_pieces)]
                tokenize = ctypes.cast(lib().llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
                self._grammar_tokenizer = LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
                    tokens=tokens,
                    vocab_ptr=self.vocab,
                    tokenize_fptr=tokenize,
                    eos_token=sorted(self.eog_tokens) or [self.eos],
                    slices=None,
                )
            return self._grammar_tokenizer

    def grammar_matcher(self, grammar: str) -> Any:
        """A fresh llguidance matcher for ``grammar`` (Lark text). The first
        use compiles it (milliseconds to tens of them for an agent's tool
        list: do it off the engine thread, as the generation core's prepare
        does); later ones copy the compiled one (microseconds). A grammar
        that does not compile is an :class:`AdmissionError`."""
        import llguidance

        with self._grammar_lock:
            compiled = self._grammars.get(grammar)
            if compiled is not None:
                self._grammars.move_to_end(grammar)
                return compiled.deep_copy()
        matcher = llguidance.LLMatcher(
            self.grammar_tokenizer(), llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0
        )
        if matcher.is_error():
            why = matcher.get_error().splitlines()[0][:300]
            raise AdmissionError(f"the grammar could not be compiled: {why}", "grammar")
        with self._grammar_lock:
            self._grammars[grammar] = matcher
            while len(self._grammars) > _GRAMMAR_CACHE:
                self._grammars.popitem(last=False)
        return matcher.deep_copy()

    def token_text(self, token: int) -> str:
        if 0 <= token < self.n_vocab:
            return self.special_pieces[token].decode("utf-8", "replace")
        return ""

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        L = lib()
        data = text.encode("utf-8")
        cap = len(data) + 16
        arr = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
            if n < 0:
                raise RuntimeError("tokenization failed")
        return list(arr[:n])

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        table = self.special_pieces if special else self.pieces
        return b"".join(table[t] for t in tokens if 0 <= t < self.n_vocab).decode("utf-8", "replace")

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lib().llama_model_free(self.ptr)
            self.ptr = None


class Batch:
    """A llama_batch whose arrays are numpy buffers we own, so filling a
    prefill chunk is a slice assignment rather than thousands of ctypes
    element writes."""

    def __init__(self, capacity: int) -> None:
        L = lib()
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros((capacity, 1), dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        row = ctypes.POINTER(ctypes.c_int32)
        base = self.seq_ids.ctypes.data
        self._rows = (row * capacity)(*[ctypes.cast(base + 4 * i, row) for i in range(capacity)])
        self.struct = L.llama_batch()
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.embd = ctypes.POINTER(ctypes.c_float)()
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = ctypes.cast(self._rows, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def add(self, token: int, pos: int, seq: int, output: bool) -> int:
        i = self.n
        self.token[i] = token
        self.pos[i] = pos
        self.seq_ids[i, 0] = seq
        self.logits[i] = 1 if output else 0
        self.n = i + 1
        return i

    def add_run(self, tokens: list[int], pos0: int, seq: int, output_last: bool) -> int:
        """Add a run of tokens of one sequence; returns the index of the last."""
        i, k = self.n, len(tokens)
        self.token[i : i + k] = tokens
        self.pos[i : i + k] = np.arange(pos0, pos0 + k, dtype=np.int32)
        self.seq_ids[i : i + k, 0] = seq
        self.logits[i : i + k] = 0
        if output_last:
            self.logits[i + k - 1] = 1
        self.n = i + k
        return i + k - 1

    @property
    def room(self) -> int:
        return self.capacity - self.n


class EmbdBatch(Batch):
    """A llama_batch of embeddings (media chunks' rows) instead of token
    ids: llama.cpp takes one or the other in a batch."""

    def __init__(self, capacity: int, n_embd: int) -> None:
        super().__init__(capacity)
        self.embd = np.zeros((capacity, n_embd), dtype=np.float32)
        self.struct.token = ctypes.POINTER(ctypes.c_int32)()
        self.struct.embd = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def add_rows(self, rows: np.ndarray, pos0: int, seq: int, output_last: bool) -> int:
        """Add a run of one sequence's embedding rows; returns the index of the last."""
        i, k = self.n, len(rows)
        self.embd[i : i + k] = rows
        self.pos[i : i + k] = np.arange(pos0, pos0 + k, dtype=np.int32)
        self.seq_ids[i : i + k, 0] = seq
        self.logits[i : i + k] = 0
        if output_last:
            self.logits[i + k - 1] = 1
        self.n = i + k
        return i + k - 1


class LlamaContext:
    """One llama_context (KV memory + compute) over a loaded model."""

    def __init__(self, model: LlamaModelFile, opts: ContextOptions) -> None:
        L = lib()
        self.model = model
        self.opts = opts
        p = L.llama_context_default_params()
        p.n_ctx = opts.n_ctx
        p.n_batch = opts.n_batch
        p.n_ubatch = min(opts.n_ubatch, opts.n_batch)
        p.n_seq_max = opts.n_seq_max
        threads = opts.n_threads or default_threads()
        p.n_threads = threads
        p.n_threads_batch = threads
        p.kv_unified = (
            opts.kv_unified if opts.kv_unified is not None else os.environ.get("TURBOSPARK_KV_UNIFIED", "0") == "1"
        )
        p.no_perf = True
        p.embeddings = opts.embeddings
        if opts.embeddings:
            p.pooling_type = opts.pooling
        p.flash_attn_type = opts.flash_attn
        if opts.cache_type != "f16":
            p.type_k = p.type_v = CACHE_TYPES[opts.cache_type]
        self.ptr = L.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            raise RuntimeError(
                f"llama.cpp could not create a context of {opts.n_ctx} tokens "
                f"x {opts.n_seq_max} sequences (out of memory?)"
            )
        self.n_ctx = L.llama_n_ctx(self.ptr)
        self.n_ctx_seq = L.llama_n_ctx_seq(self.ptr)
        self.mem = L.llama_get_memory(self.ptr)
        self.threads = threads

    def decode(self, batch: Batch) -> int:
        batch.struct.n_tokens = batch.n
        rc: int = lib().llama_decode(self.ptr, batch.struct)
        return rc

    def set_causal(self, causal: bool) -> None:
        """Causal attention on or off (a non-causal media chunk's decode)."""
        lib().llama_set_causal_attn(self.ptr, causal)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(lib().llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Copy ``src``'s KV cells in positions [p0, p1) to ``dst``
        (``llama_memory_seq_cp``; -1 = open end).

        With one KV stream per sequence (``kv_unified`` false) llama.cpp
        copies only whole streams: it replaces ``dst``'s whole stream with
        ``src``'s, and the data moves at the start of the next decode (before
        anything is written). There, p0 and p1 MUST stay -1: a partial range
        across streams fails an assertion that aborts the process. Copy the
        whole sequence, then ``seq_rm`` what ``dst`` should not keep."""
        lib().llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_state(self, seq: int) -> bytes:
        """The KV state of one sequence (``llama_state_seq_get_data``)."""
        L = lib()
        size = int(L.llama_state_seq_get_size(self.ptr, seq))
        buf = (ctypes.c_uint8 * size)()
        got = int(L.llama_state_seq_get_data(self.ptr, buf, size, seq))
        return ctypes.string_at(buf, got)

    def set_seq_state(self, seq: int, state: bytes) -> bool:
        """Load a state from :meth:`seq_state` into ``seq`` (emptied first)."""
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        return int(lib().llama_state_seq_set_data(self.ptr, buf, len(state), seq)) != 0

    def seq_pos_max(self, seq: int) -> int:
        return int(lib().llama_memory_seq_pos_max(self.mem, seq))

    def clear(self) -> None:
        lib().llama_memory_clear(self.mem, True)

    def embeddings_seq(self, seq: int) -> np.ndarray | None:
        ptr = lib().llama_get_embeddings_seq(self.ptr, seq)
        if not ptr:
            return None
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_embd,)).copy()

    def embeddings_ith(self, i: int) -> np.ndarray | None:
        ptr = lib().llama_get_embeddings_ith(self.ptr, i)
        if not ptr:
            return None
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_embd,)).copy()

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lib().llama_free(self.ptr)
            self.ptr = None
