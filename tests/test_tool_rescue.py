"""Tool calls a small model writes in the wrong shape (CONTRACT §8): an answer
that is exactly one JSON object valid for exactly one offered tool, or
``{"name": X, ...arguments beside it}``, becomes a call to that tool; any
other JSON answer stays the answer. The exact shapes come from a scripted
model (a real one cannot be made to write them on demand); the real Qwen
model is asked to write the bare-arguments shape too."""

from __future__ import annotations

import json
import time

import httpx
import orjson
import pytest

from tests.support import Script, scripted
from turbospark.tools.rescue import may_become_call, rescue_call

SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"}},
            "required": ["command"],
        },
    },
}
BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}
ANYTHING = {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}


def test_rescue_rules():
    call, why = rescue_call('{"command": ["echo", "hi"]}', [SHELL, BASH])
    assert call is not None and call.name == "shell" and json.loads(call.arguments) == {"command": ["echo", "hi"]}
    call, _ = rescue_call('{"name": "Bash", "command": "echo hi", "timeout": 120000}', [SHELL, BASH])
    assert call is not None and call.name == "Bash"
    assert json.loads(call.arguments) == {"command": "echo hi", "timeout": 120000}
    # positional arguments: the list is the one required parameter
    call, _ = rescue_call('{"name": "shell", "arguments": ["echo", "hi"]}', [SHELL])
    assert call is not None and json.loads(call.arguments) == {"command": ["echo", "hi"]}
    call, why = rescue_call('{"name": "shell", "arguments": [["echo"]]}', [SHELL])
    assert call is None and "list" in why
    # fenced is the same answer
    assert rescue_call('```json\n{"command": ["ls"]}\n```', [SHELL])[0] is not None
    # the name beside invalid arguments: no call, but a problem to re-ask about
    call, why = rescue_call('{"name": "Bash", "timeout": 5}', [BASH])
    assert call is None and why is not None and "command" in why
    # two tools fit, a schema that takes anything, keys the schema does not
    # declare, prose around it, a list: all stay answers
    assert rescue_call('{"command": "ls"}', [BASH, {**BASH, "function": {**BASH["function"], "name": "B2"}}])[0] is None
    assert rescue_call('{"text": "hello"}', [ANYTHING]) == (None, None)
    assert rescue_call('{"command": ["ls"], "colour": "red"}', [SHELL]) == (None, None)
    assert rescue_call('Run {"command": ["ls"]}', [SHELL]) == (None, None)
    assert rescue_call('[{"command": ["ls"]}]', [SHELL]) == (None, None)
    assert may_become_call("  {") and may_become_call("```json\n{") and not may_become_call("Sure: {")


@pytest.mark.parametrize(
    "pieces, name, args",
    [
        (['{"command": ', '["echo", ', '"hi"]}'], "shell", {"command": ["echo", "hi"]}),
        (
            ['{"name": "Bash", ', '"command": "echo hi", "timeout": 120000}'],
            "Bash",
            {"command": "echo hi", "timeout": 120000},
        ),
    ],
)
def test_a_misshapen_call_is_a_call_streamed_or_not(pieces, name, args):
    srv, _, _ = scripted(Script(pieces), Script(pieces))
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "run it"}], "tools": [SHELL, BASH]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30).json()
        msg = r["choices"][0]["message"]
        assert r["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] is None
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [
            (name, args)
        ]
        content, calls = "", []
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    delta = orjson.loads(line[6:])["choices"][0]["delta"]
                    content += delta.get("content") or ""
                    calls += delta.get("tool_calls") or []
        assert content == "" and [c["function"]["name"] for c in calls] == [name]


def test_a_json_answer_that_fits_no_tool_stays_the_answer_in_the_stream():
    pieces = ['{"colour": ', '"red"}']
    srv, _, _ = scripted(Script(pieces))
    with srv:
        body = {
            "model": "scripted",
            "messages": [{"role": "user", "content": "json please"}],
            "tools": [SHELL],
            "stream": True,
        }
        content = ""
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    chunk = orjson.loads(line[6:])
                    content += chunk["choices"][0]["delta"].get("content") or ""
                    assert not chunk["choices"][0]["delta"].get("tool_calls")
        assert content == '{"colour": "red"}'


def test_a_long_json_answer_is_not_held_back_for_more_than_a_few_seconds():
    """An answer that begins as a JSON object is held while it may be
    rescued as a call, but never longer than HOLD_SECONDS: one that takes
    longer to write streams as the text it is (the stream is never silent
    for long while tokens come)."""
    from turbospark.generation import HOLD_SECONDS

    pieces = ['{"colour": "', *(["red, "] * 60), 'blue"}']
    srv, _, _ = scripted(Script(pieces, delay=0.1))  # about 6 s to write
    with srv:
        body = {
            "model": "scripted",
            "messages": [{"role": "user", "content": "json"}],
            "tools": [SHELL],
            "stream": True,
        }
        start = time.monotonic()
        first = None
        content = ""
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    delta = orjson.loads(line[6:])["choices"][0]["delta"]
                    if delta.get("content") and first is None:
                        first = time.monotonic() - start
                    content += delta.get("content") or ""
        total = time.monotonic() - start
    assert content == "".join(pieces)  # nothing lost, nothing doubled
    assert first is not None and HOLD_SECONDS <= first < HOLD_SECONDS + 1.5 < total - 1, (first, total)


def test_the_name_beside_bad_arguments_is_re_asked():
    srv, model, obs = scripted(
        Script(['{"name": "Bash", "timeout": 5}']), Script(['{"name": "Bash", "command": "ls"}'])
    )
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "list"}], "tools": [BASH]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
        msg = r.json()["choices"][0]["message"]
        assert msg["tool_calls"][0]["function"]["name"] == "Bash"
        assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
        gens = [e for e in obs.of(int(r.headers["x-request-id"])) if e.kind == "generated"]
        assert len(gens) == 2  # the first attempt, then the re-ask


def test_real_qwen_positional_arguments_become_a_call(qwen_server):
    """Asked to print a shell command's JSON with a shell tool offered,
    Qwen2.5-Coder-0.5B writes ``{"name": "shell", "arguments": ["echo", "hi"]}``
    (the arguments as a list): the first attempt is already a valid call, so
    no re-ask is needed. (Told to, it does not write the bare-arguments or
    name-beside shapes; the scripted tests above cover those.)"""
    srv, events = qwen_server
    body = {
        "model": "qwen",
        "messages": [{"role": "user", "content": 'Print this JSON and nothing else: {"command": ["echo", "hi"]}'}],
        "tools": [SHELL],
        "temperature": 0,
        "max_tokens": 60,
    }
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300)
    msg = r.json()["choices"][0]["message"]
    assert msg.get("tool_calls") and not msg["content"], msg
    call = msg["tool_calls"][0]["function"]
    assert call["name"] == "shell" and json.loads(call["arguments"]) == {"command": ["echo", "hi"]}
    gens = [e for e in events.of(int(r.headers["x-request-id"])) if e.kind == "generated"]
    assert len(gens) == 1
