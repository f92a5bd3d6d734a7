"""The one generation core every dialect goes through.

A dialect translates its wire request into a :class:`ChatRequest`, calls
:func:`prepare` (template + admission: errors here are clean 4xx before any
byte of the response is sent), then either :func:`complete` or
:func:`stream`, and renders the :class:`Final` in its own shape. Usage always
comes from the engine's :class:`RawDecodeResult`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from .engine.types import AdmissionError, CancelFlag, GenerationConfig, Progress, RawDecodeResult

DEFAULT_MAX_TOKENS = 256


@dataclass
class ChatRequest:
    """The internal request: what every chat dialect translates into."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    #: A raw prompt (``/v1/completions``, Ollama ``raw``): no chat template.
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    config: GenerationConfig = field(default_factory=GenerationConfig)
    #: True when the client set the budget; otherwise it is a default that
    #: may be clipped to the room left in the context.
    max_tokens_explicit: bool = False
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prepared:
    prompt_ids: list[int]
    config: GenerationConfig


@dataclass
class Delta:
    """Visible text produced since the previous delta."""

    text: str


@dataclass
class Final:
    """The end of a generation, with the engine's own numbers."""

    result: RawDecodeResult
    text: str

    @property
    def prompt_tokens(self) -> int:
        return self.result.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.result.new_tokens

    @property
    def cached_tokens(self) -> int:
        return self.result.reused_prefix_tokens


def render(model: Any, req: ChatRequest) -> list[int]:
    """The prompt token ids exactly as :func:`prepare` prefills them (token
    counting endpoints use this, so their count is the real one)."""
    if req.prompt is not None:
        if req.prompt == "":
            raise AdmissionError("the prompt is empty", "prompt")
        return model.prompt_ids(req.prompt)
    if not req.messages:
        raise AdmissionError("'messages' must contain at least one message", "messages")
    return model.render_chat(req.messages, tools=req.tools, **req.template_kwargs)


def prepare(model: Any, req: ChatRequest) -> Prepared:
    """Render and tokenize the prompt and admit it against the context."""
    ids = render(model, req)
    if not ids:
        raise AdmissionError("the prompt is empty", "messages" if req.prompt is None else "prompt")
    config = req.config
    if not req.max_tokens_explicit:
        config.max_new_tokens = model.default_max_new(len(ids), req.default_max_tokens)
    model.check_admission(len(ids), config.max_new_tokens)
    return Prepared(ids, config)


async def complete(model: Any, prepared: Prepared, cancel: CancelFlag) -> Final:
    """Run to the end; the text comes from the engine's result."""
    result = await model.run_completion(prepared.prompt_ids, prepared.config, None, cancel, _ignore)
    return Final(result, result.text)


def _ignore(_: Progress) -> None:
    return None


async def stream(model: Any, prepared: Prepared, cancel: CancelFlag) -> AsyncIterator[Delta | Final]:
    """Deltas as the engine produces them, then one :class:`Final`.

    Closing the iterator early (a client that went away) sets the cancel flag
    but leaves the generation task running: the scheduler drops the sequence
    at its next step and the task ends with a ``cancelled`` result, which the
    reporting decorator still records as real work done.
    """
    queue: asyncio.Queue[Progress | None] = asyncio.Queue()
    task = asyncio.ensure_future(
        model.run_completion(prepared.prompt_ids, prepared.config, None, cancel, queue.put_nowait)
    )
    task.add_done_callback(_end_of(queue))
    pieces: list[str] = []
    try:
        while True:
            item = await queue.get()
            if item is None:
                break
            if item.text:
                pieces.append(item.text)
                yield Delta(item.text)
        result = task.result()  # raises the engine's error, if any
        yield Final(result, "".join(pieces))
    finally:
        if not task.done():
            cancel.cancel("the client went away")


def _end_of(queue: "asyncio.Queue[Progress | None]") -> Any:
    def done(task: "asyncio.Future[Any]") -> None:
        queue.put_nowait(None)
        if not task.cancelled():
            task.exception()  # retrieved here so an abandoned task logs nothing

    return done
