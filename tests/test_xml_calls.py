"""Calls in the xml syntax (Qwen3-Coder's ``<function=N>`` /
``<parameter=K>`` blocks) stream as they are written, like the JSON
syntaxes' (issue 15, point 5): ``tools/streaming.XmlCallReader`` turns the
blocks into the arguments' JSON object as they come, a raw string
parameter's characters as they are written. No bundled model writes this
syntax, so the server tests use a scripted model whose template teaches it
(the lazy grammar's shape, and the same call with no grammar behind it)."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson

from turbospark import ListObserver, Server
from turbospark.tools.calls import parse_tool_calls
from turbospark.tools.grammar import tool_call_grammar, xml_raw_parameters
from turbospark.tools.streaming import Closed, Opened, Piece, XmlCallReader

from .fakes import Script, ScriptedModel
from .support import ChatStream, stream_chat

WRITE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a text file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"}},
            "required": ["path", "content"],
        },
    },
}
LS = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}
CONTENT = "".join(f'line {i}: the sea is {"calm" if i % 3 else "rough"} \\ "quoted"\n' for i in range(40))
CALL = (
    "<tool_call>\n<function=write_file>\n<parameter=path>\nsea.txt\n</parameter>\n"
    f"<parameter=content>\n{CONTENT}\n</parameter>\n<parameter=mode>\n420\n</parameter>\n</function>\n</tool_call>"
)
ARGS = {"path": "sea.txt", "content": CONTENT, "mode": 420}


def read(text: str, rng: random.Random, names: tuple[str, ...] | None = None) -> tuple[XmlCallReader, list]:
    reader, events, i = XmlCallReader(xml_raw_parameters([WRITE, LS]), names), [], 0
    while i < len(text):
        k = rng.randint(1, 9)
        events += reader.feed(text[i : i + k])
        i += k
    return reader, events


def test_the_reader_streams_the_arguments_object_however_the_text_is_cut():
    text = CALL + "\n<tool_call>\n<function=ls>\n</function>\n</tool_call>"
    rng = random.Random(3)
    for _ in range(100):
        reader, events = read(text, rng)
        assert not reader.failed and not reader.reading
        opened = [e for e in events if isinstance(e, Opened)]
        assert [e.name for e in opened] == ["write_file", "ls"]
        for index, expected in ((0, ARGS), (1, {})):
            streamed = "".join(e.text for e in events if isinstance(e, Piece) and e.index == index)
            closed = [e for e in events if isinstance(e, Closed) and e.index == index]
            assert len(closed) == 1 and closed[0].call.arguments == streamed and json.loads(streamed) == expected
        # the content streams as it is written, not when its block closes
        pieces = [e for e in events if isinstance(e, Piece) and e.index == 0]
        assert len(pieces) > 20
    # the same arguments as the parser reads from the whole text
    parsed = parse_tool_calls(CALL, ["write_file", "ls"])
    assert [json.loads(c.arguments) for c in parsed.calls] == [ARGS]


def test_the_reader_takes_raw_what_the_grammar_writes_raw():
    """``xml_raw_parameters`` names exactly the parameters the grammar
    writes raw (its ``P_`` regex rules), required ones left undeclared
    included; the rest are JSON values."""
    cmd = {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer"}, "mode": {"enum": ["a", "b"]}},
                "required": ["cmd"],
                "additionalProperties": {"type": "string"},
            },
        },
    }
    for tool in (WRITE, cmd):
        grammar = tool_call_grammar([tool], "xml")
        params = list(tool["function"]["parameters"]["properties"]) + tool["function"]["parameters"].get("required", [])
        params = list(dict.fromkeys(params))
        raw_in_grammar = {p for j, p in enumerate(params) if f"P_0_{j}:" in grammar}
        assert xml_raw_parameters([tool])[tool["function"]["name"]] == raw_in_grammar
    assert xml_raw_parameters([cmd])["run"] == {"cmd", "mode"}
    # a raw value reads as the string it is; a JSON one as its value, never NaN
    reader = XmlCallReader(xml_raw_parameters([cmd]))
    text = "<tool_call>\n<function=run>\n<parameter=cmd>\ntrue\n</parameter>\n<parameter=n>\nInfinity\n</parameter>\n"
    events = reader.feed(text + "</function>\n</tool_call>")
    closed = [e for e in events if isinstance(e, Closed)]
    assert json.loads(closed[0].call.arguments) == {"cmd": "true", "n": "Infinity"}
    assert orjson.loads(closed[0].call.arguments)  # strict JSON


def test_the_reader_ends_a_call_at_its_tool_call_close_and_opens_none_on_prose():
    rng = random.Random(9)
    text = "<tool_call>\n<function=ls>\n<parameter=path>\n/tmp\n</parameter>\n</tool_call>"
    reader, events = read(text, rng, names=("ls",))
    closed = [e for e in events if isinstance(e, Closed)]
    assert not reader.failed and len(closed) == 1 and json.loads(closed[0].call.arguments) == {"path": "/tmp"}
    # prose that mentions the tag is no call (a tail starts at the tag)
    reader = XmlCallReader(xml_raw_parameters([LS]), ("ls",))
    events = [e for ch in "<function=ls> tool lists files, and I will use it now." for e in reader.feed(ch)]
    assert not events and not reader.reading


def test_on_speculation_only_offered_names_are_read():
    rng = random.Random(5)
    reader, events = read(CALL.replace("write_file", "delete_all"), rng, names=("write_file",))
    assert reader.failed and not events
    reader, events = read(CALL, rng, names=("write_file",))
    assert not reader.failed and [e.name for e in events if isinstance(e, Opened)] == ["write_file"]
    # cut inside a parameter: the text as written so far
    reader, _ = read(CALL[:120], rng, names=("write_file",))
    assert reader.reading and reader.partial_text == CALL[:120]


def xml_server(pieces: list[str], grammar: bool) -> tuple[Server, ListObserver]:
    model = ScriptedModel(scripts=[Script(pieces, delay=0.05)], enforces_grammars=grammar)
    model.chat_template = "{# tools #}<tool_call>\n<function=name>\n<parameter=k>"
    obs = ListObserver()
    return Server(models=[model], observer=obs), obs


def slow(text: str) -> list[str]:
    """The call in small pieces (0.05 s each: about 4 s in all)."""
    return [text[i : i + 24] for i in range(0, len(text), 24)]


def stream_openai(url: str, tools: list) -> ChatStream:
    got = stream_chat(url, {"model": "scripted", "messages": [{"role": "user", "content": "write"}], "tools": tools})
    assert got.content == ""
    return got


def test_a_grammar_held_xml_call_streams_from_its_start():
    """Under the lazy grammar (an engine that enforces it), the call's name
    goes out when its block opens and its content as it is written, in
    OpenAI's and Anthropic's frames; a non-streamed answer has the same call."""
    srv, _ = xml_server(slow(CALL), grammar=True)
    a_tool = {"name": "write_file", "input_schema": WRITE["function"]["parameters"]}
    body = {"model": "scripted", "max_tokens": 900, "messages": [{"role": "user", "content": "write"}],
            "tools": [a_tool], "stream": True}  # fmt: skip

    def anthropic_stream() -> tuple[float | None, float, str, int]:
        start, opened, partial, deltas = time.monotonic(), None, "", 0
        with httpx.stream("POST", srv.url + "/v1/messages", json=body, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    e = orjson.loads(line[6:])
                    if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
                        opened = time.monotonic() - start
                    elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
                        partial += e["delta"]["partial_json"]
                        deltas += 1
        return opened, time.monotonic() - start, partial, deltas

    def whole() -> dict:
        chat = {"model": "scripted", "messages": [{"role": "user", "content": "write"}], "tools": [WRITE]}
        return httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=60).json()

    # the three requests at once (the script sleeps between pieces, so they
    # do not slow one another): one call's time instead of three
    with srv, ThreadPoolExecutor(3) as pool:
        streamed = pool.submit(stream_openai, srv.url, [WRITE])
        anthropic, plain = pool.submit(anthropic_stream), pool.submit(whole)
        got, (opened, total, partial, deltas), r = streamed.result(), anthropic.result(), plain.result()
    assert got.names == ["write_file"] and json.loads(got.arguments) == ARGS and got.finish == "tool_calls"
    assert got.first_call_at is not None and got.first_call_at < got.total / 4, (got.first_call_at, got.total)

    assert json.loads(partial) == ARGS and deltas > 20
    assert opened is not None and opened < total / 4, (opened, total)

    assert [json.loads(c["function"]["arguments"]) for c in r["choices"][0]["message"]["tool_calls"]] == [ARGS]


def test_an_xml_call_no_grammar_holds_streams_after_the_hold(monkeypatch):
    import turbospark.core.answer as answer

    monkeypatch.setattr(answer, "HOLD_SECONDS", 1.0)  # the server runs in this process
    srv, _ = xml_server(slow(CALL), grammar=False)
    with srv:
        got = stream_openai(srv.url, [WRITE])
    assert got.names == ["write_file"] and json.loads(got.arguments) == ARGS and got.finish == "tool_calls"
    assert got.first_call_at is not None and 1.0 <= got.first_call_at < got.total - 1, (got.first_call_at, got.total)


def test_a_non_streamed_grammar_held_xml_call_keeps_its_raw_strings():
    """A client reading the whole answer at once gets the guardrails' checks
    on a grammar-held call, on the call as the reader took it: a string
    parameter the grammar wrote raw stays a string even when it reads as
    JSON (``12345``, ``{"a": 1}``); the xml parser alone would make it a
    number or an object, fail the schema and re-ask."""
    call = (
        "<tool_call>\n<function=write_file>\n<parameter=path>\n12345\n</parameter>\n"
        '<parameter=content>\n{"a": 1}\n</parameter>\n</function>\n</tool_call>'
    )
    srv, obs = xml_server(slow(call), grammar=True)
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "write"}], "tools": [WRITE]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        calls = r.json()["choices"][0]["message"]["tool_calls"]
        assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"path": "12345", "content": '{"a": 1}'}]
        assert len([e for e in obs.of(int(r.headers["x-request-id"])) if e.kind == "generated"]) == 1
