"""No 500 from bad input: every malformed field, in every dialect, is a 4xx
in that dialect's error shape whose message names the field.

A table of hand-written malformed bodies per route, then a seeded mutation
run: valid bodies with random fields replaced by values of the wrong type,
none of which may answer a 5xx."""

from __future__ import annotations

import copy
import json
import random
import threading
from typing import Any

import httpx
import pytest

from turbospark.dialects.common import validate

USER = {"role": "user", "content": "hi"}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

CHAT = {"model": "m", "max_tokens": 2, "messages": [USER]}
COMPLETIONS = {"model": "m", "max_tokens": 2, "prompt": "hi"}
RESPONSES = {"model": "m", "max_output_tokens": 2, "input": "hi"}
MESSAGES = {"model": "m", "max_tokens": 2, "messages": [USER]}
COUNT = {"model": "m", "messages": [USER]}
OL_CHAT = {"model": "m", "stream": False, "options": {"num_predict": 2}, "messages": [USER]}
OL_GENERATE = {"model": "m", "stream": False, "options": {"num_predict": 2}, "prompt": "hi"}
EMBED = {"model": "m", "input": "hi"}
EMBEDDINGS = {"model": "m", "prompt": "hi"}
V1_EMBEDDINGS = {"model": "m", "input": "hi"}
SHOW = {"model": "m"}

BASES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": COUNT,
    "/api/chat": OL_CHAT,
    "/api/generate": OL_GENERATE,
    "/api/embed": EMBED,
    "/api/embeddings": EMBEDDINGS,
    "/v1/embeddings": V1_EMBEDDINGS,
    "/api/show": SHOW,
}


