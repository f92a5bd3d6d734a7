"""The llama.cpp-backed chat model: the model interface of CONTRACT §3.

It renders prompts with the GGUF's chat template, admits requests (empty
prompts and context overflows are clean errors, never silent truncation), and
hands generation to its scheduler thread. ``generate`` is the ONE generation
entry point every dialect goes through: an async iterator of progress items
ending in the result, fed straight from the scheduler thread (engine/channel.py).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .channel import Channel, Run
from .embedding import DEFAULT_EMBED_CTX, Embedder, declared_pooling, embed_threads
from .gguf import POOLING_RANK
from .hostcache import cache_folder, default_budget_mib
from .jobs import Job
from .llama import CACHE_TYPES, FLASH_ATTN, ContextOptions, LlamaContext, LlamaModelFile, default_threads, lib
from .media import MediaPrompt, Projector, check_ids
from .memory import KvPlan, plan_kv
from .rerank import DEFAULT_RANK_CTX, Ranker
from .sampling import lazy_grammar
from .scheduler import Scheduler
from .slotcontrol import SlotControl
from .template import TURN_END_MARKERS, ChatTemplate
from .types import (
    AdmissionError,
    CancelFlag,
    ContextOverflow,
    Embeddings,
    EngineError,
    GenerationConfig,
    Progress,
    Ranking,
    RawDecodeResult,
    ReaderBehind,
)

#: pieces of output a run may hold for a reader that does not take them
#: (a streaming client that stopped reading) before the run is cut: about
#: 25 s of decoding at 40 tokens/s, far more than a reader that keeps up
#: ever leaves (it takes everything at each wake-up)
MAX_UNREAD = 1024


@dataclass
class ModelOptions:
    """How to load and run one model (CLI flags / config map onto this)."""

    path: str
    id: str | None = None
    aliases: tuple[str, ...] = ()
    #: informational tags the model lists show (llama-server's ``--tags``)
    tags: tuple[str, ...] = ()
    #: "chat" (chat, completions and embeddings), "embedding" (embeddings
    #: only) or "rerank" (a reranker: rerank only; a GGUF whose pooling is
    #: rank is one whatever its kind says)
    kind: str = "chat"
    #: seconds idle before the registry unloads it (None: stays resident)
    keep_alive: float | None = None
    ctx: int = 4096
    threads: int = 0
    parallel: int = 4
    session_slots: int = 0  # 0 = same as parallel
    prefix_reuse: bool = True
    #: prompt-lookup speculative decoding (exact; see engine/speculative.py)
    speculative: bool = True
    draft_max: int = 16
    max_queue: int = 0
    #: the host-memory KV tier in MiB (None: a quarter of the memory
    #: available at load, at most 4 GiB; 0: off)
    cache_ram: int | None = None
    #: KV cache element type: "f16" (default, exact), "q8_0" or "q4_0"
    cache_type: str = "f16"
    #: keep the host tier in this folder across restarts (None: memory only)
    cache_dir: str | None = None
    batch: int = 512
    prefill_chunk: int = 256
    #: flash attention: "auto" (on where the backend has it), "on" or "off"
    flash_attn: str = "auto"
    gpu_layers: int = -1
    default_system: str | None = None
    default_reasoning: str | None = None
    chat_template: str | None = None
    #: sampling defaults (``GenerationConfig`` fields: temperature, top_p,
    #: top_k, min_p, seed and the penalties) for requests that do not set them
    sampling: dict[str, Any] = field(default_factory=dict)
    #: where the model comes from when it is pulled (a reference such as
    #: ``org/repo:Q4_K_M``; the config's ``pull`` key), else None
    pull: str | None = None
    #: a multimodal projector GGUF beside it (images, sound: ``--mmproj``)
    mmproj: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def derive_id(path: str) -> str:
    """A short model id from a file name: ``SmolLM2-135M-Instruct.Q4_1.gguf``
    becomes ``smollm2-135m-instruct``."""
    name = os.path.basename(path)
    if name.lower().endswith(".gguf"):
        name = name[:-5]
    head = name.split(".")[0] if "." in name else name
    return head.lower()


def flash_attn_type(setting: str) -> int:
    """``--flash-attn`` as llama.cpp's ``llama_flash_attn_type``."""
    if setting not in FLASH_ATTN:
        raise ValueError(f"flash attention must be one of {', '.join(FLASH_ATTN)}, not {setting!r}")
    return FLASH_ATTN[setting]


