"""Tool calls, structured output, reasoning and guardrails through the OpenAI
Chat Completions dialect: real models for what they can do, the scripted model
for syntaxes and failures they cannot be made to produce."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from .fakes import Script
from .support import (
    ASK,
    BAD_CALL,
    GOOD_CALL,
    PERSON,
    TIME_FUNCTION,
    WEATHER_FUNCTION,
    assert_openai_error,
    chat_tool,
    generated,
    scripted,
)
from .support import openai_client as client

WEATHER = chat_tool(WEATHER_FUNCTION)
TIME = chat_tool(TIME_FUNCTION)


def valid_args(call, tool=WEATHER) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


@pytest.fixture()
def qwen(qwen_server):
    """The session's shared Qwen2.5-Coder server (tests/conftest.py)."""
    return qwen_server


def test_qwen_calls_the_weather_tool_and_answers_the_follow_up(qwen):
    srv, obs = qwen
    raw = client(srv).chat.completions.with_raw_response.create(
        model="qwen", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=120
    )
    r = raw.parse()
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert valid_args(call)["city"].lower().startswith("paris")
    gen = next(e for e in obs.of(int(raw.headers["x-request-id"])) if e.kind == "generated")
    assert gen.stop_reason == "toolCalls"
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18, "sky": "sunny"})},
    ]
    r2 = client(srv).chat.completions.create(
        model="qwen", messages=follow, tools=[WEATHER], temperature=0, max_tokens=80
    )
    assert r2.choices[0].finish_reason == "stop"
    answer = r2.choices[0].message.content
    assert answer and ("18" in answer or "sunny" in answer.lower()), answer


def test_qwen_streams_the_call_as_tool_call_deltas(qwen):
    srv, _ = qwen
    chunks = list(
        client(srv).chat.completions.create(
            model="qwen", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=120, stream=True
        )
    )
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather" and calls[0].index == 0
    args = json.loads("".join(tc.function.arguments or "" for tc in calls if tc.index == 0))
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_smollm2_makes_a_valid_call_when_one_is_required(oai, hub, choice):
    raw = oai.chat.completions.with_raw_response.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, temperature=0, max_tokens=120
    )
    r = raw.parse()
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    want = "get_time" if isinstance(choice, dict) else None
    if want:
        assert call.function.name == want
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    valid_args(call, tool)
    gens = [e for e in hub.of(raw.headers["x-request-id"]) if e.kind == "generated"]
    assert len(gens) == 1  # the grammar made it valid the first time: no re-ask


def test_json_schema_output_parses_and_validates(oai):
    for prompt in ["Invent a person.", "Describe a retired sailor as JSON.", "A student who likes chess."]:
        r = oai.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=200,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_object_output_parses(oai):
    r = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Describe a dog as a JSON object with a name and an age."}],
        temperature=0,
        max_tokens=400,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_unsupported_schema_feature_is_400_naming_it(oai):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(
            model="m",
            messages=ASK,
            max_tokens=5,
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "object", "propertyNames": {"maxLength": 3}},
                },
            },
        )
    assert "propertyNames" in exc.value.body["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
    ],
)
def test_bad_tool_bodies_are_400(base_url, body, param):
    r = httpx.post(base_url + "/v1/chat/completions", json={"model": "m", "messages": ASK, "max_tokens": 5, **body})
    assert_openai_error(r, 400, param)


# ---------------------------------------------------------------- scripted
def test_invalid_call_is_reasked_once_and_the_second_answer_returned():
    srv, model, obs = scripted(Script([BAD_CALL]), Script([GOOD_CALL]))
    with srv:
        raw = client(srv).chat.completions.with_raw_response.create(
            model="m", messages=ASK, tools=[WEATHER], max_tokens=50
        )
    r = raw.parse()
    gens = generated(obs, raw.headers["x-request-id"])
    assert len(gens) == 2
    assert r.usage.completion_tokens == gens[-1].new_tokens  # the answered attempt alone
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
    corrective = model.calls[-1]["messages"][-1]
    assert corrective["role"] == "user" and ("town" in corrective["content"] or "city" in corrective["content"])


def test_still_invalid_after_the_reask_returns_the_last_answer_as_is():
    srv, _, obs = scripted(Script([BAD_CALL]), Script(["I cannot do that."]))
    with srv:
        raw = client(srv).chat.completions.with_raw_response.create(
            model="m", messages=ASK, tools=[WEATHER], max_tokens=50
        )
    r = raw.parse()
    assert raw.status_code == 200
    assert len(generated(obs, raw.headers["x-request-id"])) == 2
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"