def with_(route: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return route, {**copy.deepcopy(BASES[route]), **fields}


def history(*turns: dict[str, Any]) -> list[dict[str, Any]]:
    """A conversation ending in a user turn, with ``turns`` in the middle."""
    return [USER, *turns, {"role": "user", "content": "and now?"}]


#: stands for a value nested too deeply for JSON writers (see :func:`deep_json`)
DEEP = "\u0000deep\u0000"


def deep_json(body: dict[str, Any], depth: int = 1000) -> bytes:
    """``body`` as JSON text with :data:`DEEP` replaced by objects nested
    ``depth`` levels (Python's and orjson's writers refuse that depth; the
    server's reader takes up to 1024)."""
    deep = '{"a":' * depth + "{}" + "}" * depth
    return json.dumps(body).replace(json.dumps(DEEP), deep).encode()


CH, CO, RS = "/v1/chat/completions", "/v1/completions", "/v1/responses"
MS, CT = "/v1/messages", "/v1/messages/count_tokens"
OC, OG, OE, OEL, VE, OS = "/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/v1/embeddings", "/api/show"

# (route, body, a text the error message must contain: the offending field)
CASES: list[tuple[tuple[str, dict[str, Any]], str]] = [
    # -- OpenAI Chat Completions
    (
        with_(CH, messages=[USER, {"role": "assistant", "tool_calls": [{"function": 5}]}]),
        "messages[1].tool_calls[0].function",
    ),
    (
        with_(
            CH, messages=history({"role": "assistant", "tool_calls": [{"function": {"name": 5, "arguments": "{}"}}]})
        ),
        "messages[1].tool_calls[0].function.name",
    ),
    (
        with_(CH, messages=history({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]})),
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        with_(CH, messages=history({"role": "assistant", "tool_calls": [{"function": "f"}]})),
        "messages[1].tool_calls[0].function",
    ),
    (with_(CH, messages=history({"role": "assistant", "tool_calls": [5]})), "messages[1].tool_calls[0]"),
    (with_(CH, messages=history({"role": "assistant", "tool_calls": "f()"})), "messages[1].tool_calls"),
    (
        with_(
            CH,
            messages=history(
                {
                    "role": "assistant",
                    "tool_calls": [{"id": 5, "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                }
            ),
        ),
        "messages[1].tool_calls[0].id",
    ),
    (
        with_(
            CH,
            messages=history(
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}"}}],
                }
            ),
        ),
        "messages[1].tool_calls[0].type",
    ),
    (with_(CH, messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), "messages[0].content[0].text"),
    (with_(CH, messages=[{"role": "user", "content": [5]}]), "messages[0].content[0]"),
    (
        with_(CH, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": 5}]}]),
        "messages[0].content[0].image_url",
    ),
    (with_(CH, messages=[{"role": "user", "content": "hi", "name": 5}]), "messages[0].name"),
    (with_(CH, messages=history({"role": "tool", "content": "x", "tool_call_id": 5})), "messages[1].tool_call_id"),
    (with_(CH, tools=[5]), "tools[0]"),
    (
        with_(CH, tools=[{"type": "function", "function": {"name": "f", "parameters": 5}}]),
        "tools[0].function.parameters",
    ),
    (
        with_(CH, tools=[{"type": "function", "function": {"name": "f", "description": 5}}]),
        "tools[0].function.description",
    ),
    (with_(CH, tools=[TOOL], tool_choice=5), "tool_choice"),
    (with_(CH, tools=[TOOL], tool_choice={"type": "function", "function": {"name": 5}}), "tool_choice"),
    (
        with_(
            CH,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}],
            tool_choice="required",
        ),
        "tools[0].function.parameters",
    ),
    (with_(CH, response_format="json"), "response_format"),
    (
        with_(
            CH,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": 5}},
            },
        ),
        "response_format.json_schema.schema",
    ),
    (with_(CH, stop=[1]), "stop"),
    (with_(CH, logit_bias={"abc": 1}), "logit_bias"),
    (with_(CH, stream_options=5), "stream_options"),
    (
        with_(CH, stream=True, messages=[USER, {"role": "assistant", "tool_calls": [{"function": 5}]}]),
        "messages[1].tool_calls[0].function",
    ),
    # -- OpenAI Completions
    (with_(CO, prompt=5), "prompt"),
    (with_(CO, prompt=[1, {"a": 1}]), "prompt"),
    (with_(CO, stop={"a": 1}), "stop"),
    (with_(CO, logit_bias=[]), "logit_bias"),
    # -- OpenAI Responses
    (with_(RS, input=5), "input"),
    (with_(RS, input=[5]), "input[0]"),
    (
        with_(RS, input=[{"type": "function_call", "call_id": "c1", "name": "f", "arguments": {}}, USER]),
        "input[0].arguments",
    ),
    (with_(RS, input=[{"type": "function_call_output", "call_id": "c1", "output": 5}]), "input[0].output"),
    (
        with_(
            RS, input=[{"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": 5}]}]
        ),
        "input[0].output[0].text",
    ),
    (with_(RS, input=[{"type": "reasoning", "summary": 5}, USER]), "input[0].summary"),
    (with_(RS, input=[{"type": 5}]), "input[0].type"),
    (with_(RS, input=[{"type": None, "role": "user", "content": "hi"}]), "input[0].type"),
    (
        with_(RS, input=[{"role": "user", "content": [{"type": "input_image", "image_url": 5}]}]),
        "input[0].content[0].image_url",
    ),
    (with_(RS, tools=[{"type": "function", "name": 5}]), "tools[0].name"),
    (with_(RS, tool_choice=5), "tool_choice"),
    (with_(RS, text={"format": 5}), "text.format"),
    (
        with_(
            RS,
            tools=[{"type": "function", "name": "f", "parameters": {"type": "object", "properties": 5}}],
            tool_choice="required",
        ),
        "tools[0].parameters",
    ),
    # -- Anthropic Messages
    (
        with_(
            MS,
            messages=history(
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": 5}]}
            ),
        ),
        "messages[1].content[0].input",
    ),
    (
        with_(
            MS,
            messages=[
                USER,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [5]}]},
            ],
        ),
        "messages[2].content[0].content[0]",
    ),
    (
        with_(
            MS,
            messages=[
                USER,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": 5}]}],
                },
            ],
        ),
        "messages[2].content[0].content[0].text",
    ),
    (
        with_(MS, messages=[{"role": "user", "content": [{"type": "image", "source": 5}]}]),
        "messages[0].content[0].source",
    ),
    (with_(MS, system=[5]), "system[0]"),
    (with_(MS, system=[{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]), "system[0]"),
    (with_(MS, tools=[{"name": 5, "input_schema": {}}]), "tools[0].name"),
    (
        with_(
            MS, tools=[{"name": "f", "input_schema": {"type": "object", "properties": 5}}], tool_choice={"type": "any"}
        ),
        "tools[0].input_schema",
    ),
    (with_(MS, tool_choice={"type": "tool", "name": 5}), "tool_choice.name"),
    (with_(MS, stop_sequences="x"), "stop_sequences"),
    (with_(MS, thinking={"type": "enabled", "budget_tokens": "x"}), "thinking.budget_tokens"),
    (with_(MS, messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    # -- Anthropic count_tokens
    (
        with_(
            CT,
            messages=history(
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": [1]}]}
            ),
        ),
        "messages[1].content[0].input",
    ),
    (with_(CT, system=5), "system"),
    (with_(CT, messages="hi"), "messages"),
    # -- Ollama chat
    (
        with_(OC, messages=[USER, {"role": "assistant", "tool_calls": [{"function": 5}]}]),
        "messages[1].tool_calls[0].function",
    ),
    (
        with_(OC, stream=True, messages=[USER, {"role": "assistant", "tool_calls": [{"function": "f"}]}]),
        "messages[1].tool_calls[0].function",
    ),
    (
        with_(
            OC, messages=history({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]})
        ),
        "messages[1].tool_calls[0].function.arguments",
    ),
    (with_(OC, messages=[{"role": "user", "content": "hi", "images": [5]}]), "messages[0].images[0]"),
    (with_(OC, messages=[{"role": "user", "content": "hi", "images": ["not base64!"]}]), "messages[0].images[0]"),
    (with_(OC, options=5), "options"),
    (with_(OC, options={"num_predict": 2, "temperature": "hot"}), "options.temperature"),
    (with_(OC, options={"num_predict": 2, "stop": [1]}), "options.stop"),
    (with_(OC, options={"num_predict": 2, "stop": [f"s{i}" for i in range(65)]}), "options.stop"),
    (with_(OG, options={"num_predict": 2, "stop": [f"s{i}" for i in range(65)]}), "options.stop"),
    (with_(OC, format=5), "format"),
    (with_(OC, format={"type": "object", "properties": 5}), "format"),
    (
        with_(OC, tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]),
        "tools[0].function.parameters",
    ),
    (with_(OC, messages=[{"role": "user", "content": ["x"]}]), "messages[0].content"),
    # -- Ollama generate
    (with_(OG, images=[5]), "images[0]"),
    (with_(OG, images="abc"), "images"),
    (with_(OG, images=["%%%"]), "images[0]"),
    (with_(OG, context=["a"]), "context[0]"),
    (with_(OG, template=5), "template"),
    (with_(OG, system=5), "system"),
    (with_(OG, raw="yes"), "raw"),
    # -- embeddings
    (with_(OE, input=5), "input"),
    (with_(OE, input=[1, "a"]), "input[0]"),
    (with_(OE, input=[{"a": 1}]), "input[0]"),
    (with_(OE, dimensions="x"), "dimensions"),
    (with_(OE, truncate="x"), "truncate"),
    (with_(OEL, prompt=5), "prompt"),
    (with_(OEL, prompt=["a"]), "prompt"),
    (with_(VE, input={"a": 1}), "input"),
    (with_(VE, input=["a", 5]), "input[1]"),
    (with_(VE, encoding_format="hex"), "encoding_format"),
    (with_(VE, dimensions=0), "dimensions"),
    # -- Ollama show
    (with_(OS, model=5), "model"),
    (with_(OS, model=None, name=[1]), "name"),
    (("/api/show", {}), "model"),
]


