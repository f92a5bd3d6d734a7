"""Anthropic Messages on the real bundled model, through the official SDK,
plus raw SSE framing, the scripted model for failures, and the pure
translation functions."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from turbospark import Server
from turbospark.dialects import anthropic as msgs
from turbospark.dialects.common import BadRequest
from turbospark.engine.detok import StopMatcher
from turbospark.engine.types import MEDIA_MARKER, StopReason

from .fakes import Script, ScriptedModel
from .support import assert_anthropic_error, post_body, sse_frames

GREEDY = {"temperature": 0}  # this SDK version no longer has a temperature argument
HELLO = [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}]
COUNT = [{"role": "user", "content": "Count from 1 to 10 separated by commas."}]
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def ant(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def kinds(events):
    return [e.kind for e in events]


def post(url: str, body, path: str = "/v1/messages", **kw) -> httpx.Response:
    return post_body(url + path, body, **kw)


def assert_usage_is_engines(usage, gen) -> None:
    """Disjoint input fields that add up to the engine's prompt count."""
    assert usage.output_tokens == gen.new_tokens
    assert usage.cache_read_input_tokens == gen.reused_prefix_tokens
    assert usage.input_tokens == gen.prompt_tokens - gen.reused_prefix_tokens
    assert usage.cache_creation_input_tokens == 0


# ------------------------------------------------------------ real model, SDK
def test_create_non_stream_shape_usage_and_events(ant, hub):
    raw = ant.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=40, system="Be brief.", messages=HELLO, extra_body=GREEDY
    )
    rid = raw.headers["x-request-id"]
    assert raw.headers["request-id"] == rid
    m = raw.parse()
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == "claude-sonnet-4-5"  # the client's string is echoed
    assert len(m.content) == 1 and m.content[0].type == "text"
    assert "Paris" in m.content[0].text
    assert m.stop_reason == "end_turn" and m.stop_sequence is None

    events = hub.wait_for(lambda es: "requestFinished" in kinds(es), rid)
    assert kinds(events) == ["requestStarted", "requestRouted", "generated", "requestFinished"]
    started, routed, gen, finished = events
    assert started.path == "/v1/messages" and started.method == "POST"
    assert routed.requested == "claude-sonnet-4-5" and routed.served == "smollm2-135m"
    assert routed.stream is False
    assert gen.stop_reason == "endOfTurn"
    assert_usage_is_engines(m.usage, gen)
    assert finished.status == 200


def test_stream_sdk_text_stream_and_final_usage(ant, hub):
    kw = dict(model="claude-haiku", max_tokens=40, system="Be brief.", messages=HELLO, extra_body=GREEDY)
    with ant.messages.stream(**kw) as s:
        rid = s.response.headers["x-request-id"]
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert len(pieces) > 1 and all(isinstance(p, str) for p in pieces)
    assert "".join(pieces) == final.content[0].text
    assert final.stop_reason == "end_turn" and final.model == "claude-haiku"
    gen = hub.wait_kind(rid, "generated")
    # message_start only knew the rendered prompt; message_delta's engine
    # figures are what the SDK's final message holds
    assert_usage_is_engines(final.usage, gen)
    assert hub.wait_kind(rid, "requestRouted").stream is True
    assert hub.wait_kind(rid, "requestFinished").status == 200
    # same text as the non-streamed answer (greedy)
    assert ant.messages.create(**kw).content[0].text == final.content[0].text


def test_count_tokens_equals_the_prefill(ant, hub):
    kw = dict(model="m", system=[{"type": "text", "text": "Be brief."}], messages=HELLO, tools=[WEATHER_TOOL])
    raw = ant.messages.with_raw_response.count_tokens(**kw)
    n = raw.parse().input_tokens
    events = hub.wait_for(lambda es: "requestFinished" in kinds(es), raw.headers["x-request-id"])
    assert kinds(events) == ["requestStarted", "requestRouted", "requestFinished"]  # nothing generated
    assert events[1].stream is False

    real = ant.messages.with_raw_response.create(max_tokens=5, extra_body=GREEDY, **kw)
    gen = hub.wait_kind(real.headers["x-request-id"], "generated")
    assert n == gen.prompt_tokens
    u = real.parse().usage
    assert u.input_tokens + u.cache_read_input_tokens == n
    # the system prompt counts
    assert ant.messages.count_tokens(model="m", messages=HELLO).input_tokens != n


