"""OpenAI Chat Completions: wire models and pure translations.

In: a ``/v1/chat/completions`` body to the internal :class:`ChatRequest`.
Out: the engine's result to ``chat.completion`` JSON, or to the SSE chunk
sequence: role chunk, content deltas, finish chunk, optional usage chunk
(``stream_options.include_usage``), ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.answer import Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallDelta
from ..core.request import ChatRequest, Final, Media, Prepared
from ..engine.types import GenerationConfig, PromptProgress, StopReason, TokenProb, TokenTimings
from ..tools.calls import ToolCall
from . import base
from .base import Kind, Served
from .common import (
    BadRequest,
    check_json_schema,
    check_tool_schemas,
    constrain,
    new_id,
    sse_data,
    unix_time,
)
from .errors import Failure, openai_error
from .media import content_text
from .render import SSE, native_result, progress_timings, prompt_progress, token_timings
from .translate import (
    ToolChoice,
    Translation,
    copy_sampling,
    logit_bias,
    logprobs_setting,
    probabilities,
    sampling_params,
    set_sampling,
    slot_setting,
    token_logprob,
    tool_calls_for_template,
)

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class ToolCallFunction(BaseModel):
    """``function`` of a tool call sent back in the history: ``arguments``
    as JSON text (OpenAI) or as an object (Ollama)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str
    arguments: str | dict[str, Any] | None = None


