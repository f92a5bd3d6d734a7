"""OpenAI Responses: wire models and pure translations.

In: a ``/v1/responses`` body (``input`` as a string or a list of items,
``instructions``, flat function tools ...) to the internal
:class:`ChatRequest`. Out: the engine's result to a ``response`` object, or
to the typed SSE event sequence (``event:`` lines, ``sequence_number`` from
0): created → in_progress → per output item (opened as its content arrives):
a ``reasoning`` item (content_part.added → reasoning_text.delta* → done
events), the ``message`` (output_item.added → content_part.added →
output_text.delta* → output_text.done → content_part.done →
output_item.done), one ``function_call`` item per call (added →
function_call_arguments.delta* → .done → output_item.done) → completed |
incomplete, or ``response.failed`` when the engine fails mid-stream.

The response store is the route's (``routes/stored.py``): it expands
``previous_response_id`` and ``conversation`` into ``input`` before this
translation, and tells the renderer (``extras["stored"]``) the response's id
and what to echo. What reaches the translation still naming them (a server
with ``--store off``), a stored ``prompt`` and ``item_reference`` inputs are
refused with a clear 400 instead of silently answering without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.answer import Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallDelta
from ..core.request import ChatRequest, Final, Media, Prepared
from ..engine.types import GenerationConfig, PromptProgress, StopReason, TokenProb, TokenTimings
from ..tools.calls import ToolCall
from . import base
from .base import Kind, Served
from .common import (
    BadRequest,
    argument_pieces,
    check_json_schema,
    check_tool_schemas,
    new_id,
    sse_event,
    unix_time,
    validation_error,
)
from .errors import Failure, openai_error
from .media import content_text
from .openai_chat import OPENAI_CORS_PREFIXES, REASONING_EFFORTS, timings
from .render import SSE, progress_timings, prompt_progress, token_timings
from .translate import (
    SAMPLING,
    ToolChoice,
    Translation,
    copy_sampling,
    logprobs_setting,
    pick,
    token_logprob,
    tool_calls_for_template,
)

#: the event that ends a stream, by the response's status
TERMINAL = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.cancelled",
}
#: the ``include`` value that asks for the answer's log-probabilities
INCLUDE_LOGPROBS = "message.output_text.logprobs"

TOOL_CHOICES = ("none", "auto", "required")
TEXT_FORMATS = ("text", "json_object", "json_schema")


class _Wire(BaseModel):
    """Strict types, unknown fields accepted (newer SDK parameters)."""

    model_config = ConfigDict(extra="allow", strict=True)


class ReasoningConfig(_Wire):
    effort: str | None = None
    summary: str | None = None


class TextConfig(_Wire):
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(_Wire):
    """The fields we act on or echo; everything else is ignored."""

    model: str | None = None
    #: optional, as in the API: ``instructions`` alone is an empty user turn
    input: str | list[Any] = ""
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    #: Not in the OpenAI API; llama.cpp-style extension for reproducible sampling.
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = False
    prompt_cache_key: str | None = None
    user: str | None = None
    reasoning: ReasoningConfig | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    text: TextConfig | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    #: a stored prompt template (``{"id": "pmpt_…"}``): refused, no store here
    prompt: Any = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    #: extra output: "message.output_text.logprobs" is acted on, the others
    #: (encrypted reasoning, tool results) have nothing here to include
    include: list[str] | None = None
    #: llama-server's: ``response.in_progress`` events with ``prompt_progress``
    #: while a streamed prompt is prefilled
    return_progress: bool | None = None
    #: llama-server's: the engine's timings so far on every text delta, and
    #: the whole run's on ``response.completed``
    timings_per_token: bool | None = None


class MessageItem(_Wire):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Any]


class FunctionCallItem(_Wire):
    type: Literal["function_call"]
    call_id: str
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Wire):
    type: Literal["function_call_output"]
    call_id: str | None = None
    output: str | list[Any]


class ReasoningItem(_Wire):
    """A reasoning item sent back: checked for shape, then dropped (past
    thinking is not replayed)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None


class FunctionTool(_Wire):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


