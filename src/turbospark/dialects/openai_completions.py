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
A prompt may be token ids (mixed with texts, as llama-server takes them),
and a list of prompts answers one choice each, by its index. Features the
engine cannot give (``echo``, ``best_of`` above 1) are refused with a 400
naming the field, rather than silently answered without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.answer import Delta
from ..core.request import ChatRequest, FillIn, Final, Prepared
from ..engine.types import GenerationConfig, PromptProgress, StopReason, TokenProb, TokenTimings
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
from .prompts import batch, prompts_of
from .render import SSE, Unsent, native_result, progress_timings, prompt_progress, token_timings
from .translate import Translation, logprob_value, logprobs_setting, sampling_params

#: OpenAI's documented default for ``max_tokens`` on this endpoint.
DEFAULT_MAX_TOKENS = 16


class CompletionRequest(BaseModel):
    """The fields we act on; unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    #: a string, token ids, ids and texts mixed, llama-server's object, or a
    #: list of prompts (``dialects/prompts.py``)
    prompt: str | list[Any] | dict[str, Any]
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
    #: llama-server's: the answer carries its native result (``__verbose``)
    verbose: bool | None = None
    #: llama-server's: ``prompt_progress`` chunks while a streamed prompt is
    #: prefilled; the engine's timings so far on every text chunk
    return_progress: bool | None = None
    timings_per_token: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences are supported")
        return v


def _refuse_unsupported(body: CompletionRequest) -> None:
    if body.echo:
        raise BadRequest("'echo' is not supported by this server", "echo")
    if body.best_of not in (None, 1):
        raise BadRequest("only best_of=1 is supported", "best_of")


def translate(body: CompletionRequest) -> Translation:
    """A raw prompt, no template: a string, token ids, ids and texts mixed,
    or (llama-server's) a ``{"prompt_string", "multimodal_data"}`` object;
    a list of prompts answers one choice each (``ChatRequest.batch``)."""
    _refuse_unsupported(body)
    prompts = prompts_of(body.prompt)
    n = choices(body.n)
    if len(prompts) > 1 and n > 1:
        raise BadRequest("'n' above 1 with several prompts is not supported: send one prompt per request", "n")
    if body.suffix is not None and (len(prompts) > 1 or prompts[0].text is None or prompts[0].media):
        raise BadRequest("'suffix' goes with one text prompt", "suffix")

    def make() -> ChatRequest:
        config = GenerationConfig()
        sampling(body, config, text_keys=True)
        config.logprobs = logprobs_setting(body.logprobs is not None, body.logprobs, "logprobs")
        config.session_key = body.prompt_cache_key or body.user
        config.return_progress = bool(body.return_progress and body.stream)
        config.timings_per_token = bool(body.timings_per_token and body.stream)
        req = ChatRequest(
            config=config,
            max_tokens_explicit=body.max_tokens is not None,
            default_max_tokens=DEFAULT_MAX_TOKENS,
            n=n,
        )
        if body.max_tokens is not None:
            config.max_new_tokens = body.max_tokens
        constraints(body, req)
        req.verbose = bool(body.verbose)
        return req

    if body.suffix is not None:
        req = make()
        req.fill_in = FillIn(prompts[0].text or "", body.suffix)
    else:
        req = batch(prompts, make)
    return Translation(req, [], bool(body.stream), {"prompts": len(prompts)})


def finish_reason(reason: StopReason) -> str:
    """Completions knows only ``stop`` and ``length`` (no tool calls)."""
    return "length" if reason is StopReason.MAX_TOKENS else "stop"


class CompletionRenderer(Unsent):
    """Renders one response (non-streamed JSON or the SSE chunk sequence):
    a :class:`~turbospark.dialects.render.ChoicesRenderer` of text only."""

    media_type = SSE

    def __init__(self, model_name: str, body: Any, stream: bool = False, prompts: int = 1) -> None:
        self.stream = stream
        self.id = new_id("cmpl-")
        self.created = unix_time()
        self.model = model_name
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.want_timings = bool(body.timings)
        #: ``timings_per_token``: the engine's timings so far, put on text chunks
        self.per_token = bool(body.timings_per_token and stream)
        self._timings: dict[str, Any] | None = None
        self.logprobs = body.logprobs is not None
        #: several prompts: a choice each (``n`` is then 1), each prompt counted in usage
        self.prompts = prompts > 1
        self.n = prompts if self.prompts else choices(body.n)
        self._finals: list[Final] = []
        #: llama-server's ``verbose``: (the prompt's text, the settings) for ``__verbose``
        self.verbose: tuple[str, dict[str, Any]] | None = None
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
        out["usage"] = usage(*finals, prompts=self.prompts)
        if self.want_timings:
            out["timings"] = timings(finals[0])
        if self.verbose is not None:
            out["__verbose"] = native_result(finals[0], self.model, *self.verbose)
        return out

    def _chunk(self, choice: dict[str, Any], final: Final | None = None) -> bytes:
        chunk = self._object([choice])
        if self.include_usage:
            chunk["usage"] = None
        if final is not None and self.want_timings:
            chunk["timings"] = timings(final)
        if final is not None and self.verbose is not None:
            chunk["__verbose"] = native_result(final, self.model, *self.verbose)
        return sse_data(chunk)

    def text(self, delta: Delta) -> bytes:
        if self._timings is None:
            return self._chunk(self._choice(delta.text, None, delta.choice, delta.logprobs))
        chunk = self._object([self._choice(delta.text, None, delta.choice, delta.logprobs)])
        if self.include_usage:
            chunk["usage"] = None
        return sse_data({**chunk, "timings": self._timings})

    def token_timings(self, t: TokenTimings) -> None:
        self._timings = token_timings(t)

    def prompt_progress(self, progress: PromptProgress) -> bytes:
        """llama-server's progress chunk: no choices, the prefill so far."""
        chunk: dict[str, Any] = {**self._object([]), "prompt_progress": prompt_progress(progress)}
        if self.per_token:
            chunk["timings"] = progress_timings(progress)
        return sse_data(chunk)

    def final(self, final: Final) -> bytes:
        out = self._chunk(self._choice("", finish_reason(final.result.reason), final.choice), final)
        self._finals.append(final)
        if len(self._finals) < self.n:
            return out
        if self.include_usage:
            last = self._object([])
            last["usage"] = usage(*sorted(self._finals, key=lambda f: f.choice), prompts=self.prompts)
            out += sse_data(last)
        return out + b"data: [DONE]\n\n"

    def error(self, failure: Failure) -> bytes:
        """One ``event: error`` frame, and no ``[DONE]``."""
        return failure.sse_frame(openai_error)


def renderer(body: CompletionRequest, tr: Translation, prepared: Prepared, served: Served) -> CompletionRenderer:
    made = CompletionRenderer(body.model or served.model, body, tr.stream, tr.extras.get("prompts", 1))
    if body.verbose:
        settings = {"n_ctx": served.max_context, **sampling_params(prepared.config), "stream": made.stream}
        made.verbose = (prepared.prompt_text or "", settings)
    return made


Dialect = base.Dialect(
    "openai-completions",
    openai_error,
    {"/v1/completions": Kind(CompletionRequest, translate, renderer)},
    cors_header_prefixes=OPENAI_CORS_PREFIXES,
)
