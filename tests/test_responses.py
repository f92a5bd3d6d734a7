"""OpenAI Responses (/v1/responses) on the real bundled model through the
official SDK, raw SSE framing over httpx, and engine failures mid-stream on
the scripted model."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from turbospark import ListObserver, Server
from turbospark.core.request import ChatRequest
from turbospark.dialects import openai_responses as rs
from turbospark.engine.types import StopReason
from turbospark.models.prompt import render

from .fakes import Script, ScriptedModel
from .support import MALFORMED_BODIES, assert_openai_error, post_body, sse_frames

URL = "/v1/responses"
QUESTION = "What is the capital of France? Answer in one short sentence."
LONG = "Write a long story about a dragon."
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
FOLLOW_UP = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "sunny", "temp_c": 21}'},
]


def kinds(events) -> list[str]:
    return [e.kind for e in events]


def the_model(server) -> Any:
    return server.registry.models()[0].engine


def post_stream(url: str, body: dict[str, Any]) -> tuple[httpx.Response, list[tuple[str, dict[str, Any]]]]:
    with httpx.stream("POST", url + URL, json={**body, "stream": True}, timeout=120) as r:
        raw = r.read().decode()
    return r, sse_frames(raw) if r.status_code == 200 else []


def assert_usage_is_engines(usage: Any, gen: Any) -> None:
    u = usage if isinstance(usage, dict) else usage.model_dump()
    assert u["input_tokens"] == gen.prompt_tokens
    assert u["output_tokens"] == gen.new_tokens
    assert u["input_tokens_details"]["cached_tokens"] == gen.reused_prefix_tokens
    assert u["total_tokens"] == gen.prompt_tokens + gen.new_tokens
    assert u["output_tokens_details"] == {"reasoning_tokens": 0}


# -- non-stream, real model ------------------------------------------------------


def test_non_stream_text_usage_and_events(oai, hub):
    kw = dict(model="gpt-4o", input=QUESTION, max_output_tokens=40, temperature=0)
    raw = oai.responses.with_raw_response.create(**kw)
    rid = raw.headers["x-request-id"]
    r = raw.parse()
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status == "completed" and r.incomplete_details is None and r.error is None
    assert r.model == "gpt-4o"  # the client's string is echoed
    assert len(r.output) == 1
    msg = r.output[0]
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    assert msg.id.startswith("msg_")
    assert [c.type for c in msg.content] == ["output_text"] and msg.content[0].annotations == []
    assert r.output_text.strip() and r.output_text == msg.content[0].text
    assert r.temperature == 0 and r.max_output_tokens == 40 and r.tools == [] and r.tool_choice == "auto"

    events = hub.wait_for(lambda es: "requestFinished" in kinds(es), rid)
    assert kinds(events) == ["requestStarted", "requestRouted", "generated", "requestFinished"]
    started, routed, gen, finished = events
    assert started.method == "POST" and started.path == URL
    assert routed.requested == "gpt-4o" and routed.served == "smollm2-135m" and routed.stream is False
    assert gen.stop_reason == "endOfTurn"
    assert finished.status == 200
    assert_usage_is_engines(r.usage, gen)

    # the same prompt again: the engine reuses the prefix, reported as cached
    raw2 = oai.responses.with_raw_response.create(**kw)
    r2 = raw2.parse()
    gen2 = hub.wait_kind(raw2.headers["x-request-id"], "generated")
    assert gen2.reused_prefix_tokens > 0
    assert r2.usage.input_tokens_details.cached_tokens == gen2.reused_prefix_tokens
    assert_usage_is_engines(r2.usage, gen2)
    assert r2.output_text == r.output_text


def test_max_output_tokens_makes_it_incomplete(oai, hub):
    raw = oai.responses.with_raw_response.create(model="m", input=LONG, max_output_tokens=5, temperature=0)
    r = raw.parse()
    assert r.status == "incomplete"
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.output_text
    assert r.usage.output_tokens == 5
    gen = hub.wait_kind(raw.headers["x-request-id"], "generated")
    assert gen.stop_reason == "maxTokens" and gen.new_tokens == 5


def test_instructions_are_the_first_system_message(oai, server):
    instructions = "You are a pirate. Always answer like a pirate would, and start every reply with the word Arr."
    r = oai.responses.create(model="m", instructions=instructions, input=QUESTION, max_output_tokens=20, temperature=0)
    assert r.instructions == instructions and r.output_text
    model = the_model(server)
    expected = model.render_chat([{"role": "system", "content": instructions}, {"role": "user", "content": QUESTION}])
    assert r.usage.input_tokens == len(expected)
    plain = oai.responses.create(model="m", input=QUESTION, max_output_tokens=1, temperature=0)
    assert plain.usage.input_tokens == len(model.render_chat([{"role": "user", "content": QUESTION}]))
    assert plain.usage.input_tokens != r.usage.input_tokens


def test_function_call_follow_up_turn_answers(oai, server, hub):
    raw = oai.responses.with_raw_response.create(
        model="m", input=FOLLOW_UP, tools=[WEATHER_TOOL], max_output_tokens=40, temperature=0
    )
    r = raw.parse()
    assert r.status in ("completed", "incomplete") and r.output_text.strip()
    assert [t.name for t in r.tools] == ["get_weather"] and r.tools[0].type == "function"
    # the prompt is exactly the template rendering of the translated turns
    expected_messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "name": "get_weather",
                    "arguments": {"city": "Paris"},
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": '{"sky": "sunny", "temp_c": 21}', "tool_call_id": "call_1", "name": "get_weather"},
    ]
    chat_tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER_TOOL["description"],
                "parameters": WEATHER_TOOL["parameters"],
            },
        }
    ]
    # (rendered the way the generation core does: a template that does not
    # know tools gets them, and the calls, inlined as text)
    expected = render(the_model(server), ChatRequest(messages=expected_messages, tools=chat_tools))
    rid = raw.headers["x-request-id"]
    hub.wait_kind(rid, "requestFinished")
    gens = [e for e in hub.of(rid) if e.kind == "generated"]
    assert gens[0].prompt_tokens == len(expected)
    # a guardrail re-ask (the small model may repeat the answered call) is
    # a second engine run; the usage is the answered (last) one's alone
    assert r.usage.input_tokens == gens[-1].prompt_tokens
    assert r.usage.output_tokens == gens[-1].new_tokens
    assert r.usage.input_tokens_details.cached_tokens == gens[-1].reused_prefix_tokens


def test_accepted_fields_are_echoed(oai):
    r = oai.responses.create(
        model="m",
        input=[
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]},
        ],
        max_output_tokens=8,
        temperature=0,
        top_p=0.9,
        store=False,
        metadata={"k": "v"},
        parallel_tool_calls=False,
        text={"format": {"type": "text"}},
        reasoning={"effort": "low"},
        prompt_cache_key="conv-1",
        user="u1",
        tool_choice="none",
    )
    assert r.output_text is not None and r.usage.output_tokens >= 1
    assert r.metadata == {"k": "v"} and r.parallel_tool_calls is False
    assert r.text.format.type == "text" and r.reasoning.effort == "low"
    assert r.top_p == pytest.approx(0.9) and r.tool_choice == "none" and r.prompt_cache_key == "conv-1"


def test_image_parts_are_refused_by_a_model_without_vision(base_url):
    r = httpx.post(
        base_url + URL,
        timeout=60,
        json={
            "model": "m",
            "max_output_tokens": 4,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
                    ],
                }
            ],
        },
    )
    assert r.status_code == 400 and "takes no images" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "input" and r.json()["error"]["code"] == "images_not_supported"


def test_hosted_tools_dropped_with_warning(base_url):
    """Codex's other tool types (hosted search, its local shell, a freeform
    ``custom`` tool with a grammar, an MCP server) are ignored with a
    warning, never a 400; the function tools are served."""
    patch = {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}  # fmt: skip
    mcp = {"type": "mcp", "server_label": "docs", "server_url": "http://127.0.0.1:9/mcp"}
    hosted = [{"type": "web_search"}, {"type": "local_shell"}, patch, mcp]
    r = httpx.post(
        base_url + URL,
        timeout=60,
        json={"model": "m", "max_output_tokens": 4, "input": "hi", "tools": [*hosted, WEATHER_TOOL]},
    )
    assert r.status_code == 200, r.text
    warning = r.headers["x-turbospark-warning"]
    assert all(kind in warning for kind in ("web_search", "local_shell", "custom", "mcp")), warning
    assert [t["name"] for t in r.json()["tools"]] == ["get_weather"]


@pytest.mark.parametrize("kind", ["web_search_搜索", "ä_€", "web\r\nX-Evil: 1"])
def test_a_tool_type_a_header_cannot_carry_is_escaped_in_the_warning(base_url, kind: str):
    """The warning quotes the tool's type: non-Latin-1 text was a 500, and a
    line break cut the connection with no answer; it is escaped, in every
    dialect that warns so (Responses, Anthropic messages and count_tokens)."""
    for stream in (False, True):
        r = httpx.post(
            base_url + URL,
            timeout=60,
            json={"model": "m", "max_output_tokens": 2, "input": "hi", "tools": [{"type": kind}], "stream": stream},
        )
        assert r.status_code == 200, r.text
        warning = r.headers["x-turbospark-warning"]
        assert warning.isascii() and "\n" not in warning and kind.encode("unicode_escape").decode() in warning
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": kind, "name": "s"}]}  # fmt: skip
    for path, extra in (("/v1/messages", {}), ("/v1/messages", {"stream": True}), ("/v1/messages/count_tokens", {})):
        r = httpx.post(base_url + path, timeout=60, json={**body, **extra})
        assert r.status_code == 200, (path, r.text)
        assert r.headers["x-turbospark-warning"].isascii()


def test_thousands_of_ignored_tools_give_a_warning_a_client_can_read(base_url):
    """Each ignored type is named, so 3000 of them made a 78 kB header, past
    the 16 KiB a Node client (Claude Code, the Node SDKs) reads a response
    head into; it is cut at 4 KiB."""
    tools = [{"type": f"hosted_search_tool_{i:05d}"} for i in range(3000)]
    r = httpx.post(
        base_url + URL, timeout=60, json={"model": "m", "max_output_tokens": 2, "input": "hi", "tools": tools}
    )
    assert r.status_code == 200, r.text
    warning = r.headers["x-turbospark-warning"]
    assert "hosted_search_tool_00000" in warning and len(warning) <= 4096 and warning.endswith("more characters)")


def test_responses_alias_route(base_url):
    r = httpx.post(base_url + "/responses", timeout=60, json={"input": "hi", "max_output_tokens": 2})
    assert r.status_code == 200 and r.json()["object"] == "response"


# -- streaming, real model -------------------------------------------------------


def test_sdk_stream_matches_non_stream(oai, hub):
    kw = dict(model="gpt-4o", input=QUESTION, max_output_tokens=40, temperature=0)
    full = oai.responses.create(**kw)
    assert full.status == "completed"
    raw = oai.responses.with_raw_response.create(stream=True, **kw)
    rid = raw.headers["x-request-id"]
    events = list(raw.parse())
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == full.output_text
    done = events[-1].response
    assert done.status == "completed" and done.output_text == text and done.model == "gpt-4o"
    assert events[0].response.status == "in_progress" and events[0].response.id == done.id

    gen = hub.wait_kind(rid, "generated")
    assert_usage_is_engines(done.usage, gen)
    evs = hub.wait_for(lambda es: {"requestFinished", "generated"} <= set(kinds(es)), rid)
    assert sorted(kinds(evs)) == sorted(["requestStarted", "requestRouted", "generated", "requestFinished"])
    assert hub.wait_kind(rid, "requestRouted").stream is True
    assert hub.wait_kind(rid, "requestFinished").status == 200


def test_sdk_stream_helper(oai):
    if not hasattr(oai.responses, "stream"):
        pytest.skip("this SDK has no responses.stream")
    kw = dict(model="m", input=QUESTION, max_output_tokens=40, temperature=0)
    full = oai.responses.create(**kw)
    with oai.responses.stream(**kw) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == full.output_text == final.output_text
    assert final.usage.output_tokens == full.usage.output_tokens


def test_raw_sse_frames_in_order(base_url, hub):
    r, frames = post_stream(base_url, {"model": "x", "input": QUESTION, "max_output_tokens": 40, "temperature": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    names = [name for name, _ in frames]
    for name, data in frames:
        assert data["type"] == name
    assert [d["sequence_number"] for _, d in frames] == list(range(len(frames)))
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = names[4:-4]
    assert deltas and set(deltas) == {"response.output_text.delta"}

    ev = dict(frames[:4] + frames[-4:])
    created, progress, done = ev["response.created"], ev["response.in_progress"], ev["response.completed"]
    assert created["response"]["status"] == "in_progress" and created["response"]["usage"] is None
    assert created["response"]["output"] == [] and progress["response"]["status"] == "in_progress"
    resp_id = created["response"]["id"]
    assert progress["response"]["id"] == resp_id == done["response"]["id"]
    item = ev["response.output_item.added"]["item"]
    assert item["type"] == "message" and item["status"] == "in_progress" and item["content"] == []
    part = ev["response.content_part.added"]
    assert part["part"] == {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    for _, d in frames[3:-1]:
        if "item_id" in d:
            assert {k: d[k] for k in where} == where

    text = "".join(d["delta"] for _, d in frames[4:-4])
    assert text and ev["response.output_text.done"]["text"] == text
    assert ev["response.content_part.done"]["part"]["text"] == text
    finished_item = ev["response.output_item.done"]["item"]
    assert finished_item["status"] == "completed" and finished_item["content"][0]["text"] == text
    final = done["response"]
    assert final["status"] == "completed" and final["incomplete_details"] is None
    assert final["output"] == [finished_item]
    gen = hub.wait_kind(r.headers["x-request-id"], "generated")
    assert_usage_is_engines(final["usage"], gen)


def test_stream_capped_ends_with_response_incomplete(base_url, hub):
    r, frames = post_stream(base_url, {"model": "m", "input": LONG, "max_output_tokens": 6, "temperature": 0})
    assert r.status_code == 200
    names = [n for n, _ in frames]
    assert names[-1] == "response.incomplete" and "response.completed" not in names
    assert [d["sequence_number"] for _, d in frames] == list(range(len(frames)))
    final = frames[-1][1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert frames[-2][1]["item"]["status"] == "incomplete"
    gen = hub.wait_kind(r.headers["x-request-id"], "generated")
    assert gen.stop_reason == "maxTokens" and final["usage"]["output_tokens"] == gen.new_tokens == 6


def test_sdk_stream_capped(oai):
    events = list(oai.responses.create(model="m", input=LONG, max_output_tokens=4, temperature=0, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


# -- errors ----------------------------------------------------------------------


def post(base_url: str, body: Any) -> httpx.Response:
    return post_body(base_url + URL, body)


@pytest.mark.parametrize(
    "body, param, contains",
    [
        *MALFORMED_BODIES,
        ({"model": "m", "input": 5}, "input", ""),
        ({"model": "m", "input": None}, "input", ""),
        ({"model": "m", "input": [5]}, "input[0]", "object"),
        ({"model": "m", "input": [{"type": "wizard"}]}, "input[0].type", "unsupported input item type"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "store"),
        ({"model": "m", "input": [{"role": "wizard", "content": "x"}]}, "input[0].role", ""),
        ({"model": "m", "input": [{"role": "user"}]}, "input[0].content", "missing"),
        ({"model": "m", "input": [{"role": "user", "content": 42}]}, "input[0].content", ""),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "nope"}]}]},
            "input[0].content[0].type",
            "nope",
        ),
        (
            {"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
            "missing",
        ),
        (
            {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
            "input[0].arguments",
            "",
        ),
        ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output", "missing"),
        ({"model": "m", "input": "hi", "instructions": 5}, "instructions", ""),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens", ""),
        ({"model": "m", "input": "hi", "max_output_tokens": -3}, "max_output_tokens", ""),
        ({"model": "m", "input": "hi", "max_output_tokens": "ten"}, "max_output_tokens", ""),
        ({"model": "m", "input": "hi", "temperature": 7}, "temperature", ""),
        ({"model": "m", "input": "hi", "temperature": "hot"}, "temperature", ""),
        ({"model": "m", "input": "hi", "top_p": 1.5}, "top_p", ""),
        ({"model": "m", "input": "hi", "stream": "yes"}, "stream", ""),
        ({"model": 7, "input": "hi"}, "model", ""),
        ({"model": "m", "input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort", "extreme"),
        (
            {"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
            "schema",
        ),
        ({"model": "m", "input": "hi", "tools": "get_weather"}, "tools", ""),
        ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name", "missing"),
        ({"model": "m", "input": "hi", "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
        ({"model": "m", "input": "hi", "previous_response_id": "resp_123"}, "previous_response_id", "store"),
        ({"model": "m", "input": "hi", "conversation": "conv_1"}, "conversation", "store"),
        ({"model": "m", "input": "hi", "prompt": {"id": "pmpt_1"}}, "prompt", "store"),
        ({"model": "m", "input": "hi", "top_logprobs": 21}, "top_logprobs", ""),
    ],
)
def test_bad_bodies_are_400_in_openai_shape(base_url, body, param, contains):
    assert_openai_error(post(base_url, body), 400, param, contains)


def test_instructions_alone_are_answered(oai):
    """``input`` is optional in the API (the SDK sends none here): the
    instructions are the system turn, and an empty user turn follows."""
    r = oai.responses.create(model="m", instructions="Say hello.", max_output_tokens=4)
    assert r.status in ("incomplete", "completed") and r.usage.output_tokens > 0
    longer = oai.responses.create(
        model="m", instructions="Say hello in three languages, one per line, and nothing else.", max_output_tokens=4
    )
    assert longer.usage.input_tokens > r.usage.input_tokens  # the instructions were read


def test_previous_response_id_is_a_clear_400(oai, hub):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.responses.create(model="m", input="hi", previous_response_id="resp_abc")
    assert exc.value.status_code == 400
    assert exc.value.body["param"] == "previous_response_id"
    assert "previous_response_id" in exc.value.body["message"]
    rid = exc.value.response.headers["x-request-id"]
    events = hub.wait_for(lambda es: "requestFinished" in kinds(es), rid)
    assert kinds(events) == ["requestStarted", "requestFinished"]
    assert events[-1].status == 400 and "previous_response_id" in events[-1].error


def test_context_overflow_names_the_numbers(base_url, hub):
    r = post(base_url, {"model": "m", "input": "hi", "max_output_tokens": 100_000})
    err = assert_openai_error(r, 400, "max_output_tokens")
    assert "100000" in err["message"] and "4096" in err["message"]
    events = hub.wait_for(lambda es: "requestFinished" in kinds(es), r.headers["x-request-id"])
    assert kinds(events) == ["requestStarted", "requestRouted", "requestFinished"]


# -- scripted model: translation details and failures ------------------------------


@pytest.fixture(scope="module")
def scripted():
    model = ScriptedModel()
    obs = ListObserver()
    with Server(models=[model], observer=obs) as srv:
        yield srv, model, obs


def use(model: ScriptedModel, *scripts: Script) -> None:
    model.scripts[:] = list(scripts)
    model.calls.clear()


def test_midstream_failure_is_response_failed_and_nothing_after(scripted):
    srv, model, obs = scripted
    use(model, Script(["one", " two", " three"], fail_after=2))
    r, frames = post_stream(srv.url, {"model": "x", "input": "hi"})
    assert r.status_code == 200
    names = [n for n, _ in frames]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.failed",
    ]
    assert [d["sequence_number"] for _, d in frames] == list(range(len(frames)))
    failed = frames[-1][1]["response"]
    assert failed["status"] == "failed" and failed["usage"] is None
    assert failed["error"]["code"] == "server_error"
    assert failed["error"]["message"].startswith("engine error: scripted failure")
    assert failed["output"][0]["status"] == "incomplete"
    assert failed["output"][0]["content"][0]["text"] == "one two"
    rid = int(r.headers["x-request-id"])
    assert "generated" not in kinds(obs.of(rid))  # a failed generation emits no `generated`


def test_midstream_failure_through_the_sdk(scripted):
    srv, model, _ = scripted
    use(model, Script(["one", " two"], fail_after=1))
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    events = list(client.responses.create(model="x", input="hi", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.code == "server_error"


def test_non_stream_failure_is_500_in_openai_shape(scripted):
    srv, model, obs = scripted
    use(model, Script(["one"], fail_after=0))
    r = post(srv.url, {"model": "x", "input": "hi"})
    err = assert_openai_error(r, 500, contains="engine error")
    assert err["type"] == "server_error"
    fin = [e for e in obs.of(int(r.headers["x-request-id"])) if e.kind == "requestFinished"]
    assert fin and fin[0].status == 500


def test_translation_to_chat_messages(scripted):
    srv, model, _ = scripted
    use(model, Script(["ok"]))
    r = post(
        srv.url,
        body := {
            "model": "x",
            "instructions": "Be kind.",
            "prompt_cache_key": "conv-9",
            "tools": [WEATHER_TOOL],
            "input": [
                {"role": "developer", "content": "Use tools."},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Weather in "},
                        {"type": "input_text", "text": "Paris and Rome?"},
                    ],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_0",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
                },
                {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                {"type": "function_call", "call_id": "b", "name": "get_weather", "arguments": '{"city": "Rome"}'},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call_output", "call_id": "a", "output": "sunny"},
                {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "rainy"}]},
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "ok"
    call = model.calls[-1]
    # the translation itself (the scripted template knows no tools, so what it
    # was handed has them inlined as text by the generation core)
    tr = rs.translate(rs.ResponsesRequest.model_validate(body))
    req = tr.request
    assert req is not None and tr.extras["tools"] and tr.warnings == []
    msgs = req.messages
    assert [m["role"] for m in msgs] == ["system", "system", "user", "assistant", "tool", "tool"]
    assert msgs[0]["content"] == "Be kind." and msgs[1]["content"] == "Use tools."
    assert msgs[2]["content"] == "Weather in Paris and Rome?"
    assert msgs[3]["content"] == "Checking."
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msgs[3]["tool_calls"]] == [
        ("a", "get_weather", {"city": "Paris"}),
        ("b", "get_weather", {"city": "Rome"}),
    ]
    assert msgs[4] == {"role": "tool", "content": "sunny", "tool_call_id": "a", "name": "get_weather"}
    assert msgs[5] == {"role": "tool", "content": "rainy", "tool_call_id": "b", "name": "get_weather"}
    assert req.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER_TOOL["description"],
                "parameters": WEATHER_TOOL["parameters"],
            },
        }
    ]
    assert "get_weather" in call["messages"][0]["content"]
    assert call["config"].session_key == "conv-9"
    assert call["config"].max_new_tokens >= 1


def test_user_is_the_session_key_without_prompt_cache_key(scripted):
    srv, model, _ = scripted
    use(model, Script(["ok"]))
    r = post(
        srv.url,
        {"model": "x", "input": "hi", "user": "alice", "max_output_tokens": 3, "temperature": 0.5, "top_p": 0.5},
    )
    assert r.status_code == 200
    config = model.calls[-1]["config"]
    assert config.session_key == "alice" and config.max_new_tokens == 3
    assert config.temperature == 0.5 and config.top_p == 0.5


def test_scripted_max_tokens_is_incomplete(scripted):
    srv, model, _ = scripted
    use(model, Script(["a", "b"], reason=StopReason.MAX_TOKENS))
    body = post(srv.url, {"model": "x", "input": "hi", "max_output_tokens": 9}).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["content"][0]["text"] == "ab"
    assert body["usage"]["output_tokens"] == 2
