"""Anthropic Messages: wire models and pure translations.

In: a ``/v1/messages`` (or ``/v1/messages/count_tokens``) body to the
internal :class:`ChatRequest`. Content blocks are checked here by hand rather
than by a pydantic union, so a bad block gets a message naming its exact
place (``messages[1].content[0].source.type``).
Out: the engine's result to a ``message`` object (``thinking`` block, then
``text``, then ``tool_use`` blocks), or to the SSE sequence ``message_start,
ping``, then per block ``content_block_start, content_block_delta*,
content_block_stop`` (blocks open as their content arrives, so a thinking
block comes first and each tool call is its own block with
``input_json_delta`` pieces), then ``message_delta, message_stop`` (no
``[DONE]``).

Usage is disjoint, as Anthropic defines it: ``input_tokens`` is the part of
the prompt that was prefilled, ``cache_read_input_tokens`` the part reused
from the KV cache; together they are the engine's prompt token count.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from ..core.answer import Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallDelta
from ..core.request import ChatRequest, Final, Media, Prepared, media_text
from ..engine.types import MEDIA_MARKER, GenerationConfig, StopReason
from ..tools.calls import ToolCall
from . import base
from .base import Kind, Served
from .common import BadRequest, argument_pieces, check_json_schema, check_tool_schemas, new_id, sse_event
from .errors import Failure, anthropic_error
from .media import decode_base64
from .render import SSE
from .translate import SAMPLING, Translation, copy_sampling, pick
from .translate import ToolChoice as Choice

DEFAULT_MAX_TOKENS = 1024
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
#: Assistant-history blocks that carry nothing a text template can use.
DROPPED_BLOCKS = ("thinking", "redacted_thinking")


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    user_id: str | None = None


class ThinkingConfig(BaseModel):
    """Flips the template's thinking switch (see :func:`reasoning_effort`);
    the budget only picks an effort, it is not enforced."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=0)


class OutputFormat(BaseModel):
    """Structured output: ``{"type": "json_schema", "schema": {...}}``."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["user", "assistant", "system"]
    content: str | list[Any]


class CountTokensRequest(BaseModel):
    """``/v1/messages/count_tokens``: the prompt half of a Messages body.
    Unknown fields are accepted and ignored, like newer SDK parameters."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    #: the older beta spelling of ``output_config.format``
    output_format: OutputFormat | None = None


class MessagesRequest(CountTokensRequest):
    """``/v1/messages``. ``max_tokens`` is required by Anthropic; a missing
    one gets a default clipped to the context instead of a 400."""

    #: (empty: answered from the template's generation prompt alone, as
    #: llama-server answers it)
    messages: list[InputMessage]
    max_tokens: int | None = Field(default=None, ge=1)
    stop_sequences: list[str] | None = Field(default=None, max_length=64)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    stream: bool | None = False


