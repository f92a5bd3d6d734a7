"""Only the attempt that is answered is rendered, stored and counted (issue
42, item 14). Qwen2.5-Coder once echoed its template's ``<tools>`` listing,
then wrote a call to a tool nobody offered: the call was stopped and re-asked,
the second attempt made a valid call, but the echo went out as text beside
it, the stored response kept it and later turns copied it. Here a scripted
model plays that first attempt and the valid second one, and every dialect's
wire (streamed and not), the Responses store and the next turn's prompt are
checked: the echo is nowhere, the usage is the answered attempt's, and the
events still show both runs."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support import (
    ASK,
    GOOD_CALL,
    WEATHER_FUNCTION,
    Script,
    anthropic_tool,
    chat_tool,
    generated,
    responses_tool,
    wait_event,
)
from turbospark import ListObserver, Server

from .fakes import ScriptedModel

ECHO = "<tools>\n" + json.dumps(chat_tool(WEATHER_FUNCTION)) + "\n</tools>\n"
#: a call to a tool nobody offered, whose arguments would take 80 pieces more
MISNAMED = '<tool_call>\n{"name": "lookup_weather", "arguments": {"city": "' + "Paris " * 80 + '"}}\n</tool_call>'


def _pieces(text: str, size: int = 6) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


FIRST = Script(_pieces(ECHO + MISNAMED), delay=0.005)
SECOND = Script([GOOD_CALL])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    model = ScriptedModel(scripts=[SECOND])
    obs = ListObserver()
    srv = Server(models=[model], observer=obs, state_dir=str(tmp_path_factory.mktemp("state"))).start()
    yield srv, model, obs
    srv.stop()


def _arm(model: ScriptedModel) -> None:
    """The next request's two attempts: the echo and misnamed call, then the valid call."""
    model.scripts = [FIRST, SECOND]


def _two_runs(obs: ListObserver, rid: str) -> list[Any]:
    """Both attempts are in the events (the first stopped early), and the
    request ended once."""
    wait_event(obs, rid, "requestFinished")
    gens = generated(obs, rid)
    # the first stopped near the misnamed call's name, not at its end
    assert len(gens) == 2 and gens[0].stop_reason == "cancelled" and gens[0].new_tokens < 100, gens
    return gens


