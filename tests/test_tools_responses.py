"""Function calls, reasoning and structured output through the OpenAI
Responses dialect: Qwen2.5-Coder for real calls (the shared ``qwen_server``),
SmolLM2 plus a grammar for forced calls and JSON output, the scripted model
for thinking tags, re-asks and exact event shapes."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel

from .fakes import Script
from .support import ASK_TEXT as ASK
from .support import (
    BAD_CALL,
    GOOD_CALL,
    PERSON,
    SCHEMAS,
    THINKING,
    TIME_FUNCTION,
    WEATHER_FUNCTION,
    assert_openai_error,
    generated,
    responses_tool,
    scripted,
    sse_frames,
)
from .support import openai_client as client

WEATHER = responses_tool(WEATHER_FUNCTION)
TIME = responses_tool(TIME_FUNCTION)


def stream_frames(url: str, body: dict) -> tuple[httpx.Response, list[tuple[str, dict]]]:
    with httpx.stream("POST", url + "/v1/responses", json={**body, "stream": True}, timeout=300) as r:
        raw = r.read().decode()
    assert r.status_code == 200, raw
    frames = sse_frames(raw)
    assert [d["sequence_number"] for _, d in frames] == list(range(len(frames)))
    return r, frames


def items_of(frames: list[tuple[str, dict]]) -> list[dict]:
    """Rebuild the output items from the events, checking that each item is
    added, fed and done in turn at the next ``output_index``, and that the
    terminal response lists exactly the finished items."""
    names = [n for n, _ in frames]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] in ("response.completed", "response.incomplete")
    items: list[dict] = []
    done: list[dict] = []
    current: dict | None = None
    for name, d in frames[2:-1]:
        if name == "response.output_item.added":
            assert current is None and d["output_index"] == len(items)
            current = dict(d["item"], _text="", _args="")
            items.append(current)
            continue
        assert current is not None and d["output_index"] == len(items) - 1, (name, d)
        if "item_id" in d:
            assert d["item_id"] == current["id"]
        if name in ("response.output_text.delta", "response.reasoning_text.delta"):
            current["_text"] += d["delta"]
        elif name in ("response.output_text.done", "response.reasoning_text.done"):
            assert d["text"] == current["_text"]
        elif name == "response.function_call_arguments.delta":
            current["_args"] += d["delta"]
        elif name == "response.function_call_arguments.done":
            assert d["arguments"] == current["_args"]
        elif name == "response.output_item.done":
            done.append(d["item"])
            current = None
        else:
            assert name in ("response.content_part.added", "response.content_part.done"), name
    assert current is None
    assert frames[-1][1]["response"]["output"] == done
    return [dict(i, **{"done": f}) for i, f in zip(items, done)]


def calls_of(response) -> list:
    return [o for o in response.output if o.type == "function_call"]


# ------------------------------------------------------------ Qwen2.5-Coder
def test_qwen_calls_the_weather_tool_and_answers_the_follow_up(qwen_server):
    srv, events = qwen_server
    raw = client(srv).responses.with_raw_response.create(
        model="qwen", input=ASK, tools=[WEATHER], temperature=0, max_output_tokens=120
    )
    r = raw.parse()
    assert r.status == "completed"
    calls = calls_of(r)
    assert calls and calls[0].name == "get_weather" and calls[0].status == "completed"
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, WEATHER["parameters"])
    assert args["city"].lower().startswith("paris")
    assert all(o.type != "message" or o.content[0].text for o in r.output)  # no empty message beside the call
    gens = generated(events, raw.headers["x-request-id"])
    assert gens[-1].stop_reason == "toolCalls"
    assert r.usage.output_tokens == gens[-1].new_tokens  # the answered attempt alone
    assert r.usage.input_tokens == gens[-1].prompt_tokens

    follow = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name, "arguments": calls[0].arguments},
        {
            "type": "function_call_output",
            "call_id": calls[0].call_id,
            "output": json.dumps({"temperature_c": 18, "sky": "sunny"}),
        },
    ]
    r2 = client(srv).responses.create(model="qwen", input=follow, tools=[WEATHER], temperature=0, max_output_tokens=80)
    assert r2.status == "completed" and not calls_of(r2)
    assert "18" in r2.output_text or "sunny" in r2.output_text.lower(), r2.output_text


def test_qwen_streams_the_call_as_a_function_call_item(qwen_server):
    srv, events = qwen_server
    body = {"model": "qwen", "input": ASK, "tools": [WEATHER], "temperature": 0, "max_output_tokens": 120}
    r, frames = stream_frames(srv.url, body)
    items = items_of(frames)
    calls = [i for i in items if i["type"] == "function_call"]
    assert calls and calls[0]["name"] == "get_weather"
    assert calls[0]["arguments"] == "" and calls[0]["status"] == "in_progress"  # as added
    assert calls[0]["done"]["arguments"] == calls[0]["_args"] and calls[0]["done"]["status"] == "completed"
    jsonschema.validate(json.loads(calls[0]["_args"]), WEATHER["parameters"])
    names = [n for n, _ in frames]
    assert names.count("response.function_call_arguments.delta") > 1
    at = names.index("response.function_call_arguments.done")
    assert names[at + 1] == "response.output_item.done"
    final = frames[-1][1]["response"]
    assert final["status"] == "completed"
    rid = r.headers["x-request-id"]
    evs = events.wait_for(lambda es: any(e.kind == "generated" for e in es), rid)
    assert next(e for e in evs if e.kind == "requestRouted").stream is True
    assert final["usage"]["output_tokens"] == generated(events, rid)[-1].new_tokens

    # the SDK's stream helper rebuilds the same call
    with client(srv).responses.stream(
        model="qwen", input=ASK, tools=[WEATHER], temperature=0, max_output_tokens=120
    ) as s:
        done = s.get_final_response()
    assert calls_of(done)[0].arguments == calls[0]["_args"]


# ------------------------------------------------- SmolLM2 with a grammar
@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_time"}])
def test_forced_call_is_valid(oai, hub, choice):
    raw = oai.responses.with_raw_response.create(
        model="m",
        input=ASK,
        tools=[WEATHER, TIME],
        tool_choice=choice,
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=120,
    )
    r = raw.parse()
    calls = calls_of(r)
    assert len(calls) == 1  # parallel_tool_calls=False
    if isinstance(choice, dict):
        assert calls[0].name == "get_time"
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
    assert r.tool_choice == choice if isinstance(choice, str) else r.tool_choice.name == "get_time"  # echoed
    gens = [e for e in hub.of(raw.headers["x-request-id"]) if e.kind == "generated"]
    assert len(gens) == 1 and r.usage.output_tokens == gens[0].new_tokens  # valid at once: no re-ask


def test_json_schema_format_parses_and_validates(oai):
    for prompt in ["Invent a person.", "A student who likes chess."]:
        r = oai.responses.create(
            model="m",
            input=prompt,
            temperature=0,
            max_output_tokens=200,
            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
        )
        assert r.text.format.type == "json_schema" and r.text.format.name == "person"
        jsonschema.validate(json.loads(r.output_text), PERSON)


def test_sdk_parse_with_a_pydantic_text_format(oai):
    class City(BaseModel):
        name: str
        country: str

    r = oai.responses.parse(
        model="m", input="Name a famous city.", temperature=0, max_output_tokens=120, text_format=City
    )
    assert isinstance(r.output_parsed, City)


def test_json_object_format_and_streamed_json_schema(base_url):
    r = httpx.post(
        base_url + "/v1/responses",
        timeout=120,
        json={
            "model": "m",
            "input": "Describe a dog as a JSON object with a name and an age.",
            "temperature": 0,
            "max_output_tokens": 400,
            "text": {"format": {"type": "json_object"}},
        },
    )
    assert r.status_code == 200, r.text
    text = r.json()["output"][0]["content"][0]["text"]
    assert isinstance(json.loads(text), dict)
    _, frames = stream_frames(
        base_url,
        {
            "model": "m",
            "input": "Invent a person.",
            "temperature": 0,
            "max_output_tokens": 200,
            "text": {"format": {"type": "json_schema", "name": "p", "schema": PERSON}},
        },
    )
    jsonschema.validate(json.loads(items_of(frames)[0]["_text"]), PERSON)


@pytest.mark.parametrize(
    "body, param, needle",
    [
        ({"tool_choice": {"type": "function"}, "tools": [WEATHER]}, "tool_choice.name", "name"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice.type", "file_search"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice", "nope"),
        ({"tool_choice": "required"}, "tool_choice", "no tools"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "yaml"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": "{}"}}}, "text.format.schema", "schema"),
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"type": "object", "propertyNames": {"maxLength": 3}},
                    }
                }
            },
            "text.format",
            "propertyNames",
        ),
    ],
)
def test_bad_tool_and_format_bodies_are_400(base_url, body, param, needle):
    r = httpx.post(
        base_url + "/v1/responses", json={"model": "m", "input": ASK, "max_output_tokens": 5, **body}, timeout=60
    )
    err = assert_openai_error(r, 400, param)
    assert needle in err["message"] and err["type"] == "invalid_request_error"


# ------------------------------------------------------------------ scripted
def test_thinking_is_a_reasoning_item_before_the_message():
    srv, _, obs = scripted(Script(THINKING))
    with srv:
        raw = client(srv).responses.with_raw_response.create(model="x", input=ASK)
        _, frames = stream_frames(srv.url, {"model": "x", "input": ASK})
        events = list(client(srv).responses.create(model="x", input=ASK, stream=True))
    r = raw.parse()
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "The user wants the weather." and r.output[0].summary == []
    assert r.output_text == "Let me check."
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.usage.output_tokens == generated(obs, raw.headers["x-request-id"])[0].new_tokens

    items = items_of(frames)
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert items[0]["_text"] == "The user wants the weather." and items[1]["_text"] == "Let me check."
    assert items[0]["done"]["content"] == [{"type": "reasoning_text", "text": "The user wants the weather."}]
    names = [n for n, _ in frames]
    last_reasoning = max(i for i, n in enumerate(names) if n == "response.reasoning_text.delta")
    assert last_reasoning < names.index("response.output_text.delta")
    usage = frames[-1][1]["response"]["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == r.usage.output_tokens_details.reasoning_tokens
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and kinds[-1] == "response.completed"
    assert [o.type for o in events[-1].response.output] == ["reasoning", "message"]


def test_invalid_call_is_reasked_once_and_the_second_answer_returned():
    srv, _, obs = scripted(Script([BAD_CALL]), Script([GOOD_CALL]))
    with srv:
        raw = client(srv).responses.with_raw_response.create(model="x", input=ASK, tools=[WEATHER])
    r = raw.parse()
    gens = generated(obs, raw.headers["x-request-id"])
    assert len(gens) == 2 and r.usage.output_tokens == gens[-1].new_tokens
    assert [o.type for o in r.output] == ["function_call"]
    assert json.loads(r.output[0].arguments) == {"city": "Paris"}


def test_text_then_calls_stream_as_a_message_then_function_call_items():
    two = GOOD_CALL + "\n" + GOOD_CALL.replace("Paris", "Rome")
    pieces = ["Let me check. ", two[:20], two[20:]]
    srv, _, _ = scripted(Script(pieces))
    with srv:
        _, frames = stream_frames(srv.url, {"model": "x", "input": ASK, "tools": [WEATHER]})
        with client(srv).responses.stream(model="x", input=ASK, tools=[WEATHER]) as s:
            sdk = s.get_final_response()
        single = client(srv).responses.create(model="x", input=ASK, tools=[WEATHER], parallel_tool_calls=False)
    items = items_of(frames)
    assert [i["type"] for i in items] == ["message", "function_call", "function_call"]
    assert items[0]["_text"] == "Let me check. "
    assert [json.loads(i["_args"])["city"] for i in items[1:]] == ["Paris", "Rome"]
    assert len({i["done"]["call_id"] for i in items[1:]}) == 2
    assert [o.type for o in sdk.output] == ["message", "function_call", "function_call"]
    assert sdk.output_text == "Let me check. "
    assert [o.type for o in single.output] == ["message", "function_call"]


def test_reasoning_effort_reaches_the_template_switch():
    srv, model, _ = scripted(Script(["Hi"]))
    with srv:
        client(srv).responses.create(model="x", input=ASK, reasoning={"effort": "none"})
        client(srv).responses.create(model="x", input=ASK, reasoning={"effort": "high"})
    assert model.calls[-2]["enable_thinking"] is False
    assert model.calls[-1]["enable_thinking"] is True and model.calls[-1]["reasoning_effort"] == "high"
