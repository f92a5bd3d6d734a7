"""OpenAI Chat Completions: wire models and pure translations.

In: a ``/v1/chat/completions`` body to the internal :class:`ChatRequest`.
Out: the engine's result to ``chat.completion`` JSON, or to the SSE chunk
sequence: role chunk, content deltas, finish chunk, optional usage chunk
(``stream_options.include_usage``), ``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..engine.types import GenerationConfig, StopReason
from ..generation import ChatRequest, Final, ToolCallDelta
from ..tools.calls import ToolCall
from .common import BadRequest, check_json_schema, check_tool_schemas, new_id, sse_data, text_of, unix_time
from .errors import Failure, openai_error
from .render import SSE
from .translate import ToolChoice, Translation, copy_sampling, tool_calls_for_template

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

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences are supported")
        return v


def sampling(body: Any, config: GenerationConfig) -> None:
    """Sampling fields shared by Chat Completions and Completions."""
    copy_sampling(body, config)
    rp = body.repetition_penalty if body.repetition_penalty is not None else body.repeat_penalty
    if rp is not None:
        config.repeat_penalty = rp
    if body.stop is not None:
        config.stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    if body.n not in (None, 1):
        raise BadRequest("only n=1 is supported", "n")
    if body.logit_bias:
        try:
            config.logit_bias = {int(k): max(-100.0, min(100.0, float(v))) for k, v in body.logit_bias.items()}
        except ValueError:
            raise BadRequest("logit_bias keys must be token ids", "logit_bias") from None
        if any(k < 0 for k in config.logit_bias):
            raise BadRequest("logit_bias keys must be token ids (non-negative integers)", "logit_bias")
    if body.ignore_eos:
        config.ignore_eos = True
    if body.logprobs or body.top_logprobs:
        raise BadRequest("logprobs are not supported by this server", "logprobs")


def to_messages(messages: list[Message], images: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        if role == "function":
            role = "tool"
        if m.content is None and not m.tool_calls and role != "assistant":
            raise BadRequest(f"'messages[{i}].content' is required for role {m.role!r}", f"messages[{i}].content")
        msg: dict[str, Any] = {
            "role": role,
            "content": text_of(m.content, images=images, where=f"messages[{i}].content"),
        }
        if m.name:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = tool_calls_for_template(m.tool_calls, f"messages[{i}].tool_calls")
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def to_chat_request(body: ChatCompletionRequest) -> Translation:
    warnings: list[str] = []
    if body.reasoning_effort is not None and body.reasoning_effort not in REASONING_EFFORTS:
        raise BadRequest(
            f"unknown reasoning_effort {body.reasoning_effort!r}; expected one of: {', '.join(REASONING_EFFORTS)}",
            "reasoning_effort",
        )
    images: list[Any] = []
    messages = to_messages(body.messages, images)
    if images:
        warnings.append(f"{len(images)} image part(s) ignored: this model has no vision support")
    config = GenerationConfig()
    sampling(body, config)
    config.session_key = body.prompt_cache_key or body.user
    budget = body.max_completion_tokens or body.max_tokens
    req = ChatRequest(
        messages=messages,
        tools=check_tools(body.tools),
        config=config,
        max_tokens_explicit=budget is not None,
        reasoning=body.reasoning_effort,
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )
    req.tool_choice, req.tool_name, _ = tool_choice(body.tool_choice)
    check_tool_schemas(
        [
            (f"tools[{i}].function.parameters", t["function"]["name"], t["function"]["parameters"])
            for i, t in enumerate(req.tools or ())
        ],
        req.tool_choice,
        req.tool_name,
    )
    if body.response_format is not None:
        structured_output(body.response_format, req)
    if budget is not None:
        config.max_new_tokens = budget
    return Translation(req, warnings, bool(body.stream))


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


def structured_output(fmt: ResponseFormat, req: ChatRequest) -> None:
    if fmt.type == "json_object":
        req.json_object = True
    elif fmt.type == "json_schema":
        spec = fmt.json_schema
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest(
                "response_format.json_schema.schema must be a JSON schema object", "response_format.json_schema.schema"
            )
        req.json_schema = check_json_schema(schema, "response_format.json_schema.schema")


def finish_reason(reason: StopReason) -> str:
    """Chat Completions' finish_reason for a turn's stop reason
    (``Final.reason``: tool calls win over the engine's own ending)."""
    if reason is StopReason.TOOL_CALLS:
        return "tool_calls"
    if reason is StopReason.MAX_TOKENS:
        return "length"
    return "stop"


def usage(final: Final) -> dict[str, Any]:
    p, c = final.prompt_tokens, final.completion_tokens
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": final.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": final.reasoning_tokens},
    }


def timings(final: Final) -> dict[str, Any]:
    """llama.cpp server's per-response ``timings`` object (opt-in), summed
    over the turn's attempts (a guardrail re-ask is one more)."""
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
        "predicted_per_token_ms": predicted_ms / new if new else 0.0,
        "predicted_per_second": new / decode if decode else 0.0,
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
    a :class:`~turbospark.dialects.render.Renderer`."""

    media_type = SSE

    def __init__(
        self, model_name: str, include_usage: bool = False, want_timings: bool = False, stream: bool = False
    ) -> None:
        self.stream = stream
        self.id = new_id("chatcmpl-")
        self.created = unix_time()
        self.model = model_name
        self.include_usage = include_usage
        self.want_timings = want_timings

    def complete(self, final: Final) -> dict[str, Any]:
        out = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "turbospark",
            "choices": [
                {
                    "index": 0,
                    "message": message(final),
                    "logprobs": None,
                    "finish_reason": finish_reason(final.reason),
                }
            ],
            "usage": usage(final),
        }
        if self.want_timings:
            out["timings"] = timings(final)
        return out

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "turbospark",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def opening(self, prompt_tokens: int) -> bytes:
        """The role chunk, ``content: null`` as OpenAI sends it."""
        return sse_data(self._chunk({"role": "assistant", "content": None}))

    def text(self, text: str) -> bytes:
        # the hot path (one frame per token): the chunk around the text is
        # the same every time, so it is serialized once
        frame = getattr(self, "_text_parts", None)
        if frame is None:
            mark = "\u0000turbospark\u0000"
            rendered = sse_data(self._chunk({"content": mark}))
            head, _, tail = rendered.partition(orjson.dumps(mark))
            frame = self._text_parts = (head, tail)
        return frame[0] + orjson.dumps(text) + frame[1]

    def reasoning(self, text: str) -> bytes:
        return sse_data(self._chunk({"reasoning_content": text}))

    def tool_call(self, delta: ToolCallDelta) -> bytes:
        return sse_data(self._chunk({"tool_calls": [{"index": delta.index, **wire_call(delta.call)}]}))

    def final(self, final: Final) -> bytes:
        last = self._chunk({}, finish_reason(final.reason))
        if self.want_timings:
            last["timings"] = timings(final)
        out = sse_data(last)
        if self.include_usage:
            out += sse_data(
                {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "system_fingerprint": "turbospark",
                    "choices": [],
                    "usage": usage(final),
                }
            )
        return out + b"data: [DONE]\n\n"

    def error(self, failure: Failure) -> bytes:
        """One ``event: error`` frame, and no ``[DONE]``."""
        return failure.sse_frame(openai_error)