class HistoryToolCall(BaseModel):
    """An assistant turn's ``tool_calls[]`` entry (Chat Completions, Ollama)."""

    model_config = ConfigDict(extra="allow", strict=True)
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[Any] | None = None
    name: str | None = None
    tool_calls: list[HistoryToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None
    #: llama-server's shape: ``{"type": "json_object", "schema": {...}}``
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class ChatCompletionRequest(BaseModel):
    """The fields we act on; unknown fields are accepted and ignored, the way
    OpenAI-compatible servers treat newer SDK parameters."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
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
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    reasoning_effort: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    timings: bool | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool | None = None
    #: llama-server's constraints: a GBNF grammar, or a JSON schema
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    #: llama-server's: stream ``prompt_progress`` chunks while the prompt is prefilled
    return_progress: bool | None = None
    #: llama-server's: the engine's timings so far on every streamed text chunk
    timings_per_token: bool | None = None
    #: llama-server's: log-probabilities as probabilities after the selection
    post_sampling_probs: bool | None = None
    #: llama-server's (and vLLM's) template switches: the assistant's turn
    #: opened after the messages, or the last (assistant) message continued
    add_generation_prompt: bool | None = None
    continue_final_message: bool | str | None = None
    #: llama-server's: the answer carries its native result (``__verbose``)
    verbose: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences are supported")
        return v


def sampling(body: Any, config: GenerationConfig, text_keys: bool = False) -> None:
    """Sampling fields shared by Chat Completions and Completions (and
    llama-server's ``id_slot``, the slot the request runs in);
    ``text_keys``: a ``logit_bias`` key that is no token id is a text,
    tokenized as llama-server does (else a 400: OpenAI's rule)."""
    copy_sampling(body, config)
    config.slot = slot_setting(body.id_slot)
    rp = body.repetition_penalty if body.repetition_penalty is not None else body.repeat_penalty
    if rp is not None:
        set_sampling(config, "repeat_penalty", rp)
    if body.stop is not None:
        config.stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    if body.logit_bias:
        config.logit_bias, config.logit_bias_text = logit_bias(body.logit_bias)
        if config.logit_bias_text and not text_keys:
            raise BadRequest("logit_bias keys must be token ids (non-negative integers)", "logit_bias")
    if body.ignore_eos:
        config.ignore_eos = True


def to_messages(messages: list[Message], media: list[Media]) -> list[dict[str, Any]]:
    """The messages as the template reads them; each image or sound part a
    marker in its message's text, its item appended to ``media``."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        if role == "function":
            role = "tool"
        if m.content is None and not m.tool_calls and role != "assistant":
            raise BadRequest(f"'messages[{i}].content' is required for role {m.role!r}", f"messages[{i}].content")
        msg: dict[str, Any] = {
            "role": role,
            "content": content_text(m.content, media, f"messages[{i}].content", role),
        }
        if m.name:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = tool_calls_for_template(m.tool_calls, f"messages[{i}].tool_calls")
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def translate(body: ChatCompletionRequest) -> Translation:
    warnings: list[str] = []
    if body.reasoning_effort is not None and body.reasoning_effort not in REASONING_EFFORTS:
        raise BadRequest(
            f"unknown reasoning_effort {body.reasoning_effort!r}; expected one of: {', '.join(REASONING_EFFORTS)}",
            "reasoning_effort",
        )
    media: list[Media] = []
    messages = to_messages(body.messages, media)
    config = GenerationConfig()
    sampling(body, config)
    config.logprobs = logprobs_setting(body.logprobs, body.top_logprobs)
    config.session_key = body.prompt_cache_key or body.user
    config.return_progress = bool(body.return_progress and body.stream)
    config.timings_per_token = bool(body.timings_per_token and body.stream)
    config.post_sampling_probs = bool(body.post_sampling_probs)
    budget = body.max_completion_tokens or body.max_tokens
    req = ChatRequest(
        messages=messages,
        tools=check_tools(body.tools),
        config=config,
        max_tokens_explicit=budget is not None,
        reasoning=body.reasoning_effort,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        n=choices(body.n),
        media=media,
    )
    req.continue_final, generation_prompt = continuation(body)
    if not generation_prompt and not req.continue_final:
        req.template_kwargs["add_generation_prompt"] = False
    req.verbose = bool(body.verbose)
    req.tool_choice, req.tool_name, _ = tool_choice(body.tool_choice)
    check_tool_schemas(
        [
            (f"tools[{i}].function.parameters", t["function"]["name"], t["function"]["parameters"])
            for i, t in enumerate(req.tools or ())
        ],
        req.tool_choice,
        req.tool_name,
    )
    constraints(body, req)
    if budget is not None:
        config.max_new_tokens = budget
    return Translation(req, warnings, bool(body.stream))


def continuation(body: ChatCompletionRequest) -> tuple[bool, bool]:
    """(continue the last message, open the assistant's turn), as
    llama-server decides them: a last assistant message is a prefill
    (continued, no generation prompt) unless the one before it is an
    assistant's too, a 400; ``continue_final_message`` with
    ``add_generation_prompt`` (true unless set false) is a 400, and so is a
    continued message that is no assistant's or holds tool calls."""
    messages, wanted = body.messages, body.continue_final_message
    generation = body.add_generation_prompt is not False
    last = len(messages) - 1
    if wanted not in (None, False, True, "content"):
        raise BadRequest(
            f"continue_final_message {wanted!r} is not supported: true (or 'content') continues the answer's text",
            "continue_final_message",
        )
    if wanted in (None, False):
        if messages[last].role != "assistant":
            return False, generation
        if last >= 1 and messages[last - 1].role == "assistant":
            raise BadRequest("Cannot have 2 or more assistant messages at the end of the list.", "messages")
        generation = False
    if generation:
        raise BadRequest(
            "Cannot set both add_generation_prompt and continue_final_message to true.", "add_generation_prompt"
        )
    if messages[last].role != "assistant":
        raise BadRequest("continue_final_message continues the last message, which must be an assistant's", "messages")
    if messages[last].tool_calls:
        raise BadRequest("Cannot continue an assistant message that contains tool calls.", f"messages[{last}]")
    return True, False


def check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools as the template and the grammar expect them."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type", "function") != "function":
            raise BadRequest(f"tools[{i}].type must be 'function'", f"tools[{i}].type")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools[{i}].function.name must be a non-empty string", f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise BadRequest(
                f"tools[{i}].function.parameters must be a JSON schema object", f"tools[{i}].function.parameters"
            )
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise BadRequest(f"tools[{i}].function.description must be a string", f"tools[{i}].function.description")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    return out


def tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice:
    if choice is None or choice == "auto":
        return ToolChoice("auto")
    if choice in ("none", "required"):
        return ToolChoice(choice)
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") == "function" and isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return ToolChoice("named", fn["name"])
    raise BadRequest(
        'tool_choice must be \'none\', \'auto\', \'required\' or {"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


def constraints(body: Any, req: ChatRequest) -> None:
    """``response_format``, or llama-server's ``grammar`` / ``json_schema``:
    one of them (two are a 400, as llama-server refuses them)."""
    fmt = body.response_format if body.response_format is not None and body.response_format.type != "text" else None
    given = [
        name
        for name, v in (("response_format", fmt), ("grammar", body.grammar or None), ("json_schema", body.json_schema))
        if v is not None
    ]
    if len(given) > 1:
        raise BadRequest(f"give one of {' and '.join(given)}, not both: each constrains the whole output", given[1])
    if fmt is not None:
        structured_output(fmt, req)
    constrain(req, body.grammar, body.json_schema)


def structured_output(fmt: ResponseFormat, req: ChatRequest) -> None:
    if fmt.type == "json_object" and fmt.schema_ is None:
        req.json_object = True
    elif fmt.schema_ is not None:  # llama-server's response_format.schema
        req.json_schema = check_json_schema(fmt.schema_, "response_format.schema")
    elif fmt.type == "json_schema":
        spec = fmt.json_schema
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest(
                "response_format.json_schema.schema must be a JSON schema object", "response_format.json_schema.schema"
            )
        req.json_schema = check_json_schema(schema, "response_format.json_schema.schema")


#: the most choices one request may ask for (``n``): each takes a sequence
#: slot of its own, or waits for one
MAX_CHOICES = 16


def choices(n: int | None) -> int:
    """OpenAI's ``n``, checked."""
    if n is None:
        return 1
    if not 1 <= n <= MAX_CHOICES:
        raise BadRequest(f"'n' must be between 1 and {MAX_CHOICES}", "n")
    return n


def finish_reason(reason: StopReason) -> str:
    """Chat Completions' finish_reason for a turn's stop reason
    (``Final.reason``: tool calls win over the engine's own ending)."""
    if reason is StopReason.TOOL_CALLS:
        return "tool_calls"
    if reason is StopReason.MAX_TOKENS:
        return "length"
    return "stop"


def usage(*finals: Final, prompts: bool = False) -> dict[str, Any]:
    """Summed over the choices as OpenAI counts them: the prompt once (plus
    the longer prompt of each other choice a guardrail re-ask answered;
    ``prompts``: each choice had a prompt of its own, all counted), every
    choice's completion; each choice's answered attempt only."""
    first = finals[0]
    again = [f for f in finals[1:] if f.reasked or prompts]
    p = first.prompt_tokens + sum(f.prompt_tokens for f in again)
    cached = first.cached_tokens + sum(f.cached_tokens for f in again)
    c = sum(f.completion_tokens for f in finals)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": sum(f.reasoning_tokens for f in finals)},
    }


def content_logprobs(logprobs: Sequence[TokenProb], post: bool = False) -> dict[str, Any]:
    """A choice's (or a chunk's) ``logprobs`` object (with llama-server's
    ``post_sampling_probs``: its ``prob`` and ``top_probs`` entries)."""
    if post:
        return {"content": probabilities(logprobs, post=True), "refusal": None}
    return {"content": [token_logprob(p) for p in logprobs], "refusal": None}


def timings(final: Final) -> dict[str, Any]:
    """llama.cpp server's per-response ``timings`` object (opt-in), of the
    answered attempt (a guardrail re-ask's, when there was one)."""
    prompt_n = final.prompt_tokens - final.cached_tokens
    prefill, decode, new = final.prefill_seconds, final.decode_seconds, final.completion_tokens
    prompt_ms, predicted_ms = prefill * 1000.0, decode * 1000.0
    return {
        "cache_n": final.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / prefill if prefill else 0.0,
        "predicted_n": new,
        "predicted_ms": predicted_ms,
        # (over decode steps, as llama-server: the first token comes from the prompt's last batch)
        "predicted_per_token_ms": predicted_ms / (new - 1) if new > 1 else 0.0,
        "predicted_per_second": (new - 1) / decode if new > 1 and decode else 0.0,
    }


def wire_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def message(final: Final) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": final.text if (final.text or not final.tool_calls) else None,
        "refusal": None,
    }
    if final.reasoning:
        msg["reasoning_content"] = final.reasoning
    if final.tool_calls:
        msg["tool_calls"] = [wire_call(c) for c in final.tool_calls]
    return msg


class ChatRenderer:
    """Renders one response (non-streamed JSON or the SSE chunk sequence):
    a :class:`~turbospark.dialects.render.ChoicesRenderer`."""

    media_type = SSE

    def __init__(self, model_name: str, body: Any, stream: bool = False) -> None:
        self.stream = stream
        self.id = new_id("chatcmpl-")
        self.created = unix_time()
        self.model = model_name
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.want_timings = bool(body.timings)
        #: llama-server's ``timings_per_token``: timings on every chunk, the last one's too
        self.per_token = bool(body.timings_per_token and stream)
        self.logprobs = bool(body.logprobs)
        self.post = bool(body.post_sampling_probs)
        #: the settings it ran with, sent with ``timings`` (llama.cpp's extras)
        self.settings: dict[str, Any] = {}
        #: llama-server's ``verbose``: its native result as ``__verbose``, with the prompt's text
        self.verbose: str | None = None
        self.n = choices(body.n)
        self._finals: list[Final] = []
        #: a text chunk's frame before and after its text (serialized once)
        self._text_parts: tuple[bytes, bytes] | None = None
        #: the engine's timings so far (``timings_per_token``), put on text chunks
        self._timings: dict[str, Any] | None = None

    def complete(self, final: Final) -> dict[str, Any]:
        return self.complete_choices([final])

    def complete_choices(self, finals: list[Final]) -> dict[str, Any]:
        out = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "turbospark",
            "choices": [
                {
                    "index": final.choice,
                    "message": message(final),
                    "logprobs": content_logprobs(final.logprobs, self.post) if self.logprobs else None,
                    "finish_reason": finish_reason(final.reason),
                }
                for final in finals
            ],
            "usage": usage(*finals),
        }
        if self.want_timings:
            out["timings"] = timings(finals[0])
            out["generation_settings"] = self.settings
        if self.verbose is not None:
            out["__verbose"] = native_result(finals[0], self.model, self.verbose, self.settings)
        return out

    def token_timings(self, timings: TokenTimings) -> None:
        self._timings = token_timings(timings)

    def prompt_progress(self, progress: PromptProgress) -> bytes:
        """llama-server's progress chunk: no choices, the prompt's prefill so far."""
        chunk = {**self._chunk({}), "choices": [], "prompt_progress": prompt_progress(progress)}
        if self.per_token:
            chunk["timings"] = progress_timings(progress)
        return sse_data(chunk)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "turbospark",
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def opening(self, prompt_tokens: int) -> bytes:
        """The role chunk of each choice, ``content: null`` as OpenAI sends it."""
        return b"".join(sse_data(self._chunk({"role": "assistant", "content": None}, index=i)) for i in range(self.n))

    def text(self, delta: Delta) -> bytes:
        if delta.logprobs or delta.choice or self._timings is not None:
            chunk = self._chunk({"content": delta.text}, index=delta.choice)
            if delta.logprobs:
                chunk["choices"][0]["logprobs"] = content_logprobs(delta.logprobs, self.post)
            if self._timings is not None:
                chunk["timings"] = self._timings
            return sse_data(chunk)
        # the hot path (one frame per token): the chunk around the text is
        # the same every time, so it is serialized once
        frame = self._text_parts
        if frame is None:
            mark = "\u0000turbospark\u0000"
            rendered = sse_data(self._chunk({"content": mark}))
            head, _, tail = rendered.partition(orjson.dumps(mark))
            frame = self._text_parts = (head, tail)
        return frame[0] + orjson.dumps(delta.text) + frame[1]

    def reasoning(self, delta: ReasoningDelta) -> bytes:
        return sse_data(self._chunk({"reasoning_content": delta.text}, index=delta.choice))

    def tool_call_begin(self, delta: ToolCallBegin) -> bytes:
        """A streamed call's first chunk: index, id, name, no arguments yet."""
        function = {"name": delta.name, "arguments": ""}
        call = {"index": delta.index, "id": delta.id, "type": "function", "function": function}
        return sse_data(self._chunk({"tool_calls": [call]}, index=delta.choice))

    def tool_arguments(self, delta: ToolArgumentsDelta) -> bytes:
        call = {"index": delta.index, "function": {"arguments": delta.text}}
        return sse_data(self._chunk({"tool_calls": [call]}, index=delta.choice))

    def tool_call(self, delta: ToolCallDelta) -> bytes | None:
        """A whole call in one chunk (a streamed one is complete already)."""
        if delta.streamed:
            return None
        call = {"index": delta.index, **wire_call(delta.call)}
        return sse_data(self._chunk({"tool_calls": [call]}, index=delta.choice))

    def final(self, final: Final) -> bytes:
        """The choice's finish chunk; after the last choice's, the usage
        chunk (when asked for) and ``[DONE]``. With ``timings_per_token``
        the stream's last chunk (the usage one, when asked for) carries the
        whole run's ``timings``, as llama-server's does."""
        last = self._chunk({}, finish_reason(final.reason), final.choice)
        if self.want_timings:
            last["timings"] = timings(final)
            last["generation_settings"] = self.settings
        elif self.per_token and not self.include_usage:
            last["timings"] = timings(final)
        if self.verbose is not None:
            last["__verbose"] = native_result(final, self.model, self.verbose, self.settings)
        out = sse_data(last)
        self._finals.append(final)
        if len(self._finals) < self.n:
            return out
        if self.include_usage:
            finals = sorted(self._finals, key=lambda f: f.choice)
            chunk = {**self._chunk({}), "choices": [], "usage": usage(*finals)}
            if self.per_token:
                chunk["timings"] = timings(finals[0])
            out += sse_data(chunk)
        return out + b"data: [DONE]\n\n"

    def error(self, failure: Failure) -> bytes:
        """One ``event: error`` frame, and no ``[DONE]``."""
        return failure.sse_frame(openai_error)


def renderer(body: ChatCompletionRequest, tr: Translation, prepared: Prepared, served: Served) -> ChatRenderer:
    made = ChatRenderer(body.model or served.model, body, tr.stream)
    if made.want_timings or body.verbose:  # (llama.cpp's opt-in extras: its generation_settings too)
        settings = {"n_ctx": served.max_context, **sampling_params(prepared.config)}
        made.settings = {**settings, "post_sampling_probs": made.post, "stream": made.stream}
    if body.verbose:
        made.verbose = prepared.prompt_text or ""
    return made


#: OpenAI's official SDKs (and Stainless-generated ones) send these from a browser
OPENAI_CORS_PREFIXES = ("openai-", "x-stainless-")

Dialect = base.Dialect(
    "openai",
    openai_error,
    {p: Kind(ChatCompletionRequest, translate, renderer) for p in ("/v1/chat/completions", "/chat/completions")},
    cors_header_prefixes=OPENAI_CORS_PREFIXES,
)