def test_raw_sse_frames_in_order(base_url, hub):
    body = {
        "model": "x",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "temperature": 0,
    }
    with httpx.stream(
        "POST", base_url + "/v1/messages", json=body, timeout=60, headers={"anthropic-version": "2023-06-01"}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        rid = r.headers["x-request-id"]
        raw = r.read().decode()
    assert "[DONE]" not in raw
    frames = sse_frames(raw)
    names = [name for name, _ in frames]
    for name, data in frames:
        assert data["type"] == name
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"} and len(names) > 6

    gen = hub.wait_kind(rid, "generated")
    start = frames[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["role"] == "assistant" and start["model"] == "x"
    assert start["usage"] == {
        "input_tokens": gen.prompt_tokens,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert frames[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    for _, d in frames[3:-3]:
        assert d["index"] == 0 and d["delta"]["type"] == "text_delta" and isinstance(d["delta"]["text"], str)
    assert frames[-3][1] == {"type": "content_block_stop", "index": 0}
    delta = frames[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": gen.prompt_tokens - gen.reused_prefix_tokens,
        "output_tokens": 8,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": gen.reused_prefix_tokens,
    }
    assert gen.new_tokens == 8 and gen.stop_reason == "maxTokens"
    assert frames[-1][1] == {"type": "message_stop"}


def test_max_tokens_stop_reason(ant, hub):
    raw = ant.messages.with_raw_response.create(
        model="m",
        max_tokens=5,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        extra_body=GREEDY,
    )
    m = raw.parse()
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == 5
    gen = hub.wait_kind(raw.headers["x-request-id"], "generated")
    assert gen.stop_reason == "maxTokens" and gen.new_tokens == 5


def test_stop_sequence_works_and_is_not_leaked(ant):
    kw = dict(model="m", max_tokens=40, messages=COUNT, extra_body=GREEDY)
    full = ant.messages.create(**kw).content[0].text
    assert "4" in full and "7" in full, full
    # several sequences: the engine names the one that matched
    m = ant.messages.create(stop_sequences=["zebra", "7", "4"], **kw)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "4"
    text = m.content[0].text
    assert "4" not in text and full.startswith(text)
    with ant.messages.stream(stop_sequences=["zebra", "7", "4"], **kw) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "4"


def test_disjoint_usage_with_cached_prefix(ant, hub):
    convo = [{"role": "user", "content": "Name three rivers in Europe, one per line."}]
    first = ant.messages.with_raw_response.create(model="m", max_tokens=6, messages=convo, extra_body=GREEDY)
    hub.wait_kind(first.headers["x-request-id"], "generated")
    second = ant.messages.with_raw_response.create(model="m", max_tokens=6, messages=convo, extra_body=GREEDY)
    gen = hub.wait_kind(second.headers["x-request-id"], "generated")
    u = second.parse().usage
    assert u.cache_read_input_tokens > 0
    assert u.input_tokens >= 1  # at least one prompt token is always evaluated
    assert u.input_tokens + u.cache_read_input_tokens == gen.prompt_tokens
    assert_usage_is_engines(u, gen)


def test_system_as_string_and_as_blocks(ant):
    kw = dict(model="m", max_tokens=12, messages=HELLO, extra_body=GREEDY)
    as_str = ant.messages.create(system="You answer in French.", **kw)
    as_blocks = ant.messages.create(system=[{"type": "text", "text": "You answer in French."}], **kw)
    assert as_str.content[0].text == as_blocks.content[0].text
    assert as_str.usage.input_tokens + as_str.usage.cache_read_input_tokens == (
        as_blocks.usage.input_tokens + as_blocks.usage.cache_read_input_tokens
    )
    default = ant.messages.count_tokens(model="m", messages=HELLO).input_tokens
    custom = ant.messages.count_tokens(model="m", messages=HELLO, system="You answer in French.").input_tokens
    assert custom != default  # the system prompt replaced the template's default one


def test_image_blocks_are_refused_by_a_model_without_vision(ant, hub):
    content = [
        {"type": "text", "text": "What is 2 + 2?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
    ]
    with pytest.raises(anthropic.BadRequestError) as err:
        ant.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": content}])
    assert "takes no images" in err.value.message and "2 image(s)" in err.value.message
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    # counting tokens is not answering: an image adds nothing to the prompt
    with_image = ant.messages.count_tokens(model="m", messages=[{"role": "user", "content": content}])
    text_only = ant.messages.count_tokens(model="m", messages=[{"role": "user", "content": "What is 2 + 2?"}])
    assert with_image.input_tokens == text_only.input_tokens


def test_tool_result_follow_up_turn_renders_and_answers(ant, hub):
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 degrees and sunny"},
            ],
        },
    ]
    raw = ant.messages.with_raw_response.create(
        model="m",
        max_tokens=30,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "auto"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=history,
        extra_body=GREEDY,
    )
    m = raw.parse()
    assert m.content[0].text.strip()
    assert m.stop_reason in ("end_turn", "max_tokens")
    gen = hub.wait_kind(raw.headers["x-request-id"], "generated")
    assert_usage_is_engines(m.usage, gen)
    # the tool result is in the prompt, the thinking block is not
    base = ant.messages.count_tokens(model="m", messages=history, tools=[WEATHER_TOOL]).input_tokens
    assert base == gen.prompt_tokens
    longer = json.loads(json.dumps(history))
    longer[2]["content"][0]["content"] = "18 degrees and sunny, with a light breeze from the west"
    assert ant.messages.count_tokens(model="m", messages=longer, tools=[WEATHER_TOOL]).input_tokens > base
    no_thinking = json.loads(json.dumps(history))
    del no_thinking[1]["content"][0]
    assert ant.messages.count_tokens(model="m", messages=no_thinking, tools=[WEATHER_TOOL]).input_tokens == base


@pytest.mark.parametrize("stream", [False, True])
def test_four_events_with_stream_flag(base_url, hub, stream):
    body = {
        "model": "claude-3-5-sonnet",
        "max_tokens": 6,
        "stream": stream,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hello!"}],
        "metadata": {"user_id": "user-42"},
    }
    with httpx.stream("POST", base_url + "/v1/messages", json=body, timeout=60) as r:
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        raw = r.read().decode()
    events = hub.wait_for(lambda es: {"generated", "requestFinished"} <= set(kinds(es)), rid)
    assert sorted(kinds(events)) == sorted(["requestStarted", "requestRouted", "generated", "requestFinished"])
    assert kinds(events)[:2] == ["requestStarted", "requestRouted"]
    routed = next(e for e in events if e.kind == "requestRouted")
    gen = next(e for e in events if e.kind == "generated")
    assert routed.stream is stream and routed.requested == "claude-3-5-sonnet"
    usage = sse_frames(raw)[-2][1]["usage"] if stream else json.loads(raw)["usage"]
    assert usage["output_tokens"] == gen.new_tokens


def test_beta_client_and_version_headers(ant, base_url, hub):
    m = ant.beta.messages.create(
        model="m", max_tokens=4, messages=HELLO, betas=["interleaved-thinking-2025-05-14"], extra_body=GREEDY
    )
    assert m.type == "message" and m.usage.output_tokens == 4
    r = httpx.post(
        base_url + "/v1/messages?beta=true",
        timeout=60,
        headers={"anthropic-version": "2023-06-01", "anthropic-beta": "foo,bar", "x-api-key": "k"},
        json={"model": "m", "max_tokens": 3, "messages": HELLO},
    )
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 3
    n = ant.beta.messages.count_tokens(model="m", messages=HELLO).input_tokens
    assert n == ant.messages.count_tokens(model="m", messages=HELLO).input_tokens


def test_tool_fields_of_newer_clients_are_accepted(ant, base_url):
    """Claude Code's tools carry ``strict``, ``defer_loading``,
    ``cache_control`` and ``input_examples``: accepted (the tool is still
    offered, so it is counted in the prompt), never a 400."""
    schema = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
    tool = {"name": "Bash", "description": "Run a shell command", "input_schema": schema}
    extra = {"strict": True, "defer_loading": True, "cache_control": {"type": "ephemeral"},
             "input_examples": [{"command": "ls"}]}  # fmt: skip
    body = {"model": "m", "max_tokens": 3, "messages": HELLO, "tools": [{**tool, **extra}]}
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "advanced-tool-use-2025-11-20", "x-api-key": "k"}
    r = httpx.post(base_url + "/v1/messages?beta=true", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    counted = ant.messages.count_tokens(model="m", messages=HELLO, tools=[tool]).input_tokens
    assert r.json()["usage"]["input_tokens"] + r.json()["usage"].get("cache_read_input_tokens", 0) == counted


def test_prompt_over_the_context_is_400_in_shape(ant):
    with pytest.raises(anthropic.BadRequestError) as exc:
        ant.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "word " * 5000}])
    assert exc.value.body["type"] == "error"
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    assert "4096" in exc.value.body["error"]["message"]