# ---------------------------------------------------------------- content in
class _Translation:
    """Accumulates internal messages, their media and warnings for one request."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        #: the media of the messages, in the order their markers stand
        self.media: list[Media] = []
        self.documents = 0
        self.tool_names: dict[str, str] = {}  # tool_use id -> tool name

    def append(self, msg: dict[str, Any], media: list[Media] | None = None) -> None:
        """Consecutive turns of one role are one turn (Anthropic's rule); the
        turn's media (``media``, in its text's order) follow those before it."""
        self.media.extend(media or ())
        prev = self.messages[-1] if self.messages else None
        if prev is not None and msg["role"] != "tool" and prev["role"] == msg["role"]:
            if msg["content"]:
                prev["content"] = f"{prev['content']}\n\n{msg['content']}" if prev["content"] else msg["content"]
            if msg.get("tool_calls"):
                prev.setdefault("tool_calls", []).extend(msg["tool_calls"])
            return
        self.messages.append(msg)

    def warnings(self) -> list[str]:
        out = []
        if self.documents:
            out.append(f"{self.documents} non-text document block(s) ignored: this model reads text only")
        return out


def _block(part: Any, where: str) -> tuple[dict[str, Any], str]:
    if not isinstance(part, dict):
        raise BadRequest(f"'{where}' must be a content block object", where)
    kind = part.get("type")
    if not isinstance(kind, str):
        raise BadRequest(f"'{where}.type' is required", f"{where}.type")
    return part, kind


def _str_field(part: dict[str, Any], name: str, where: str) -> str:
    value = part.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"'{where}.{name}' must be a string", f"{where}.{name}")
    return value


def _image(part: dict[str, Any], where: str) -> Media:
    """An image block, validated as Anthropic does: ``base64`` data of an
    image media type, or an http(s) ``url`` (fetched by the server only
    with ``--allow-media-urls``)."""
    source = part.get("source")
    if not isinstance(source, dict):
        raise BadRequest(f"'{where}.source' must be an object", f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = source.get("media_type")
        if media not in IMAGE_MEDIA_TYPES:
            raise BadRequest(
                f"'{where}.source.media_type' must be one of: {', '.join(IMAGE_MEDIA_TYPES)}",
                f"{where}.source.media_type",
            )
        data = _str_field(source, "data", f"{where}.source")
        return Media("image", decode_base64(data, f"{where}.source.data"), field=f"{where}.source.data")
    if kind == "url":
        url = _str_field(source, "url", f"{where}.source")
        if not url.lower().startswith(("http://", "https://")):
            raise BadRequest(f"'{where}.source.url' must be an http(s) URL", f"{where}.source.url")
        return Media("image", url=url, field=f"{where}.source.url")
    files = " (there is no Files API on this server: send the image as base64)" if kind == "file" else ""
    raise BadRequest(
        f"unsupported image source type {kind!r} in '{where}.source'; expected 'base64' or 'url'{files}",
        f"{where}.source.type",
    )


def _joined(pieces: list[str]) -> str:
    """Text pieces one per line; a media marker stands against its neighbours."""
    out = ""
    for i, piece in enumerate(pieces):
        if i and MEDIA_MARKER not in (piece, pieces[i - 1]):
            out += "\n"
        out += piece
    return out


def _document_text(part: dict[str, Any], where: str, tr: _Translation, media: list[Media]) -> str:
    """Plain-text documents are read; PDFs and URLs are dropped with a warning."""
    source = part.get("source")
    if not isinstance(source, dict):
        raise BadRequest(f"'{where}.source' must be an object", f"{where}.source")
    if source.get("type") == "text":
        return media_text(_str_field(source, "data", f"{where}.source"))
    if source.get("type") == "content":
        return _text_blocks(source.get("content"), f"{where}.source.content", tr, media)
    tr.documents += 1
    return ""


def _text_blocks(content: Any, where: str, tr: _Translation, media: list[Media]) -> str:
    """Text of a string or of text/image/document blocks (system prompts,
    tool results, document content); each image a marker (its item in ``media``)."""
    if isinstance(content, str):
        return media_text(content)
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of content blocks", where)
    out: list[str] = []
    for i, raw in enumerate(content):
        at = f"{where}[{i}]"
        part, kind = _block(raw, at)
        if kind == "text":
            out.append(media_text(_str_field(part, "text", at)))
        elif kind == "image":
            media.append(_image(part, at))
            out.append(MEDIA_MARKER)
        elif kind == "document":
            text = _document_text(part, at, tr, media)
            if text:
                out.append(text)
        elif kind == "search_result":
            out.append(_text_blocks(part.get("content"), f"{at}.content", tr, media))
        else:
            raise BadRequest(f"unsupported content block type {kind!r} in '{at}'", f"{at}.type")
    return _joined(out)


def _system_text(system: str | list[Any] | None, tr: _Translation) -> str:
    if system is None:
        return ""
    if isinstance(system, list):
        for i, raw in enumerate(system):
            _, kind = _block(raw, f"system[{i}]")
            if kind != "text":
                raise BadRequest(f"'system[{i}]' must be a text block, not {kind!r}", f"system[{i}].type")
    return _text_blocks(system, "system", tr, [])


def _tool_call(part: dict[str, Any], where: str, tr: _Translation) -> dict[str, Any]:
    """An Anthropic ``tool_use`` block as the OpenAI-style call chat
    templates expect (arguments as an object, also flattened on top)."""
    call_id = _str_field(part, "id", where)
    name = _str_field(part, "name", where)
    args = part.get("input", {})
    if not isinstance(args, dict):
        raise BadRequest(f"'{where}.input' must be an object", f"{where}.input")
    tr.tool_names[call_id] = name
    fn = {"name": name, "arguments": args}
    return {"id": call_id, "type": "function", "function": fn, **fn}


def _tool_message(part: dict[str, Any], where: str, tr: _Translation) -> None:
    """A ``tool_result`` block as a ``tool`` message (its images, such as
    Claude Code's screenshots, in place)."""
    call_id = _str_field(part, "tool_use_id", where)
    is_error = part.get("is_error", False)
    if not isinstance(is_error, bool):
        raise BadRequest(f"'{where}.is_error' must be a boolean", f"{where}.is_error")
    media: list[Media] = []
    msg: dict[str, Any] = {
        "role": "tool",
        "content": _text_blocks(part.get("content", ""), f"{where}.content", tr, media),
        "tool_call_id": call_id,
    }
    if call_id in tr.tool_names:
        msg["name"] = tr.tool_names[call_id]
    if is_error:
        msg["is_error"] = True
    tr.append(msg, media)


def _turn(m: InputMessage, i: int, tr: _Translation) -> None:
    where = f"messages[{i}].content"
    if m.role == "system":
        tr.append({"role": "system", "content": _system_text(m.content, tr)})
        return
    if isinstance(m.content, str):
        tr.append({"role": m.role, "content": media_text(m.content)})
        return
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    media: list[Media] = []
    for j, raw in enumerate(m.content):
        at = f"{where}[{j}]"
        part, kind = _block(raw, at)
        if kind == "text":
            texts.append(media_text(_str_field(part, "text", at)))
        elif kind in DROPPED_BLOCKS and m.role == "assistant":
            continue
        elif kind == "tool_use" and m.role == "assistant":
            calls.append(_tool_call(part, at, tr))
        elif kind == "tool_result" and m.role == "user":
            # Tool results answer the previous assistant turn, so they go
            # before whatever the user wrote alongside them.
            _tool_message(part, at, tr)
        elif kind == "image" and m.role == "user":
            media.append(_image(part, at))
            texts.append(MEDIA_MARKER)
        elif kind == "document" and m.role == "user":
            text = _document_text(part, at, tr, media)
            if text:
                texts.append(text)
        elif kind == "search_result" and m.role == "user":
            texts.append(_text_blocks(part.get("content"), f"{at}.content", tr, media))
        else:
            raise BadRequest(f"unsupported content block type {kind!r} in a {m.role} message at '{at}'", f"{at}.type")
    has_tool_results = any(isinstance(p, dict) and p.get("type") == "tool_result" for p in m.content)
    if texts or calls or not has_tool_results:
        msg: dict[str, Any] = {"role": m.role, "content": _joined(texts)}
        if calls:
            msg["tool_calls"] = calls
        tr.append(msg, media)


def to_messages(body: CountTokensRequest) -> tuple[list[dict[str, Any]], list[str], list[Media]]:
    """The conversation as internal messages, warnings for the client, and
    its images in the order their markers stand in the messages."""
    tr = _Translation()
    system = _system_text(body.system, tr)
    if system:
        tr.append({"role": "system", "content": system})
    for i, m in enumerate(body.messages):
        _turn(m, i, tr)
    if body.messages and body.messages[-1].role == "assistant":
        raise BadRequest(
            "this model does not support assistant prefill: the last message must have the 'user' role",
            f"messages[{len(body.messages) - 1}].role",
        )
    return tr.messages, tr.warnings(), tr.media


def to_tools(tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """Custom tools as OpenAI-style function tools (what chat templates
    read). Anthropic's server tools (``web_search_...``) run on Anthropic's
    side; here they are ignored with a warning."""
    if not tools:
        return None, []
    out: list[dict[str, Any]] = []
    skipped: list[str] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type")
        if kind not in (None, "custom"):
            if not isinstance(kind, str):
                raise BadRequest(f"'{where}.type' must be a string", f"{where}.type")
            skipped.append(kind)
            continue
        name = _str_field(tool, "name", where)
        if not name:
            raise BadRequest(f"'{where}.name' must not be empty", f"{where}.name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise BadRequest(f"'{where}.input_schema' must be a JSON schema object", f"{where}.input_schema")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest(f"'{where}.description' must be a string", f"{where}.description")
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        if description:
            fn["description"] = description
        out.append({"type": "function", "function": fn})
    warnings = [f"server tool(s) ignored: {', '.join(skipped)}"] if skipped else []
    return out or None, warnings


def tool_choice(choice: ToolChoice | None) -> Choice:
    """In internal terms: ``any`` is "required", ``tool`` is "named"."""
    if choice is None:
        return Choice("auto")
    parallel = choice.disable_parallel_tool_use is not True
    if choice.type == "tool":
        if not choice.name:
            raise BadRequest("'tool_choice.name' is required when tool_choice.type is 'tool'", "tool_choice.name")
        return Choice("named", choice.name, parallel)
    return Choice({"auto": "auto", "any": "required", "none": "none"}[choice.type], None, parallel)


def reasoning_effort(body: CountTokensRequest) -> str | None:
    """The effort the template's thinking switch gets: ``disabled`` turns it
    off; ``enabled`` picks an effort from the budget; ``output_config.effort``
    names one; otherwise the model's default."""
    thinking = body.thinking
    if thinking is not None and thinking.type == "disabled":
        return "none"
    effort = body.output_config.effort if body.output_config else None
    if effort is not None:
        return "xhigh" if effort == "max" else effort
    if thinking is not None and thinking.type == "enabled":
        budget = thinking.budget_tokens or 0
        return "high" if budget >= 16384 else "medium" if budget >= 4096 else "low"
    return None


def output_schema(body: CountTokensRequest) -> dict[str, Any] | None:
    fmt: OutputFormat | None
    if body.output_config and body.output_config.format:
        fmt, where = body.output_config.format, "output_config.format.schema"
    else:
        fmt, where = body.output_format, "output_format.schema"
    return check_json_schema(fmt.schema_, where) if fmt is not None else None


def to_prompt_request(body: CountTokensRequest) -> tuple[ChatRequest, list[str]]:
    """The prompt half (count_tokens renders exactly what a real request
    would): messages, tools, tool choice, thinking switch, output schema."""
    choice, name, parallel = tool_choice(body.tool_choice)
    messages, warnings, media = to_messages(body)
    tools, tool_warnings = to_tools(body.tools)
    check_tool_schemas(
        [
            (f"tools[{i}].input_schema", t.get("name"), t.get("input_schema"))
            for i, t in enumerate(body.tools or ())
            if t.get("type") in (None, "custom")
        ],
        choice,
        name,
    )
    req = ChatRequest(
        messages=messages,
        tools=tools,
        tool_choice=choice,
        tool_name=name,
        parallel_tool_calls=parallel,
        reasoning=reasoning_effort(body),
        json_schema=output_schema(body),
        media=media,
    )
    return req, warnings + tool_warnings


def translate(body: MessagesRequest) -> Translation:
    """The internal request, warnings for the client, streamed or not.

    The budget is never "explicit" in the engine's sense: Anthropic clients
    (Claude Code) ask for a large ``max_tokens`` whatever the context, and
    the API answers by generating until the context is full, ending with
    ``model_context_window_exceeded``. So the requested budget is clipped to
    the room left in the context (see :func:`stop_reason`); a prompt that
    does not fit at all is still a 400.
    """
    req, warnings = to_prompt_request(body)
    config = GenerationConfig()
    copy_sampling(body, config, pick(SAMPLING, "temperature", "top_p", "top_k"))
    if body.stop_sequences:
        config.stop = tuple(body.stop_sequences)
    if body.metadata is not None and body.metadata.user_id:
        config.session_key = body.metadata.user_id
    req.config = config
    req.max_tokens_explicit = False
    req.default_max_tokens = body.max_tokens or DEFAULT_MAX_TOKENS
    req.empty_chat = not body.messages  # (llama-server answers it: the template's generation prompt alone)
    return Translation(req, warnings, bool(body.stream))


# ---------------------------------------------------------------- result out
def stop_reason(final: Final, stops: tuple[str, ...], clipped: bool) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)``; a turn with tool calls is ``tool_use``.

    The engine reports which stop string matched (``result.stop_string``).
    An engine that does not (a scripted test model) still gets a right answer
    when only one stop sequence was given; with several and no report,
    ``stop_sequence`` is null rather than a guess.
    """
    reason = final.reason
    if reason is StopReason.TOOL_CALLS:
        return "tool_use", None
    if reason is StopReason.STOP_STRING:
        matched = final.result.stop_string
        if matched is None and len(set(stops)) == 1:
            matched = stops[0]
        return "stop_sequence", matched
    if reason is StopReason.MAX_TOKENS:
        return ("model_context_window_exceeded" if clipped else "max_tokens"), None
    return "end_turn", None


def usage(final: Final) -> dict[str, int]:
    cached = final.cached_tokens
    return {
        "input_tokens": final.prompt_tokens - cached,
        "output_tokens": final.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_use_id(call: ToolCall | ToolCallBegin) -> str:
    """Anthropic-looking ids (``toolu_…``) from the call's own id."""
    return "toolu_" + call.id.removeprefix("call_")


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": orjson.loads(call.arguments)}


class MessageRenderer:
    """Renders one response: a ``message`` object or its SSE events (a
    :class:`~turbospark.dialects.render.Renderer`)."""

    media_type = SSE

    def __init__(self, model_name: str, prepared: Prepared, stream: bool = False) -> None:
        self.stream = stream
        self.id = new_id("msg_")
        self.model = model_name
        self.stops = prepared.config.stop
        # the budget (asked for, or the default) was cut to the room in the
        # context: a turn that ends on it ran out of context, not of budget
        req = prepared.request
        self.clipped = req is not None and prepared.config.max_new_tokens < req.default_max_tokens
        #: an opaque value the SDK requires on thinking blocks; history
        #: thinking blocks are dropped on the way in, so it is never checked
        self.signature = new_id("sig_")
        self._index = -1  # of the last block opened
        self._open: str | None = None  # type of the open block
        self._had_text = False
        self._had_call = False

    def _message(self, content: list[dict[str, Any]], final: Final | None, prompt_tokens: int) -> dict[str, Any]:
        if final is None:
            reason, sequence = None, None
            use = {
                "input_tokens": prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            }
        else:
            reason, sequence = stop_reason(final, self.stops, self.clipped)
            use = usage(final)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": use,
        }

    def content(self, final: Final) -> list[dict[str, Any]]:
        """Thinking, then the text (left out when empty and there are
        calls), then one ``tool_use`` block per call."""
        blocks: list[dict[str, Any]] = []
        if final.reasoning:
            blocks.append({"type": "thinking", "thinking": final.reasoning, "signature": self.signature})
        if final.text or not final.tool_calls:
            blocks.append({"type": "text", "text": final.text})
        blocks.extend(tool_use_block(c) for c in final.tool_calls)
        return blocks

    def complete(self, final: Final) -> dict[str, Any]:
        return self._message(self.content(final), final, 0)

    # -- stream ----------------------------------------------------------------
    def opening(self, prompt_tokens: int) -> bytes:
        """``message_start`` (usage from the rendered prompt: the cached part
        is not known until the engine answers, so the real split comes in
        ``message_delta``) and ``ping``; blocks open as content arrives."""
        return sse_event(
            "message_start", {"type": "message_start", "message": self._message([], None, prompt_tokens)}
        ) + sse_event("ping", {"type": "ping"})

    def keep_alive(self) -> bytes:
        """The ``ping`` Anthropic sends while a response is quiet."""
        return sse_event("ping", {"type": "ping"})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _start(self, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        self._open = block["type"]
        return out + sse_event(
            "content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block}
        )

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            out += self._delta({"type": "signature_delta", "signature": self.signature})
        self._open = None
        return out + sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def reasoning(self, delta: ReasoningDelta) -> bytes:
        out = b"" if self._open == "thinking" else self._start({"type": "thinking", "thinking": "", "signature": ""})
        return out + self._delta({"type": "thinking_delta", "thinking": delta.text})

    def text(self, delta: Delta) -> bytes:
        out = b"" if self._open == "text" else self._start({"type": "text", "text": ""})
        self._had_text = True
        return out + self._delta({"type": "text_delta", "text": delta.text})

    def tool_call_begin(self, delta: ToolCallBegin) -> bytes:
        """A streamed call's ``tool_use`` block opens (empty input)."""
        self._had_call = True
        return self._start({"type": "tool_use", "id": tool_use_id(delta), "name": delta.name, "input": {}})

    def tool_arguments(self, delta: ToolArgumentsDelta) -> bytes:
        return self._delta({"type": "input_json_delta", "partial_json": delta.text})

    def tool_call(self, delta: ToolCallDelta) -> bytes:
        """A streamed call's block closes (one the budget cut short closes
        with the JSON it has, as Anthropic's API does); a whole call is one
        ``tool_use`` block: start, the arguments in a few
        ``input_json_delta`` pieces, stop."""
        if delta.streamed:
            return self._close()
        call = delta.call
        self._had_call = True
        out = self._start({"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": {}})
        for piece in argument_pieces(call.arguments):
            out += self._delta({"type": "input_json_delta", "partial_json": piece})
        return out + self._close()

    def final(self, final: Final) -> bytes:
        """Closes the open block (an answer with no content at all still
        gets its empty text block, as the non-streamed one does);
        ``message_delta`` carries the engine's usage (cumulative totals: the
        SDK overwrites its ``message_start`` figures with them)."""
        out = b""
        if not self._had_text and not self._had_call:
            out += self._start({"type": "text", "text": ""})
        reason, sequence = stop_reason(final, self.stops, self.clipped)
        return (
            out
            + self._close()
            + sse_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(final),
                },
            )
            + sse_event("message_stop", {"type": "message_stop"})
        )

    def error(self, failure: Failure) -> bytes:
        """One ``event: error`` in Anthropic's shape (an engine failure is an
        ``api_error``), and no ``message_stop`` after it."""
        return failure.sse_frame(anthropic_error)


def renderer(body: MessagesRequest, tr: Translation, prepared: Prepared, served: Served) -> MessageRenderer:
    return MessageRenderer(body.model or served.model, prepared, tr.stream)


Dialect = base.Dialect(
    "anthropic",
    anthropic_error,
    {"/v1/messages": Kind(MessagesRequest, translate, renderer)},
    prefixes=("/v1/messages", "/messages"),
    # an Anthropic client lists models where OpenAI's do, and reads its own errors there
    client_header="anthropic-version",
    shared_paths=("/v1/models",),
    cors_headers=("anthropic-version", "anthropic-beta", "anthropic-dangerous-direct-browser-access"),
    cors_header_prefixes=("anthropic-", "x-stainless-"),
    # what the SDK exposes as ``_request_id``: the id the request's events carry
    request_id_header="request-id",
)