def can_roll_back(file: LlamaModelFile) -> bool:
    """Speculation removes rejected drafts from the KV; sliding-window and
    recurrent memories cannot drop a partial sequence."""
    L = lib()
    return not (
        L.llama_model_n_swa(file.ptr) > 0 or L.llama_model_is_recurrent(file.ptr) or L.llama_model_is_hybrid(file.ptr)
    )


def open_chat(
    file: LlamaModelFile, opts: ModelOptions, seq_ctx: int, name: str, end_turn_tokens: frozenset[int]
) -> tuple[KvPlan, LlamaContext, Scheduler]:
    """A chat model's context (its KV cache holds ``seq_ctx`` tokens for
    every session slot) and the scheduler thread that owns it."""
    slots = max(opts.session_slots or opts.parallel, opts.parallel, 1)
    if opts.batch < 1 or opts.prefill_chunk < 1:
        raise ValueError("batch and prefill chunk must be at least 1 token")
    flash_attn = flash_attn_type(opts.flash_attn)
    if opts.cache_type not in CACHE_TYPES:
        raise ValueError(f"cache type must be one of {', '.join(CACHE_TYPES)}, not {opts.cache_type!r}")
    kv_plan = plan_kv(file, slots, seq_ctx, opts.cache_type)
    ctx = LlamaContext(
        file,
        ContextOptions(
            n_ctx=kv_plan.cells,
            n_batch=opts.batch,
            n_ubatch=opts.batch,
            n_seq_max=slots,
            flash_attn=flash_attn,
            n_threads=opts.threads or default_threads(),
            cache_type=opts.cache_type,
        ),
    )
    try:
        scheduler = Scheduler(
            file,
            ctx,
            parallel=opts.parallel,
            prefix_reuse=opts.prefix_reuse,
            max_queue=opts.max_queue,
            prefill_chunk=opts.prefill_chunk,
            end_turn_tokens=end_turn_tokens,
            speculative=opts.speculative and can_roll_back(file),
            draft_max=opts.draft_max,
            name=name,
            host_cache_bytes=(default_budget_mib() if opts.cache_ram is None else opts.cache_ram) << 20,
            cache_dir=cache_folder(opts.cache_dir, opts.path, opts.cache_type) if opts.cache_dir else None,
        )
    except BaseException:
        ctx.close()
        raise
    return kv_plan, ctx, scheduler