# ------------------------------------------------------------- bad input
OK = [{"role": "user", "content": "hi"}]
IMG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}


def with_content(*blocks):
    return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": list(blocks)}]}


@pytest.mark.parametrize(
    "body, contains",
    [
        (b"{not json", "malformed JSON"),
        (b"", "empty"),
        (b"[1, 2]", "JSON object"),
        ({"model": "m", "max_tokens": 5}, "missing required field 'messages'"),
        ({"model": "m", "max_tokens": 5, "messages": "hello"}, "messages"),
        ({"model": 7, "max_tokens": 5, "messages": OK}, "model"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
        ({"model": "m", "max_tokens": 0, "messages": OK}, "max_tokens"),
        ({"model": "m", "max_tokens": -3, "messages": OK}, "max_tokens"),
        ({"model": "m", "max_tokens": "ten", "messages": OK}, "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "temperature": 1.5}, "temperature"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "temperature": "hot"}, "temperature"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "top_p": 2}, "top_p"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "top_k": -1}, "top_k"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "stream": "yes"}, "stream"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "stop_sequences": "END"}, "stop_sequences"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "stop_sequences": [1]}, "stop_sequences[0]"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "system": 5}, "system"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "system": [IMG]}, "system[0]"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "metadata": {"user_id": 5}}, "metadata.user_id"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"model": "m", "max_tokens": 5, "messages": OK, "tools": [{"input_schema": {}}]}, "tools[0].name"),
        (with_content({"type": "text"}), "messages[0].content[0].text"),
        (with_content("plain"), "messages[0].content[0]"),
        (with_content({"type": "video"}), "unsupported content block type 'video'"),
        (with_content({"type": "image", "source": {"type": "file", "file_id": "f"}}), "source type 'file'"),
        (
            with_content({"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": PNG}}),
            "media_type",
        ),
        (
            with_content({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@@"}}),
            "base64",
        ),
        (with_content({"type": "image"}), "messages[0].content[0].source"),
        (with_content({"type": "tool_use", "id": "t", "name": "f", "input": {}}), "in a user message"),
        (with_content({"type": "tool_result", "content": "x"}), "tool_use_id"),
        (with_content({"type": "tool_result", "tool_use_id": "t", "content": 3}), "content[0].content"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]},
                    {"role": "user", "content": "go"},
                ],
            },
            "messages[1].content[0].input",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": OK + [{"role": "assistant", "content": "The answer is"}]},
            "prefill",
        ),
    ],
)
def test_bad_bodies_are_400_in_anthropic_shape(base_url, body, contains):
    assert_anthropic_error(post(base_url, body), 400, contains)