def test_guardrails_off_means_one_attempt():
    srv, _, obs = scripted(Script([BAD_CALL]), Script([GOOD_CALL]), guardrails=False)
    with srv:
        raw = client(srv).chat.completions.with_raw_response.create(
            model="m", messages=ASK, tools=[WEATHER], max_tokens=50
        )
    assert len(generated(obs, raw.headers["x-request-id"])) == 1


def test_text_before_a_call_streams_and_the_call_follows():
    srv, _, _ = scripted(
        Script(
            [
                "Let me check. ",
                "<tool_",
                "call>\n",
                '{"name": "get_weather", ',
                '"arguments": {"city": "Oslo"}}',
                "\n</tool_call>",
            ]
        )
    )
    with srv:
        chunks = list(
            client(srv).chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=50, stream=True)
        )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Let me check. "
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and json.loads(calls[0].function.arguments) == {"city": "Oslo"}


def test_tool_choice_none_never_parses_calls():
    srv, _, _ = scripted(Script([GOOD_CALL]))
    with srv:
        r = client(srv).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=50
        )
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content


def test_think_text_lands_only_in_reasoning_content():
    pieces = ["<think>", "The user wants ", "a greeting.", "</think>", "\n\nHello", " there!"]
    srv, _, _ = scripted(Script(pieces))
    with srv:
        r = client(srv).chat.completions.create(model="m", messages=ASK, max_tokens=50)
        chunks = list(
            client(srv).chat.completions.create(
                model="m", messages=ASK, max_tokens=50, stream=True, stream_options={"include_usage": True}
            )
        )
    msg = r.choices[0].message
    assert msg.content == "Hello there!"
    assert msg.model_extra["reasoning_content"] == "The user wants a greeting."
    assert r.usage.completion_tokens_details.reasoning_tokens > 0
    order = [
        ("r", c.choices[0].delta.model_extra.get("reasoning_content"))
        if c.choices[0].delta.model_extra.get("reasoning_content")
        else ("c", c.choices[0].delta.content)
        for c in chunks
        if c.choices and (c.choices[0].delta.content or c.choices[0].delta.model_extra.get("reasoning_content"))
    ]
    assert "".join(t for k, t in order if k == "r") == "The user wants a greeting."
    assert "".join(t for k, t in order if k == "c") == "Hello there!"
    kinds = [k for k, _ in order]
    assert kinds == sorted(kinds, key=lambda k: 0 if k == "r" else 1)  # reasoning first, then the answer


def test_reasoning_effort_reaches_the_template_switch():
    srv, model, _ = scripted(Script(["Hi"]))
    with srv:
        client(srv).chat.completions.create(model="m", messages=ASK, max_tokens=5, reasoning_effort="none")
        client(srv).chat.completions.create(model="m", messages=ASK, max_tokens=5, reasoning_effort="high")
    assert model.calls[-2]["enable_thinking"] is False
    assert model.calls[-1]["enable_thinking"] is True and model.calls[-1]["reasoning_effort"] == "high"


def test_qwen_with_tool_choice_none_answers_in_text(qwen):
    srv, _ = qwen
    c = client(srv)
    msgs = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    r = c.chat.completions.create(
        model="qwen", messages=msgs, tools=[WEATHER], tool_choice="none", max_tokens=60, temperature=0
    )
    plain = c.chat.completions.create(model="qwen", messages=msgs, max_tokens=60, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls
    # with tool_choice none the tools never reach the prompt
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens


@pytest.mark.parametrize("effort", ["none", "high"])
def test_reasoning_switches_reach_the_real_templates(server, qwen, effort):
    """Both real templates render with the switch set, in every dialect."""
    for srv in (server, qwen[0]):
        url = srv.url
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=120,
            json={"model": "m", "messages": ASK, "max_tokens": 4, "reasoning_effort": effort},
        )
        assert r.status_code == 200, r.text
        thinking = {"type": "disabled"} if effort == "none" else {"type": "enabled", "budget_tokens": 1024}
        r = httpx.post(
            url + "/v1/messages",
            timeout=120,
            json={"model": "m", "messages": ASK, "max_tokens": 4, "thinking": thinking},
        )
        assert r.status_code == 200, r.text
        r = httpx.post(
            url + "/api/chat",
            timeout=120,
            json={
                "model": "m",
                "messages": ASK,
                "stream": False,
                "think": effort != "none",
                "options": {"num_predict": 4},
            },
        )
        if effort != "none":  # neither template thinks: refused as Ollama refuses it
            assert r.status_code == 400 and "does not support thinking" in r.json()["error"], r.text
            continue
        assert r.status_code == 200, r.text
        assert r.json()["done"] is True