def _check(model: type[BaseModel], data: Any, where: str) -> Any:
    """Validate one nested object, naming it by its full path on failure."""
    if not isinstance(data, dict):
        raise BadRequest(f"'{where}' must be an object", where)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        bad = validation_error(exc)
        param = f"{where}.{bad.param}" if bad.param else where
        message = bad.message.replace(f"'{bad.param}'", f"'{param}'") if bad.param else f"'{where}': {bad.message}"
        raise BadRequest(message, param) from None


def _content(content: str | list[Any], media: list[Media], where: str, role: str) -> str:
    """Message content to text; ``refusal`` parts (assistant turns sent back)
    count as text, each image or sound part a marker (its item in ``media``)."""
    if isinstance(content, list):
        content = [
            {"type": "text", "text": p.get("refusal")} if isinstance(p, dict) and p.get("type") == "refusal" else p
            for p in content
        ]
    return content_text(content, media, where, role)


def to_messages(body: ResponsesRequest, media: list[Media]) -> list[dict[str, Any]]:
    """``instructions`` + ``input`` to chat messages. Function calls become an
    assistant turn's ``tool_calls`` (consecutive calls share one turn), their
    outputs become ``tool`` messages."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        out.append({"role": "user", "content": body.input})
        return out
    if not body.input:
        # Codex probes a provider with an empty input and max_output_tokens 1:
        # an empty user turn, answered like any other
        out.append({"role": "user", "content": ""})
        return out
    call_names: dict[str, str] = {}
    for i, raw in enumerate(body.input):
        where = f"input[{i}]"
        if not isinstance(raw, dict):
            raise BadRequest(f"'{where}' must be an object", where)
        kind = raw.get("type", "message")
        if kind == "message":
            item = _check(MessageItem, raw, where)
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": _content(item.content, media, f"{where}.content", role)})
        elif kind == "function_call":
            call = _check(FunctionCallItem, raw, where)
            call_names[call.call_id] = call.name
            wire = {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                out.append(last)
            last.setdefault("tool_calls", []).extend(tool_calls_for_template([wire]))
        elif kind == "function_call_output":
            result = _check(FunctionCallOutputItem, raw, where)
            output = _content(result.output, media, f"{where}.output", "tool")
            msg: dict[str, Any] = {"role": "tool", "content": output}
            if result.call_id is not None:
                msg["tool_call_id"] = result.call_id
                if result.call_id in call_names:
                    msg["name"] = call_names[result.call_id]
            out.append(msg)
        elif kind == "reasoning":
            _check(ReasoningItem, raw, where)
            continue  # past thinking is not replayed (chat templates drop it too)
        elif kind == "item_reference":  # (resolved by the store before this: here it is off)
            raise BadRequest(
                f"'{where}' is an item_reference, but this server keeps no response store (--store off); "
                "send the referenced item itself",
                f"{where}.type",
            )
        elif not isinstance(kind, str):
            raise BadRequest(f"'{where}.type' must be a string", f"{where}.type")
        else:
            raise BadRequest(f"unsupported input item type {kind!r} in '{where}'", f"{where}.type")
    if not out:
        raise BadRequest("'input' has no message or function-call items", "input")
    return out


def to_tools(
    tools: list[dict[str, Any]] | None, warnings: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Flat function tools to the chat-style list the template expects.
    Returns (chat tools, tools echoed in the response); hosted tool types
    (web search, file search ...) do not exist here and are dropped with a
    warning."""
    chat: list[dict[str, Any]] = []
    echo: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, raw in enumerate(tools or []):
        kind = raw.get("type")
        if kind != "function":
            if not isinstance(kind, str):
                raise BadRequest(f"'tools[{i}].type' must be a string", f"tools[{i}].type")
            dropped.append(kind)
            continue
        tool = _check(FunctionTool, raw, f"tools[{i}]")
        fn: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            fn["description"] = tool.description
        fn["parameters"] = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
        if tool.strict is not None:
            fn["strict"] = tool.strict
        chat.append({"type": "function", "function": fn})
        echo.append(
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
                "strict": tool.strict,
            }
        )
    if dropped:
        warnings.append(f"tool type(s) {', '.join(sorted(set(dropped)))} ignored: only function tools are supported")
    return chat, echo


def tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice:
    if choice is None:
        return ToolChoice("auto")
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise BadRequest(
                f"unknown tool_choice {choice!r}; expected one of: {', '.join(TOOL_CHOICES)} or an object",
                "tool_choice",
            )
        return ToolChoice(choice)
    kind = choice.get("type")
    if not isinstance(kind, str):
        raise BadRequest("'tool_choice.type' must be a string", "tool_choice.type")
    if kind != "function":
        raise BadRequest(
            f"tool_choice type {kind!r} is not supported; only function tools exist here", "tool_choice.type"
        )
    name = choice.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest("'tool_choice.name' must be a non-empty string", "tool_choice.name")
    return ToolChoice("named", name)


def structured_output(fmt: dict[str, Any] | None, req: ChatRequest) -> None:
    """``text.format``: ``json_schema`` (``{"type", "name", "schema",
    "strict"}``) or ``json_object``, enforced by a grammar."""
    if fmt is None:
        return
    kind = fmt.get("type")
    if not isinstance(kind, str):
        raise BadRequest("'text.format.type' must be a string", "text.format.type")
    if kind not in TEXT_FORMATS:
        raise BadRequest(
            f"unknown text.format type {kind!r}; expected one of: {', '.join(TEXT_FORMATS)}", "text.format.type"
        )
    if kind == "json_object":
        req.json_object = True
    elif kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise BadRequest("'text.format.schema' must be a JSON schema object", "text.format.schema")
        req.json_schema = check_json_schema(schema, "text.format.schema", "text.format")


def _refuse_unsupported(body: ResponsesRequest) -> None:
    if body.previous_response_id is not None:
        raise BadRequest(
            "previous_response_id is not supported: this server keeps no response store; "
            "send the whole conversation in 'input'",
            "previous_response_id",
        )
    if body.conversation is not None:
        raise BadRequest(
            "conversation is not supported: this server keeps no conversation store; "
            "send the whole conversation in 'input'",
            "conversation",
        )
    if body.prompt is not None:
        raise BadRequest(
            "prompt (a stored prompt template) is not supported: this server keeps no prompt store; "
            "send its text in 'instructions' and 'input'",
            "prompt",
        )
    if body.background:
        raise BadRequest(
            "background responses are not supported: this server keeps no response store (--store off)", "background"
        )
    effort = body.reasoning.effort if body.reasoning else None
    if effort is not None and effort not in REASONING_EFFORTS:
        raise BadRequest(
            f"unknown reasoning.effort {effort!r}; expected one of: {', '.join(REASONING_EFFORTS)}",
            "reasoning.effort",
        )


def translate(body: ResponsesRequest) -> Translation:
    """The internal request, warnings for the client, streamed or not, and
    (``extras["tools"]``) the function tools to echo in the response object."""
    _refuse_unsupported(body)
    choice, name, _ = tool_choice(body.tool_choice)
    warnings: list[str] = []
    media: list[Media] = []
    messages = to_messages(body, media)
    tools, echo_tools = to_tools(body.tools, warnings)
    check_tool_schemas(
        [
            (f"tools[{i}].parameters", t.get("name"), t.get("parameters") or {"type": "object", "properties": {}})
            for i, t in enumerate(body.tools or ())
            if t.get("type") == "function"
        ],
        choice,
        name,
    )
    config = GenerationConfig()
    copy_sampling(body, config, pick(SAMPLING, "temperature", "top_p", "seed"))
    wanted = INCLUDE_LOGPROBS in (body.include or ()) or bool(body.top_logprobs)
    config.logprobs = logprobs_setting(wanted, body.top_logprobs)
    config.session_key = body.prompt_cache_key or body.user
    config.return_progress = bool(body.return_progress and body.stream)
    config.timings_per_token = bool(body.timings_per_token and body.stream)
    if body.max_output_tokens is not None:
        config.max_new_tokens = body.max_output_tokens
    req = ChatRequest(
        messages=messages,
        tools=tools or None,
        config=config,
        max_tokens_explicit=body.max_output_tokens is not None,
        tool_choice=choice,
        tool_name=name,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        reasoning=body.reasoning.effort if body.reasoning else None,
        media=media,
    )
    structured_output(body.text.format if body.text else None, req)
    return Translation(req, warnings, bool(body.stream), {"tools": echo_tools})