def error_message(route: str, r: httpx.Response) -> str:
    """The error message, after checking the body is exactly the shape this
    route's dialect uses."""
    body = r.json()
    if route.startswith("/api/"):
        assert list(body) == ["error"] and isinstance(body["error"], str), body
        return body["error"]
    if route.startswith("/v1/messages"):
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"}, body
        return body["error"]["message"]
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["message"]


@pytest.mark.parametrize("request_, field", CASES, ids=[f"{c[0][0]}-{i}" for i, c in enumerate(CASES)])
def test_malformed_field_is_4xx_naming_it(base_url, request_, field):
    route, body = request_
    r = httpx.post(base_url + route, json=body, timeout=60)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    message = error_message(route, r)
    assert field in message, (field, message)


@pytest.mark.parametrize(
    "route, body, field",
    [
        (
            OC,
            {
                **OL_CHAT,
                "messages": history(
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": DEEP}}}]}
                ),
            },
            "messages[1].tool_calls[0].function",
        ),
        (
            MS,
            {
                **MESSAGES,
                "messages": history(
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": DEEP}}],
                    }
                ),
            },
            "messages[1].content[0].input",
        ),
        (
            CH,
            {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"a": DEEP}}}},
            "response_format.json_schema.schema",
        ),
        (
            CH,
            {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": DEEP}}}]},
            "tools[0].function.parameters",
        ),
        (
            RS,
            {**RESPONSES, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"a": DEEP}}}},
            "text.format.schema",
        ),
        (RS, {**RESPONSES, "metadata": {"a": DEEP}}, "metadata.a"),
        (OG, {**OL_GENERATE, "format": {"a": DEEP}}, "format.a"),
        (VE, {**V1_EMBEDDINGS, "input": [[[DEEP]]]}, "input[0][0]"),
    ],
)
def test_deeply_nested_values_are_400(base_url, route, body, field):
    """Nested past what JSON writers take (orjson reads 1024 levels, writes
    254): refused up front, naming where, rather than failing when the value
    is rendered into the prompt or echoed in the response."""
    r = httpx.post(base_url + route, content=deep_json(body), timeout=60, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    message = error_message(route, r)
    assert field in message and "nested too deeply" in message, message


@pytest.mark.parametrize("route", [CH, MS, OC, "/completion", VE])
def test_a_body_of_too_many_values_is_413_before_it_is_parsed(base_url, route):
    """Parsing and validating each value holds the event loop (the parsers
    keep the GIL): a 30 MB list of 15M token ids froze every stream and
    /health for seconds. Past a million values, no context could take them."""
    base = BASES.get(route, {"prompt": "hi", "n_predict": 2})
    body = json.dumps({**base, "metadata": {"ids": [1] * 1_000_001}}).encode()
    r = httpx.post(base_url + route, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text
    message = r.json()["error"] if route.startswith("/api/") else r.json()["error"]["message"]
    assert "too many values" in message, message


def test_a_large_body_is_validated_off_the_event_loop(server, monkeypatch: pytest.MonkeyPatch):
    from turbospark.routes import common

    threads: list[str] = []

    def recording(model: Any, data: Any) -> Any:
        threads.append(threading.current_thread().name)
        return validate(model, data)

    monkeypatch.setattr(common, "validate", recording)
    small = httpx.post(server.url + CH, json=CHAT, timeout=60)
    large = httpx.post(server.url + CH, json={**CHAT, "metadata": {"pad": "x" * (2 << 20)}}, timeout=60)
    assert (small.status_code, large.status_code) == (200, 200), large.text
    assert len(threads) == 2 and threads[0] != threads[1]  # the loop's own thread, then a worker


# ------------------------------------------------------------ mutations
TOOL_HISTORY_CHAT = {
    "model": "m",
    "max_tokens": 2,
    "temperature": 0,
    "stop": ["\n\n"],
    "tools": [TOOL],
    "tool_choice": "auto",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ],
    "response_format": {"type": "text"},
}
RESPONSES_TOOLS = {
    "model": "m",
    "max_output_tokens": 2,
    "temperature": 0,
    "instructions": "Be brief.",
    "tools": [{"type": "function", "name": "get_weather", "parameters": TOOL["function"]["parameters"]}],
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "user", "content": "thanks"},
    ],
    "text": {"format": {"type": "text"}},
}
ANTHROPIC_TOOLS = {
    "model": "m",
    "max_tokens": 2,
    "temperature": 0,
    "system": [{"type": "text", "text": "Be brief."}],
    "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": TOOL["function"]["parameters"]}],
    "tool_choice": {"type": "auto"},
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "thanks"},
            ],
        },
    ],
}
OLLAMA_TOOLS = {
    "model": "m",
    "stream": False,
    "options": {"num_predict": 2, "temperature": 0, "stop": ["\n\n"]},
    "tools": [TOOL],
    "think": False,
    "keep_alive": "5m",
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        {"role": "user", "content": "thanks"},
    ],
}
MUTATION_BASES = [
    (
        CH,
        {
            **CHAT,
            "temperature": 0,
            "top_p": 0.9,
            "stop": "x",
            "seed": 1,
            "n": 1,
            "user": "u",
            "stream_options": {"include_usage": True},
            "logit_bias": {"1": 0.5},
        },
    ),
    (CH, TOOL_HISTORY_CHAT),
    (CO, {**COMPLETIONS, "temperature": 0, "stop": ["x"], "seed": 1, "echo": False, "best_of": 1}),
    (
        RS,
        {
            **RESPONSES,
            "temperature": 0,
            "reasoning": {"effort": "low"},
            "metadata": {"a": "b"},
            "tool_choice": "auto",
            "truncation": "disabled",
        },
    ),
    (RS, RESPONSES_TOOLS),
    (
        MS,
        {
            **MESSAGES,
            "temperature": 0,
            "top_k": 5,
            "stop_sequences": ["x"],
            "metadata": {"user_id": "u"},
            "thinking": {"type": "disabled"},
        },
    ),
    (MS, ANTHROPIC_TOOLS),
    (CT, {k: v for k, v in ANTHROPIC_TOOLS.items() if k not in ("max_tokens", "temperature")}),
    (OC, OLLAMA_TOOLS),
    (
        OG,
        {
            **OL_GENERATE,
            "system": "Be brief.",
            "context": [1, 2],
            "template": "{{ .Prompt }}",
            "format": "json",
            "raw": False,
            "options": {"num_predict": 2, "top_k": 5, "repeat_last_n": 8},
        },
    ),
    (OE, {**EMBED, "input": ["hi", "there"], "truncate": True, "dimensions": 8, "options": {"a": 1}}),
    (OEL, {**EMBEDDINGS, "options": {"a": 1}, "keep_alive": 5}),
    (VE, {**V1_EMBEDDINGS, "input": ["hi", "there"], "encoding_format": "float", "dimensions": 8}),
    (OS, {**SHOW, "verbose": False}),
]
#: what a field is replaced with: every JSON type but the right one (mostly)
WRONG = [7, -1, 2**40, 0.5, [], [1, "a"], {}, {"a": 1}, None, "x", "", True]
#: the budget stays tiny whatever else changes, so every request is quick
PROTECTED = {("max_tokens",), ("max_output_tokens",), ("options",), ("options", "num_predict"), ("stream",)}
MUTATIONS_PER_BODY = 11


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return out
    for key, child in items:
        path = prefix + (key,)
        if path not in PROTECTED:
            out.append(path)
        out.extend(paths(child, path))
    return out