class LlamaChatModel:
    """A loaded GGUF serving chat/completion requests through its scheduler."""

    supports_chat = True
    #: the sampler applies ``config.grammar`` (engine/sampling.py)
    enforces_grammars = True
    supports_embeddings = True
    supports_rerank = False
    default_reasoning: str | None = None

    def __init__(self, opts: ModelOptions, progress: Callable[[float], None] | None = None) -> None:
        self.opts = opts
        if opts.kind not in ("chat", "embedding", "rerank"):
            raise ValueError(f"model kind must be 'chat', 'embedding' or 'rerank', not {opts.kind!r}")
        self.file = LlamaModelFile(opts.path, n_gpu_layers=opts.gpu_layers, progress=progress)
        ranks = opts.kind == "rerank" or declared_pooling(self.file) == POOLING_RANK
        self.kind = "rerank" if ranks else opts.kind
        self.supports_chat = self.kind == "chat"
        self.supports_embeddings = not ranks
        self.supports_rerank = ranks
        #: --ctx is what ONE request may use (prompt + new tokens)
        self.seq_ctx = opts.ctx or self.file.n_ctx_train
        self.model_id = opts.id or derive_id(opts.path)
        self.aliases = tuple(opts.aliases)
        self.default_system = opts.default_system
        self.default_reasoning = opts.default_reasoning
        self.default_sampling = dict(opts.sampling)
        self._embedder: Embedder | None = None  # created on first encode()
        self.projector: Projector | None = None
        self.ranker: Ranker | None = None
        self._embedder_lock = threading.Lock()
        self._closed = False
        bos = self.file.token_text(self.file.bos) if self.file.bos >= 0 else ""
        eos = self.file.token_text(self.file.eos) if self.file.eos >= 0 else ""
        self.template = ChatTemplate(opts.chat_template or self.file.chat_template(), bos, eos)
        self.end_turn_tokens = self._end_turn_tokens()
        self.eog_tokens = tuple(sorted(self.file.eog_tokens))  # (ignore_eos bans them)
        # An embedding-only model or a reranker has no chat context, KV slots
        # or scheduler: only its own context, made at once since it is the point.
        self.kv_plan: KvPlan | None = None
        self.ctx: LlamaContext | None = None
        self.scheduler: Scheduler | None = None
        try:
            if self.supports_chat:
                self.kv_plan, self.ctx, self.scheduler = open_chat(
                    self.file, opts, self.seq_ctx, self.model_id, self.end_turn_tokens
                )
                if opts.mmproj:
                    self.projector = Projector(opts.mmproj, self.file, opts.threads)
            elif ranks:
                fa = flash_attn_type(opts.flash_attn)
                self.ranker = Ranker(self.file, opts.ctx or DEFAULT_RANK_CTX, opts.threads, fa, self.model_id)
            else:
                self.embedder()
        except Exception:
            self._close_engine()
            raise

    # ------------------------------------------------------------ interface
    @property
    def template_source(self) -> str:
        return self.template.source

    @property
    def leading_bos(self) -> tuple[int, ...]:
        return (self.file.bos,) if self.file.add_bos and self.file.bos >= 0 else ()

    @property
    def marked_tokens(self) -> dict[str, int]:
        """Text → id of the tokens a grammar names by id (tools/grammar.py)."""
        return self.file.marked_tokens

    def compile_grammar(self, grammar: str, trigger: str | None = None) -> None:
        """Compile ``grammar`` (lazy behind ``trigger``) for this vocabulary
        off the engine thread, where the sequence then only copies it (an
        :class:`AdmissionError` if it does not compile); the first call also
        builds the grammar engine's view of the vocabulary (~1 s)."""
        self.file.grammar_matcher(lazy_grammar(grammar, trigger))

    @property
    def vision(self) -> bool:  # (a projector that takes images is loaded)
        return self.projector is not None and self.projector.vision

    @property
    def audio(self) -> bool:  # (a projector that takes sound is loaded)
        return self.projector is not None and self.projector.audio

    def render_media_chat(
        self,
        messages: list[dict[str, Any]],
        media: list[bytes],
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> MediaPrompt:
        """:meth:`render_chat` for messages whose text holds media markers."""
        return self.media_prompt(self.chat_text(messages, tools, **template_kwargs), media, chat=True)

    def media_prompt(self, text: str, media: list[bytes], chat: bool) -> MediaPrompt:
        """Text holding ``MEDIA_MARKER`` once per item, and the items' bytes,
        tokenized (off the engine thread: images are decoded here); ``chat``:
        a rendered chat (special tokens parsed), else a raw prompt."""
        if self.projector is None:
            raise AdmissionError(f"model {self.model_id!r} has no projector: it takes no images or sound", "messages")
        self._check_length(text)
        bos = self.template.bos_token if chat else ""
        add_bos = self.file.add_bos and not (bos and text.startswith(bos))
        batch = self.ctx.opts.n_batch if self.ctx is not None else 0
        return self.projector.prompt(text, media, add_bos, chat, batch)

    @property
    def vocab_size(self) -> int:
        return self.file.n_vocab

    @property
    def max_context(self) -> int:
        return self.ranker.max_tokens if self.ranker is not None else self.seq_ctx

    def info(self) -> dict[str, Any]:
        md = self.file.metadata
        return {
            "id": self.model_id,
            "aliases": list(self.aliases),
            "tags": list(self.opts.tags),
            "path": self.opts.path,
            "architecture": md.get("general.architecture", ""),
            "name": md.get("general.name", ""),
            "description": self.file.describe(),
            "parameters": self.file.n_params,
            "size_bytes": self.file.size_bytes,
            "context": self.max_context,
            "context_train": self.file.n_ctx_train,
            "parallel": self.scheduler.parallel if self.scheduler else 0,
            "session_slots": len(self.scheduler.slots) if self.scheduler else 0,
            "speculative": self.scheduler.speculative if self.scheduler else False,
            "kv_cache": self.kv_plan.describe() if self.kv_plan else f"no chat KV cache ({self.kind} model)",
            "kv_cache_bytes": self.kv_plan.kv_bytes if self.kv_plan else 0,
            "threads": self._own_context().threads,
            "kind": self.kind,
            **({"rerank": self.ranker.info()} if self.ranker is not None else {}),
            "quantization": md.get("general.file_type", ""),
            "chat_template": self.template.source,
            "sampling": dict(self.default_sampling),
            "mmproj": self.opts.mmproj if self.projector is not None else None,
            "modalities": {"vision": self.vision, "audio": self.audio},
        }

    def _own_context(self) -> LlamaContext:
        """The context it runs on: the chat one, else the reranker's or the embedder's."""
        if self.ctx is not None:
            return self.ctx
        return self.ranker.ctx if self.ranker is not None else self.embedder().ctx

    def slot_control(self) -> SlotControl | None:
        """Its session slots (``/slots``); None for an embedding model or a reranker."""
        return SlotControl(self.scheduler, self.seq_ctx) if self.scheduler is not None else None

    def _end_turn_tokens(self) -> frozenset[int]:
        out = set()
        if self.file.eot >= 0:
            out.add(self.file.eot)
        for t in self.file.eog_tokens:
            text = self.file.token_text(t)
            if text in TURN_END_MARKERS and text in self.template.source:
                out.add(t)
        return frozenset(out)

    # -- tokenizer -----------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.file.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return self.file.detokenize(tokens)

    @property
    def fim_tokens(self) -> dict[str, int]:
        """The vocabulary's fill-in-the-middle tokens: pre, suf, mid, pad,
        rep, sep (-1 where it has none)."""
        return dict(self.file.fim)

    def chat_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Messages through the model's own template, as text (the prompt
        :meth:`render_chat` tokenises; llama.cpp's ``/apply-template``)."""
        if self.default_system and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": self.default_system}, *messages]
        return self.template.render(messages, tools=tools, **template_kwargs)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Messages to prompt token ids through the model's own template."""
        text = self.chat_text(messages, tools, **template_kwargs)
        self._check_length(text)
        bos = self.template.bos_token
        add_bos = self.file.add_bos and not (bos and text.startswith(bos))
        ids = self.file.tokenize(text, add_bos, True)
        return ids

    def prompt_ids(self, text: str) -> list[int]:
        """A raw prompt (no chat template), BOS per the model."""
        self._check_length(text)
        return self.file.tokenize(text, self.file.add_bos, False)

    # -- admission -----------------------------------------------------------
    def _check_length(self, text: str) -> None:
        """Refuse a text that cannot fit the context before tokenising it: no
        token is longer than the vocabulary's longest piece, so the text has
        at least len(bytes) / longest tokens (tokenising megabytes takes
        seconds; this takes microseconds)."""
        longest = self.file.longest_piece
        if len(text) <= self.max_context or longest <= 0:
            return
        at_least = len(text.encode("utf-8")) // longest
        if at_least > self.max_context:
            # at least this many: counted from its length, not tokenised
            raise ContextOverflow(at_least, 0, self.max_context, "messages")

    @property
    def failure(self) -> str | None:
        """Why this model's engine thread died, if it did (it then serves
        nothing more: the registry replaces it)."""
        if self.ranker is not None:
            return self.ranker.failure
        return self.scheduler.failure if self.scheduler is not None else None

    def stalled_for(self) -> float:
        """Seconds its engine has made no step while work waits (0: none)."""
        return self.scheduler.stalled_for() if self.scheduler is not None else 0.0

    def reserve(self, config: GenerationConfig) -> Callable[[], None]:
        """Hold a place on the wait list for the generation ``config`` will
        run (raises :class:`Overloaded` when it is full), before any response
        byte is sent; returns the release for a generation that never runs."""
        if self.scheduler is None:
            return lambda: None
        reservation = self.scheduler.reserve()
        config.reservation = reservation
        return reservation.release

    def check_admission(self, n_prompt: int, max_new: int) -> None:
        if n_prompt <= 0:
            raise AdmissionError("the prompt is empty", "messages")
        if max_new <= 0:
            raise AdmissionError("max_tokens must be at least 1", "max_tokens")
        limit = self.max_context
        if n_prompt + max_new > limit:
            raise ContextOverflow(n_prompt, max_new, limit)

    def default_max_new(self, n_prompt: int, default: int) -> int:
        """The default budget, clipped to what the context still has room for."""
        return max(1, min(default, self.max_context - n_prompt))

    # -- generation ----------------------------------------------------------
    def generate(
        self, prompt_ids: list[int], config: GenerationConfig, media: MediaPrompt | None, cancel: CancelFlag
    ) -> Run:
        """Submit one generation to the scheduler; the returned :class:`Run`
        yields its progress, then its result (call it on the event loop).
        ``media``: the prompt's media (from :meth:`media_prompt`; its ids
        are ``prompt_ids``). Refusals (no room, no chat context) raise here,
        before any engine work."""
        if self.scheduler is None:
            raise AdmissionError(f"model {self.model_id!r} serves {self._serves} only", "model")
        check_ids(prompt_ids, media, self.projector)
        self.check_admission(len(prompt_ids), config.max_new_tokens)
        channel = Channel(asyncio.get_running_loop(), MAX_UNREAD, lambda unread: cancel.fail(ReaderBehind(unread)))
        self.scheduler.submit(Job(list(prompt_ids), config, cancel, channel, media=media))
        return Run(channel)

    def generate_many(
        self, prompt_ids: list[int], configs: list[GenerationConfig], media: MediaPrompt | None, cancel: CancelFlag
    ) -> list[Run]:
        """:meth:`generate` for the choices of one request (OpenAI ``n``):
        one run per config, the prompt prefilled once and its KV copied to
        the others (see ``steps.Stepper._fork``). They share ``cancel``."""
        if len(configs) == 1:
            return [self.generate(prompt_ids, configs[0], media, cancel)]
        if self.scheduler is None:
            raise AdmissionError(f"model {self.model_id!r} serves {self._serves} only", "model")
        check_ids(prompt_ids, media, self.projector)
        for config in configs:
            self.check_admission(len(prompt_ids), config.max_new_tokens)
        loop = asyncio.get_running_loop()
        channels = [Channel(loop, MAX_UNREAD, lambda unread: cancel.fail(ReaderBehind(unread))) for _ in configs]
        jobs = [
            Job(list(prompt_ids), config, cancel, channel, media=media) for config, channel in zip(configs, channels)
        ]
        jobs[0].siblings = jobs[1:]
        self.scheduler.submit(jobs[0])
        return [Run(channel) for channel in channels]

    async def run_completion(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        media: MediaPrompt | None,
        cancel: CancelFlag,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> RawDecodeResult:
        """:meth:`generate` run to its end (for tests and benchmarks; the
        server iterates the run itself). Cancelling the awaiting task sets
        ``cancel``; the engine stops at its next step."""
        run = self.generate(prompt_ids, config, media, cancel)
        try:
            return await run.result(on_progress)
        except asyncio.CancelledError:
            cancel.cancel("the client went away")
            raise

    def load(self) -> dict[str, Any]:
        """What the scheduler is doing now (for /api/ps, /v1/slots, gauges)."""
        sch = self.scheduler
        if sch is None:
            return {"running": 0, "waiting": self.ranker.waiting if self.ranker else 0, "slots": []}
        return {
            "running": sch.running,
            "waiting": sch.waiting,
            "slots": sch.slot_view(),
            "host_cache": sch.host.snapshot(),
        }

    @property
    def _serves(self) -> str:
        return "rerank requests" if self.ranker is not None else "embeddings"

    def embedder(self) -> Embedder:
        """The embedding context, created on first use: servers that never
        embed never pay for it. ``opts.extra["embed_ctx"]`` and
        ``["embed_threads"]`` size it."""
        with self._embedder_lock:
            if self._closed:
                raise EngineError(f"model {self.model_id!r} is closed")
            if self._embedder is None:
                n_ctx = int(self.opts.extra.get("embed_ctx") or min(self.max_context, DEFAULT_EMBED_CTX))
                # beside a chat context it takes half the threads; alone, all
                threads = int(
                    self.opts.extra.get("embed_threads")
                    or (
                        embed_threads(self.opts.threads)
                        if self.supports_chat
                        else self.opts.threads or default_threads()
                    )
                )
                self._embedder = Embedder(self.file, n_ctx=n_ctx, threads=threads)
            return self._embedder

    def encode(self, texts: list[str], truncate: bool = False) -> Embeddings:
        """Blocking (call it from a worker thread); never waits for the chat
        scheduler, since the embedder has a context of its own. ``truncate``
        cuts inputs longer than the embedding context (Ollama's default)
        instead of refusing them."""
        if self.ranker is not None:
            raise AdmissionError(f"model {self.model_id!r} is a reranker: it serves rerank requests only", "model")
        return self.embedder().encode(texts, truncate)

    def rerank(
        self,
        query: str,
        documents: list[str],
        cancel: CancelFlag,
        truncate: bool = False,
        max_doc_tokens: int | None = None,
    ) -> Ranking:
        """Blocking (call it from a worker thread): each document's score
        against ``query``, scored on the reranker's engine thread beside
        other requests' pairs (``engine/rerank.py``); a pair over the
        context is a 400 unless ``truncate`` (``engine/rankpairs.py``)."""
        if self.ranker is None:
            raise AdmissionError(f"model {self.model_id!r} is not a reranker (its GGUF's pooling is not rank)", "model")
        pairs = self.ranker.format.pairs(query, documents, truncate, max_doc_tokens)
        return self.ranker.submit(pairs.ids, cancel, pairs.truncated).result()

    def close(self) -> None:
        with self._embedder_lock:
            self._closed = True
            embedder, self._embedder = self._embedder, None
        if embedder is not None:
            embedder.close()
        self._close_engine()

    def _close_engine(self) -> None:
        """The scheduler (or the reranker), then the projector, the context and the file."""
        if self.scheduler is not None:
            self.scheduler.close()
        if self.ranker is not None:
            self.ranker.close()
        if self.projector is not None:
            self.projector.close()  # (before the model it was loaded beside)
        if self.ctx is not None:
            self.ctx.close()
        self.file.close()