def usage(final: Final) -> dict[str, Any]:
    """From the engine's result only. ``cache_write_tokens`` is 0: there are
    no explicit cache writes here; KV kept in a session slot shows up as
    ``cached_tokens`` on the next turn."""
    p, c = final.prompt_tokens, final.completion_tokens
    return {
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": final.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": c,
        "output_tokens_details": {"reasoning_tokens": final.reasoning_tokens},
        "total_tokens": p + c,
    }


def status_of(reason: StopReason) -> str:
    """The response's status for a turn's stop reason (``Final.reason``)."""
    if reason is StopReason.MAX_TOKENS:
        return "incomplete"
    if reason is StopReason.CANCELLED:
        return "cancelled"
    return "completed"


def function_call_item(call: ToolCall, item_id: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": "" if status == "in_progress" else call.arguments,
        "status": status,
    }


class ResponsesRenderer:
    """Renders one response: the non-streamed object, or the typed event
    sequence with its own ``sequence_number`` counter. Output items open as
    their content arrives, so their order (reasoning, message, calls) and
    ``output_index`` are those of the output itself."""

    media_type = SSE

    def __init__(
        self,
        body: ResponsesRequest,
        model_name: str,
        config: GenerationConfig,
        tools: list[dict[str, Any]],
        stored: dict[str, Any] | None = None,
    ) -> None:
        stored = stored or {}
        self.stream = bool(body.stream)
        self.id = stored.get("id") or new_id("resp_")
        #: the last response object built (what the store keeps)
        self.result: dict[str, Any] | None = None
        #: the answer the response ended with (its engine numbers), once it has
        self.answered: Final | None = None
        self.msg_id = new_id("msg_")
        self.reasoning_id = new_id("rs_")
        self.created = unix_time()
        self.seq = 0
        #: streamed items: done ones, then the open one (kind, id, text pieces)
        self._done: list[dict[str, Any]] = []
        self._open: tuple[str, str, list[str]] | None = None
        #: the open message's tokens' log-probabilities (when asked for)
        self._probs: list[TokenProb] = []
        self._had_message = False
        #: the call being streamed: its item id, the call (arguments so far)
        self._call: tuple[str, ToolCall] | None = None
        self._had_call = False
        #: llama-server's ``timings_per_token``: the engine's timings so far
        #: (put on text deltas), and the run's on the terminal event
        self._per_token = bool(body.timings_per_token and body.stream)
        self._timings: dict[str, Any] | None = None
        reasoning = body.reasoning
        fmt = body.text.format if body.text and body.text.format else {"type": "text"}
        self._echo: dict[str, Any] = {
            "background": bool(stored.get("background")),
            "conversation": stored.get("conversation"),
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {},
            "model": model_name,
            "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
            "previous_response_id": stored.get("previous_response_id"),
            "prompt_cache_key": body.prompt_cache_key,
            "reasoning": {
                "effort": reasoning.effort if reasoning else None,
                "summary": reasoning.summary if reasoning else None,
            },
            "store": bool(stored.get("store")),
            "temperature": config.temperature,
            "text": {"format": fmt, "verbosity": (body.text.verbosity if body.text else None) or "medium"},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": tools,
            "top_p": config.top_p,
            "truncation": body.truncation or "disabled",
            "user": body.user,
        }

    # -- objects ---------------------------------------------------------------
    def _response(
        self,
        status: str,
        output: list[dict[str, Any]],
        final: Final | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        if final is not None:
            self.answered = final
        self.result = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "completed_at": unix_time() if status == "completed" else None,
            "error": error,
            "incomplete_details": incomplete,
            **self._echo,
            "output": output,
            "usage": usage(final) if final is not None else None,
        }
        return self.result

    def snapshot(self, status: str = "in_progress") -> dict[str, Any]:
        """The response before any output (what a store keeps while it runs)."""
        return self._response(status, [])

    def _part(self, text: str, logprobs: Sequence[TokenProb] | None = None) -> dict[str, Any]:
        lp = [token_logprob(p) for p in logprobs] if logprobs else []
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": lp}

    def _message(self, status: str, content: list[dict[str, Any]], item_id: str | None = None) -> dict[str, Any]:
        return {
            "id": item_id or self.msg_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _reasoning(self, status: str, text: str | None, item_id: str | None = None) -> dict[str, Any]:
        """The thinking, as ``reasoning_text`` content (no summary is made)."""
        content = [] if text is None else [{"type": "reasoning_text", "text": text}]
        return {
            "id": item_id or self.reasoning_id,
            "type": "reasoning",
            "summary": [],
            "content": content,
            "status": status,
        }

    def output(self, final: Final) -> list[dict[str, Any]]:
        """Reasoning, the message (left out when empty and there are calls),
        then one ``function_call`` item per call."""
        items: list[dict[str, Any]] = []
        if final.reasoning:
            items.append(self._reasoning("completed", final.reasoning))
        if final.text or not final.tool_calls:
            status = "completed" if status_of(final.reason) == "completed" else "incomplete"
            items.append(self._message(status, [self._part(final.text, final.logprobs)]))
        items.extend(function_call_item(c, "fc_" + c.id.removeprefix("call_")) for c in final.tool_calls)
        return items

    def complete(self, final: Final) -> dict[str, Any]:
        """The non-streamed ``response`` object."""
        return self._response(status_of(final.reason), self.output(final), final)

    # -- stream ----------------------------------------------------------------
    def _event(self, type_: str, payload: dict[str, Any]) -> bytes:
        frame = sse_event(type_, {"type": type_, "sequence_number": self.seq, **payload})
        self.seq += 1
        return frame

    def _where(self, item_id: str) -> dict[str, Any]:
        return {"item_id": item_id, "output_index": len(self._done), "content_index": 0}

    def opening(self, prompt_tokens: int) -> bytes:
        """``response.created`` and ``response.in_progress`` (sent before
        generation); items follow as their content arrives."""
        snapshot = self._response("in_progress", [])
        return self._event("response.created", {"response": snapshot}) + self._event(
            "response.in_progress", {"response": snapshot}
        )

    def queued(self) -> bytes:
        """A background run's first events: ``response.created`` and
        ``response.queued``, the response ``queued`` (its run's renderer
        goes on from :meth:`in_progress`, numbering after these)."""
        snapshot = self._response("queued", [])
        return self._event("response.created", {"response": snapshot}) + self._event(
            "response.queued", {"response": snapshot}
        )

    def in_progress(self) -> bytes:
        """``response.in_progress`` alone (a queued run that starts)."""
        return self._event("response.in_progress", {"response": self._response("in_progress", [])})

    def prompt_progress(self, progress: PromptProgress) -> bytes:
        """llama-server's ``return_progress``: a ``response.in_progress``
        event carrying the prefill so far (``prompt_progress``)."""
        payload: dict[str, Any] = {"response": self._response("in_progress", list(self._done))}
        payload["prompt_progress"] = prompt_progress(progress)
        if self._per_token:
            payload["timings"] = progress_timings(progress)
        return self._event("response.in_progress", payload)

    def token_timings(self, t: TokenTimings) -> None:
        self._timings = token_timings(t)

    def ended(self, body: dict[str, Any]) -> bytes:
        """The terminal event of ``body`` (a response that ended without a
        streamed end: cancelled while queued, failed before it ran)."""
        return self._event(TERMINAL.get(str(body.get("status")), "response.failed"), {"response": body})

    def _start(self, kind: str) -> bytes:
        out = self._close()
        first = not any(item["type"] == kind for item in self._done)
        if kind == "message":
            item_id = self.msg_id if first else new_id("msg_")
            item, part = self._message("in_progress", [], item_id), self._part("")
            self._had_message = True
        else:
            item_id = self.reasoning_id if first else new_id("rs_")
            item, part = self._reasoning("in_progress", None, item_id), {"type": "reasoning_text", "text": ""}
        self._open = (kind, item_id, [])
        self._probs = []
        index = len(self._done)
        return (
            out
            + self._event("response.output_item.added", {"output_index": index, "item": item})
            + self._event("response.content_part.added", {**self._where(item_id), "part": part})
        )

    def _close(self, status: str = "completed") -> bytes:
        """done events for the open item's text, part and item."""
        if self._open is None:
            return b""
        kind, item_id, pieces = self._open
        text = "".join(pieces)
        where = self._where(item_id)
        if kind == "message":
            part = self._part(text, self._probs)
            item = self._message(status, [part], item_id)
            out = self._event("response.output_text.done", {**where, "text": text, "logprobs": part["logprobs"]})
        else:
            part, item = {"type": "reasoning_text", "text": text}, self._reasoning("completed", text, item_id)
            out = self._event("response.reasoning_text.done", {**where, "text": text})
        out += self._event("response.content_part.done", {**where, "part": part})
        out += self._event("response.output_item.done", {"output_index": len(self._done), "item": item})
        self._done.append(item)
        self._open = None
        return out

    def text(self, delta: Delta) -> bytes:
        out = b"" if self._open and self._open[0] == "message" else self._start("message")
        assert self._open is not None
        self._open[2].append(delta.text)
        self._probs += delta.logprobs
        logprobs = [token_logprob(p) for p in delta.logprobs]
        payload = {**self._where(self._open[1]), "delta": delta.text, "logprobs": logprobs}
        if self._timings is not None:
            payload["timings"] = self._timings
        return out + self._event("response.output_text.delta", payload)

    def reasoning(self, delta: ReasoningDelta) -> bytes:
        out = b"" if self._open and self._open[0] == "reasoning" else self._start("reasoning")
        assert self._open is not None
        self._open[2].append(delta.text)
        return out + self._event("response.reasoning_text.delta", {**self._where(self._open[1]), "delta": delta.text})

    def tool_call_begin(self, delta: ToolCallBegin) -> bytes:
        """A ``function_call`` item is added (its arguments follow)."""
        out = self._close()
        call = ToolCall(delta.id, delta.name, "")
        item_id = "fc_" + call.id.removeprefix("call_")
        self._call, self._had_call = (item_id, call), True
        item = function_call_item(call, item_id, "in_progress")
        return out + self._event("response.output_item.added", {"output_index": len(self._done), "item": item})

    def tool_arguments(self, delta: ToolArgumentsDelta) -> bytes:
        assert self._call is not None
        item_id, call = self._call
        call.arguments += delta.text
        where = {"item_id": item_id, "output_index": len(self._done)}
        return self._event("response.function_call_arguments.delta", {**where, "delta": delta.text})

    def tool_call(self, delta: ToolCallDelta) -> bytes:
        """The end of a streamed ``function_call`` item (arguments done,
        item done; ``incomplete`` when the budget cut it short), or a whole
        one: added, the arguments in a few deltas, done."""
        call, out = delta.call, b""
        if not delta.streamed:
            out = self.tool_call_begin(ToolCallBegin(delta.index, call.id, call.name))
            for piece in argument_pieces(call.arguments):
                out += self.tool_arguments(ToolArgumentsDelta(delta.index, piece))
        assert self._call is not None
        item_id, index = self._call[0], len(self._done)
        where = {"item_id": item_id, "output_index": index}
        out += self._event(
            "response.function_call_arguments.done", {**where, "name": call.name, "arguments": call.arguments}
        )
        item = function_call_item(call, item_id, "incomplete" if delta.cut else "completed")
        out += self._event("response.output_item.done", {"output_index": index, "item": item})
        self._done.append(item)
        self._call = None
        return out

    def final(self, final: Final) -> bytes:
        """Closes the open item (an answer with no content at all still gets
        its empty message, as the non-streamed one does), then the terminal
        ``response.completed`` (or ``response.incomplete`` when capped)."""
        status = status_of(final.reason)
        item_status = "completed" if status == "completed" else "incomplete"
        out = b""
        if not self._had_message and not self._had_call:
            out += self._start("message")
        out += self._close(item_status)
        body = self._response(status, list(self._done), final)
        payload: dict[str, Any] = {"response": body}
        if self._per_token:
            payload["timings"] = timings(final)
        return out + self._event(TERMINAL.get(body["status"], "response.incomplete"), payload)

    def error(self, failure: Failure) -> bytes:
        """Mid-stream failure: ``response.failed`` carrying the error and the
        items streamed so far (the open one as incomplete); nothing follows.
        An overloaded server is ``rate_limit_exceeded``."""
        code = "rate_limit_exceeded" if failure.code == "overloaded" else "server_error"
        message = failure.message
        output = list(self._done)
        if self._open is not None:
            kind, item_id, pieces = self._open
            text = "".join(pieces)
            output.append(
                self._message("incomplete", [self._part(text)], item_id)
                if kind == "message"
                else self._reasoning("incomplete", text, item_id)
            )
        if self._call is not None:  # a call cut short by the failure
            output.append(function_call_item(self._call[1], self._call[0], "incomplete"))
        body = self._response("failed", output, error={"code": code, "message": message})
        return self._event("response.failed", {"response": body})


def renderer(body: ResponsesRequest, tr: Translation, prepared: Prepared, served: Served) -> ResponsesRenderer:
    model = body.model or served.model
    return ResponsesRenderer(body, model, prepared.config, tr.extras["tools"], tr.extras.get("stored"))


#: engine parameter names in admission errors -> this dialect's names
PARAMS = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}

