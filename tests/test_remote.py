"""Remote engines and replica groups (issue 17), against real upstreams on
loopback: two turbospark processes serving SmolLM2 (one of them behind an
API key, writing its own event log), llama.cpp's llama-server when the
bench's peer build is present, and a scripted upstream only for what a real
one cannot be made to do (a 429, a call left as text, a mid-stream error).

Every dialect is served over a remote model with the official SDKs; the
counts in the front's events and usage are the upstream's own."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from turbospark import ListObserver, Server
from turbospark.engine.model import ModelOptions
from turbospark.models.loading import GroupOptions
from turbospark.upstream.model import RemoteOptions

from .remote_support import (
    LINGER,
    STALL,
    ClosingUpstream,
    ScriptedUpstream,
    Upstream,
    free_port,
    keep_reading,
    peer_binary,
    wait_up,
)
from .support import WEATHER_FUNCTION, chat_tool, wait_event, wait_until

SECRET = "sk-upstream-secret-4242"
KEY_ENV = "TS_TEST_UPSTREAM_KEY"
SYSTEM = "You are a terse assistant. Answer in one short sentence."


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory):
    log = str(tmp_path_factory.mktemp("upstream") / "a.jsonl")
    a = Upstream(key=SECRET, event_log=log)
    b = Upstream()
    a.start()
    b.start()
    yield a, b
    a.kill()
    b.kill()


@pytest.fixture(scope="module")
def scripted_upstream():
    up = ScriptedUpstream().start()
    yield up
    up.stop()


@pytest.fixture(autouse=True)
def _scripted_reset(request: pytest.FixtureRequest):
    """A test that set the scripted upstream's mode leaves it answering
    ``ok`` again, even when it failed half-way."""
    yield
    if "scripted_upstream" in request.fixturenames:
        up = request.getfixturevalue("scripted_upstream")
        up.mode, up.queue = "ok", []


@pytest.fixture(scope="module")
def front(upstreams, scripted_upstream):
    a, b = upstreams
    os.environ[KEY_ENV] = SECRET
    obs = ListObserver()

    def remote(url: str, key: bool = False, **kw: Any) -> RemoteOptions:
        return RemoteOptions(
            id="x", base_url=url + "/v1", model="smollm2-135m", api_key_env=KEY_ENV if key else None, ctx=2048, **kw
        )

    solo = remote(a.url, key=True)
    solo.id = "solo"
    scripted = RemoteOptions(id="scripted", base_url=scripted_upstream.url + "/v1", model="scripted", ctx=4096)
    # health checks only when a test asks (interval), so a killed replica is
    # found by the request that fails on it
    pool = GroupOptions(
        "pool", [("a", remote(a.url, key=True)), ("b", remote(b.url))], health_interval=3600, cooldown=1
    )
    srv = Server([solo, scripted, pool], observer=obs).start()
    yield srv, obs
    srv.stop()
    os.environ.pop(KEY_ENV, None)


def oai(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)


def ant(srv: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=120)


def gen(obs: ListObserver, rid: Any) -> dict[str, Any]:
    return wait_event(obs, rid, "generated").to_dict()


def routed(obs: ListObserver, rid: Any) -> list[str]:
    wait_event(obs, rid, "requestFinished")
    return [e.served for e in obs.of(int(rid)) if e.kind == "requestRouted"]


def scripted_pool(srv: Server, upstream: ScriptedUpstream, name: str, **group: Any) -> Any:
    """A group ``name`` of two replicas (``one``, ``two``) over the scripted
    upstream, attached once per module; its ``ReplicaSet``."""
    registry = srv.assembly.registry
    if registry.lookup(name) is None:
        from turbospark.models.loading import attach_group

        one = RemoteOptions(id="x", base_url=upstream.url + "/v1", model="scripted", ctx=4096)
        attach_group(registry, GroupOptions(name, [("one", one), ("two", one)], **{"health_interval": 3600, **group}))
    return registry.lookup(name).group


def anthropic_stream(srv: Server, model: str = "scripted") -> tuple[int, str, str]:
    """(status, raw SSE text, request id) of a streamed Anthropic request."""
    body = {"model": model, "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, timeout=60) as r:
        return r.status_code, r.read().decode(), r.headers["x-request-id"]


def same_as_upstream(upstream: Upstream, g: dict[str, Any], before: int) -> None:
    """The front's ``generated`` carries the counts the upstream's own
    ``generated`` (its event log, which had ``before`` of them before the
    request) has for the same run."""
    logged = wait_until(lambda: len(upstream.generated()) > before, what="the upstream's generated event")
    assert logged
    theirs = upstream.generated()[before]
    assert (g["promptTokens"], g["newTokens"]) == (theirs["promptTokens"], theirs["newTokens"])
    assert g["reusedPrefixTokens"] == theirs["reusedPrefixTokens"]


MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
#: an answer that goes on for a while (SmolLM2 ends "Name a colour." within a
#: second, which a test holding a stream open must not race)
LONG = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread, in many chapters."}]


# ------------------------------------------------------------ five dialects
def test_openai_chat_over_a_remote_model(front, upstreams) -> None:
    srv, obs = front
    c = oai(srv)
    before = upstreams[0].settled()
    raw = c.chat.completions.with_raw_response.create(model="solo", messages=MESSAGES, max_tokens=12, temperature=0)
    body = raw.parse()
    g = gen(obs, raw.headers["x-request-id"])
    assert body.choices[0].message.content
    assert g["model"] == "solo"
    assert (body.usage.prompt_tokens, body.usage.completion_tokens) == (g["promptTokens"], g["newTokens"])
    same_as_upstream(upstreams[0], g, before)

    before = upstreams[0].settled()
    stream = c.chat.completions.with_raw_response.create(
        model="solo",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream.parse())
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    usage = chunks[-1].usage
    g = gen(obs, stream.headers["x-request-id"])
    assert text == body.choices[0].message.content  # greedy: the same answer
    assert (usage.prompt_tokens, usage.completion_tokens) == (g["promptTokens"], g["newTokens"])
    assert usage.prompt_tokens_details.cached_tokens == g["reusedPrefixTokens"] > 0  # the upstream's reuse
    same_as_upstream(upstreams[0], g, before)
    assert g["prefillSeconds"] > 0 and g["decodeSeconds"] >= 0


def test_log_probabilities_are_the_upstreams_own(front, upstreams) -> None:
    """Chat (streamed and not), completions and Responses over a remote
    model carry the upstream's own log-probabilities, token for token as
    the upstream answers them directly."""
    srv, _ = front
    a, _ = upstreams
    c = oai(srv)
    direct = openai.OpenAI(base_url=a.url + "/v1", api_key=SECRET, max_retries=0, timeout=120)
    ask = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    theirs = direct.chat.completions.create(model="smollm2-135m", **ask).choices[0].logprobs.content
    ours = c.chat.completions.create(model="solo", **ask).choices[0].logprobs.content
    assert len(theirs) == 6

    def rows(entries: Any) -> list[tuple[str, float, list[str]]]:
        return [(e.token, round(e.logprob, 3), [t.token for t in e.top_logprobs]) for e in entries]

    assert rows(ours) == rows(theirs)
    assert all(len(e.top_logprobs) == 2 and e.bytes == list(e.token.encode()) for e in ours)
    streamed = [
        e
        for ch in c.chat.completions.create(model="solo", stream=True, **ask)
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content
    ]
    assert rows(streamed) == rows(theirs)
    completion = {"prompt": "The sky is", "max_tokens": 4, "temperature": 0, "logprobs": 2}
    theirs_c = direct.completions.create(model="smollm2-135m", **completion).choices[0].logprobs
    ours_c = c.completions.create(model="solo", **completion).choices[0].logprobs
    assert ours_c.tokens == theirs_c.tokens and len(ours_c.tokens) == 4
    assert ours_c.token_logprobs == pytest.approx(theirs_c.token_logprobs, abs=1e-3)
    assert [sorted(t) for t in ours_c.top_logprobs] == [sorted(t) for t in theirs_c.top_logprobs]
    r = httpx.post(
        srv.url + "/v1/responses",
        json={"model": "solo", "input": "Name a colour.", "max_output_tokens": 16, "temperature": 0,
              "include": ["message.output_text.logprobs"], "top_logprobs": 2},
        timeout=120,
    )  # fmt: skip
    assert r.status_code == 200 and "x-turbospark-warning" not in r.headers
    part = next(o for o in r.json()["output"] if o["type"] == "message")["content"][0]
    assert part["logprobs"] and all(len(e["top_logprobs"]) == 2 for e in part["logprobs"])
    body = {"model": "solo", "messages": MESSAGES, "stream": False, "logprobs": True, "top_logprobs": 2,
            "options": {"num_predict": 6, "temperature": 0}}  # fmt: skip
    lines = httpx.post(srv.url + "/api/chat", json=body, timeout=120).json()["logprobs"]
    assert [(e["token"], round(e["logprob"], 3)) for e in lines] == [row[:2] for row in rows(theirs)]


def test_n_choices_over_a_remote_model(front) -> None:
    """``n`` > 1: each choice is its own upstream run (a ``generated``
    each, with the upstream's counts), and the usage is their sum."""
    srv, obs = front
    raw = oai(srv).chat.completions.with_raw_response.create(
        model="solo", messages=MESSAGES, max_tokens=6, n=2, temperature=0.9, seed=7
    )
    body = raw.parse()
    assert sorted(ch.index for ch in body.choices) == [0, 1] and all(ch.message.content for ch in body.choices)
    rid = raw.headers["x-request-id"]
    wait_event(obs, rid, "requestFinished")
    gens = [e for e in obs.of(int(rid)) if e.kind == "generated"]
    assert len(gens) == 2 and all(g.model == "solo" for g in gens)
    assert body.usage.completion_tokens == sum(g.new_tokens for g in gens)
    assert body.usage.prompt_tokens == gens[0].prompt_tokens


def test_completions_over_a_remote_model(front, upstreams) -> None:
    srv, obs = front
    before = upstreams[0].settled()
    raw = oai(srv).completions.with_raw_response.create(
        model="solo", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    body = raw.parse()
    g = gen(obs, raw.headers["x-request-id"])
    assert body.choices[0].text and body.usage.completion_tokens == g["newTokens"] == 8
    assert body.choices[0].finish_reason == "length" and g["stopReason"] == "maxTokens"
    same_as_upstream(upstreams[0], g, before)
    chunks = list(
        oai(srv).completions.create(
            model="solo", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == body.choices[0].text


def test_responses_over_a_remote_model(front) -> None:
    srv, obs = front
    c = oai(srv)
    raw = c.responses.with_raw_response.create(
        model="solo", input="Name a colour.", max_output_tokens=16, temperature=0
    )
    body = raw.parse()
    g = gen(obs, raw.headers["x-request-id"])
    assert body.output_text
    assert (body.usage.input_tokens, body.usage.output_tokens) == (g["promptTokens"], g["newTokens"])
    events = list(
        c.responses.create(model="solo", input="Name a colour.", max_output_tokens=16, temperature=0, stream=True)
    )
    done = [e for e in events if e.type in ("response.completed", "response.incomplete")][0]
    assert done.response.output_text == body.output_text
    assert done.response.usage.output_tokens == g["newTokens"]


def test_anthropic_over_a_remote_model(front) -> None:
    srv, obs = front
    c = ant(srv)
    raw = c.messages.with_raw_response.create(
        model="solo",
        max_tokens=16,
        system=SYSTEM,
        messages=[{"role": "user", "content": "Name a colour."}],
        extra_body={"temperature": 0},
    )
    msg = raw.parse()
    g = gen(obs, raw.headers["x-request-id"])
    assert msg.content[0].text
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == g["promptTokens"]
    assert msg.usage.output_tokens == g["newTokens"]
    with c.messages.stream(
        model="solo",
        max_tokens=16,
        system=SYSTEM,
        messages=[{"role": "user", "content": "Name a colour."}],
        extra_body={"temperature": 0},
    ) as s:
        final = s.get_final_message()
    assert final.content[0].text == msg.content[0].text
    # count_tokens is the upstream's own count of the same prompt
    n = c.messages.count_tokens(model="solo", system=SYSTEM, messages=[{"role": "user", "content": "Name a colour."}])
    assert n.input_tokens == g["promptTokens"]


def test_ollama_over_a_remote_model(front) -> None:
    srv, obs = front
    c = ollama.Client(host=srv.url, timeout=120)
    r = c.chat(model="solo", messages=MESSAGES, options={"num_predict": 8, "temperature": 0})
    assert r.message.content and r.done and r.eval_count == 8
    pieces = list(c.chat(model="solo", messages=MESSAGES, options={"num_predict": 8, "temperature": 0}, stream=True))
    assert "".join(p.message.content for p in pieces) == r.message.content
    assert pieces[-1].done and pieces[-1].eval_count == 8
    g = c.generate(model="solo", prompt="Name a colour.", options={"num_predict": 6, "temperature": 0})
    assert g.response and g.eval_count == 6


def test_remote_model_listed_with_its_context_and_no_key(front) -> None:
    srv, _ = front
    models = {m["id"]: m for m in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert models["solo"]["context_length"] == 2048
    assert [r["name"] for r in models["pool"]["replicas"]] == ["a", "b"]
    assert models["pool@a"]["state"] in ("loaded", "down")
    show = httpx.post(srv.url + "/api/show", json={"model": "solo"}).json()
    assert any(k.endswith("context_length") and v == 2048 for k, v in show["model_info"].items())


def test_a_client_leaving_stops_the_upstream(front, upstreams) -> None:
    """A client that disconnects mid-stream closes the upstream stream: the
    upstream cancels its run instead of generating on for nobody."""
    srv, obs = front
    before = upstreams[0].settled()
    body = {"model": "solo", "stream": True, "max_tokens": 1500, "messages": [
        {"role": "user", "content": "Write a very long story about a lighthouse."}]}  # fmt: skip
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
        rid = r.headers["x-request-id"]
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break
    g = gen(obs, rid)
    assert g["stopReason"] == "cancelled"
    wait_until(lambda: len(upstreams[0].generated()) > before, what="the upstream's generated event")
    theirs = upstreams[0].generated()[before]
    assert theirs["stopReason"] == "cancelled" and theirs["newTokens"] < 1500


def test_a_drain_that_runs_out_cuts_a_remote_stream_and_the_upstream_run(front, upstreams) -> None:
    """Stopping the front (SIGTERM's path) with a remote stream still going:
    past the drain timeout the stream ends with its error frame, and the
    upstream's own run is cancelled, not left generating."""
    a, _ = upstreams
    before = a.settled()
    opts = RemoteOptions(id="drained", base_url=a.url + "/v1", model="m", api_key_env=KEY_ENV, ctx=2048)
    srv = Server([opts], drain_timeout=1.0).start()
    # (ignore_eos: a story the model ends within the drain timeout would end
    # the stream before the drain cuts it)
    body = {"model": "drained", "stream": True, "max_tokens": 1500, "ignore_eos": True, "messages": [
        {"role": "user", "content": "Write a very long story about a lighthouse."}]}  # fmt: skip
    got: list[str] = []
    started = threading.Event()

    def read() -> None:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                got.append(line)
                if line.startswith("data: {"):
                    started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(60)
    finally:
        srv.stop()
    reader.join(60)
    text = "\n".join(got)
    assert "shutting" in text and "event: error" in text, text[-400:]
    wait_until(lambda: len(a.generated()) > before, what="the upstream's generated event")
    theirs = a.generated()[before]
    assert theirs["stopReason"] == "cancelled" and theirs["newTokens"] < 1500


def test_a_client_that_never_reads_a_remote_stream_is_cut(front, upstreams) -> None:
    """A client that holds a remote stream open and reads nothing loses it
    (``client too slow``), and the upstream's run is cancelled with it."""
    a, _ = upstreams
    before = a.settled()
    obs = ListObserver()
    opts = RemoteOptions(id="silent", base_url=a.url + "/v1", model="m", api_key_env=KEY_ENV, ctx=2048)
    body = json.dumps({"model": "silent", "stream": True, "max_tokens": 1900, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "Write a very long story."}]}).encode()  # fmt: skip
    with Server([opts], observer=obs, send_timeout=3.0) as srv:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window: the server's buffers fill soon
        s.connect(("127.0.0.1", srv.port))
        try:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            done = wait_until(
                lambda: next((e for e in obs.events if e.kind == "requestFinished"), None), 120, "the request's end"
            )
        finally:
            s.close()
    assert done.error == "client too slow", done
    wait_until(lambda: len(a.generated()) > before, what="the upstream's generated event")
    theirs = a.generated()[before]
    assert theirs["stopReason"] == "cancelled" and theirs["newTokens"] < 1900


# ------------------------------------------------------------ tools
def test_tool_calls_through_a_remote_model(front) -> None:
    srv, obs = front
    c = oai(srv)
    tools = [chat_tool(WEATHER_FUNCTION)]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    raw = c.chat.completions.with_raw_response.create(
        model="solo", messages=ask, tools=tools, tool_choice="required", max_tokens=60, temperature=0
    )
    body = raw.parse()
    call = body.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    assert body.choices[0].finish_reason == "tool_calls"
    assert gen(obs, raw.headers["x-request-id"])["stopReason"] == "toolCalls"

    chunks = list(
        c.chat.completions.create(
            model="solo", messages=ask, tools=tools, tool_choice="required", max_tokens=60, temperature=0, stream=True
        )
    )
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    # the pieces as the upstream streamed them join into the call's arguments
    assert "city" in json.loads("".join(d.function.arguments or "" for d in deltas))
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"

    msg = ant(srv).messages.create(
        model="solo",
        max_tokens=60,
        messages=ask,
        tools=[
            {
                "name": "get_weather",
                "description": WEATHER_FUNCTION["description"],
                "input_schema": WEATHER_FUNCTION["parameters"],
            }
        ],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},
    )
    use = [b for b in msg.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and "city" in use.input and msg.stop_reason == "tool_use"


def test_a_call_left_as_text_by_the_upstream_is_read_by_our_parsers(front, scripted_upstream) -> None:
    srv, obs = front
    scripted_upstream.mode = "text_call"
    raw = oai(srv).chat.completions.with_raw_response.create(
        model="scripted", messages=[{"role": "user", "content": "weather?"}], tools=[chat_tool(WEATHER_FUNCTION)]
    )
    body = raw.parse()
    call = body.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert not body.choices[0].message.content
    g = gen(obs, raw.headers["x-request-id"])
    assert (g["promptTokens"], g["newTokens"], g["reusedPrefixTokens"]) == (11, 7, 4)  # the upstream's usage
    sent = scripted_upstream.bodies[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["tools"][0]["function"]["name"] == "get_weather"


def test_calls_and_reasoning_parsed_upstream_are_relayed_as_they_stream(front, scripted_upstream) -> None:
    srv, obs = front
    scripted_upstream.mode = "parsed_call"
    tools = [chat_tool(WEATHER_FUNCTION)]
    ask = [{"role": "user", "content": "weather?"}]
    chunks = list(oai(srv).chat.completions.create(model="scripted", messages=ask, tools=tools, stream=True))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id == "call_up1" and deltas[0].function.name == "get_weather"
    assert len(deltas) >= 3  # opened, then the argument pieces as the upstream sent them
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
    msg = ant(srv).messages.create(
        model="scripted",
        max_tokens=50,
        messages=ask,
        tools=[{"name": "get_weather", "input_schema": WEATHER_FUNCTION["parameters"]}],
    )
    kinds = [b.type for b in msg.content]
    assert kinds == ["thinking", "tool_use"] and msg.content[1].input == {"city": "Paris"}
    assert msg.stop_reason == "tool_use" and msg.usage.output_tokens == 12


def test_an_upstream_call_and_reasoning_in_every_dialect(front, scripted_upstream) -> None:
    """The upstream's own parsed call and its reasoning reach every dialect,
    streamed and not: OpenAI's reasoning_content, Responses' reasoning and
    function_call items, Anthropic's thinking and input_json_delta pieces,
    Ollama's thinking and tool_calls."""
    srv, _ = front
    scripted_upstream.mode = "parsed_call"
    ask = [{"role": "user", "content": "weather?"}]
    c = oai(srv)
    msg = c.chat.completions.create(model="scripted", messages=ask, tools=[chat_tool(WEATHER_FUNCTION)]).choices[0]
    assert msg.message.model_extra.get("reasoning_content") == "The user wants Paris."
    assert json.loads(msg.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    chunks = list(c.chat.completions.create(model="scripted", messages=ask, tools=[chat_tool(WEATHER_FUNCTION)],
                                            stream=True))  # fmt: skip
    thought = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for ch in chunks
                      if ch.choices)  # fmt: skip
    assert thought == "The user wants Paris."

    rtools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_FUNCTION["parameters"]}]
    r = c.responses.create(model="scripted", input="weather?", tools=rtools)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "function_call"], kinds
    assert r.output[0].content[0].text == "The user wants Paris."
    assert r.output[1].name == "get_weather" and json.loads(r.output[1].arguments) == {"city": "Paris"}
    events = list(c.responses.create(model="scripted", input="weather?", tools=rtools, stream=True))
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) >= 2 and json.loads("".join(pieces)) == {"city": "Paris"}  # as the upstream streamed them
    done = [e for e in events if e.type == "response.completed"][0].response
    assert [item.type for item in done.output] == kinds

    atools = [{"name": "get_weather", "input_schema": WEATHER_FUNCTION["parameters"]}]
    with ant(srv).messages.stream(model="scripted", max_tokens=50, messages=ask, tools=atools) as s:
        raw_events = list(s)
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[0].thinking == "The user wants Paris." and final.content[1].input == {"city": "Paris"}
    json_pieces = [e.delta.partial_json for e in raw_events if e.type == "content_block_delta"
                   and e.delta.type == "input_json_delta"]  # fmt: skip
    assert len(json_pieces) >= 2 and json.loads("".join(json_pieces)) == {"city": "Paris"}
    assert final.stop_reason == "tool_use"

    o = ollama.Client(host=srv.url, timeout=60)
    r = o.chat(model="scripted", messages=ask, tools=[chat_tool(WEATHER_FUNCTION)], think=True)
    assert r.message.thinking == "The user wants Paris."
    assert r.message.tool_calls[0].function.name == "get_weather"
    assert dict(r.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    lines = list(o.chat(model="scripted", messages=ask, tools=[chat_tool(WEATHER_FUNCTION)], think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in lines) == "The user wants Paris."
    calls = [tc for p in lines for tc in (p.message.tool_calls or [])]
    assert len(calls) == 1 and dict(calls[0].function.arguments) == {"city": "Paris"} and lines[-1].done
    scripted_upstream.mode = "ok"


@pytest.mark.parametrize("mode", ["two_calls", "interleaved_calls"])
def test_several_calls_parsed_upstream_reach_every_dialect_whole(front, scripted_upstream, mode: str) -> None:
    """Two calls the upstream parsed itself, sent one after the other (as
    vLLM, SGLang and llama-server send parallel calls) or interleaved by
    index (legal in the OpenAI stream): each reaches every dialect with its
    own arguments, streamed and not. A streamed Responses answer failed on
    the second call (an assertion), and Anthropic's and Responses' streams
    gave interleaved pieces to the last call opened."""
    srv, _ = front
    scripted_upstream.mode = mode
    want = [{"city": "Paris"}, {"city": "Oslo"}]
    ask = [{"role": "user", "content": "weather in Paris and Oslo?"}]
    c = oai(srv)
    tools = [chat_tool(WEATHER_FUNCTION)]
    whole = c.chat.completions.create(model="scripted", messages=ask, tools=tools).choices[0].message.tool_calls
    assert [json.loads(t.function.arguments) for t in whole] == want
    args: dict[int, str] = {}
    for ch in c.chat.completions.create(model="scripted", messages=ask, tools=tools, stream=True):
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
    assert [json.loads(args[i]) for i in sorted(args)] == want

    rtools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_FUNCTION["parameters"]}]
    r = c.responses.create(model="scripted", input="weather?", tools=rtools)
    assert [json.loads(o.arguments) for o in r.output if o.type == "function_call"] == want
    events = list(c.responses.create(model="scripted", input="weather?", tools=rtools, stream=True))
    assert not [e for e in events if e.type == "response.failed"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == want
    pieces: dict[str, str] = {}
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            pieces[e.item_id] = pieces.get(e.item_id, "") + e.delta
    assert [json.loads(pieces[e.item_id]) for e in done] == want  # each item's deltas make its own arguments
    final = [e for e in events if e.type == "response.completed"][0].response
    assert [json.loads(o.arguments) for o in final.output if o.type == "function_call"] == want
    assert len({o.call_id for o in final.output if o.type == "function_call"}) == 2

    atools = [{"name": "get_weather", "input_schema": WEATHER_FUNCTION["parameters"]}]
    msg = ant(srv).messages.create(model="scripted", max_tokens=50, messages=ask, tools=atools)
    assert [b.input for b in msg.content if b.type == "tool_use"] == want
    with ant(srv).messages.stream(model="scripted", max_tokens=50, messages=ask, tools=atools) as st:
        streamed = st.get_final_message()
    assert [b.input for b in streamed.content if b.type == "tool_use"] == want
    assert streamed.stop_reason == "tool_use"

    o = ollama.Client(host=srv.url, timeout=60)
    assert [
        dict(t.function.arguments) for t in o.chat(model="scripted", messages=ask, tools=tools).message.tool_calls
    ] == want
    lines = list(o.chat(model="scripted", messages=ask, tools=tools, stream=True))
    assert [dict(t.function.arguments) for p in lines for t in (p.message.tool_calls or [])] == want
    scripted_upstream.mode = "ok"


def test_a_reask_takes_the_upstreams_parsed_call(front, scripted_upstream) -> None:
    """The guardrails re-ask after a call that fails its schema; the second
    attempt's call, parsed by the upstream itself, is the answer."""
    srv, obs = front
    scripted_upstream.queue = ["bad_text_call", "parsed_call"]
    raw = oai(srv).chat.completions.with_raw_response.create(
        model="scripted", messages=[{"role": "user", "content": "weather?"}], tools=[chat_tool(WEATHER_FUNCTION)]
    )
    call = raw.parse().choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    wait_event(obs, raw.headers["x-request-id"], "requestFinished")
    assert len([e for e in obs.of(int(raw.headers["x-request-id"])) if e.kind == "generated"]) == 2


def test_configured_headers_reach_the_upstream_and_the_clients_key_does_not(scripted_upstream) -> None:
    """A remote's ``headers`` go with every request to it; what the client
    authenticated with here never goes upstream."""
    opts = RemoteOptions(id="hdr", base_url=scripted_upstream.url + "/v1", model="scripted", ctx=4096,
                         headers={"x-team": "blue"})  # fmt: skip
    with Server([opts], api_keys=["client-key-77"]) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "hdr", "messages": MESSAGES},
                       headers={"Authorization": "Bearer client-key-77"}, timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
    sent = scripted_upstream.headers[-1]
    assert sent["x-team"] == "blue"
    assert "authorization" not in sent and "client-key-77" not in json.dumps(sent)


