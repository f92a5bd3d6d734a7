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
400). ``logprobs: N`` gives each token's log-probability and the N most
likely at its place; ``n`` choices decode side by side from one prefill.
Features the engine cannot give (``echo``, ``best_of`` above 1, token-id
prompts) are refused with a 400 naming the field, rather than silently
answered without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.answer import Delta
from ..core.request import ChatRequest, FillIn, Final, Prepared
from ..engine.types import GenerationConfig, StopReason, TokenProb
from . import base
from .base import Kind, Served
from .common import BadRequest, new_id, sse_data, unix_time
from .errors import Failure, openai_error
from .openai_chat import (
    OPENAI_CORS_PREFIXES,
    ResponseFormat,
    StreamOptions,
    choices,
    constraints,
    sampling,
    timings,
    usage,
)
from .render import SSE, Unsent
from .translate import Translation, logprob_value, logprobs_setting

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
    #: llama-server's: the session slot to run in (-1: any)
    id_slot: int | None = None
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
    #: llama-server's constraints: a GBNF grammar, a JSON schema, or a
    #: response_format (``json_object`` / ``json_schema``, with a schema)
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

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
        return cast(str, prompt[0])
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt) or all(isinstance(p, list) for p in prompt):
        raise BadRequest("token-id prompts are not supported; send 'prompt' as a string", "prompt")
    raise BadRequest("'prompt' must be a string or a list with one string", "prompt")


def _refuse_unsupported(body: CompletionRequest) -> None:
    if body.echo:
        raise BadRequest("'echo' is not supported by this server", "echo")
    if body.best_of not in (None, 1):
        raise BadRequest("only best_of=1 is supported", "best_of")


def translate(body: CompletionRequest) -> Translation:
    """A raw prompt, no template."""
    _refuse_unsupported(body)
    text = prompt_text(body.prompt)
    config = GenerationConfig()
    sampling(body, config)
    config.logprobs = logprobs_setting(body.logprobs is not None, body.logprobs, "logprobs")
    config.session_key = body.prompt_cache_key or body.user
    fill = FillIn(text, body.suffix) if body.suffix is not None else None
    req = ChatRequest(
        prompt=None if fill else text,
        fill_in=fill,
        config=config,
        max_tokens_explicit=body.max_tokens is not None,
        default_max_tokens=DEFAULT_MAX_TOKENS,
        n=choices(body.n),
    )
    if body.max_tokens is not None:
        config.max_new_tokens = body.max_tokens
    constraints(body, req)
    return Translation(req, [], bool(body.stream))


def finish_reason(reason: StopReason) -> str:
    """Completions knows only ``stop`` and ``length`` (no tool calls)."""
    return "length" if reason is StopReason.MAX_TOKENS else "stop"


class CompletionRenderer(Unsent):
    """Renders one response (non-streamed JSON or the SSE chunk sequence):
    a :class:`~turbospark.dialects.render.ChoicesRenderer` of text only."""

    media_type = SSE

    def __init__(self, model_name: str, body: Any, stream: bool = False) -> None:
        self.stream = stream
        self.id = new_id("cmpl-")
        self.created = unix_time()
        self.model = model_name
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.want_timings = bool(body.timings)
        self.logprobs = body.logprobs is not None
        self.n = choices(body.n)
        self._finals: list[Final] = []
        #: each choice's text so far, in characters (``text_offset``)
        self._offsets = [0] * self.n

    def _object(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "turbospark",
            "choices": choices,
        }

    def _choice(
        self, text: str, finish: str | None, index: int = 0, logprobs: Sequence[TokenProb] | None = None
    ) -> dict[str, Any]:
        lp = self._logprobs(index, logprobs) if logprobs is not None and self.logprobs else None
        return {"text": text, "index": index, "logprobs": lp, "finish_reason": finish}

    def _logprobs(self, index: int, logprobs: Sequence[TokenProb]) -> dict[str, Any]:
        """The legacy shape: parallel lists of tokens, their logprobs, their
        alternatives as token -> logprob, and where each starts in the text."""
        offsets = []
        at = self._offsets[index]
        for p in logprobs:
            offsets.append(at)
            at += len(p.text)
        self._offsets[index] = at
        return {
            "tokens": [p.text for p in logprobs],
            "token_logprobs": [logprob_value(p.logprob) for p in logprobs],
            "top_logprobs": [{t.text: logprob_value(t.logprob) for t in p.top} for p in logprobs],
            "text_offset": offsets,
        }

    def complete(self, final: Final) -> dict[str, Any]:
        return self.complete_choices([final])

    def complete_choices(self, finals: list[Final]) -> dict[str, Any]:
        out = self._object([self._choice(f.text, finish_reason(f.result.reason), f.choice, f.logprobs) for f in finals])
        out["usage"] = usage(*finals)
        if self.want_timings:
            out["timings"] = timings(finals[0])
        return out

    def _chunk(self, choice: dict[str, Any], final: Final | None = None) -> bytes:
        chunk = self._object([choice])
        if self.include_usage:
            chunk["usage"] = None
        if final is not None and self.want_timings:
            chunk["timings"] = timings(final)
        return sse_data(chunk)

    def text(self, delta: Delta) -> bytes:
        return self._chunk(self._choice(delta.text, None, delta.choice, delta.logprobs))

    def final(self, final: Final) -> bytes:
        out = self._chunk(self._choice("", finish_reason(final.result.reason), final.choice), final)
        self._finals.append(final)
        if len(self._finals) < self.n:
            return out
        if self.include_usage:
            last = self._object([])
            last["usage"] = usage(*sorted(self._finals, key=lambda f: f.choice))
            out += sse_data(last)
        return out + b"data: [DONE]\n\n"

    def error(self, failure: Failure) -> bytes:
        """One ``event: error`` frame, and no ``[DONE]``."""
        return failure.sse_frame(openai_error)


def renderer(body: CompletionRequest, tr: Translation, prepared: Prepared, served: Served) -> CompletionRenderer:
    return CompletionRenderer(body.model or served.model, body, tr.stream)


Dialect = base.Dialect(
    "openai-completions",
    openai_error,
    {"/v1/completions": Kind(CompletionRequest, translate, renderer)},
    cors_header_prefixes=OPENAI_CORS_PREFIXES,
)