Dialect = base.Dialect(
    "openai-responses",
    openai_error,
    {
        p: Kind(ResponsesRequest, translate, renderer, params=PARAMS, stored=True)
        for p in ("/v1/responses", "/responses")
    },
    cors_header_prefixes=OPENAI_CORS_PREFIXES,
)


def _replay_item(item: dict[str, Any], index: int, event: Any) -> list[bytes]:
    """One finished output item as the events that streamed it."""
    where = {"item_id": item.get("id"), "output_index": index}
    opened = {**item, "status": "in_progress"}
    out = [event("response.output_item.added", {"output_index": index, "item": opened})]
    kind = item.get("type")
    if kind == "function_call":
        args = item.get("arguments", "")
        out.append(event("response.function_call_arguments.delta", {**where, "delta": args}))
        out.append(event("response.function_call_arguments.done", {**where, "arguments": args}))
    elif kind in ("message", "reasoning"):
        for n, part in enumerate(item.get("content") or []):
            text = part.get("text", "") if isinstance(part, dict) else ""
            at = {**where, "content_index": n}
            name = "output_text" if kind == "message" else "reasoning_text"
            out.append(event("response.content_part.added", {**at, "part": {**part, "text": ""}}))
            out.append(event(f"response.{name}.delta", {**at, "delta": text}))
            out.append(event(f"response.{name}.done", {**at, "text": text}))
            out.append(event("response.content_part.done", {**at, "part": part}))
    out.append(event("response.output_item.done", {"output_index": index, "item": item}))
    return out