def test_an_upstream_that_reports_no_usage_gives_zeros_not_a_count_of_chunks(front, scripted_upstream) -> None:
    srv, obs = front
    scripted_upstream.mode = "no_usage"
    raw = oai(srv).chat.completions.with_raw_response.create(model="scripted", messages=MESSAGES)
    body = raw.parse()
    assert body.choices[0].message.content == "Hello there"  # two pieces came
    g = gen(obs, raw.headers["x-request-id"])
    assert (g["promptTokens"], g["newTokens"], g["reusedPrefixTokens"]) == (0, 0, 0)
    assert (body.usage.prompt_tokens, body.usage.completion_tokens) == (0, 0)


def test_an_upstream_that_does_not_stream_is_a_502(front, scripted_upstream) -> None:
    srv, _ = front
    scripted_upstream.mode = "json"
    r = httpx.post(
        srv.url + "/v1/chat/completions", json={"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 502 and "not an event stream" in r.json()["error"]["message"]


def test_local_only_operations_on_a_remote_model_are_clean_400s(front) -> None:
    srv, _ = front
    for path, body in (
        ("/tokenize", {"model": "solo", "content": "hi"}),
        ("/detokenize", {"model": "solo", "tokens": [1, 2]}),
        ("/apply-template", {"model": "solo", "messages": [{"role": "user", "content": "hi"}]}),
        ("/infill", {"model": "solo", "input_prefix": "def f(", "input_suffix": ")"}),
        # (a raw prompt's structure is not in the chat body sent upstream: never unenforced)
        ("/completion", {"model": "solo", "prompt": "x", "grammar": 'root ::= "a"'}),
    ):
        r = httpx.post(srv.url + path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert "remote engine" in r.json()["error"]["message"]


# ------------------------------------------------------------ errors
def test_upstream_429_reaches_anthropic_as_rate_limit_error(front, scripted_upstream) -> None:
    srv, _ = front
    scripted_upstream.mode = "rate_limited"
    with pytest.raises(anthropic.RateLimitError) as err:
        ant(srv).messages.create(model="scripted", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 429
    assert err.value.response.headers["retry-after"] == "7"
    assert err.value.body["error"]["type"] == "rate_limit_error"
    with pytest.raises(openai.RateLimitError) as oerr:
        oai(srv).chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert oerr.value.response.headers["retry-after"] == "7"
    r = httpx.post(srv.url + "/api/chat", json={"model": "scripted", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 429 and r.json()["error"] == "slow down"


def test_vllms_context_refusal_reaches_the_agents_as_ours(front, scripted_upstream) -> None:
    """vLLM's 400 for a prompt over its context, worded as this server's own:
    Anthropic's "prompt is too long" (Claude Code compacts on it), OpenAI's
    ``context_length_exceeded`` (Codex acts on it), in the Responses API too."""
    srv, _ = front
    scripted_upstream.mode = "vllm_overflow"  # (the autouse fixture sets it back)
    with pytest.raises(anthropic.BadRequestError) as aerr:
        ant(srv).messages.create(model="scripted", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert aerr.value.body["error"]["message"].startswith("prompt is too long: 5000 tokens > 4096 maximum")
    with pytest.raises(openai.BadRequestError) as oerr:
        oai(srv).responses.create(model="scripted", input="hi", stream=True)
    assert oerr.value.body["code"] == "context_length_exceeded"


def test_a_refusal_inside_the_stream_before_any_token_keeps_its_status(front, scripted_upstream) -> None:
    """SGLang refuses a prompt over its context inside a 200 event stream, and
    llama-server (before 2025-09) wrote its errors as an SSE field of their
    own (``error:``): before any token, the client gets the 400 they name (an
    overflow worded as ours), not a 502 nor an empty "successful" answer."""
    srv, _ = front
    ask = [{"role": "user", "content": "hi"}]
    scripted_upstream.mode = "sglang_refusal"
    with pytest.raises(anthropic.BadRequestError) as aerr:
        ant(srv).messages.create(model="scripted", max_tokens=8, messages=ask)
    assert aerr.value.body["error"]["message"].startswith("prompt is too long: 5000 tokens > 4096 maximum")
    with pytest.raises(openai.BadRequestError) as oerr:
        oai(srv).chat.completions.create(model="scripted", messages=ask, stream=True)
    assert oerr.value.body["code"] == "context_length_exceeded"

    scripted_upstream.mode = "llama_error_field"
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as oerr:
            oai(srv).chat.completions.create(model="scripted", messages=ask, stream=stream)
        assert "exceeds the available context size" in oerr.value.body["message"]
    r = httpx.post(srv.url + "/api/chat", json={"model": "scripted", "messages": ask, "stream": False}, timeout=60)
    assert r.status_code == 400 and "available context size" in r.json()["error"]

    # after a token: the run failed, never a short "successful" answer
    scripted_upstream.mode = "llama_error_field_late"
    with pytest.raises(openai.APIStatusError) as late:
        oai(srv).chat.completions.create(model="scripted", messages=ask)
    assert late.value.status_code == 502 and "available context size" in late.value.body["message"]
    status, raw, _ = anthropic_stream(srv)
    assert status == 200 and "Hello" in raw and "event: error" in raw and "message_stop" not in raw


def test_a_whole_answer_held_open_without_done_is_answered_at_once(front, scripted_upstream) -> None:
    """An upstream that sent its answer, finish and usage, then holds the
    stream open without ``[DONE]``: the answer is whole at its usage chunk.
    It waited for the read timeout (10 minutes) and then failed."""
    srv, obs = front
    scripted_upstream.mode = "held_open"  # (holds the stream for 60 s)
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
    raw = c.chat.completions.with_raw_response.create(model="scripted", messages=MESSAGES)
    body = raw.parse()
    assert body.choices[0].message.content == "Hello there" and body.choices[0].finish_reason == "stop"
    assert (body.usage.prompt_tokens, body.usage.completion_tokens) == (11, 7)
    assert wait_event(obs, raw.headers["x-request-id"], "requestFinished").error is None
    chunks = list(c.chat.completions.create(model="scripted", messages=MESSAGES, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hello there"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]


def test_a_gateways_error_in_a_200_json_body_keeps_its_message(front, scripted_upstream) -> None:
    srv, _ = front
    scripted_upstream.mode = "json_error_200"
    r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "scripted", "messages": MESSAGES}, timeout=60)
    assert r.status_code == 502 and "not loaded on this worker" in r.json()["error"]["message"], r.text


def test_an_upstream_call_with_a_null_index_is_read(front, scripted_upstream) -> None:
    srv, _ = front
    scripted_upstream.mode = "null_index"
    msg = oai(srv).chat.completions.create(model="scripted", messages=MESSAGES, tools=[chat_tool(WEATHER_FUNCTION)])
    call = msg.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    # calls with no index at all are told apart by their ids (they were one call, its arguments lost)
    scripted_upstream.mode = "no_index"
    msg = oai(srv).chat.completions.create(model="scripted", messages=MESSAGES, tools=[chat_tool(WEATHER_FUNCTION)])
    calls = msg.choices[0].message.tool_calls
    assert [(c.id, json.loads(c.function.arguments)) for c in calls] == [
        ("call_0", {"city": "Paris"}),
        ("call_1", {"city": "Oslo"}),
    ]


def test_a_key_cut_in_two_by_a_truncated_error_body_is_still_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error page quoting the key where the relayed message is cut (300
    characters of a body that is not JSON), or where the body's read stops:
    no start of the key is left either."""
    from turbospark.upstream.client import Endpoint, answer_error

    monkeypatch.setenv(KEY_ENV, SECRET)
    headers = {"x-api-token": "tok-123456789", "x-team": "blue-team-42"}
    e = Endpoint("http://127.0.0.1:1/v1", api_key_env=KEY_ENV, headers=headers)
    for pad in range(270, 300):
        page = ("<html>" + "x" * pad + f"Authorization: Bearer {SECRET} x-api-token: tok-123456789</html>").encode()
        message = e.redact(answer_error(502, e.redact_body(page), httpx.Headers()).message)
        assert SECRET[:4] not in message and "tok-1234" not in message, (pad, message)
    cut = e.redact_body(b"error; headers: Authorization: Bearer " + SECRET[:10].encode())
    assert cut.endswith(b"Bearer [redacted]") and SECRET[:4].encode() not in cut
    # a header that does not name a credential is not blanked where it appears
    assert e.redact("team blue-team-42") == "team blue-team-42"


def test_an_upstream_error_that_echoes_the_key_never_shows_it(scripted_upstream, caplog) -> None:
    """A gateway (or a debug build) that quotes the request's Authorization
    header in its error: the key is redacted wherever that text goes (the
    client's error in each dialect, the events, a replica's down reason in
    the listings and the log)."""
    before = os.environ.get(KEY_ENV)  # (the module's front reads it too)
    os.environ[KEY_ENV] = SECRET
    obs = ListObserver()
    keyed = RemoteOptions(id="keyed", base_url=scripted_upstream.url + "/v1", model="scripted", ctx=4096,
                          api_key_env=KEY_ENV)  # fmt: skip
    member = RemoteOptions(id="x", base_url=scripted_upstream.url + "/v1", model="scripted", ctx=4096,
                           api_key_env=KEY_ENV)  # fmt: skip
    group = GroupOptions("kpool", [("one", member), ("two", member)], health_interval=3600, cooldown=60)
    caplog.set_level(logging.INFO)
    try:
        with Server([keyed, group], observer=obs) as srv:
            scripted_upstream.mode = "echo_key"
            seen = []
            for path, body in (
                ("/v1/chat/completions", {"model": "keyed", "messages": MESSAGES}),
                ("/v1/messages", {"model": "keyed", "max_tokens": 8, "messages": MESSAGES}),
                ("/api/chat", {"model": "keyed", "messages": MESSAGES, "stream": False}),
                ("/v1/messages/count_tokens", {"model": "keyed", "messages": MESSAGES}),
            ):
                r = httpx.post(srv.url + path, json=body, timeout=60)
                assert r.status_code == 400 and "[redacted]" in r.text, (path, r.text)
                seen.append(r.text)
            scripted_upstream.mode = "echo_key_503"
            r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "kpool", "messages": MESSAGES}, timeout=60)
            assert r.status_code == 503 and "[redacted]" in r.text
            seen += [r.text, httpx.get(srv.url + "/v1/models").text, httpx.get(srv.url + "/api/ps").text]
            seen.append(httpx.get(srv.url + "/v1/stats").text)
            assert any("[redacted]" in text for text in seen[-4:-1])  # the replicas' down reason is shown
        assert scripted_upstream.headers[-1]["authorization"] == f"Bearer {SECRET}"  # it was sent
        seen += [json.dumps(e.to_dict()) for e in obs.events] + [caplog.text]
        assert not [text for text in seen if SECRET in text]
    finally:
        if before is None:
            os.environ.pop(KEY_ENV, None)


def test_a_lone_remote_model_with_no_answer_shows_down_until_one_comes(front) -> None:
    """A remote model outside any group has no health checks: while its
    upstream gives no answer it looked healthy in every view (only its
    requests' 502s told). What its requests find now shows: ``down`` in
    ``/v1/models`` and a ``modelHealth`` event, ``ok`` once one is answered
    again. ``/health`` stays 200: nothing checks it back without traffic."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    srv, obs = front
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()  # nothing listens there yet
    body = {"id": "lone", "kind": "remote", "base_url": f"http://127.0.0.1:{port}/v1", "model": "m", "ctx": 2048}
    assert httpx.post(srv.url + "/v1/admin/models", json=body).status_code == 201

    def card() -> dict[str, Any]:
        return next(m for m in httpx.get(srv.url + "/v1/admin/models").json()["data"] if m["id"] == "lone")

    def health() -> list[tuple[str, str]]:
        return [(e.state, e.reason) for e in obs.events if e.kind == "modelHealth" and e.model == "lone"]

    ask = {"model": "lone", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    httpd = None
    try:
        assert httpx.post(srv.url + "/v1/chat/completions", json=ask).status_code == 502
        wait_until(lambda: card()["state"] == "down", what="down")
        assert health()[0][0] == "down" and "unreachable" in health()[0][1]
        assert httpx.get(srv.url + "/health").status_code == 200

        class Answer(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["content-length"]))
                chunk = {"choices": [{"index": 0, "delta": {"content": "hey"}, "finish_reason": "stop"}]}
                usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for data in (json.dumps(chunk), json.dumps(usage), "[DONE]"):
                    self.wfile.write(f"data: {data}\n\n".encode())

            def log_message(self, *a):
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", port), Answer)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        assert httpx.post(srv.url + "/v1/chat/completions", json=ask).status_code == 200
        wait_until(lambda: card()["state"] == "loaded", what="up again")
        assert health()[-1][0] == "ok"
    finally:
        httpx.delete(srv.url + "/v1/admin/models/lone")
        if httpd is not None:
            httpd.shutdown()


def test_upstream_failure_mid_stream_is_an_error_frame(front, scripted_upstream) -> None:
    srv, obs = front
    scripted_upstream.mode = "mid_stream"
    status, raw, rid = anthropic_stream(srv)
    assert status == 200 and "Hello" in raw
    assert "event: error" in raw and "the GPU fell over" in raw
    finished = wait_event(obs, rid, "requestFinished")
    assert "the GPU fell over" in (finished.error or "")


def test_an_upstream_stream_that_closes_before_its_end_is_an_error_not_an_answer(front, scripted_upstream) -> None:
    """A stream that closes with neither a finish_reason nor ``[DONE]`` (a
    proxy's cut, a crash between chunks) was not answered in full: a stream
    ends with an error frame, a whole answer is a 502, and before the first
    token a group's request goes to another replica."""
    srv, obs = front
    scripted_upstream.mode = "cut"
    status, raw, rid = anthropic_stream(srv)
    assert status == 200 and "Hello" in raw
    assert "event: error" in raw and "message_stop" not in raw
    finished = wait_event(obs, rid, "requestFinished")
    assert "before its end" in (finished.error or "")
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": "scripted", "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert r.status_code == 502 and "before its end" in r.json()["error"]["message"]
    scripted_pool(srv, scripted_upstream, "cutpool")
    scripted_upstream.mode = "ok"
    scripted_upstream.queue = ["cut_empty"]
    raw_body = oai(srv).chat.completions.with_raw_response.create(
        model="cutpool", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in raw_body.parse() if ch.choices)
    assert text == "Hello there"
    assert len(routed(obs, raw_body.headers["x-request-id"])) == 2


def test_an_error_a_replica_answers_moves_the_request_and_leaves_it_up(front, scripted_upstream) -> None:
    """A 500 a replica answers (an engine's error for this request) sends the
    request to another replica once, but does not take the replica out: one
    bad request must not leave a group with no replica up."""
    srv, obs = front
    group = scripted_pool(srv, scripted_upstream, "errpool")
    scripted_upstream.mode = "ok"
    scripted_upstream.queue = ["server_error"]
    raw = oai(srv).chat.completions.with_raw_response.create(model="errpool", messages=MESSAGES)
    assert raw.parse().choices[0].message.content == "Hello there"
    assert len(routed(obs, raw.headers["x-request-id"])) == 2
    scripted_upstream.mode = "server_error"  # on every replica: the client gets the error, with its status
    with pytest.raises(openai.InternalServerError) as err:
        oai(srv).chat.completions.create(model="errpool", messages=MESSAGES, stream=True)
    assert err.value.status_code == 500 and "failed to apply the chat template" in str(err.value)
    scripted_upstream.mode = "ok"
    assert all(r.up for r in group.replicas)
    assert not [e for e in obs.events if e.kind == "modelHealth" and e.model.startswith("errpool@")]


def test_which_refusals_take_a_replica_out(front, scripted_upstream) -> None:
    """A 503 without Retry-After (an engine not ready) and a draining
    turbospark's 503 take the replica out and move the request; a busy
    signal moves it only to a replica that is up, else the client gets it
    with its Retry-After."""
    srv, obs = front
    group = scripted_pool(srv, scripted_upstream, "outpool", cooldown=3600)
    for mode in ("unavailable", "draining"):
        for r in group.replicas:
            r.up, r.reason, r.down_until = True, "", 0.0
        scripted_upstream.queue = [mode]
        raw = oai(srv).chat.completions.with_raw_response.create(model="outpool", messages=MESSAGES)
        assert raw.parse().choices[0].message.content == "Hello there"
        first, second = routed(obs, raw.headers["x-request-id"])
        assert not group.by_name(first.split("@")[1]).up and group.by_name(second.split("@")[1]).up, mode
    # one replica down, the other busy: the busy signal, not the down replica's failure
    scripted_upstream.mode = "rate_limited"
    with pytest.raises(openai.RateLimitError) as err:
        oai(srv).chat.completions.create(model="outpool", messages=MESSAGES)
    assert err.value.response.headers["retry-after"] == "7"
    assert len(routed(obs, err.value.response.headers["x-request-id"])) == 1


def test_an_upstream_that_goes_silent_past_its_read_timeout(scripted_upstream) -> None:
    """``read_timeout`` bounds an upstream's silence: before the first token
    a 504 (and a group's request moves to the other replica), after it an
    error frame, each within the timeout, not when the upstream wakes."""
    opts = RemoteOptions(
        id="slow", base_url=scripted_upstream.url + "/v1", model="scripted", ctx=4096, read_timeout=1.5
    )
    one = RemoteOptions(id="x", base_url=scripted_upstream.url + "/v1", model="scripted", ctx=4096, read_timeout=1.5)
    obs = ListObserver()
    with Server(
        [opts, GroupOptions("slowpool", [("one", one), ("two", one)], health_interval=3600)], observer=obs
    ) as srv:
        scripted_upstream.mode = "stall"
        started = time.monotonic()
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "slow", "messages": MESSAGES}, timeout=60)
        assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
        assert time.monotonic() - started < STALL
        scripted_upstream.mode = "stall_mid"
        started = time.monotonic()
        with httpx.stream(
            "POST",
            srv.url + "/v1/messages",
            json={"model": "slow", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        ) as s:
            raw = s.read().decode()
        assert "Hello" in raw and "event: error" in raw and "timed out" in raw and "message_stop" not in raw
        assert time.monotonic() - started < STALL
        scripted_upstream.mode = "ok"
        scripted_upstream.queue = ["stall"]
        raw_body = oai(srv).chat.completions.with_raw_response.create(model="slowpool", messages=MESSAGES)
        assert raw_body.parse().choices[0].message.content == "Hello there"
        assert len(routed(obs, raw_body.headers["x-request-id"])) == 2


def test_remote_timings_are_sent_to_first_token_and_first_to_last(front, scripted_upstream) -> None:
    """``prefillSeconds`` is request sent → first token and ``decodeSeconds``
    first → last token, as the front saw them: an upstream silent for
    STALL seconds before its answer shows it in prefill, one silent after
    its first piece shows it in decode."""
    srv, obs = front
    timings = {}

    def ask(mode: str) -> None:
        raw = oai(srv).chat.completions.with_raw_response.create(model="scripted", messages=MESSAGES)
        assert raw.parse().choices[0].message.content == "Hello there"
        g = gen(obs, raw.headers["x-request-id"])
        timings[mode] = (g["prefillSeconds"], g["decodeSeconds"])

    # both at once (each stalls STALL seconds): the first request sent takes
    # the first mode, the second is sent once the upstream has it
    scripted_upstream.queue = ["stall", "stall_mid"]
    got = len(scripted_upstream.bodies)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, "stall")
        wait_until(lambda: len(scripted_upstream.bodies) > got, 60, "the first request at the upstream")
        second = pool.submit(ask, "stall_mid")
        first.result(), second.result()
    (pre, dec), (pre_mid, dec_mid) = timings["stall"], timings["stall_mid"]
    assert pre >= STALL - 0.2 and dec < STALL / 2, timings
    assert dec_mid >= STALL - 0.2 and pre_mid < STALL / 2, timings


def test_an_upstream_killed_mid_stream_ends_the_stream_with_an_error(upstreams) -> None:
    """A real upstream process killed while it streams: the client's stream
    ends with an error frame (not a clean end), and the request's events say
    it failed."""
    doomed = Upstream().start()
    try:
        obs = ListObserver()
        opts = RemoteOptions(id="doomed", base_url=doomed.url + "/v1", model="smollm2-135m", ctx=2048)
        with Server([opts], observer=obs) as srv:
            body = {"model": "doomed", "messages": LONG, "max_tokens": 1500, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=120) as r:
                lines = r.iter_lines()
                head = [next(lines) for _ in range(6)]
                doomed.kill()
                rest = list(lines)
                rid = r.headers["x-request-id"]
            assert any(ln.startswith("data: {") and '"content"' in ln for ln in head + rest)  # it was streaming
            last = [ln for ln in rest if ln][-2:]
            assert last[0] == "event: error" and '"error"' in last[1], last  # no [DONE]: not a clean end
            finished = wait_event(obs, rid, "requestFinished")
            assert finished.error and "unreachable" in finished.error, finished.to_dict()
    finally:
        doomed.kill()


def test_a_real_upstreams_refusals_reach_the_client(front, upstreams) -> None:
    """A real upstream's 400 (a prompt over its context) keeps its status,
    code and numbers in the caller's dialect; its refusal of this server's
    key is a 502 (not the client's fault), and the key is not in it."""
    srv, obs = front
    big = [{"role": "user", "content": "lighthouse keeper " * 1500}]
    with pytest.raises(openai.BadRequestError) as err:
        oai(srv).chat.completions.create(model="solo", messages=big, max_tokens=8)
    assert err.value.body["code"] == "context_length_exceeded"
    assert "prompt is too long" in err.value.body["message"] and "> 2048 maximum" in err.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as aerr:
        ant(srv).messages.create(model="solo", max_tokens=8, messages=big)
    assert aerr.value.body["error"]["type"] == "invalid_request_error"
    assert "prompt is too long" in aerr.value.body["error"]["message"]  # what Claude Code reads to compact
    a, _ = upstreams
    wrong = RemoteOptions(id="wrongkey", base_url=a.url + "/v1", model="smollm2-135m", ctx=2048)
    os.environ["TS_TEST_WRONG_KEY"] = "sk-not-the-one"
    wrong.api_key_env = "TS_TEST_WRONG_KEY"
    try:
        with Server([wrong]) as other:
            r = httpx.post(other.url + "/v1/chat/completions", json={"model": "wrongkey", "messages": MESSAGES})
            assert r.status_code == 502 and "refused this server's credentials (401)" in r.json()["error"]["message"]
            assert "sk-not-the-one" not in r.text and SECRET not in r.text
    finally:
        os.environ.pop("TS_TEST_WRONG_KEY", None)


# ------------------------------------------------------------ keys
def test_the_upstream_key_is_sent_and_never_shown(front, upstreams, caplog: pytest.LogCaptureFixture) -> None:
    srv, obs = front
    caplog.set_level(logging.DEBUG)
    r = oai(srv).chat.completions.create(model="solo", messages=MESSAGES, max_tokens=4)  # A refuses requests without it
    assert r.choices[0].message is not None
    admin = httpx.get(srv.url + "/v1/admin/models").text
    seen = [
        httpx.get(srv.url + "/v1/models").text,
        httpx.get(srv.url + "/api/ps").text,
        httpx.get(srv.url + "/api/tags").text,
        httpx.get(srv.url + "/metrics").text,
        httpx.get(srv.url + "/v1/stats").text,
        admin,
        json.dumps([e.to_dict() for e in obs.events]),
        caplog.text,
    ]
    assert all(SECRET not in text for text in seen)
    assert KEY_ENV not in httpx.get(srv.url + "/v1/models").text


# ------------------------------------------------------------ replicas
def test_session_affinity_keeps_a_conversation_on_its_replica(front) -> None:
    srv, obs = front
    c = oai(srv)
    for conv in ("alpha", "beta", "gamma"):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Conversation {conv}: hi"}]
        served, reused = [], []
        for _turn in range(3):
            raw = c.chat.completions.with_raw_response.create(
                model="pool", messages=messages, max_tokens=6, temperature=0, extra_headers={"x-session-id": conv}
            )
            answer = raw.parse().choices[0].message.content or ""
            rid = raw.headers["x-request-id"]
            served += routed(obs, rid)
            reused.append(gen(obs, rid)["reusedPrefixTokens"])
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
        assert len(set(served)) == 1 and served[0] in ("pool@a", "pool@b"), served
        assert all(n > 0 for n in reused[1:]), reused  # the replica's KV held the conversation
    # without a session key, the conversation's beginning routes it the same way
    keyless = []
    for _ in range(2):
        raw = c.chat.completions.with_raw_response.create(model="pool", messages=MESSAGES, max_tokens=4)
        keyless += routed(obs, raw.headers["x-request-id"])
    assert len(set(keyless)) == 1
    # Ollama's routes route by the same keys
    oc = ollama.Client(host=srv.url, timeout=120)
    by_ollama = []
    for _ in range(2):
        oc.chat(model="pool", messages=MESSAGES, options={"num_predict": 3})
        by_ollama.append([e.served for e in obs.events if e.kind == "requestRouted"][-1])
    assert by_ollama == keyless


def test_many_requests_at_once_over_a_group(front) -> None:
    """Eight conversations at once, streamed and not: every one answered,
    one ``generated`` each with the upstream's counts, spread over both
    replicas, and every in-flight count back to zero after."""
    srv, obs = front
    group = srv.assembly.registry.lookup("pool").group

    def one(i: int) -> tuple[str, int]:
        ask = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Crowd {i}: name a fruit."}]
        body = {"model": "pool", "messages": ask, "max_tokens": 8, "stream": i % 2 == 0}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.headers["x-request-id"], len(r.content)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    served = []
    for rid, size in results:
        assert size > 0
        events = wait_event(obs, rid, "requestFinished") and obs.of(int(rid))
        gens = [e for e in events if e.kind == "generated"]
        assert len(gens) == 1 and gens[0].new_tokens > 0 and gens[0].prompt_tokens > 0
        served.append(gens[0].model)
    assert set(served) == {"pool@a", "pool@b"}, served
    wait_until(lambda: all(r.in_flight == 0 for r in group.replicas), what="in-flight counts back to zero")


def test_a_killed_replica_is_routed_around_marked_down_and_comes_back(front, upstreams) -> None:
    srv, obs = front
    a, b = upstreams
    group = srv.assembly.registry.lookup("pool").group
    c = oai(srv)
    # a session key the router sends to b
    key = next(k for k in (f"s{i}" for i in range(500)) if group.pick("session:" + k).name == "b")
    b.kill()
    try:
        raw = c.chat.completions.with_raw_response.create(
            model="pool", messages=MESSAGES, max_tokens=6, extra_headers={"x-session-id": key}
        )
        assert raw.parse().choices[0].message.content is not None
        rid = raw.headers["x-request-id"]
        assert routed(obs, rid) == ["pool@b", "pool@a"]  # tried on b, answered by a
        assert gen(obs, rid)["model"] == "pool@a"
        assert [g for g in obs.of(int(rid)) if g.kind == "generated"][0].model == "pool@a"
        down = [e for e in obs.events if e.kind == "modelHealth" and e.model == "pool@b" and e.state == "down"]
        assert down and "unreachable" in down[-1].reason
        models = {m["id"]: m for m in httpx.get(srv.url + "/v1/models").json()["data"]}
        assert models["pool@b"]["state"] == "down"
        assert {r["name"]: r["state"] for r in models["pool"]["replicas"]} == {"a": "up", "b": "down"}
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'turbospark_replica_up{model="pool",replica="b"} 0.0' in metrics
        assert 'turbospark_replica_down_total{model="pool@b"}' in metrics
        assert re.search(r'turbospark_request_success_total\{[^}]*model="pool@a"[^}]*\} [1-9]', metrics)
        ps = next(m for m in httpx.get(srv.url + "/api/ps").json()["models"] if m.get("replicas"))
        assert {r["name"]: r["state"] for r in ps["replicas"]} == {"a": "up", "b": "down"}
        # while b is down its conversations go to a, streams included
        with c.chat.completions.with_streaming_response.create(
            model="pool", messages=MESSAGES, max_tokens=4, stream=True, extra_headers={"x-session-id": key}
        ) as s:
            assert "data:" in s.read().decode()
            assert routed(obs, s.headers["x-request-id"]) == ["pool@a"]
        # a stream that fails over gives the failed replica back at once: while
        # it is still being answered by a, b holds nothing
        bb = group.by_name("b")
        bb.up, bb.reason, bb.down_until = True, "", 0.0  # as if a check had passed just before it died
        fresh = next(k for k in (f"t{i}" for i in range(500)) if group.pick("session:" + k).name == "b")
        with c.chat.completions.with_streaming_response.create(
            model="pool",
            messages=LONG,
            max_tokens=1500,
            stream=True,
            extra_headers={"x-session-id": fresh},
            extra_body={"ignore_eos": True},  # the answer outlasts the assertions below
        ) as s:
            lines = s.iter_lines()
            first = next(lines)
            rid = s.headers["x-request-id"]
            served = [e.served for e in obs.of(int(rid)) if e.kind == "requestRouted"]
            assert served == ["pool@b", "pool@a"]
            gauge = 'turbospark_replica_in_flight{model="pool",replica="a"} 1.0'
            if not (bb.in_flight == 0 and group.by_name("a").in_flight == 1):
                # (seen a few times under CPU load, a at 0: the rest of the
                # stream and the request's events, once it ended, tell why)
                counts = (bb.in_flight, group.by_name("a").in_flight)
                rest = [ln for ln in lines if ln][:6]
                wait_event(obs, rid, "requestFinished")
                events = [e.to_dict() for e in obs.of(int(rid))]
                pytest.fail(json.dumps({"in_flight": counts, "first": first, "rest": rest, "events": events}))
            assert gauge in httpx.get(srv.url + "/metrics").text
        assert not bb.up
        wait_until(lambda: group.by_name("a").in_flight == 0, what="a's lease released once the client left")
        # b comes back: after the cooldown, the next health check finds it
        b.start()
        group.health_interval = 0.3
        group._next_check = 0.0
        wait_until(lambda: group.by_name("b").up, timeout=30, what="replica b up again")
        up = [e for e in obs.events if e.kind == "modelHealth" and e.model == "pool@b" and e.state == "ok"]
        assert up
        assert 'turbospark_replica_up{model="pool",replica="b"} 1.0' in httpx.get(srv.url + "/metrics").text
        raw = c.chat.completions.with_raw_response.create(
            model="pool", messages=MESSAGES, max_tokens=4, extra_headers={"x-session-id": key}
        )
        raw.parse()
        assert routed(obs, raw.headers["x-request-id"]) in (["pool@a"], ["pool@b"])
    finally:  # a failure here must not leave b dead, or the group checking, for the module's later tests
        if b.proc is None or b.proc.poll() is not None:
            b.start()
        group.health_interval = 3600


def test_a_kept_alive_connection_the_upstream_closes_is_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream closes an idle connection (uvicorn's and llama-server's
    5 s) just as the front reuses it: the request goes once more, on a new
    connection, instead of failing with a 502 (streamed, and answered whole
    for a token count)."""
    from turbospark.upstream import client

    monkeypatch.setattr(client, "KEEPALIVE_SECONDS", 60.0)  # a slow box's pauses must not expire them first
    up = ClosingUpstream()
    try:
        opts = RemoteOptions(id="closing", base_url=up.url + "/v1", model="m", ctx=4096)
        with Server([opts]) as srv:
            c = oai(srv)
            for _ in range(3):
                with c.chat.completions.with_streaming_response.create(
                    model="closing", messages=MESSAGES, max_tokens=4, stream=True
                ) as s:
                    assert "Hello" in s.read().decode()
            for _ in range(2):
                counted = ant(srv).messages.count_tokens(model="closing", messages=[{"role": "user", "content": "hi"}])
                assert counted.input_tokens == 7
        assert up.dropped >= 3  # each request after the first met a closed connection
        assert up.connections >= 5
    finally:
        up.stop()


def test_a_new_connection_the_upstream_closes_is_its_failure_and_not_sent_twice() -> None:
    """Only a request sent on a kept connection is sent again: one that
    opened its own and was closed unanswered (an upstream that crashes on
    it) is a 502 at once, sent once."""
    up = ClosingUpstream("never")
    try:
        opts = RemoteOptions(id="closing", base_url=up.url + "/v1", model="m", ctx=4096)
        with Server([opts]) as srv:
            for i in range(2):
                with pytest.raises(openai.InternalServerError, match="unreachable"):
                    oai(srv).chat.completions.create(model="closing", messages=MESSAGES, max_tokens=4)
                assert up.dropped == up.connections == i + 1
            with pytest.raises(anthropic.InternalServerError, match="unreachable"):
                ant(srv).messages.count_tokens(model="closing", messages=[{"role": "user", "content": "hi"}])
            assert up.dropped == up.connections == 3
    finally:
        up.stop()


@pytest.mark.parametrize("mode", ["short", "linger"])
def test_a_cut_or_a_pause_past_the_end_of_a_finished_stream_changes_nothing(mode: str) -> None:
    """The connection closes before the body's announced end after the
    stream's ``[DONE]`` (``short``), or stays open and silent there
    (``linger``, 10 s): the answer is whole, and the client gets it at
    once, not when the upstream lets go."""
    up = ClosingUpstream(mode)
    try:
        opts = RemoteOptions(id="closing", base_url=up.url + "/v1", model="m", ctx=4096)
        with Server([opts]) as srv:
            c = oai(srv)
            started = time.monotonic()  # (the server's start and stop are not timed: a loaded box is slow there)
            out = c.chat.completions.create(model="closing", messages=MESSAGES, max_tokens=4)
            assert out.choices[0].message.content == "Hello" and out.choices[0].finish_reason == "stop"
            with c.chat.completions.with_streaming_response.create(
                model="closing", messages=MESSAGES, max_tokens=4, stream=True
            ) as s:
                text = s.read().decode()
            assert "Hello" in text and '"finish_reason":"stop"' in text and "data: [DONE]" in text
            # (the two requests each wait at most a second for the stream's end)
            assert time.monotonic() - started < LINGER
    finally:
        up.stop()


def test_health_paths_are_read_from_the_root_or_from_base_url(upstreams, monkeypatch: pytest.MonkeyPatch) -> None:
    """``/health`` is read at the upstream's root, where vLLM, SGLang,
    llama-server and turbospark serve it (not ``base_url``'s ``/v1/health``);
    the default ``models`` and other paths without a slash follow
    ``base_url``; a whole URL is taken as it is."""
    from turbospark.upstream.client import Connection, Endpoint

    a, b = upstreams

    def check(path: str, up: Upstream = b, key: bool = False) -> str | None:
        end = Endpoint(up.url + "/v1", KEY_ENV if key else None, health_path=path)
        return asyncio.run(Connection(end).healthy())

    assert Endpoint("http://h:1/v1").health_url() == "http://h:1/v1/models"
    # ("/models": the default's first spelling, still base_url's model list)
    for path in ("/health", "/v1/models", "models", "/models", b.url + "/health"):
        assert check(path) is None, path
    assert check("/v1/health") == "health check answered 404"
    assert check("health") == "health check answered 404"  # base_url's /v1/health
    # behind a key: the model list needs it, /health does not
    monkeypatch.setenv(KEY_ENV, SECRET)
    assert check("models", a, key=True) is None
    assert check("/health", a) is None
    monkeypatch.delenv(KEY_ENV)
    assert check("models", a, key=True) == "health check answered 401"


def test_replica_never_retried_after_a_token(front, scripted_upstream) -> None:
    """A replica that fails mid-stream is not retried: the client already
    has its first bytes (the scripted upstream fails after one piece)."""
    srv, obs = front
    scripted_upstream.mode = "mid_stream"
    scripted_pool(srv, scripted_upstream, "flaky")
    with httpx.stream(
        "POST",
        srv.url + "/v1/chat/completions",
        json={"model": "flaky", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    ) as r:
        raw = r.read().decode()
        rid = r.headers["x-request-id"]
    assert "Hello" in raw and "the GPU fell over" in raw
    assert len(routed(obs, rid)) == 1


def test_a_full_replica_sends_the_request_elsewhere_and_stays_up(upstreams) -> None:
    """A real upstream whose wait list is full answers 503 with Retry-After:
    alone, that reaches an Anthropic client as ``overloaded_error`` with the
    header; in a group, the request goes to the other replica and the busy
    one stays up (it answered; marking it down would leave a burst of traffic
    nowhere to go)."""
    _, b = upstreams
    full = Upstream("--parallel", "1", "--max-queue", "1").start()
    hold: list[httpx.Response] = []
    clients: list[httpx.Client] = []
    try:
        busy = {"model": "smollm2-135m", "messages": LONG, "max_tokens": 1500, "stream": True, "ignore_eos": True}
        for _ in range(2):  # one runs in its only sequence, one waits: the list is full
            client = httpx.Client(timeout=120)
            clients.append(client)
            r = client.send(client.build_request("POST", full.url + "/v1/chat/completions", json=busy), stream=True)
            hold.append(r)
            keep_reading(r)

        def metric(name: str) -> float:
            for line in httpx.get(full.url + "/metrics").text.splitlines():
                if line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
            return 0.0

        wait_until(lambda: metric("turbospark_num_requests_waiting") >= 1, what="the upstream's wait list full")
        obs = ListObserver()
        solo = RemoteOptions(id="solo", base_url=full.url + "/v1", model="smollm2-135m", ctx=2048)
        pool = GroupOptions(
            "pool",
            [
                ("full", RemoteOptions(id="x", base_url=full.url + "/v1", model="smollm2-135m", ctx=2048)),
                ("b", RemoteOptions(id="x", base_url=b.url + "/v1", model="smollm2-135m", ctx=2048)),
            ],
            health_interval=3600,
        )
        with Server([solo, pool], observer=obs) as srv:
            with pytest.raises(anthropic.APIStatusError) as err:
                ant(srv).messages.create(model="solo", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            assert err.value.status_code == 503
            assert err.value.body["error"]["type"] == "overloaded_error"
            assert int(err.value.response.headers["retry-after"]) >= 1
            group = srv.assembly.registry.lookup("pool").group
            keys = [k for k in (f"s{i}" for i in range(500)) if group.pick("session:" + k).name == "full"][:2]
            for key, streamed in zip(keys, (False, True)):  # fresh keys: a key follows where it was served
                wait_until(lambda: metric("turbospark_num_requests_waiting") >= 1, what="the wait list still full")
                r = httpx.post(
                    srv.url + "/v1/chat/completions",
                    json={"model": "pool", "messages": MESSAGES, "max_tokens": 4, "stream": streamed},
                    headers={"x-session-id": key},
                    timeout=120,
                )
                assert r.status_code == 200, r.text
                assert routed(obs, r.headers["x-request-id"]) == ["pool@full", "pool@b"]
            assert group.by_name("full").up
            assert not [e for e in obs.events if e.kind == "modelHealth" and e.model == "pool@full"]
    finally:
        for r in hold:
            r.close()
        for client in clients:
            client.close()
        full.kill()


def test_a_full_local_replica_sends_the_request_to_another_replica(upstreams) -> None:
    """A local replica (a GGUF this process runs) whose wait list is full
    refuses at admission: in a group the request goes to the other replica
    (OpenAI and Ollama), and the full one stays up."""
    from turbospark.models.catalog import resolve_model

    _, b = upstreams
    gguf, _ = resolve_model("smollm2-135m")
    local = ModelOptions(path=gguf, ctx=2048, parallel=1, threads=1, max_queue=1)
    remote = RemoteOptions(id="x", base_url=b.url + "/v1", model="smollm2-135m", ctx=2048)
    obs = ListObserver()
    with Server(
        [GroupOptions("busy", [("here", local), ("there", remote)], health_interval=3600)], observer=obs
    ) as srv:
        group = srv.assembly.registry.lookup("busy").group
        keys = [k for k in (f"s{i}" for i in range(500)) if group.pick("session:" + k).name == "here"][:3]
        # load the local replica, then fill it: one runs in its only sequence, one waits
        warm = httpx.post(srv.url + "/v1/chat/completions", json={"model": "busy", "messages": MESSAGES,
                          "max_tokens": 2}, headers={"x-session-id": keys[0]}, timeout=120)  # fmt: skip
        assert warm.status_code == 200 and routed(obs, warm.headers["x-request-id"]) == ["busy@here"]
        busy = {"model": "busy@here", "messages": LONG, "max_tokens": 1500, "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=120) as c1, httpx.Client(timeout=120) as c2:
            held = [c.send(c.build_request("POST", srv.url + "/v1/chat/completions", json=busy), stream=True)
                    for c in (c1, c2)]  # fmt: skip
            for h in held:
                keep_reading(h)
            try:
                model = srv.assembly.registry.lookup("busy@here").model

                def full() -> bool:  # (a waiting request alone may be one its free sequence is about to take)
                    load = model.load()
                    return bool(load["running"] >= 1 and load["waiting"] >= 1)

                wait_until(full, what="the local replica's wait list full")
                r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "busy", "messages": MESSAGES,
                               "max_tokens": 4}, headers={"x-session-id": keys[1]}, timeout=120)  # fmt: skip
                assert r.status_code == 200, r.text
                assert routed(obs, r.headers["x-request-id"]) == ["busy@here", "busy@there"]
                ask = {"model": "busy", "messages": MESSAGES, "stream": False, "options": {"num_predict": 4}}
                wait_until(full, what="the wait list still full")
                o = httpx.post(srv.url + "/api/chat", json=ask, headers={"x-session-id": keys[2]}, timeout=120)
                assert o.status_code == 200 and o.json()["done"], o.text
                assert routed(obs, o.headers["x-request-id"]) == ["busy@here", "busy@there"]
                assert group.by_name("here").up
            finally:
                for h in held:
                    h.close()


def test_embeddings_over_a_remote_model(upstreams) -> None:
    """A remote model marked ``embeddings`` serves OpenAI's and Ollama's
    embedding routes from the upstream's ``/v1/embeddings``."""
    _, b = upstreams
    opts = RemoteOptions(id="emb", base_url=b.url + "/v1", model="smollm2-135m", ctx=2048, embeddings=True)
    with Server([opts]) as srv:
        out = oai(srv).embeddings.create(model="emb", input=["a lighthouse", "a storm at sea"])
        assert len(out.data) == 2 and len(out.data[0].embedding) == len(out.data[1].embedding) > 10
        assert out.usage.prompt_tokens > 0
        theirs = httpx.post(b.url + "/v1/embeddings", json={"input": ["a lighthouse"]}).json()["data"][0]["embedding"]
        assert out.data[0].embedding == pytest.approx(theirs, abs=1e-5)  # the upstream's own vector
        r = ollama.Client(host=srv.url, timeout=60).embed(model="emb", input="a lighthouse")
        assert len(r.embeddings[0]) == len(theirs)


def test_embeddings_and_token_counts_over_a_group_move_off_a_dead_replica(upstreams) -> None:
    """An embedding request or a token count that meets a dead replica is
    served by another one (once), and the dead one is marked down, as for a
    chat request before its first token."""
    _, b = upstreams

    def emb(url: str) -> RemoteOptions:
        return RemoteOptions(id="x", base_url=url + "/v1", model="smollm2-135m", ctx=2048, embeddings=True)

    obs = ListObserver()
    dead_url = f"http://127.0.0.1:{free_port()}"
    group = GroupOptions("embpool", [("dead", emb(dead_url)), ("b", emb(b.url))], health_interval=3600, cooldown=3600)
    with Server([group], observer=obs) as srv:
        pool = srv.assembly.registry.lookup("embpool").group
        dead = pool.by_name("dead")
        wait_until(lambda: not dead.up, what="the first health check finds the dead replica")
        pool._next_check = float("inf")
        dead.up, dead.reason, dead.down_until = True, "", 0.0  # as if it had died after that check
        routes = []
        for i in range(2):  # keyless requests take turns over the replicas: one meets the dead one
            raw = oai(srv).embeddings.with_raw_response.create(model="embpool", input=[f"a lighthouse {i}"])
            assert len(raw.parse().data[0].embedding) > 10
            routes.append(routed(obs, raw.headers["x-request-id"]))
        assert ["embpool@dead", "embpool@b"] in routes, routes
        assert not dead.up and "unreachable" in dead.reason
        r = ollama.Client(host=srv.url, timeout=60).embed(model="embpool", input="a storm at sea")
        assert len(r.embeddings[0]) > 10
        # a token count (Claude Code asks for many) moves the same way
        dead.up, dead.reason, dead.down_until = True, "", 0.0
        counts, routes = [], []
        for _ in range(2):
            raw = ant(srv).messages.with_raw_response.count_tokens(
                model="embpool", messages=[{"role": "user", "content": "How far is the lighthouse?"}]
            )
            counts.append(raw.parse().input_tokens)
            routes.append(routed(obs, raw.headers["x-request-id"]))
        assert ["embpool@dead", "embpool@b"] in routes, routes
        assert counts[0] == counts[1] > 5 and not dead.up


def test_a_group_of_a_local_and_a_remote_replica(upstreams) -> None:
    """One id over a GGUF this process runs and an upstream: both serve,
    each named in the events."""
    from turbospark.models.catalog import resolve_model

    _, b = upstreams
    gguf, _ = resolve_model("smollm2-135m")
    local = ModelOptions(path=gguf, ctx=2048, parallel=1, threads=1)
    remote = RemoteOptions(id="x", base_url=b.url + "/v1", model="smollm2-135m", ctx=2048)
    obs = ListObserver()
    with Server([GroupOptions("mixed", [("here", local), ("there", remote)])], observer=obs) as srv:
        c = oai(srv)
        served = set()
        for i in range(6):
            raw = c.chat.completions.with_raw_response.create(
                model="mixed", messages=[{"role": "user", "content": f"Say {i}."}], max_tokens=4
            )
            assert raw.parse().usage.completion_tokens > 0
            rid = raw.headers["x-request-id"]
            served.add(gen(obs, rid)["model"])
        assert served == {"mixed@here", "mixed@there"}
        ps = httpx.get(srv.url + "/api/ps").json()["models"]
        assert {
            r["name"] for r in next(m for m in ps if m["name"].startswith("mixed") and "replicas" in m)["replicas"]
        } == {
            "here",
            "there",
        }


# ------------------------------------------------------------ admin attach
def test_attach_and_detach_a_remote_model(front, upstreams) -> None:
    srv, obs = front
    a, b = upstreams
    assert a.key is not None
    body = {"id": "late", "kind": "remote", "base_url": b.url + "/v1", "model": "smollm2-135m", "ctx": 2048}
    r = httpx.post(srv.url + "/v1/admin/models", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["kind"] == "remote" and r.json()["upstream"] == b.url + "/v1"
    out = oai(srv).chat.completions.create(model="late", messages=MESSAGES, max_tokens=4)
    assert out.usage.completion_tokens > 0
    assert httpx.post(srv.url + "/v1/admin/models", json=body).status_code == 409
    bad = httpx.post(srv.url + "/v1/admin/models", json={"id": "x2", "kind": "remote", "model": "m"})
    assert bad.status_code == 400 and "base_url" in bad.json()["error"]["message"]
    leak = httpx.post(
        srv.url + "/v1/admin/models",
        json={**body, "id": "x3", "headers": {"Authorization": "Bearer sk-no"}},
    )
    assert leak.status_code == 400 and "api_key_env" in leak.json()["error"]["message"]
    for probe in ({**body, "id": "x4", "ca_file": "/etc/hostname"}, {**body, "id": "x5", "replicas": [{
            "base_url": b.url + "/v1", "ca_file": "/nonexistent"}]}):  # fmt: skip
        # a path on the server is the config file's to name: the answer says
        # nothing of whether it exists
        r = httpx.post(srv.url + "/v1/admin/models", json=probe)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("'ca_file' is read from the config")
    r = httpx.post(srv.url + "/v1/admin/models", json={**body, "id": "x6", "replicas": 3})
    assert r.status_code == 400 and "'replicas' must be" in r.json()["error"]["message"]
    # the key in api_key_env goes to the body's base_url: only a variable the
    # operator allowed (here: the one the configured models name) may be named
    for name in ("HOME", "TS_NOT_SET_ANYWHERE"):
        member = {"base_url": b.url + "/v1", "api_key_env": name}
        for probe in ({**body, "id": "x7", "api_key_env": name}, {**body, "id": "x8", "replicas": [member]}):
            r = httpx.post(srv.url + "/v1/admin/models", json=probe)
            assert r.status_code == 403 and r.json()["error"]["code"] == "key_env_not_allowed", r.text
            assert r.json()["error"]["message"].startswith(f"'api_key_env' {name!r} is not a variable")
    # a configured model's variable, for that model's host only: not to another one
    r = httpx.post(srv.url + "/v1/admin/models", json={**body, "id": "x9", "api_key_env": KEY_ENV})
    assert r.status_code == 403 and r.json()["error"]["code"] == "key_env_not_allowed", r.text
    r = httpx.post(srv.url + "/v1/admin/models", json={**body, "id": "x10", "api_key_env": ["HOME"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "api_key_env", r.text
    keyed = {**body, "id": "keyed", "base_url": upstreams[0].url + "/v1", "api_key_env": KEY_ENV}
    r = httpx.post(srv.url + "/v1/admin/models", json=keyed)
    assert r.status_code == 201, r.text
    assert oai(srv).chat.completions.create(model="keyed", messages=MESSAGES, max_tokens=2).choices  # a refuses keyless
    assert httpx.delete(srv.url + "/v1/admin/models/keyed").status_code == 200
    group = httpx.post(
        srv.url + "/v1/admin/models",
        json={
            "id": "late-pool",
            "model": "smollm2-135m",
            "ctx": 2048,
            "replicas": [{"name": "b", "base_url": b.url + "/v1"}],
        },
    )
    assert group.status_code == 201 and group.json()["replicas"][0]["id"] == "late-pool@b"
    assert oai(srv).chat.completions.create(model="late-pool", messages=MESSAGES, max_tokens=4).choices
    member = httpx.delete(srv.url + "/v1/admin/models/late-pool@b")
    assert member.status_code == 409 and "detach the group" in member.json()["error"]["message"]
    for model_id in ("late", "late-pool"):
        assert httpx.delete(srv.url + f"/v1/admin/models/{model_id}").status_code == 200
    ids = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
    assert "late" not in ids and "late-pool@b" not in ids


def test_a_key_variable_the_operator_allowed_may_be_named_by_an_attach_body(upstreams) -> None:
    a, b = upstreams
    os.environ["TS_TEST_ALLOWED_KEY"] = SECRET
    try:
        plain = RemoteOptions(id="plain", base_url=b.url + "/v1", model="smollm2-135m", ctx=2048)
        with Server([plain], remote_key_envs=["TS_TEST_ALLOWED_KEY"]) as srv:
            body = {"id": "k", "kind": "remote", "base_url": a.url + "/v1", "model": "smollm2-135m", "ctx": 2048}
            r = httpx.post(srv.url + "/v1/admin/models", json={**body, "api_key_env": "TS_TEST_ALLOWED_KEY"})
            assert r.status_code == 201, r.text
            assert oai(srv).chat.completions.create(model="k", messages=MESSAGES, max_tokens=2).choices
            r = httpx.post(srv.url + "/v1/admin/models", json={**body, "id": "k2", "api_key_env": KEY_ENV})
            assert r.status_code == 403 and r.json()["error"]["code"] == "key_env_not_allowed"
    finally:
        os.environ.pop("TS_TEST_ALLOWED_KEY", None)


# ------------------------------------------------------------ llama-server
def test_llama_server_as_upstream(tmp_path) -> None:
    """llama.cpp's own server behind turbospark, when the bench's peer build
    is on this machine (``bench/peer.sh``; never built by the tests)."""
    peer = peer_binary()
    if peer is None:
        pytest.skip("llama-server is not built here (bench/peer.sh builds it)")
    from turbospark.models.catalog import resolve_model

    binary, env = peer
    gguf, _ = resolve_model("smollm2-135m")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-m", gguf, "--port", str(port), "-t", "1", "-c", "2048", "-np", "1", "--no-webui"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_up(f"http://127.0.0.1:{port}", proc)
        obs = ListObserver()
        opts = RemoteOptions(id="llama", base_url=f"http://127.0.0.1:{port}/v1", model="smollm2", ctx=2048)
        with Server([opts], observer=obs) as srv:
            c = oai(srv)
            raw = c.chat.completions.with_raw_response.create(
                model="llama", messages=MESSAGES, max_tokens=8, temperature=0
            )
            body = raw.parse()
            g = gen(obs, raw.headers["x-request-id"])
            assert body.choices[0].message.content
            assert (body.usage.prompt_tokens, body.usage.completion_tokens) == (g["promptTokens"], g["newTokens"])
            assert g["newTokens"] == 8
            msg = ant(srv).messages.create(model="llama", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            assert msg.usage.output_tokens == 8
            started = time.monotonic()
            list(c.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=8, stream=True))
            assert time.monotonic() - started < 120
            # its refusal of a prompt over its context, worded as ours: what
            # Claude Code reads to compact, the code Codex acts on
            big = [{"role": "user", "content": "lighthouse keeper " * 1500}]
            with pytest.raises(anthropic.BadRequestError) as aerr:
                ant(srv).messages.create(model="llama", max_tokens=8, messages=big)
            assert re.match(r"prompt is too long: \d+ tokens > 2048 maximum", aerr.value.body["error"]["message"])
            with pytest.raises(openai.BadRequestError) as oerr:
                c.chat.completions.create(model="llama", messages=big, max_tokens=8, stream=True)
            assert oerr.value.body["code"] == "context_length_exceeded"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_an_https_upstream_is_reached_over_http2_one_connection_for_many_requests(tmp_path) -> None:
    """An upstream behind TLS that offers HTTP/2 (hypercorn here; nginx or
    Envoy in front of vLLM in practice) is reached over HTTP/2, and one
    pooled connection carries many requests at once, streamed ones
    included. A private CA is trusted through ``ca_file``; without it the
    upstream's certificate is refused and the client is told why. The
    front's shutdown closes its upstream connections."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certfile, keyfile, cafile = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    ca.cert_pem.write_to_path(str(cafile))
    up = ScriptedUpstream(tls=(str(certfile), str(keyfile))).start()
    try:
        trusted = RemoteOptions(id="tls", base_url=up.url + "/v1", model="scripted", ctx=4096, ca_file=str(cafile))
        public = RemoteOptions(id="tls-public", base_url=up.url + "/v1", model="scripted", ctx=4096)
        with Server([trusted, public]) as srv:
            c = oai(srv)
            assert c.chat.completions.create(model="tls", messages=MESSAGES).choices[0].message.content == "Hello there"

            def streamed(i: int) -> str:
                chunks = c.chat.completions.create(model="tls", messages=MESSAGES, stream=True)
                return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

            with ThreadPoolExecutor(6) as pool:
                assert list(pool.map(streamed, range(6))) == ["Hello there"] * 6
            msg = ant(srv).messages.create(model="tls", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
            assert msg.content[0].text == "Hello there"  # type: ignore[union-attr]
            assert up.versions == ["2"] * 8
            assert len({port for _, port in up.clients}) == 1, up.clients  # one connection carried all 8
            r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "tls-public", "messages": MESSAGES})
            assert r.status_code == 502, r.text
            assert "TLS certificate not trusted" in r.json()["error"]["message"] and len(up.versions) == 8
        # the front's shutdown closed its connection: the upstream (which
        # waits for open connections) stops at once
        up.stop()
        assert not up.thread.is_alive()
    finally:
        up.stop()


def test_a_chain_over_a_remote_model_keeps_its_state_at_the_front(upstreams, tmp_path, monkeypatch) -> None:
    """Stored responses over a remote model (issue 37): the front keeps the
    chain, the upstream gets each turn as one whole, stateless chat request
    (no response id, no previous one)."""
    a, _ = upstreams
    monkeypatch.setenv(KEY_ENV, SECRET)
    remote = RemoteOptions(id="far", base_url=a.url + "/v1", model="smollm2-135m", api_key_env=KEY_ENV, ctx=2048)
    obs = ListObserver()
    srv = Server([remote], observer=obs, state_dir=str(tmp_path / "state")).start()
    try:
        before = len(_upstream_events(a))
        c = oai(srv)
        first = c.responses.create(model="far", input="My name is Ada.", max_output_tokens=8, temperature=0)
        second = c.responses.create(
            model="far", input="What is my name?", previous_response_id=first.id, max_output_tokens=8, temperature=0
        )
        assert second.previous_response_id == first.id and second.output_text
        assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens
        assert c.responses.retrieve(second.id).output_text == second.output_text
        (routed,) = [e for e in obs.events if e.kind == "requestRouted" and e.response_id == second.id]
        assert routed.previous_response_id == first.id
    finally:
        srv.stop()
    a.settled()
    theirs = _upstream_events(a)[before:]
    paths = [e["path"] for e in theirs if e["kind"] == "requestStarted"]
    assert paths.count("/v1/chat/completions") == 2 and not any("responses" in p for p in paths), paths
    upstream_routed = [e for e in theirs if e["kind"] == "requestRouted"]
    assert len(upstream_routed) == 2
    assert not any("responseId" in e or "previousResponseId" in e for e in upstream_routed)
    prompts = [e["promptTokens"] for e in theirs if e["kind"] == "generated"]
    assert (
        prompts == [first.usage.input_tokens, second.usage.input_tokens] and prompts[1] > prompts[0]
    )  # the chain, sent whole


def _upstream_events(upstream: Upstream) -> list[dict[str, Any]]:
    assert upstream.event_log is not None
    with open(upstream.event_log, "rb") as f:
        return [json.loads(line) for line in f]