@pytest.mark.parametrize("body", [b"{oops", {"model": "m"}, {"model": "m", "messages": OK, "tools": [{"name": "f"}]}])
def test_bad_count_tokens_bodies_are_400_in_shape(base_url, body):
    assert_anthropic_error(post(base_url, body, path="/v1/messages/count_tokens"), 400)


def test_sdk_raises_bad_request_and_failure_is_observed(ant, hub):
    with pytest.raises(anthropic.BadRequestError) as exc:
        ant.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": 42}])
    assert exc.value.status_code == 400
    assert exc.value.body["type"] == "error"
    rid = exc.value.response.headers["x-request-id"]
    events = hub.wait_for(lambda es: "requestFinished" in kinds(es), rid)
    assert kinds(events) == ["requestStarted", "requestFinished"]
    assert events[-1].status == 400 and events[-1].error == exc.value.body["error"]["message"]


# ------------------------------------------------------------- scripted model
def test_midstream_failure_is_an_error_event_without_message_stop(failing):
    srv, _, obs = failing
    body = {"model": "x", "max_tokens": 20, "stream": True, "messages": OK}
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, timeout=30) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    frames = sse_frames(raw)
    names = [n for n, _ in frames]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "error",
    ]
    assert [d["delta"]["text"] for n, d in frames if n == "content_block_delta"] == ["one", " two"]
    err = frames[-1][1]
    assert set(err) == {"type", "error"} and err["type"] == "error"
    assert err["error"]["type"] == "api_error"
    assert err["error"]["message"].startswith("engine error: scripted failure")
    assert "message_stop" not in raw
    assert not [e for e in obs.events if e.kind == "generated"]


