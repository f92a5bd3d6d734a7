"""Ollama's native API: wire models and pure translations.

In: ``/api/chat`` and ``/api/generate`` bodies to the internal
:class:`ChatRequest` (plus what only Ollama has: ``num_ctx``, the "load the
model" call with no prompt). Out: NDJSON lines (``done: false`` pieces — text
in ``content``/``response``, reasoning in ``thinking``, each tool call in a
piece's ``message.tool_calls`` the moment it is complete — then one ``done: true`` line with
``done_reason`` and nanosecond durations taken from the engine's result), the
one-object ``stream: false`` answer, and the model facts of ``/api/tags``,
``/api/show`` and ``/api/ps``.

``format`` (``"json"`` or a JSON schema) and ``think`` (true/false or an
effort) are honoured: structured output is enforced by a grammar, thinking
flips the template's switch and is returned apart from the answer.

Ollama's own sampling defaults apply (``top_k`` 40, ``top_p`` 0.9,
``repeat_penalty`` 1.1), because an Ollama client expects them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from ..core.answer import Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallDelta
from ..core.backend import Backend
from ..core.request import ChatRequest, FillIn, Final, Media, Prepared, media_text
from ..engine.types import GenerationConfig, StopReason
from ..tools.calls import ToolCall
from . import base
from .base import Kind, RendererFactory, Served
from .common import BadRequest, check_json_schema, ndjson
from .errors import Failure, ollama_error
from .media import base64_item, placed
from .openai_chat import HistoryToolCall, check_tools
from .render import NDJSON
from .translate import (
    SAMPLING,
    Translation,
    copy_sampling,
    logprobs_setting,
    pick,
    set_sampling,
    stop_strings,
    token_logprob,
    tool_calls_for_template,
)

#: ``think`` levels (``true``/``false`` are the other values)
THINK_LEVELS = ("low", "medium", "high")

#: ``GET /api/version``: recent enough that clients gating features on the
#: Ollama version accept us.
OLLAMA_VERSION = "0.12.3"

#: Ollama's ``api.DefaultOptions`` where they differ from ours.
OLLAMA_DEFAULTS: dict[str, Any] = {"top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1}

#: Sampling options we do not implement, and the value that means "off".
_UNSUPPORTED_SAMPLING = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}

#: llama.cpp's ``llama_ftype`` numbers (GGUF ``general.file_type``).
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4",
    39: "NVFP4",
}


def model_name(name: str | None) -> str | None:
    """Clients append Ollama's default tag; ``name:latest`` means ``name``."""
    if name and name.endswith(":latest"):
        return name[: -len(":latest")]
    return name