def mutate(body: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    """``body`` with one or two fields replaced by wrong-type values (or,
    now and then, dropped); returns it and a description."""
    body = copy.deepcopy(body)
    done = []
    for _ in range(rng.choice((1, 1, 2))):
        path = rng.choice(paths(body))
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and rng.random() < 0.1:
            del parent[path[-1]]
            done.append(f"del {path}")
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(WRONG))
            done.append(f"{path}={parent[path[-1]]!r}")
    return body, "; ".join(done)


@pytest.mark.parametrize(
    "index", range(len(MUTATION_BASES)), ids=[f"{r}-{i}" for i, (r, _) in enumerate(MUTATION_BASES)]
)
def test_mutated_bodies_never_answer_5xx(base_url, index):
    route, base = MUTATION_BASES[index]
    if route == OS:  # /api/show never falls back to the default model
        base = {**base, "model": httpx.get(base_url + "/api/tags", timeout=60).json()["models"][0]["name"]}
    r = httpx.post(base_url + route, json=base, timeout=60)
    assert r.status_code == 200, ("the unmutated body must be valid", r.text)
    rng = random.Random(1000 + index)
    failures = []
    for _ in range(MUTATIONS_PER_BODY):
        body, what = mutate(base, rng)
        r = httpx.post(base_url + route, json=body, timeout=60)
        if r.status_code >= 500:
            failures.append((what, r.status_code, r.text[:300]))
        elif r.status_code >= 400:
            error_message(route, r)  # in the dialect's shape
    assert not failures, failures


