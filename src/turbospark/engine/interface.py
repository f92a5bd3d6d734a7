"""The model interface (CONTRACT §3): what the generation core, the
registry and the routes may ask of a model. Nothing wraps a model: the
generation core reports each run through the request's ``observe.Reporter``,
so every caller sees the real model (its template included).

Optional, read with ``getattr`` by the registry's watchdog: ``failure`` (why
the model's engine died, or None) and ``stalled_for()`` (seconds without an
engine step while work waits); a model without them is always healthy.
Read by the generation core: ``enforces_grammars`` (True when every token
obeys ``config.grammar``; tool calls then stream as they are written; a
model without it is not trusted to), ``marked_tokens`` (text → id of the
tokens a grammar names by id) and ``compile_grammar(grammar, trigger)``
(compiles it off the engine thread, raising AdmissionError when it cannot)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .channel import Run
from .types import CancelFlag, Embeddings, GenerationConfig


@runtime_checkable
class ChatModel(Protocol):
    model_id: str
    aliases: tuple[str, ...]
    supports_chat: bool
    supports_embeddings: bool
    vision: Any
    default_reasoning: Any
    default_system: str | None

    @property
    def tokenizer(self) -> Any: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_context(self) -> int: ...

    def info(self) -> dict[str, Any]: ...
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...
    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kw: Any
    ) -> list[int]: ...
    def prompt_ids(self, text: str) -> list[int]: ...
    def check_admission(self, n_prompt: int, max_new: int) -> None: ...
    def default_max_new(self, n_prompt: int, default: int) -> int: ...
    def reserve(self, config: GenerationConfig) -> Callable[[], None]: ...
    def load(self) -> dict[str, Any]: ...
    def generate(self, prompt_ids: list[int], config: GenerationConfig, images: Any, cancel: CancelFlag) -> Run: ...
    def encode(self, texts: list[str], truncate: bool = False) -> Embeddings: ...
