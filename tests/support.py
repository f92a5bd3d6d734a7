"""What the dialect tests share: the tool tests' tools and prompts (defined
once, written in each dialect's wire shape), servers around the scripted
model, SSE framing, and the error shape of each dialect."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson

from turbospark import ListObserver, Server

from .fakes import Script, ScriptedModel

# ------------------------------------------------------------ tools and prompts
ASK_TEXT = "What is the weather like in Paris right now?"
ASK = [{"role": "user", "content": ASK_TEXT}]
#: The tools, dialect-neutral: turn them into a dialect's shape with
#: :func:`chat_tool`, :func:`responses_tool` or :func:`anthropic_tool`.
WEATHER_FUNCTION = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME_FUNCTION = {
    "name": "get_time",
    "description": "Get the current local time in a timezone.",
    "parameters": {
        "type": "object",
        "properties": {"timezone": {"type": "string", "maxLength": 40}},
        "required": ["timezone"],
        "additionalProperties": False,
    },
}
#: each tool's parameters schema, by tool name
SCHEMAS = {f["name"]: f["parameters"] for f in (WEATHER_FUNCTION, TIME_FUNCTION)}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
BAD_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>'
GOOD_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINKING = ["<think>", "The user wants ", "the weather.", "</think>", "\n\nLet me", " check."]


def chat_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A tool as OpenAI Chat Completions (and Ollama) write it."""
    return {"type": "function", "function": copy.deepcopy(function)}


def responses_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A tool as the OpenAI Responses API writes it (flat)."""
    return {"type": "function", **copy.deepcopy(function)}


def anthropic_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A tool as Anthropic Messages writes it."""
    return {
        "name": function["name"],
        "description": function["description"],
        "input_schema": copy.deepcopy(function["parameters"]),
    }


def openai_client(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)


# ------------------------------------------------------------ scripted servers
def scripted(
    *scripts: Script, guardrails: bool = True, chat_template: str = ""
) -> tuple[Server, ScriptedModel, ListObserver]:
    """A (not yet started) server around a scripted model playing ``scripts``
    (its template, what it can do, is fixed before the server sees it)."""
    model = ScriptedModel(scripts=list(scripts), chat_template=chat_template)
    obs = ListObserver()
    return Server(models=[model], observer=obs, guardrails=guardrails), model, obs


def generated(events: Any, rid: int | str) -> list:
    """The ``generated`` events of request ``rid``."""
    return [e for e in events.of(int(rid)) if e.kind == "generated"]


# ------------------------------------------------------------ wire
def post_body(url: str, body: Any, **kw: Any) -> httpx.Response:
    """POST ``body`` as JSON; bytes or str are sent as they are, labelled
    JSON (for malformed bodies)."""
    if isinstance(body, (bytes, str)):
        return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60, **kw)
    return httpx.post(url, json=body, timeout=60, **kw)


def sse_frames(raw: str) -> list[tuple[str, dict]]:
    """``event: X\\ndata: {...}`` frames, each checked for exact framing and
    for a ``type`` that names its event."""
    out = []
    for frame in raw.split("\n\n"):
        if not frame.strip() or frame.strip() == ": keep-alive":  # (a comment: a slow prefill's keep-alive)
            continue
        lines = frame.split("\n")
        assert len(lines) == 2, frame
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


# ------------------------------------------------------------ error shapes
#: Bodies a JSON route refuses before it reads any field: (body, param, what the message says).
MALFORMED_BODIES = [
    (b"{not json", None, "malformed JSON"),
    (b"", None, "empty"),
    (b"[1, 2]", None, "JSON object"),
]


@dataclass
class ChatStream:
    """What a streamed OpenAI chat answer brought, and when its first call
    delta came (seconds from the request; ``total``: to the stream's end)."""

    content: str = ""
    calls: dict[int, str] = field(default_factory=dict)  # arguments text by call index
    names: list[str] = field(default_factory=list)
    finish: str | None = None
    first_call_at: float | None = None
    first_content_at: float | None = None
    total: float = 0.0
    rid: str = ""  # the response's x-request-id
    done: bool = False  # it ended with ``data: [DONE]``

    @property
    def arguments(self) -> str:
        return "".join(self.calls[i] for i in sorted(self.calls))


def stream_chat(url: str, body: dict[str, Any], timeout: float = 300) -> ChatStream:
    """POST ``body`` to ``/v1/chat/completions`` streamed, and read it all."""
    out, start = ChatStream(), time.monotonic()
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=timeout) as s:
        out.rid = s.headers.get("x-request-id", "")
        for line in s.iter_lines():
            out.done = out.done or line == "data: [DONE]"
            if not line.startswith("data: {"):
                continue
            choices = orjson.loads(line[6:])["choices"]
            if not choices:
                continue
            delta = choices[0]["delta"]
            if delta.get("content") and out.first_content_at is None:
                out.first_content_at = time.monotonic() - start
            out.content += delta.get("content") or ""
            out.finish = choices[0].get("finish_reason") or out.finish
            for c in delta.get("tool_calls") or []:
                if out.first_call_at is None:
                    out.first_call_at = time.monotonic() - start
                out.names += [c["function"]["name"]] if c["function"].get("name") else []
                out.calls[c["index"]] = out.calls.get(c["index"], "") + (c["function"].get("arguments") or "")
    out.total = time.monotonic() - start
    return out


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None, contains: str = "") -> dict:
    """``r`` is a ``status`` error in OpenAI's shape; returns its ``error``."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    keys = {"message", "type", "param", "code"}
    if err.get("code") == "context_length_exceeded":  # (and llama-server's numbers)
        keys |= {"n_prompt_tokens", "n_ctx"}
        assert err["n_prompt_tokens"] > 0 and err["n_ctx"] > 0, err
    assert set(err) == keys
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    assert contains.lower() in err["message"].lower(), err["message"]
    return err


def assert_anthropic_error(
    r: httpx.Response, status: int, contains: str = "", type_: str = "invalid_request_error"
) -> dict:
    """``r`` is a ``status`` error of ``type_`` in Anthropic's shape; returns its ``error``."""
    assert r.status_code == status, r.text
    data = r.json()
    assert set(data) == {"type", "error"} and data["type"] == "error"
    assert set(data["error"]) == {"type", "message"}
    assert data["error"]["type"] == type_
    assert contains.lower() in data["error"]["message"].lower(), data["error"]["message"]
    return data["error"]


def assert_ollama_error(r: httpx.Response, status: int, contains: str = "") -> str:
    """``r`` is a ``status`` error in Ollama's shape (``{"error": text}``); returns the text."""
    assert r.status_code == status, r.text
    data = r.json()
    assert list(data) == ["error"] and isinstance(data["error"], str) and data["error"]
    assert contains.lower() in data["error"].lower(), data["error"]
    return data["error"]


def wait_event(obs: Any, rid: int | str, kind: str, timeout: float = 30.0) -> Any:
    """The first event of ``kind`` that request ``rid`` records (an observer
    with ``of(rid)``: ``ListObserver`` or the tests' hub), waiting for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in obs.of(int(rid)):
            if e.kind == kind:
                return e
        time.sleep(0.02)
    raise AssertionError(f"no {kind} event for request {rid}")


def wait_until(pred: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy (returned), or fail
    naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what} never held")