def test_midstream_failure_raises_in_the_sdk(failing):
    srv, _, _ = failing
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=30)
    with pytest.raises(anthropic.APIStatusError) as exc:
        with client.messages.stream(model="x", max_tokens=20, messages=OK) as s:
            list(s.text_stream)
    assert exc.value.body["error"]["type"] == "api_error"


def test_non_stream_failure_is_500_in_anthropic_shape(failing):
    srv, _, obs = failing
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=30)
    with pytest.raises(anthropic.InternalServerError) as exc:
        client.messages.create(model="x", max_tokens=20, messages=OK)
    assert exc.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": exc.value.body["error"]["message"]},
    }
    assert exc.value.body["error"]["message"].startswith("engine error")
    fin = [e for e in obs.events if e.kind == "requestFinished"][-1]
    assert fin.status == 500 and fin.error.startswith("engine error")


def test_request_fields_reach_the_engine():
    model = ScriptedModel(scripts=[Script(["a", "b"], reason=StopReason.STOP_STRING)])
    with Server(models=[model]) as srv:
        body = {
            "model": "x",
            "max_tokens": 7,
            "temperature": 0.3,
            "top_p": 0.9,
            "top_k": 20,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u-1"},
            "system": "sys",
            "tools": [WEATHER_TOOL, {"type": "web_search_20250305", "name": "web_search"}],
            # auto: a forced tool ("tool"/"any") is enforced, see test_tools_anthropic.py
            "tool_choice": {"type": "auto"},
            "messages": OK,
        }
        r = post(srv.url, body)
    assert r.status_code == 200
    # the engine did not say which stop matched; with only one given, it is that one
    assert r.json()["stop_reason"] == "stop_sequence" and r.json()["stop_sequence"] == "END"
    assert r.json()["content"] == [{"type": "text", "text": "ab"}]
    assert "server tool(s) ignored: web_search_20250305" in r.headers["x-turbospark-warning"]
    call = model.calls[-1]
    cfg = call["config"]
    assert (cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k) == (7, 0.3, 0.9, 20)
    assert cfg.stop == ("END",) and cfg.session_key == "u-1"
    # the translation (the scripted template knows no tools: the generation
    # core hands it the tool list inlined in the system turn)
    req = msgs.translate(msgs.MessagesRequest.model_validate(body)).request
    assert req is not None
    assert req.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert req.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER_TOOL["input_schema"],
                "description": "Current weather for a city.",
            },
        }
    ]
    assert call["messages"][0]["content"].startswith("sys\n\n") and "get_weather" in call["messages"][0]["content"]


def test_unnamed_stop_with_several_sequences_is_null():
    model = ScriptedModel(scripts=[Script(["a"], reason=StopReason.STOP_STRING)])
    with Server(models=[model]) as srv:
        r = post(srv.url, {"model": "x", "max_tokens": 5, "stop_sequences": ["X", "Y"], "messages": OK})
    assert r.json()["stop_reason"] == "stop_sequence" and r.json()["stop_sequence"] is None


