"""OpenAI legacy Completions (``/v1/completions``): wire models and pure
translations.

In: a raw ``prompt`` (no chat template; BOS as the model wants it) to the
internal :class:`ChatRequest`. Out: ``text_completion`` JSON, or the SSE
sequence of ``text_completion`` chunks, a finish chunk, an optional usage
chunk (``stream_options.include_usage``) and ``data: [DONE]``. With
``timings: true`` (llama.cpp server's extension) the body and the finish
chunk also carry llama.cpp's ``timings`` object, from the engine's result.

``suffix`` makes it an insert: the model fills in between the prompt and
the suffix with its fill-in-the-middle tokens (a model without them is a
400). Features the engine cannot give (``echo``, ``logprobs``,
``best_of``/``n`` above 1, token-id prompts) are refused with a 400 naming
the field, rather than silently answered without them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..engine.types import GenerationConfig, StopReason
from ..generation import ChatRequest, FillIn, Final
from .common import BadRequest, new_id, sse_data, unix_time
from .errors import Failure, openai_error
from .openai_chat import StreamOptions, sampling, timings, usage
from .render import SSE, Unsent
from .translate import Translation

#: OpenAI's documented default for ``max_tokens`` on this endpoint.
DEFAULT_MAX_TOKENS = 16


class CompletionRequest(BaseModel):
    """The fields we act on; unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    prompt: str | list[Any]
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    echo: bool | None = None
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool | None = None
    #: llama.cpp server's opt-in per-response ``timings`` object
    timings: bool | None = None

    #: ``sampling`` (shared with Chat Completions) reads this; the
    #: Completions API has no such field.
    @property
    def top_logprobs(self) -> None:
        return None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences are supported")
        return v


def prompt_text(prompt: str | list[Any]) -> str:
    """The one prompt string; batches and token-id prompts are refused."""
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        raise BadRequest("'prompt' must not be an empty list", "prompt")
    if all(isinstance(p, str) for p in prompt):
        if len(prompt) > 1:
            raise BadRequest(
                f"only one prompt per request is supported; 'prompt' is a list of {len(prompt)} strings",
                "prompt",
            )
        return prompt[0]
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt) or all(isinstance(p, list) for p in prompt):
        raise BadRequest("token-id prompts are not supported; send 'prompt' as a string", "prompt")
    raise BadRequest("'prompt' must be a string or a list with one string", "prompt")


def _refuse_unsupported(body: CompletionRequest) -> None:
    if body.echo:
        raise BadRequest("'echo' is not supported by this server", "echo")
    if body.logprobs is not None:
        raise BadRequest("'logprobs' is not supported by this server", "logprobs")
    if body.best_of not in (None, 1):
        raise BadRequest("only best_of=1 is supported", "best_of")
    if body.n not in (None, 1):
        raise BadRequest("only n=1 is supported", "n")


def to_chat_request(body: CompletionRequest) -> Translation:
    """A raw prompt, no template."""
    _refuse_unsupported(body)
    text = prompt_text(body.prompt)
    config = GenerationConfig()
    sampling(body, config)
    config.session_key = body.prompt_cache_key or body.user
    fill = FillIn(text, body.suffix) if body.suffix is not None else None
    req = ChatRequest(
        prompt=None if fill else text,
        fill_in=fill,
        config=config,
        max_tokens_explicit=body.max_tokens is not None,
        default_max_tokens=DEFAULT_MAX_TOKENS,
    )
    if body.max_tokens is not None:
        config.max_new_tokens = body.max_tokens
    return Translation(req, [], bool(body.stream))


def finish_reason(reason: StopReason) -> str:
    """Completions knows only ``stop`` and ``length`` (no tool calls)."""
    return "length" if reason is StopReason.MAX_TOKENS else "stop"


class CompletionRenderer(Unsent):
    """Renders one response (non-streamed JSON or the SSE chunk sequence):
    a :class:`~turbospark.dialects.render.Renderer` of text only."""

    media_type = SSE

    def __init__(
        self, model_name: str, include_usage: bool = False, want_timings: bool = False, stream: bool = False
    ) -> None:
        self.stream = stream
        self.id = new_id("cmpl-")
        self.created = unix_time()
        self.model = model_name
        self.include_usage = include_usage
        self.want_timings = want_timings

    def _object(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "turbospark",
            "choices": choices,
        }

    @staticmethod
    def _choice(text: str, finish: str | None) -> dict[str, Any]:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

    def complete(self, final: Final) -> dict[str, Any]:
        out = self._object([self._choice(final.text, finish_reason(final.result.reason))])
        out["usage"] = usage(final)
        if self.want_timings:
            out["timings"] = timings(final)
        return out

    def _chunk(self, text: str, finish: str | None = None, final: Final | None = None) -> bytes:
        chunk = self._object([self._choice(text, finish)])
        if self.include_usage:
            chunk["usage"] = None
        if final is not None and self.want_timings:
            chunk["timings"] = timings(final)
        return sse_data(chunk)

    def text(self, text: str) -> bytes:
        return self._chunk(text)

    def final(self, final: Final) -> bytes:
        out = self._chunk("", finish_reason(final.result.reason), final)
        if self.include_usage:
            last = self._object([])
            last["usage"] = usage(final)
            out += sse_data(last)
        return out + b"data: [DONE]\n\n"

    def error(self, failure: Failure) -> bytes:
        """One ``event: error`` frame, and no ``[DONE]``."""
        return failure.sse_frame(openai_error)