def _clean(raw: str) -> None:
    """Nothing of the rejected attempt is on the wire."""
    assert "<tools>" not in raw and "lookup_weather" not in raw and "</tools>" not in raw, raw[:600]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_answers_with_the_second_attempt_alone(served, stream: bool):
    srv, model, obs = served
    _arm(model)
    body = {"model": "scripted", "messages": ASK, "tools": [chat_tool(WEATHER_FUNCTION)], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    _clean(r.text)
    gens = _two_runs(obs, r.headers["x-request-id"])
    if stream:
        chunks = [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        calls = [t for c in chunks if c["choices"] for t in c["choices"][0]["delta"].get("tool_calls") or []]
        names, usage = [t["function"]["name"] for t in calls if t["function"].get("name")], chunks[-1]["usage"]
    else:
        msg = r.json()["choices"][0]["message"]
        content, names, usage = (
            msg["content"] or "",
            [c["function"]["name"] for c in msg["tool_calls"]],
            r.json()["usage"],
        )
    assert content == "" and names == ["get_weather"]
    # counted: the answered attempt alone (its prompt carries the corrective turn)
    assert usage["completion_tokens"] == gens[1].new_tokens and usage["prompt_tokens"] == gens[1].prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_answers_with_the_second_attempt_alone(served, stream: bool):
    srv, model, obs = served
    _arm(model)
    body = {"model": "scripted", "max_tokens": 400, "messages": ASK, "tools": [anthropic_tool(WEATHER_FUNCTION)],
            "stream": stream}  # fmt: skip
    r = httpx.post(srv.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    _clean(r.text)
    gens = _two_runs(obs, r.headers["x-request-id"])
    if stream:
        events = [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
        usage = next(e["usage"] for e in events if e["type"] == "message_delta")
    else:
        blocks, usage = [b["type"] for b in r.json()["content"]], r.json()["usage"]
    assert blocks == ["tool_use"] and usage["output_tokens"] == gens[1].new_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_answers_with_the_second_attempt_alone(served, stream: bool):
    srv, model, obs = served
    _arm(model)
    body = {"model": "scripted", "messages": ASK, "tools": [chat_tool(WEATHER_FUNCTION)], "stream": stream}
    r = httpx.post(srv.url + "/api/chat", json=body, timeout=60)
    assert r.status_code == 200, r.text
    _clean(r.text)
    gens = _two_runs(obs, r.headers["x-request-id"])
    lines = [orjson.loads(line) for line in r.text.splitlines() if line.strip()]
    content = "".join(line["message"].get("content") or "" for line in lines)
    names = [c["function"]["name"] for line in lines for c in line["message"].get("tool_calls") or []]
    assert content == "" and names == ["get_weather"] and lines[-1]["eval_count"] == gens[1].new_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_responses_store_and_later_turns_keep_the_second_attempt_alone(served, stream: bool):
    """The stored response (read back) holds the valid call only, and the
    next turn (``previous_response_id``) shows the model no echo."""
    srv, model, obs = served
    _arm(model)
    body = {"model": "scripted", "input": ASK, "tools": [responses_tool(WEATHER_FUNCTION)], "stream": stream}
    r = httpx.post(srv.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    _clean(r.text)
    gens = _two_runs(obs, r.headers["x-request-id"])
    if stream:
        events = [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        response = next(e["response"] for e in events if e["type"] == "response.completed")
    else:
        response = r.json()
    assert [o["type"] for o in response["output"]] == ["function_call"], response["output"]
    assert response["usage"]["output_tokens"] == gens[1].new_tokens
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    kept = oai.responses.retrieve(response["id"])
    assert [o.type for o in kept.output] == ["function_call"], kept.output
    call = kept.output[0]
    model.scripts = [Script(["It is sunny in Paris."])]
    after = oai.responses.create(
        model="scripted",
        previous_response_id=kept.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],  # type: ignore[union-attr]
        tools=[responses_tool(WEATHER_FUNCTION)],  # type: ignore[list-item]
    )
    assert after.output_text == "It is sunny in Paris."
    said = [m for m in model.calls[-1]["messages"] if m["role"] == "assistant"]
    assert said and "<tools>" not in json.dumps(said) and "lookup_weather" not in json.dumps(said), said


def test_text_before_a_rejected_call_is_not_the_answer():
    """A whole (not streamed) body is the answered attempt's: what the first
    wrote before its invalid call is gone with it. (A stream has sent such
    text as it came: it cannot be taken back; CONTRACT §8.)"""
    model = ScriptedModel(scripts=[Script(["Let me look that up.\n", GOOD_CALL.replace("city", "town")]), SECOND])
    obs = ListObserver()
    with Server(models=[model], observer=obs) as srv:
        body = {"model": "scripted", "messages": ASK, "tools": [chat_tool(WEATHER_FUNCTION)]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        msg = r.json()["choices"][0]["message"]
        assert not msg["content"] and msg["tool_calls"][0]["function"]["name"] == "get_weather", msg
        assert len(generated(obs, r.headers["x-request-id"])) == 2


def test_an_echo_is_held_only_while_a_re_ask_may_follow():
    """The router holds an echoed listing whole when a re-ask may replace it
    (the parsers read what follows it at the end); with none to come it is
    text as it comes."""
    from turbospark.core.answer import Router, echo_start, past_echo
    from turbospark.core.generation import prepare
    from turbospark.core.request import ChatRequest
    from turbospark.models.local import LocalBackend

    assert echo_start("Sure.\n  <tools>\n{", 0) == 8 and echo_start("a <tools>", 0) is None
    assert echo_start("x\n<to", 0) == 2 and echo_start("<tools>", 1) is None
    assert past_echo(ECHO + "rest") == (ECHO[:-1], "\nrest") and past_echo("<tools>\n{") == ("<tools>\n{", "")
    req = ChatRequest(messages=ASK, tools=[chat_tool(WEATHER_FUNCTION)])
    prepared = prepare(LocalBackend(ScriptedModel()), req)
    held = Router(prepared, live=True, reask=True)
    out = [d for piece in _pieces("Sure.\n" + ECHO + GOOD_CALL) for d in held.feed(piece)]
    assert "".join(getattr(d, "text", "") for d in out) == "Sure.\n"  # the echo and the call are held
    held.flush()
    end = held.finish(None)
    assert [c.name for c in end.calls] == ["get_weather"] and not end.problems and end.leftover.strip() == ECHO.strip()
    free = Router(prepared, live=True, reask=False)
    out = [d for piece in _pieces(ECHO) for d in free.feed(piece)]
    assert "".join(getattr(d, "text", "") for d in out) + "".join(d.text for d in free.flush()) == ECHO