def replay(response: dict[str, Any]) -> list[bytes]:
    """A stored response as the SSE events of its stream (``GET
    /v1/responses/{id}?stream=true``): created, in progress, each output
    item, then its terminal event (or, while it still runs, nothing more)."""
    seq = [0]

    def event(type_: str, payload: dict[str, Any]) -> bytes:
        frame = sse_event(type_, {"type": type_, "sequence_number": seq[0], **payload})
        seq[0] += 1
        return frame

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    out = [event("response.created", {"response": opening}), event("response.in_progress", {"response": opening})]
    for index, item in enumerate(response.get("output") or []):
        if isinstance(item, dict):
            out += _replay_item(item, index, event)
    status = str(response.get("status"))
    if status in TERMINAL:
        out.append(event(TERMINAL[status], {"response": response}))
    return out


def events_of(frames: bytes) -> list[bytes]:
    """Renderer output (one or more SSE events) as one event each."""
    return [event + b"\n\n" for event in frames.split(b"\n\n") if event]


def ends(event: bytes) -> bool:
    """Whether ``event`` is a terminal one (nothing follows it)."""
    head = event.split(b"\n", 1)[0].removeprefix(b"event: ").decode()
    return head in TERMINAL.values()


def terminal_of(response: dict[str, Any], seq: int) -> bytes | None:
    """The terminal event of a response that ended, numbered ``seq`` (None:
    it has not ended)."""
    status = str(response.get("status"))
    if status not in TERMINAL:
        return None
    return sse_event(TERMINAL[status], {"type": TERMINAL[status], "sequence_number": seq, "response": response})