# ----------------------------------------------------------------- wire models
class Options(BaseModel):
    """Runtime options we act on; load-time ones (``num_gpu``, ``num_thread``,
    ``use_mmap`` ...) are accepted and ignored: the model is already loaded."""

    model_config = ConfigDict(extra="allow", strict=True)

    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    num_predict: int | None = Field(default=None, ge=-2)
    num_ctx: int | None = Field(default=None, ge=1)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | str | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1)
    stream: bool | None = None
    options: Options | None = None
    format: str | dict[str, Any] | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: list[str] | None = None
    tool_calls: list[HistoryToolCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class ChatBody(_Common):
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None


class GenerateBody(_Common):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[str] | None = None


class ShowBody(BaseModel):
    """``{"model"}``, or the legacy ``{"name"}``."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None

    def requested(self) -> str:
        name = self.model or self.name
        if not name:
            raise BadRequest("model is required", "model")
        return name


# ------------------------------------------------------------ into the engine
#: Ollama's own spellings of llama.cpp's sampling options
OLLAMA_FIELDS = {"repeat_penalty": "repeat_penalty", "penalty_last_n": "repeat_last_n"}


def _config(body: _Common, warnings: list[str]) -> tuple[GenerationConfig, int | None, int | None]:
    """Sampling config, the explicit budget (None: until the context is full)
    and ``num_ctx``."""
    config = GenerationConfig(**OLLAMA_DEFAULTS)
    o = body.options or Options()
    # repeat_last_n -1 (the context) is resolved by prepare
    fields = {**pick(SAMPLING, *(k for k in SAMPLING if k != "seed")), **OLLAMA_FIELDS}
    copy_sampling(o, config, fields)
    if o.seed is not None and o.seed >= 0:  # -1: random, as in Ollama
        set_sampling(config, "seed", o.seed)
    stops = stop_strings(o.stop, "options.stop")
    if stops is not None:
        config.stop = stops
    extra = o.model_extra or {}
    for name, off in _UNSUPPORTED_SAMPLING.items():
        if name in extra and extra[name] not in (None, off):
            warnings.append(f"options.{name} is not supported and was ignored")
    if o.num_predict == 0:
        raise BadRequest(
            "options.num_predict must be positive, or -1 / -2 for 'until the context is full'", "options.num_predict"
        )
    budget = o.num_predict if o.num_predict is not None and o.num_predict > 0 else None
    if budget is not None:
        config.max_new_tokens = budget
    return config, budget, o.num_ctx


def _common_checks(body: _Common, warnings: list[str]) -> None:
    if isinstance(body.format, str) and body.format not in ("", "json"):
        raise BadRequest(f'invalid format {body.format!r}: expected "json" or a JSON schema', "format")
    if isinstance(body.think, str) and body.think not in THINK_LEVELS:
        raise BadRequest(
            f"invalid think value {body.think!r}: expected true, false or one of: {', '.join(THINK_LEVELS)}", "think"
        )


def reasoning(think: bool | str | None) -> str | None:
    """``think`` as the internal effort: false turns the template's thinking
    off, true asks for the default effort, a level names one; absent leaves
    the model's default."""
    if think is None:
        return None
    if think is False:
        return "none"
    return "medium" if think is True else think


def _structured(body: _Common, req: ChatRequest) -> None:
    """``format: "json"`` is any JSON object, a dict is a JSON schema; both
    are enforced by a grammar."""
    if body.format == "json":
        req.json_object = True
    elif isinstance(body.format, dict):
        req.json_schema = check_json_schema(body.format, "format")


def _request(body: _Common, warnings: list[str], **kw: Any) -> ChatRequest:
    config, budget, num_ctx = _config(body, warnings)
    config.logprobs = logprobs_setting(body.logprobs, body.top_logprobs)
    req = ChatRequest(
        config=config,
        max_tokens_explicit=budget is not None,
        # None / -1 / -2: until the context is full (prepare clips to the room)
        default_max_tokens=1 << 30,
        reasoning=reasoning(body.think),
        # prepare honours it (never truncating the prompt)
        context_limit=num_ctx,
        context_limit_field="options.num_ctx",
        **kw,
    )
    _structured(body, req)
    return req


def _nothing(stream: bool, warnings: list[str], keep_alive: float | None) -> Translation:
    """A call without a prompt: Ollama's "load" (or, with keep_alive 0,
    "unload") of the model, answered without generating."""
    extras = {"done_reason": "unload" if keep_alive == 0 else "load"}
    return Translation(None, warnings, stream, extras, keep_alive)


def _images(images: list[str] | None, where: str) -> list[Media]:
    """Ollama's images: base64 (Ollama itself refuses anything else with a
    400; a ``data:`` URL prefix is tolerated)."""
    return [base64_item(image, f"{where}[{j}]") for j, image in enumerate(images or ())]


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Ollama's ``keep_alive``: seconds as a number, or a Go duration
    (``"5m"``, ``"1h30m"``, ``"300ms"``; a bare number string is seconds).
    0 unloads the model once the request is done; a negative value keeps it
    loaded for good (``math.inf``). None: not given."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadRequest("keep_alive must be a number of seconds or a duration like '5m'", "keep_alive")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("+-")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART.findall(text)
            if not text or "".join(n + u for n, u in parts) != text:
                raise BadRequest(
                    f"invalid keep_alive {value!r}: expected seconds or a duration like '5m' or '1h30m'",
                    "keep_alive",
                ) from None
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        seconds *= sign
    return math.inf if seconds < 0 else seconds


def translate_chat(body: ChatBody) -> Translation:
    stream = body.stream is not False
    warnings: list[str] = []
    _common_checks(body, warnings)
    if not body.messages:
        return _nothing(stream, warnings, keep_alive_seconds(body.keep_alive))
    media: list[Media] = []
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(body.messages):
        content, items = placed(media_text(m.content or ""), _images(m.images, f"messages[{i}].images"))
        msg: dict[str, Any] = {"role": m.role, "content": content}
        media += items
        if m.tool_calls:
            msg["tool_calls"] = tool_calls_for_template(m.tool_calls, f"messages[{i}].tool_calls")
        if m.tool_name:
            msg["name"] = m.tool_name
        messages.append(msg)
    req = _request(body, warnings, messages=messages, tools=check_tools(body.tools), media=media)
    return Translation(req, warnings, stream, keep_alive=keep_alive_seconds(body.keep_alive))


def translate_generate(body: GenerateBody) -> Translation:
    stream = body.stream is not False
    warnings: list[str] = []
    _common_checks(body, warnings)
    if body.suffix:  # insert: fill in between prompt and suffix (a FIM model's tokens)
        if body.images:
            raise BadRequest("'images' cannot go with 'suffix': an insert takes text only", "images")
        if body.system:
            warnings.append("'system' ignored: an insert ('suffix') has no template")
        req = _request(body, warnings, fill_in=FillIn(body.prompt or "", body.suffix))
        return Translation(req, warnings, stream, keep_alive=keep_alive_seconds(body.keep_alive))
    if not body.prompt and not (body.system and not body.raw):
        return _nothing(stream, warnings, keep_alive_seconds(body.keep_alive))
    if body.template:
        warnings.append("'template' ignored: the model's own chat template is used")
    prompt, media = placed(media_text(body.prompt or ""), _images(body.images, "images"))
    if body.context:
        warnings.append("'context' ignored: send the conversation with /api/chat instead")
    if body.raw:
        if body.system:
            warnings.append("'system' ignored: raw prompts have no template")
        req = _request(body, warnings, prompt=prompt, media=media)
    else:
        messages = [{"role": "system", "content": body.system}] if body.system else []
        if prompt:  # (the images go before the prompt, or at its [img] tags)
            messages.append({"role": "user", "content": prompt})
        req = _request(body, warnings, messages=messages, media=media)
    return Translation(req, warnings, stream, keep_alive=keep_alive_seconds(body.keep_alive))


# ------------------------------------------------------------------ rendering
def rfc3339(ns: int | None = None) -> str:
    """Go's RFC3339Nano in UTC, as Ollama writes ``created_at``."""
    ns = time.time_ns() if ns is None else ns
    secs, frac = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    digits = f"{frac:09d}".rstrip("0")
    return f"{base}.{digits}Z" if digits else f"{base}Z"


def nanos(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def done_reason(reason: StopReason) -> str:
    """Ollama says ``stop`` for a turn that ended in tool calls too."""
    return "length" if reason is StopReason.MAX_TOKENS else "stop"


def stats(final: Final, wall_ns: int, load_ns: int = 0) -> dict[str, Any]:
    """The closing numbers, all from the engine's result (the answered
    attempt's; the total is the request's wall clock); ``load_ns``: the time this request spent loading the
    model (0 when it was resident). The total never undercuts the parts."""
    prompt_ns, eval_ns = nanos(final.prefill_seconds), nanos(final.decode_seconds)
    return {
        "total_duration": max(wall_ns, load_ns + nanos(final.queue_seconds) + prompt_ns + eval_ns),
        "load_duration": load_ns,
        "prompt_eval_count": final.prompt_tokens,
        "prompt_eval_duration": prompt_ns,
        "eval_count": final.completion_tokens,
        "eval_duration": eval_ns,
    }


def wire_call(index: int, call: ToolCall) -> dict[str, Any]:
    """Ollama's tool call: arguments as an object; ``id`` and
    ``function.index`` as newer Ollama versions send them."""
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": orjson.loads(call.arguments)}}


#: the most seconds a stream stays silent while a call is written (it goes
#: out only whole)
KEEPALIVE_SECONDS = 1.0


class Renderer:
    """Renders one ``/api/chat`` or ``/api/generate`` answer: the whole
    object, or NDJSON lines (a :class:`~turbospark.dialects.render.Renderer`).
    Durations are measured from ``started_ns`` (the request's arrival)."""

    media_type = NDJSON

    def __init__(
        self,
        kind: Literal["chat", "generate"],
        model: str,
        stream: bool = True,
        started_ns: int = 0,
        load_ns: int = 0,
    ) -> None:
        self.kind = kind
        self.model = model
        self.stream = stream
        self.started_ns = started_ns or time.perf_counter_ns()
        #: how long this request spent loading the model (its ``load_duration``)
        self.load_ns = load_ns
        #: since when nothing went out while a call is being written
        self._quiet_since = 0.0

    def _wall_ns(self) -> int:
        return time.perf_counter_ns() - self.started_ns

    def _line(self, text: str, done: bool, thinking: str = "", calls: list[ToolCall] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": rfc3339()}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = [wire_call(i, c) for i, c in enumerate(calls)]
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def complete(self, final: Final) -> dict[str, Any]:
        """``stream: false``: the whole answer in one object."""
        line = self._line(final.text, True, final.reasoning, final.tool_calls)
        if final.logprobs:
            line["logprobs"] = [token_logprob(p) for p in final.logprobs]
        return {**line, "done_reason": done_reason(final.reason), **stats(final, self._wall_ns(), self.load_ns)}

    def opening(self, prompt_tokens: int) -> None:
        return None

    def text(self, delta: Delta) -> bytes:
        line = self._line(delta.text, False)
        if delta.logprobs:
            line["logprobs"] = [token_logprob(p) for p in delta.logprobs]
        return ndjson(line)

    def reasoning(self, delta: ReasoningDelta) -> bytes:
        return ndjson(self._line("", False, thinking=delta.text))

    def tool_call_begin(self, delta: ToolCallBegin) -> None:
        self._quiet_since = time.monotonic()

    def tool_arguments(self, delta: ToolArgumentsDelta) -> bytes | None:
        """Ollama sends a call only whole (its arguments are an object): while
        a long one is written, a line with empty content goes out every
        :data:`KEEPALIVE_SECONDS` (as Ollama's own empty lines do), so the
        stream is never silent while tokens come."""
        now = time.monotonic()
        if now - self._quiet_since < KEEPALIVE_SECONDS:
            return None
        self._quiet_since = now
        return ndjson(self._line("", False))

    def tool_call(self, delta: ToolCallDelta) -> bytes | None:
        """Each call in a line of its own the moment it is complete (its
        arguments are an object: a call cannot go out in pieces, and one
        the budget cut short does not go out at all)."""
        if delta.cut:
            return None
        line = self._line("", False)
        line["message"]["tool_calls"] = [wire_call(delta.index, delta.call)]
        return ndjson(line)

    def final(self, final: Final) -> Iterator[bytes]:
        """The last line: empty text, the reason and the numbers."""
        done = {**self._line("", True), "done_reason": done_reason(final.reason)}
        yield ndjson({**done, **stats(final, self._wall_ns(), self.load_ns)})

    def error(self, failure: Failure) -> bytes:
        """A mid-stream failure: the stream still ends with ``done: true``."""
        return ndjson({**self._line("", True), "done_reason": "error", "error": failure.message})

    def loaded(self, reason: str) -> dict[str, Any]:
        return {**self._line("", True), "done_reason": reason}


def renderer_for(kind: Literal["chat", "generate"]) -> RendererFactory:
    """``/api/chat``'s or ``/api/generate``'s renderer; the model is named as
    the client named it, durations run from the request's arrival."""

    def make(body: _Common, tr: Translation, prepared: Prepared, served: Served) -> Renderer:
        return Renderer(kind, body.model, tr.stream, served.started_ns, served.load_ns)

    return make


def idle_for(kind: Literal["chat", "generate"]) -> Callable[[Any, Translation, Served], dict[str, Any]]:
    """The answer to a load or unload (a request without a prompt)."""

    def idle(body: _Common, tr: Translation, served: Served) -> dict[str, Any]:
        answer = Renderer(kind, body.model, tr.stream, served.started_ns, served.load_ns)
        return answer.loaded(tr.extras["done_reason"])

    return idle


def requested(body: _Common) -> str | None:
    return model_name(body.model)


def check_thinking(req: ChatRequest, model: Backend, name: str | None) -> None:
    """As Ollama answers ``think`` on a model that cannot: clients retry
    without ``think`` on this 400, or ask /api/show for the "thinking"
    capability first."""
    if req.asks_thinking() and model.capabilities.thinking is False:
        raise BadRequest(f"{json.dumps(name, ensure_ascii=False)} does not support thinking", "think")


Dialect = base.Dialect(
    "ollama",
    ollama_error,
    {
        "/api/chat": Kind(
            ChatBody, translate_chat, renderer_for("chat"), requested, check=check_thinking, idle=idle_for("chat")
        ),
        "/api/generate": Kind(
            GenerateBody,
            translate_generate,
            renderer_for("generate"),
            requested,
            check=check_thinking,
            idle=idle_for("generate"),
        ),
    },
    prefixes=("/api/",),
)


# ---------------------------------------------------------------- model facts
def parameter_size(n: int) -> str:
    """Ollama's ``format.HumanNumber``: ``134.52M``, ``8.0B``, ``7B``."""
    for scale, unit, places in ((1e9, "B", 1), (1e6, "M", 2), (1e3, "K", 0)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.{places}f}{unit}"
    return str(n)


def _file_type(info: dict[str, Any]) -> int | None:
    try:
        return int(info.get("quantization"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def quantization_level(info: dict[str, Any]) -> str:
    ft = _file_type(info)
    if ft is not None:
        return FILE_TYPES.get(ft, f"unknown ({ft})")
    return str(info.get("quantization") or "unknown")


def details(info: dict[str, Any]) -> dict[str, Any]:
    family = info.get("architecture") or "unknown"
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": parameter_size(int(info.get("parameters") or 0)),
        "quantization_level": quantization_level(info),
    }


def digest(info: dict[str, Any], mtime_ns: int) -> str:
    """A stable sha256 identity for the model file (its path, size and
    modification time; hashing gigabytes of weights per listing is not worth
    it). Changes whenever the file does."""
    key = f"{info.get('id')}\0{info.get('path')}\0{info.get('size_bytes')}\0{mtime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()


def tag_entry(info: dict[str, Any], mtime_ns: int) -> dict[str, Any]:
    return {
        "name": info["id"],
        "model": info["id"],
        "modified_at": rfc3339(mtime_ns),
        "size": int(info.get("size_bytes") or 0),
        "digest": digest(info, mtime_ns),
        "details": details(info),
    }


#: Resident models never expire; Ollama shows "forever" as now + the
#: largest Go duration (about 292 years).
FOREVER_NS = (1 << 63) - 1


def ps_entry(info: dict[str, Any], mtime_ns: int, now_ns: int, expires_in: float | None = None) -> dict[str, Any]:
    """``expires_in``: seconds until the idle unload (None: never)."""
    return {
        **tag_entry(info, mtime_ns),
        "expires_at": rfc3339(now_ns + (FOREVER_NS if expires_in is None else int(expires_in * 1e9))),
        "size_vram": 0,
        "context_length": int(info.get("context") or 0),
    }


def _number(value: Any) -> str:
    """A parameter's value as a Modelfile writes it (``0.7``, ``40``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def show(info: dict[str, Any], mtime_ns: int, capabilities: list[str]) -> dict[str, Any]:
    """``/api/show``. ``<arch>.context_length`` is the context this server
    runs the model with (what a client may send), not the trained maximum."""
    arch = info.get("architecture") or "unknown"
    ctx = int(info.get("context") or 0)
    template = info.get("chat_template") or ""
    # (its preset's sampling defaults, from the config file, are its PARAMETERs too)
    params = [("num_ctx", ctx), *(info.get("sampling") or {}).items()]
    modelfile = (
        "# Modelfile generated by turbospark\n"
        f"# To build a new Modelfile based on this, replace FROM with:\n# FROM {info['id']}\n\n"
        f"FROM {info.get('path') or info['id']}\n"
        f'TEMPLATE """{template}"""\n' + "".join(f"PARAMETER {name} {_number(value)}\n" for name, value in params)
    )
    model_info: dict[str, Any] = {
        "general.architecture": arch,
        "general.name": info.get("name") or info["id"],
        "general.parameter_count": int(info.get("parameters") or 0),
        f"{arch}.context_length": ctx,
    }
    ft = _file_type(info)
    if ft is not None:
        model_info["general.file_type"] = ft
    return {
        "modelfile": modelfile,
        "parameters": "\n".join(f"{name:<30} {_number(value)}" for name, value in params),
        "template": template,
        "details": details(info),
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": rfc3339(mtime_ns),
    }
