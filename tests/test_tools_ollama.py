"""Tool calls, thinking and structured output (``format``) through Ollama's
native API: Qwen2.5-Coder for real calls (the shared ``qwen_server``),
SmolLM2 plus a grammar for ``format``, the scripted model for thinking tags,
re-asks and exact NDJSON lines."""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

from turbospark.dialects import ollama as ol

from .fakes import Script
from .support import (
    ASK,
    BAD_CALL,
    GOOD_CALL,
    PERSON,
    THINKING,
    WEATHER_FUNCTION,
    assert_ollama_error,
    chat_tool,
    generated,
    scripted,
)

WEATHER = chat_tool(WEATHER_FUNCTION)
GREEDY = {"temperature": 0, "num_predict": 120}


def client(srv) -> ollama.Client:
    return ollama.Client(host=srv.url, timeout=300)


def ndjson_lines(url: str, path: str, body: dict) -> tuple[httpx.Response, list[dict]]:
    with httpx.stream("POST", url + path, json=body, timeout=300) as r:
        raw = r.read().decode()
    assert r.status_code == 200, raw
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in raw.splitlines()]
    assert all(not line["done"] for line in lines[:-1]) and lines[-1]["done"] is True
    return r, lines


class Ids:
    """Collects each response's x-request-id (an httpx response hook)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, response: httpx.Response) -> None:
        self.ids.append(response.headers["x-request-id"])


# ------------------------------------------------------------ Qwen2.5-Coder
def test_qwen_calls_the_weather_tool_and_answers_the_follow_up(qwen_server):
    srv, events = qwen_server
    ids = Ids()
    with ollama.Client(host=srv.url, timeout=300, event_hooks={"response": [ids]}) as c:
        r = c.chat(model="qwen", messages=ASK, tools=[WEATHER], options=GREEDY)
        assert r.done_reason == "stop"  # as Ollama reports a turn that ends in calls
        calls = r.message.tool_calls
        assert calls and calls[0].function.name == "get_weather"
        args = dict(calls[0].function.arguments)
        jsonschema.validate(args, WEATHER["function"]["parameters"])
        assert args["city"].lower().startswith("paris")
        assert "<tool_call>" not in (r.message.content or "")
        gens = generated(events, ids.ids[-1])
        assert gens[-1].stop_reason == "toolCalls" and r.eval_count == gens[-1].new_tokens

        follow = ASK + [
            {"role": "assistant", "content": r.message.content or "", "tool_calls": [calls[0].model_dump()]},
            {"role": "tool", "tool_name": "get_weather", "content": json.dumps({"temperature_c": 18, "sky": "sunny"})},
        ]
        r2 = c.chat(model="qwen", messages=follow, tools=[WEATHER], options={"temperature": 0, "num_predict": 80})
    assert not r2.message.tool_calls and r2.done_reason == "stop"
    answer = r2.message.content
    assert "18" in answer or "sunny" in answer.lower(), answer


def test_qwen_streams_each_call_in_its_own_line_before_the_done_line(qwen_server):
    srv, events = qwen_server
    body = {"model": "qwen", "messages": ASK, "tools": [WEATHER], "options": GREEDY}
    r, lines = ndjson_lines(srv.url, "/api/chat", body)
    with_calls = [i for i, line in enumerate(lines) if line["message"].get("tool_calls")]
    assert len(with_calls) == 1 and with_calls[0] == len(lines) - 2  # right before the done line
    calls = lines[with_calls[0]]["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["function"]["index"] == 0
    assert calls[0]["id"].startswith("call_")
    jsonschema.validate(calls[0]["function"]["arguments"], WEATHER["function"]["parameters"])
    assert all("<tool_call>" not in line["message"]["content"] for line in lines)
    last = lines[-1]
    assert last["done_reason"] == "stop" and "tool_calls" not in last["message"]
    rid = r.headers["x-request-id"]
    evs = events.wait_for(lambda es: any(e.kind == "generated" for e in es), rid)
    assert next(e for e in evs if e.kind == "requestRouted").stream is True
    assert last["eval_count"] == generated(events, rid)[-1].new_tokens

    # the SDK's stream yields the same call
    chunks = list(client(srv).chat(model="qwen", messages=ASK, tools=[WEATHER], options=GREEDY, stream=True))
    sdk_calls = [tc for c in chunks for tc in (c.message.tool_calls or [])]
    assert [dict(tc.function.arguments) for tc in sdk_calls] == [calls[0]["function"]["arguments"]]


# --------------------------------------------------- SmolLM2 with a grammar
def test_format_schema_is_enforced_through_the_sdk(server):
    c = client(server)
    for prompt in ["Invent a person.", "A student who likes chess."]:
        r = c.chat(
            model="m",
            messages=[{"role": "user", "content": prompt}],
            format=PERSON,
            options={"temperature": 0, "num_predict": 200},
        )
        jsonschema.validate(json.loads(r.message.content), PERSON)
    g = c.generate(
        model="m", prompt="Describe a retired sailor.", format=PERSON, options={"temperature": 0, "num_predict": 200}
    )
    jsonschema.validate(json.loads(g.response), PERSON)


def test_format_json_and_a_streamed_schema(base_url):
    r = httpx.post(
        base_url + "/api/chat",
        timeout=120,
        json={
            "model": "m",
            "stream": False,
            "format": "json",
            "options": {"temperature": 0, "num_predict": 400},
            "messages": [{"role": "user", "content": "Describe a dog as a JSON object with a name and an age."}],
        },
    )
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["message"]["content"]), dict)
    assert "x-turbospark-warning" not in r.headers
    _, lines = ndjson_lines(
        base_url,
        "/api/generate",
        {
            "model": "m",
            "prompt": "Invent a person.",
            "format": PERSON,
            "options": {"temperature": 0, "num_predict": 200},
        },
    )
    jsonschema.validate(json.loads("".join(line["response"] for line in lines)), PERSON)


@pytest.mark.parametrize(
    "path, body, needle",
    [
        ("/api/chat", {"think": "extreme"}, "think"),
        ("/api/generate", {"think": "extreme"}, "think"),
        ("/api/chat", {"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ("/api/chat", {"tools": [{"type": "function", "function": {"description": "no name"}}]}, "name"),
        (
            "/api/chat",
            {"format": {"type": "object", "propertyNames": {"maxLength": 3}}},
            "propertyNames",
        ),
        (
            "/api/generate",
            {"format": {"type": "object", "propertyNames": {"maxLength": 3}}},
            "propertyNames",
        ),
    ],
)
def test_bad_think_tools_and_format_are_400_in_ollama_shape(base_url, path, body, needle):
    base = {"model": "m", "stream": False, "options": {"num_predict": 2}}
    base.update({"messages": ASK} if path == "/api/chat" else {"prompt": "hi"})
    r = httpx.post(base_url + path, json={**base, **body}, timeout=60)
    assert needle in assert_ollama_error(r, 400)


def test_tool_name_on_tool_messages_becomes_the_tool_messages_name():
    body = {
        "model": "m",
        "messages": [
            *ASK,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ],
        "tools": [WEATHER],
        "think": "low",
    }
    tr = ol.translate_chat(ol.ChatBody.model_validate(body))
    assert tr.request is not None and tr.request.reasoning == "low"
    tool = tr.request.messages[-1]
    assert tool == {"role": "tool", "content": "sunny", "name": "get_weather"}
    assert tr.request.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert tr.request.tools == [WEATHER]


# ------------------------------------------------------------------ scripted
def test_thinking_lands_only_in_the_thinking_fields_in_order():
    srv, _, _ = scripted(Script(THINKING))
    with srv:
        r = client(srv).chat(model="x", messages=ASK)
        _, lines = ndjson_lines(srv.url, "/api/chat", {"model": "x", "messages": ASK})
        g = client(srv).generate(model="x", prompt="hi")
        _, glines = ndjson_lines(srv.url, "/api/generate", {"model": "x", "prompt": "hi"})
    assert r.message.thinking == "The user wants the weather." and r.message.content == "Let me check."
    assert r.eval_count == len(THINKING)
    order = [
        ("t", line["message"]["thinking"]) if line["message"].get("thinking") else ("c", line["message"]["content"])
        for line in lines[:-1]
    ]
    assert "".join(t for k, t in order if k == "t") == "The user wants the weather."
    assert "".join(t for k, t in order if k == "c") == "Let me check."
    kinds = [k for k, _ in order]
    assert kinds == sorted(kinds, key=lambda k: 0 if k == "t" else 1)  # thinking first, then the answer
    assert all(not (line["message"].get("thinking") and line["message"]["content"]) for line in lines)
    assert "thinking" not in lines[-1]["message"]
    assert g.thinking == "The user wants the weather." and g.response == "Let me check."
    assert "".join(line.get("thinking", "") for line in glines) == "The user wants the weather."
    assert "".join(line["response"] for line in glines) == "Let me check."


def test_invalid_call_is_reasked_once_and_the_second_answer_returned():
    srv, _, obs = scripted(Script([BAD_CALL]), Script([GOOD_CALL]))
    with srv:
        r = httpx.post(srv.url + "/api/chat", json={"model": "x", "messages": ASK, "tools": [WEATHER], "stream": False})
    gens = generated(obs, r.headers["x-request-id"])
    assert len(gens) == 2 and r.json()["eval_count"] == gens[-1].new_tokens
    calls = r.json()["message"]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}]
    assert r.json()["done_reason"] == "stop"


def test_think_reaches_the_template_switch():
    # it can think (Ollama refuses others)
    srv, model, _ = scripted(Script(["Hi"]), chat_template="{% if enable_thinking %}<think>{% endif %}")
    with srv:
        c = client(srv)
        c.chat(model="x", messages=ASK, think=False)
        c.chat(model="x", messages=ASK, think=True)
        c.chat(model="x", messages=ASK, think="high")
        c.generate(model="x", prompt="hi", think=False)
    off, on, high, gen_off = model.calls[-4:]
    assert off["enable_thinking"] is False
    assert on["enable_thinking"] is True and on["reasoning_effort"] == "medium"
    assert high["enable_thinking"] is True and high["reasoning_effort"] == "high"
    assert gen_off["enable_thinking"] is False
