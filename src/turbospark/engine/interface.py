"""The local engine's interface: what ``local.LocalBackend`` and
``prompt.prepare_local`` ask of a model that runs here (CONTRACT §3).
:class:`~turbospark.engine.model.LlamaChatModel` implements it, and so does
the tests' scripted model; every member is required (nothing is probed).

The core never sees this interface: it drives a ``backend.Backend``. A
local model's tokens and template are known here, so it renders prompts,
enforces grammars (``enforces_grammars``: every token obeys
``config.grammar``, and tool calls stream as they are written) and admits
requests itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .channel import Run
from .media import MediaPrompt
from .slotcontrol import SlotControl
from .types import CancelFlag, Embeddings, GenerationConfig, Ranking


class ChatModel(Protocol):
    model_id: str
    aliases: tuple[str, ...]
    #: "chat" models also embed; an embedding model only embeds; a reranker only reranks
    supports_chat: bool
    supports_embeddings: bool
    supports_rerank: bool
    default_reasoning: str | None
    default_system: str | None
    #: sampling fields a request that does not set them gets (temperature,
    #: top_k ...: ``ModelOptions.sampling``)
    default_sampling: dict[str, Any]
    #: the sampler applies ``config.grammar``
    enforces_grammars: bool

    @property
    def vocab_size(self) -> int: ...
    @property
    def max_context(self) -> int: ...
    @property
    def template_source(self) -> str:
        """The chat template's text (read for what it handles: tools, thinking)."""
        ...

    @property
    def fim_tokens(self) -> dict[str, int]:
        """Fill-in-the-middle tokens: pre, suf, mid, pad, rep, sep (-1: none)."""
        ...

    @property
    def marked_tokens(self) -> dict[str, int]:
        """Text → id of the tokens a grammar names by id."""
        ...

    @property
    def eog_tokens(self) -> tuple[int, ...]:
        """The end-of-generation tokens (``ignore_eos`` bans them)."""
        ...

    @property
    def leading_bos(self) -> tuple[int, ...]:
        """The BOS a prompt starts with when the vocabulary wants one."""
        ...

    @property
    def vision(self) -> bool:
        """Images are read (a projector that takes them is loaded)."""
        ...

    @property
    def audio(self) -> bool:
        """Sound is heard (a projector that takes it is loaded)."""
        ...

    def media_prompt(self, text: str, media: list[bytes], chat: bool) -> MediaPrompt:
        """A prompt's text with ``MEDIA_MARKER`` once per item, and the
        items' bytes, tokenized (its ``ids`` hold the media placeholders):
        a rendered chat (``chat``: special tokens parsed) or a raw prompt."""
        ...

    def render_media_chat(
        self, messages: list[dict[str, Any]], media: list[bytes], tools: list[dict[str, Any]] | None = None, **kw: Any
    ) -> MediaPrompt:
        """:meth:`render_chat` for messages whose text holds media markers."""
        ...

    @property
    def failure(self) -> str | None:
        """Why its engine died (it then serves nothing more), else None."""
        ...

    def stalled_for(self) -> float:
        """Seconds its engine has made no step while work waits (0: none)."""
        ...

    def info(self) -> dict[str, Any]: ...
    def slot_control(self) -> SlotControl | None:
        """Its session slots for llama-server's ``/slots`` routes (None: it
        has none to show or act on)."""
        ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...
    def chat_text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kw: Any
    ) -> str: ...
    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kw: Any
    ) -> list[int]: ...
    def prompt_ids(self, text: str) -> list[int]: ...
    def compile_grammar(self, grammar: str, trigger: str | None = None) -> None:
        """Compile off the engine thread (AdmissionError when it cannot)."""
        ...

    def check_admission(self, n_prompt: int, max_new: int) -> None: ...
    def default_max_new(self, n_prompt: int, default: int) -> int: ...
    def reserve(self, config: GenerationConfig) -> Callable[[], None]: ...
    def load(self) -> dict[str, Any]: ...
    def generate(
        self, prompt_ids: list[int], config: GenerationConfig, media: MediaPrompt | None, cancel: CancelFlag
    ) -> Run: ...
    def generate_many(
        self, prompt_ids: list[int], configs: list[GenerationConfig], media: MediaPrompt | None, cancel: CancelFlag
    ) -> list[Run]: ...
    def encode(self, texts: list[str], truncate: bool = False) -> Embeddings: ...
    def rerank(
        self,
        query: str,
        documents: list[str],
        cancel: CancelFlag,
        truncate: bool = False,
        max_doc_tokens: int | None = None,
    ) -> Ranking:
        """Each document's score against ``query`` (blocking; a reranker only)."""
        ...

    def close(self) -> None: ...
