"""Tool use, thinking and structured output through the Anthropic Messages
dialect: Qwen2.5-Coder for real tool calls (the shared ``qwen_server``),
SmolLM2 plus a grammar for forced calls and JSON output, the scripted model
for thinking tags, re-asks and exact stream shapes."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest
from pydantic import BaseModel

from .fakes import Script
from .support import (
    ASK,
    BAD_CALL,
    GOOD_CALL,
    SCHEMAS,
    THINKING,
    TIME_FUNCTION,
    WEATHER_FUNCTION,
    anthropic_tool,
    assert_anthropic_error,
    generated,
    scripted,
    sse_frames,
)

GREEDY = {"temperature": 0}  # this SDK version has no temperature argument
WEATHER = anthropic_tool(WEATHER_FUNCTION)
TIME = anthropic_tool(TIME_FUNCTION)


def client(srv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=300)


def stream_frames(url: str, body: dict) -> tuple[httpx.Response, list[tuple[str, dict]]]:
    with httpx.stream("POST", url + "/v1/messages", json={**body, "stream": True}, timeout=300) as r:
        raw = r.read().decode()
    assert r.status_code == 200, raw
    return r, sse_frames(raw)


def blocks_of(frames: list[tuple[str, dict]]) -> list[dict]:
    """Rebuild the content blocks from the frames, checking that each block
    is started, fed and stopped in turn, with indexes counting up from 0."""
    names = [n for n, _ in frames]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    blocks: list[dict] = []
    open_index = None
    for name, d in frames[2:-2]:
        if name == "content_block_start":
            assert open_index is None and d["index"] == len(blocks)
            open_index = d["index"]
            blocks.append({**d["content_block"], "_json": ""})
        elif name == "content_block_delta":
            assert d["index"] == open_index
            block, delta = blocks[open_index], d["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta" and block["type"] == "tool_use"
                block["_json"] += delta["partial_json"]
        else:
            assert name == "content_block_stop" and d["index"] == open_index
            open_index = None
    assert open_index is None
    return blocks


# ------------------------------------------------------------ Qwen2.5-Coder
def test_qwen_calls_the_weather_tool_and_answers_the_follow_up(qwen_server):
    srv, events = qwen_server
    raw = client(srv).messages.with_raw_response.create(
        model="qwen", max_tokens=120, messages=ASK, tools=[WEATHER], extra_body=GREEDY
    )
    m = raw.parse()
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    assert uses[0].input["city"].lower().startswith("paris")
    assert all(b.text for b in m.content if b.type == "text")  # no empty text block beside the call
    assert [b.type for b in m.content][-len(uses) :] == ["tool_use"] * len(uses)
    gens = generated(events, raw.headers["x-request-id"])
    assert gens[-1].stop_reason == "toolCalls"
    assert m.usage.output_tokens == gens[-1].new_tokens  # the answered attempt alone

    follow = ASK + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": uses[0].id,
                    "content": json.dumps({"temperature_c": 18, "sky": "sunny"}),
                }
            ],
        },
    ]
    m2 = client(srv).messages.create(model="qwen", max_tokens=80, messages=follow, tools=[WEATHER], extra_body=GREEDY)
    assert m2.stop_reason == "end_turn"
    answer = "".join(b.text for b in m2.content if b.type == "text")
    assert "18" in answer or "sunny" in answer.lower(), answer


def test_qwen_streams_the_call_as_a_tool_use_block(qwen_server):
    srv, events = qwen_server
    body = {"model": "qwen", "max_tokens": 120, "messages": ASK, "tools": [WEATHER], "temperature": 0}
    r, frames = stream_frames(srv.url, body)
    blocks = blocks_of(frames)
    uses = [b for b in blocks if b["type"] == "tool_use"]
    assert uses and uses[0]["name"] == "get_weather" and uses[0]["id"].startswith("toolu_")
    assert uses[0]["input"] == {}  # the input comes in input_json_delta pieces
    pieces = [
        d["delta"]["partial_json"]
        for n, d in frames
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    ]
    assert len(pieces) > 1
    args = json.loads(uses[0]["_json"])
    jsonschema.validate(args, WEATHER["input_schema"])
    assert all(b["text"] for b in blocks if b["type"] == "text")
    delta = frames[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    rid = r.headers["x-request-id"]
    gens = events.wait_for(lambda es: any(e.kind == "generated" for e in es), rid)
    routed = next(e for e in gens if e.kind == "requestRouted")
    assert routed.stream is True
    assert delta["usage"]["output_tokens"] == generated(events, rid)[-1].new_tokens

    # the SDK's stream helper rebuilds the same call from the pieces
    with client(srv).messages.stream(
        model="qwen", max_tokens=120, messages=ASK, tools=[WEATHER], extra_body=GREEDY
    ) as s:
        final = s.get_final_message()
    sdk_uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and sdk_uses[0].input == args


# ------------------------------------------------- SmolLM2 with a grammar
@pytest.mark.parametrize(
    "choice", [{"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_time"}]
)
def test_forced_tool_use_is_a_valid_call(server, hub, choice):
    ant = client(server)
    raw = ant.messages.with_raw_response.create(
        model="m", max_tokens=120, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, extra_body=GREEDY
    )
    m = raw.parse()
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    if choice["type"] == "tool":
        assert uses[0].name == "get_time"
    else:
        assert len(uses) == 1  # disable_parallel_tool_use
    for use in uses:
        jsonschema.validate(use.input, SCHEMAS[use.name])
    gens = [e for e in hub.of(raw.headers["x-request-id"]) if e.kind == "generated"]
    assert len(gens) == 1  # valid the first time: no re-ask
    assert m.usage.output_tokens == gens[0].new_tokens


def test_output_config_json_schema_is_enforced(server):
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["city", "population"],
        "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer", "minimum": 0}},
    }
    m = client(server).messages.create(
        model="m",
        max_tokens=120,
        messages=[{"role": "user", "content": "Name a big city and its population."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=GREEDY,
    )
    jsonschema.validate(json.loads(m.content[0].text), schema)


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "nope"),
        ({"tool_choice": {"type": "any"}}, "no tools"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        ({"output_config": {"format": {"type": "yaml", "schema": {}}}}, "output_config.format.type"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
        (
            {
                "output_config": {
                    "format": {
                        "type": "json_schema",
                        "schema": {"type": "object", "propertyNames": {"maxLength": 3}},
                    }
                }
            },
            "propertyNames",
        ),
    ],
)
def test_bad_tool_and_format_bodies_are_400_in_anthropic_shape(base_url, body, needle):
    r = httpx.post(base_url + "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": ASK, **body}, timeout=60)
    err = assert_anthropic_error(r, 400)
    assert needle in err["message"]


def test_count_tokens_leaves_tools_out_when_tool_choice_is_none(base_url):
    def count(**kw) -> int:
        r = httpx.post(base_url + "/v1/messages/count_tokens", json={"model": "m", "messages": ASK, **kw})
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    bare = count()
    assert count(tools=[WEATHER]) > bare
    assert count(tools=[WEATHER], tool_choice={"type": "none"}) == bare


# ------------------------------------------------------------------ scripted
def test_thinking_lands_only_in_the_thinking_block_before_the_text():
    srv, _, obs = scripted(Script(THINKING))
    with srv:
        raw = client(srv).messages.with_raw_response.create(model="x", max_tokens=50, messages=ASK)
        _, frames = stream_frames(srv.url, {"model": "x", "max_tokens": 50, "messages": ASK})
        with client(srv).messages.stream(model="x", max_tokens=50, messages=ASK) as s:
            sdk = s.get_final_message()
    m = raw.parse()
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "The user wants the weather." and isinstance(m.content[0].signature, str)
    assert m.content[1].text == "Let me check."
    assert m.usage.output_tokens == generated(obs, raw.headers["x-request-id"])[0].new_tokens == len(THINKING)

    blocks = blocks_of(frames)
    assert [b["type"] for b in blocks] == ["thinking", "text"]
    assert blocks[0]["thinking"] == "The user wants the weather." and blocks[0]["signature"]
    assert blocks[1]["text"] == "Let me check."
    # thinking deltas, then the signature, then the block ends; only then the text
    kinds = [d["delta"]["type"] if n == "content_block_delta" else n for n, d in frames[2:-2]]
    runs = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert runs == [
        "content_block_start",
        "thinking_delta",
        "signature_delta",
        "content_block_stop",
        "content_block_start",
        "text_delta",
        "content_block_stop",
    ]
    assert [b.type for b in sdk.content] == ["thinking", "text"]
    assert sdk.content[0].thinking == "The user wants the weather." and sdk.content[1].text == "Let me check."


def test_invalid_call_is_reasked_once_and_the_second_answer_returned():
    srv, model, obs = scripted(Script([BAD_CALL]), Script([GOOD_CALL]))
    with srv:
        raw = client(srv).messages.with_raw_response.create(model="x", max_tokens=50, messages=ASK, tools=[WEATHER])
    m = raw.parse()
    gens = generated(obs, raw.headers["x-request-id"])
    assert len(gens) == 2
    assert m.usage.output_tokens == gens[-1].new_tokens  # the answered attempt alone
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["tool_use"] and m.content[0].input == {"city": "Paris"}
    corrective = model.calls[-1]["messages"][-1]
    assert corrective["role"] == "user" and "get_weather" in corrective["content"]
    assert "schema" in corrective["content"]


def test_text_then_call_streams_a_text_block_then_a_tool_use_block():
    pieces = [
        "Let me check. ",
        "<tool_",
        "call>\n",
        '{"name": "get_weather", ',
        '"arguments": {"city": "Oslo"}}',
        "\n</tool_call>",
    ]
    srv, _, _ = scripted(Script(pieces))
    with srv:
        _, frames = stream_frames(srv.url, {"model": "x", "max_tokens": 50, "messages": ASK, "tools": [WEATHER]})
        with client(srv).messages.stream(model="x", max_tokens=50, messages=ASK, tools=[WEATHER]) as s:
            sdk = s.get_final_message()
    blocks = blocks_of(frames)
    assert [b["type"] for b in blocks] == ["text", "tool_use"]
    assert blocks[0]["text"] == "Let me check. " and json.loads(blocks[1]["_json"]) == {"city": "Oslo"}
    assert frames[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert [b.type for b in sdk.content] == ["text", "tool_use"] and sdk.content[1].input == {"city": "Oslo"}


def test_tool_choice_none_never_parses_calls():
    srv, model, _ = scripted(Script([GOOD_CALL]))
    with srv:
        m = client(srv).messages.create(
            model="x", max_tokens=50, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"}
        )
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["text"]
    assert "<tool_call>" in m.content[0].text
    assert model.calls[-1]["tools"] is None  # and the template never saw them


def test_thinking_and_effort_reach_the_template_switch():
    srv, model, _ = scripted(Script(["Hi"]))
    with srv:
        ant = client(srv)
        ant.messages.create(model="x", max_tokens=5, messages=ASK, thinking={"type": "disabled"})
        ant.messages.create(model="x", max_tokens=5, messages=ASK, thinking={"type": "enabled", "budget_tokens": 2048})
        ant.messages.create(model="x", max_tokens=5, messages=ASK, output_config={"effort": "high"})
        ant.messages.create(model="x", max_tokens=5, messages=ASK)
    off, low, high, default = model.calls[-4:]
    assert off["enable_thinking"] is False and off["reasoning_effort"] == "none"
    assert low["enable_thinking"] is True and low["reasoning_effort"] == "low"
    assert high["enable_thinking"] is True and high["reasoning_effort"] == "high"
    assert default["enable_thinking"] is True and "reasoning_effort" not in default


def test_beta_output_format_spelling_reaches_the_grammar():
    srv, model, _ = scripted(Script(['{"a": 1}']))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with srv:
        r = httpx.post(
            srv.url + "/v1/messages",
            json={
                "model": "x",
                "max_tokens": 20,
                "messages": ASK,
                "output_format": {"type": "json_schema", "schema": schema},
            },
        )
    assert r.status_code == 200 and r.json()["content"][0]["text"] == '{"a": 1}'
    assert model.calls[-1]["config"].grammar  # the schema became a grammar


def test_sdk_parse_with_a_pydantic_output_format():
    class City(BaseModel):
        name: str
        country: str

    srv, model, _ = scripted(Script(['{"name": "Paris", ', '"country": "France"}']))
    with srv:
        m = client(srv).messages.parse(model="x", max_tokens=50, messages=ASK, output_format=City)
    assert m.parsed_output == City(name="Paris", country="France")
    assert model.calls[-1]["config"].grammar  # sent as output_config.format: enforced


def test_sdk_parse_and_beta_output_format_on_the_real_model(server):
    class City(BaseModel):
        name: str
        country: str

    m = client(server).messages.parse(
        model="m",
        max_tokens=80,
        output_format=City,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Name a famous city."}],
    )
    assert isinstance(m.parsed_output, City)
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["a"],
        "properties": {"a": {"type": "integer"}},
    }
    r = httpx.post(
        server.url + "/v1/messages",
        timeout=120,
        json={
            "model": "m",
            "max_tokens": 40,
            "temperature": 0,
            "messages": ASK,
            "output_format": {"type": "json_schema", "schema": schema},
        },
    )
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["content"][0]["text"]), schema)