# ------------------------------------------------------------ below the dialects
def test_a_template_failing_in_any_way_is_a_400_naming_messages():
    from turbospark.engine.template import ChatTemplate, TemplateError

    messages = [{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]
    for source in (
        "{{ range(10 ** 12) | list }}",  # the sandbox's OverflowError
        "{{ messages[0]['tool_calls'][0]['function']['arguments'].items() | list }}",
        "{{ messages[0]['content'] + 5 }}",
        "{{ (messages[0]['content'] | int) // 0 }}",
    ):
        with pytest.raises(TemplateError) as exc:
            ChatTemplate(source).render(messages)
        assert exc.value.param == "messages" and "messages" in str(exc.value)


def test_tools_code_takes_odd_history_calls():
    from turbospark.tools.calls import render_call
    from turbospark.tools.guardrails import answered_calls
    from turbospark.tools.prompting import inline_tools

    odd = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                5,
                {"function": "x"},
                {"id": 3, "function": {"name": 7, "arguments": "[1"}},
                {"name": "flat", "arguments": 2},
            ],
        },
        {"role": "tool", "tool_call_id": "3", "content": "done"},
    ]
    out = inline_tools(odd, None, "hermes")
    assert out[0]["role"] == "assistant" and "<tool_call>" in out[0]["content"]
    assert answered_calls(odd)
    assert "<parameter=arguments>" in render_call("xml", "f", [1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [False, True])
def test_a_logit_bias_beyond_the_vocabulary_is_400_before_the_stream_starts(base_url, stream):
    r = httpx.post(
        base_url + "/v1/chat/completions",
        timeout=60,
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "logit_bias": {"99999999": 5},
            "stream": stream,
        },
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "logit_bias" and "vocabulary" in r.json()["error"]["message"]