def test_budget_default_and_context_clipping():
    model = ScriptedModel(scripts=[Script(["a", "b", "c"], reason=StopReason.MAX_TOKENS)], context=100)
    with Server(models=[model]) as srv:
        # no max_tokens: the default, clipped to the room in the context
        r = post(srv.url, {"model": "x", "messages": OK})
        assert r.status_code == 200
        n_prompt = r.json()["usage"]["input_tokens"] + r.json()["usage"]["cache_read_input_tokens"]
        assert model.calls[-1]["config"].max_new_tokens == 100 - n_prompt
        assert r.json()["stop_reason"] == "model_context_window_exceeded"
        # a budget beyond the context generates until the context is full
        r = post(srv.url, {"model": "x", "max_tokens": 32000, "messages": OK})
        assert model.calls[-1]["config"].max_new_tokens == 100 - n_prompt
        assert r.json()["stop_reason"] == "model_context_window_exceeded"
        # a budget that fits is the client's own limit
        r = post(srv.url, {"model": "x", "max_tokens": 3, "messages": OK})
        assert model.calls[-1]["config"].max_new_tokens == 3
        assert r.json()["stop_reason"] == "max_tokens"


def test_default_budget_is_1024_when_the_context_has_room():
    model = ScriptedModel(scripts=[Script(["a"])])
    with Server(models=[model]) as srv:
        r = post(srv.url, {"model": "x", "messages": OK})
    assert r.status_code == 200 and r.json()["stop_reason"] == "end_turn"
    assert model.calls[-1]["config"].max_new_tokens == 1024


# ------------------------------------------------------------- pure functions
def test_translation_of_tool_turns_and_dropped_blocks():
    body = msgs.MessagesRequest.model_validate(
        {
            "max_tokens": 5,
            "system": [
                {"type": "text", "text": "A"},
                {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "redacted_thinking", "data": "xx"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "is_error": True,
                            "content": [{"type": "text", "text": "timeout"}, IMG],
                        },
                        {"type": "text", "text": "try again"},
                    ],
                },
                {"role": "user", "content": "please"},
            ],
        }
    )
    messages, warnings, media = msgs.to_messages(body)
    fn = {"name": "get_weather", "arguments": {"city": "Paris"}}
    error = {"is_error": True}
    assert messages == [
        {"role": "system", "content": "A\nB"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{"id": "t1", "type": "function", "function": fn, **fn}],
        },
        # (the result's image where it stood: a screenshot reaches a model with vision)
        {"role": "tool", "content": f"timeout{MEDIA_MARKER}", "tool_call_id": "t1", "name": "get_weather"} | error,
        # consecutive user turns are one turn
        {"role": "user", "content": "try again\n\nplease"},
    ]
    assert warnings == [] and [m.field for m in media] == ["messages[2].content[0].content[1].source.data"]


def test_text_documents_are_read_and_others_dropped():
    body = msgs.CountTokensRequest.model_validate(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "DOC"}},
                        {"type": "document", "source": {"type": "url", "url": "https://x/y.pdf"}},
                        {"type": "text", "text": "summarise"},
                    ],
                }
            ]
        }
    )
    messages, warnings, _ = msgs.to_messages(body)
    assert messages == [{"role": "user", "content": "DOC\nsummarise"}]
    assert warnings == ["1 non-text document block(s) ignored: this model reads text only"]


def test_bad_block_names_its_place():
    body = msgs.CountTokensRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [{"type": "image"}]},
                {"role": "user", "content": "b"},
            ]
        }
    )
    with pytest.raises(BadRequest) as exc:
        msgs.to_messages(body)
    assert exc.value.param == "messages[1].content[0].type"


def test_stop_matcher_names_the_earliest_stop():
    m = StopMatcher(["7", "4"])
    text, hit = m.feed("1, 2, 3, 4, 5, 6, 7")
    assert hit and text == "1, 2, 3, " and m.matched == "4"
    m = StopMatcher(["END"])
    assert m.feed("E") == ("", False) and m.matched is None
    assert m.feed("ND") == ("", True) and m.matched == "END"
