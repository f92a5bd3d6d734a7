"""Tool calls stream as they are written (issue 15, point 5): under a
grammar (``tool_choice`` required/named, or the lazy grammar of ``auto``
once the model opens a call) a call's name goes out the moment it is known
and its arguments follow token by token, in every dialect's own frames:
Anthropic ``input_json_delta``, OpenAI ``function.arguments`` deltas,
Responses ``function_call_arguments.delta``, Ollama one line per call.

The long calls are real: Qwen2.5-Coder made to write a file whose
``content`` the schema holds to at least 600 characters (hundreds of
argument tokens). The scripted model covers what a real one cannot be made
to do on cue: a call written slowly, and an engine that fails inside a call."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from turbospark import ListObserver, Server
from turbospark.tools.streaming import CallReader, Closed, Opened, Piece

from .fakes import Script, ScriptedModel
from .support import ASK, WEATHER_FUNCTION, anthropic_tool, chat_tool, generated, responses_tool

WRITE_FUNCTION = {
    "name": "write_file",
    "description": "Write a text file.",
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string", "maxLength": 40},
            # (at most 700: the model writes to the limit, and every
            # character past the 600 the checks need is decode time)
            "content": {"type": "string", "minLength": 600, "maxLength": 700},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
}
WRITE_ASK = [{"role": "user", "content": "Write a long poem about the sea into the file sea.txt."}]
BUDGET = 700  # room for the whole call: 700 characters are well under 400 tokens


# ------------------------------------------------------------ the reader
CALLS = (
    '<tool_call>\n{"name": "run", "arguments": {"cmd": "echo \\"}{\\" hi", "n": [1, {"a": 2}]}}\n</tool_call>\n'
    '<tool_call>\n{"name": "x\\u0041", "arguments": {}}\n</tool_call>'
)


def test_the_reader_finds_every_call_however_the_text_is_cut():
    rng = random.Random(7)
    for _ in range(200):
        reader, events, i = CallReader(), [], 0
        while i < len(CALLS):
            k = rng.randint(1, 7)
            events += reader.feed(CALLS[i : i + k])
            i += k
        assert [(c.name, c.arguments) for c in reader.calls] == [
            ("run", '{"cmd": "echo \\"}{\\" hi", "n": [1, {"a": 2}]}'),
            ("xA", "{}"),
        ]
        assert not reader.failed and not reader.reading
        # the pieces of each call join into its arguments; opened before, closed after
        for index, call in enumerate(reader.calls):
            mine = [e for e in events if e.index == index]
            assert isinstance(mine[0], Opened) and mine[0].id == call.id
            assert isinstance(mine[-1], Closed) and mine[-1].call == call
            assert "".join(e.text for e in mine if isinstance(e, Piece)) == call.arguments


def test_the_reader_reads_mistral_and_keeps_a_call_cut_short():
    reader = CallReader()
    reader.feed('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]')
    assert [(c.name, c.arguments) for c in reader.calls] == [("f", '{"a": 1}')]
    cut = CallReader()
    cut.feed('<tool_call>\n{"name": "f", "arguments": {"text": "abc')
    assert cut.reading and cut.partial is not None and cut.partial.arguments == '{"text": "abc'
    assert cut.partial_text == '<tool_call>\n{"name": "f", "arguments": {"text": "abc'
    prose = CallReader()
    prose.feed("<tool_call> I would rather not. " * 60)
    assert prose.failed and not prose.calls


# ------------------------------------------------------------ the real model
def _timing(begin: float, first: float, end: float, pieces: int) -> None:
    """The arguments stream: many pieces, the first of them right after the
    call began (a small share of the call's time; a buffered call sends its
    arguments at the end, in one to three pieces)."""
    assert pieces >= 30, pieces
    assert first - begin <= 0.25 * (end - begin) + 0.05, (begin, first, end)
    assert first - begin < 15  # a generous bound: a few tokens' time


def _check_written(args: str) -> None:
    value = json.loads(args)
    assert set(value) == {"path", "content"} and len(value["content"]) >= 600


def test_openai_chat_streams_a_long_forced_call(qwen_server):
    srv, events = qwen_server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
    raw = client.chat.completions.with_raw_response.create(
        model="qwen",
        messages=WRITE_ASK,
        tools=[chat_tool(WRITE_FUNCTION)],
        tool_choice={"type": "function", "function": {"name": "write_file"}},
        temperature=0,
        max_tokens=BUDGET,
        stream=True,
    )
    begin = first = end = 0.0
    pieces: list[str] = []
    finish = None
    for chunk in raw.parse():
        now = time.monotonic()
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                assert tc.index == 0
                if tc.function and tc.function.name:
                    assert not begin and tc.id and tc.function.arguments == ""
                    begin = now
                elif tc.function and tc.function.arguments:
                    first = first or now
                    pieces.append(tc.function.arguments)
        end = now
    assert finish == "tool_calls"
    _check_written("".join(pieces))
    _timing(begin, first, end, len(pieces))
    assert len(generated(events, raw.headers["x-request-id"])) == 1  # valid at once: no re-ask


def test_anthropic_streams_a_long_forced_call(qwen_server):
    srv, events = qwen_server
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=300)
    raw = client.messages.with_raw_response.create(
        model="qwen",
        messages=WRITE_ASK,
        tools=[anthropic_tool(WRITE_FUNCTION)],
        tool_choice={"type": "tool", "name": "write_file"},
        extra_body={"temperature": 0},  # this SDK version has no temperature argument
        max_tokens=BUDGET,
        stream=True,
    )
    begin = first = end = 0.0
    pieces: list[str] = []
    kinds: list[str] = []
    reason = None
    for event in raw.parse():
        now = time.monotonic()
        kinds.append(event.type)
        if event.type == "content_block_start" and event.content_block.type == "tool_use":
            assert event.content_block.name == "write_file" and event.content_block.id.startswith("toolu_")
            begin = now
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            first = first or now
            pieces.append(event.delta.partial_json)
        elif event.type == "message_delta":
            reason = event.delta.stop_reason
        end = now
    assert reason == "tool_use"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    _check_written("".join(pieces))
    _timing(begin, first, end, len(pieces))
    assert len(generated(events, raw.headers["x-request-id"])) == 1


def test_responses_streams_a_long_forced_call(qwen_server):
    srv, events = qwen_server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
    raw = client.responses.with_raw_response.create(
        model="qwen",
        input=WRITE_ASK,
        tools=[responses_tool(WRITE_FUNCTION)],
        tool_choice={"type": "function", "name": "write_file"},
        temperature=0,
        max_output_tokens=BUDGET,
        stream=True,
    )
    begin = first = end = 0.0
    pieces: list[str] = []
    done_args = None
    completed = None
    for event in raw.parse():
        now = time.monotonic()
        if event.type == "response.output_item.added" and event.item.type == "function_call":
            assert event.item.name == "write_file" and event.item.arguments == ""
            begin = now
        elif event.type == "response.function_call_arguments.delta":
            first = first or now
            pieces.append(event.delta)
        elif event.type == "response.function_call_arguments.done":
            done_args = event.arguments
        elif event.type == "response.completed":
            completed = event.response
        end = now
    assert done_args == "".join(pieces)
    _check_written(done_args)
    _timing(begin, first, end, len(pieces))
    assert completed is not None
    assert [(o.type, o.arguments) for o in completed.output] == [("function_call", done_args)]
    assert len(generated(events, raw.headers["x-request-id"])) == 1


def test_ollama_stays_heard_while_a_long_call_is_written(qwen_server):
    """Ollama's wire sends a call only whole (its arguments are an object):
    while the long call is written, lines with empty content keep coming
    (one a second), so the stream is never silent; then the call's line."""
    import ollama

    from turbospark.dialects.ollama import KEEPALIVE_SECONDS

    srv, events = qwen_server
    client = ollama.Client(host=srv.url, timeout=300)
    tool = chat_tool(WRITE_FUNCTION)
    text = " ".join(f"Line {i}: the tide comes in and the tide goes out again." for i in range(12))
    ask = [{"role": "user", "content": f"Write exactly this text into the file sea.txt: {text}"}]
    stream = client.chat(model="qwen", messages=ask, tools=[tool], stream=True,
                         options={"temperature": 0, "num_predict": BUDGET})  # fmt: skip
    times: list[float] = []
    calls = []
    for chunk in stream:
        times.append(time.monotonic())
        if chunk.message.tool_calls:
            calls += chunk.message.tool_calls
            call_at = len(times) - 1
    assert [c.function.name for c in calls] == ["write_file"], calls
    assert len(calls[0].function.arguments["content"]) >= 500
    # lines kept coming while the call was written (about 200 tokens: its
    # decode time, from the engine), none after a gap longer than a
    # keepalive and a few tokens' time
    decode = next(e for e in reversed(events.events) if e.kind == "generated").decode_seconds
    # (at most one a second, when argument pieces come: on a loaded machine
    # the loop takes them in bursts, so fewer than one per second of decode:
    # two busy processes on two cores gave 6 lines in 13 s)
    assert call_at >= int(decode / KEEPALIVE_SECONDS) // 3, (call_at, decode)
    quiet = [b - a for a, b in zip(times[:call_at], times[1 : call_at + 1])]
    assert not quiet or max(quiet) < 5 * KEEPALIVE_SECONDS, quiet


def test_a_call_the_budget_cuts_short_closes_with_what_it_has(qwen_server):
    """The budget runs out inside the call: the streamed call ends where the
    model stopped (as the APIs do: the arguments are incomplete and the
    reason says why); a body that is not streamed keeps the text."""
    srv, _ = qwen_server
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=300)
    common = {
        "model": "qwen",
        "messages": WRITE_ASK,
        "tools": [anthropic_tool(WRITE_FUNCTION)],
        "tool_choice": {"type": "tool", "name": "write_file"},
        "extra_body": {"temperature": 0},
        "max_tokens": 40,
    }
    events = list(client.messages.create(**common, stream=True))
    kinds = [e.type for e in events]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert partial.startswith('{"') and not partial.rstrip().endswith("}")
    assert next(e for e in events if e.type == "message_delta").delta.stop_reason == "max_tokens"
    whole = client.messages.create(**common)
    assert whole.stop_reason == "max_tokens"
    assert [b.type for b in whole.content] == ["text"] and '"name": "write_file"' in whole.content[0].text
    assert partial in whole.content[0].text

    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
    chunks = list(
        oai.chat.completions.create(
            model="qwen",
            messages=WRITE_ASK,
            tools=[chat_tool(WRITE_FUNCTION)],
            tool_choice="required",
            temperature=0,
            max_tokens=40,
            stream=True,
        )
    )
    args = "".join(
        tc.function.arguments or "" for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])
    )
    assert args.startswith('{"') and chunks[-1].choices[0].finish_reason == "length"


#: a schema llguidance cannot take whole: the lazy grammar holds it loosely
TAGS = {
    "type": "object",
    "properties": {"tags": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}},
    "required": ["tags"],
}


def test_a_call_qwen_opens_itself_streams_under_the_lazy_grammar(qwen_server):
    """tool_choice auto: Qwen opens the call (a logit bias on its
    ``<tool_call>`` token makes sure of it), the lazy grammar holds the rest,
    and the call streams as it is written: name first, then arguments. A
    second tool whose schema is beyond the grammar (``propertyNames``, as in
    Claude Code's task tools) does not cost the others their grammar."""
    srv, events = qwen_server
    tok = httpx.post(srv.url + "/tokenize", json={"content": "<tool_call>", "parse_special": True}).json()["tokens"]
    # an enum: the bias that opens the call cannot also fill a free string
    city = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}}
    body = {
        "model": "qwen",
        "messages": ASK,
        "tools": [
            chat_tool(WEATHER_FUNCTION | {"parameters": city}),
            chat_tool({"name": "tag", "description": "Tag a task", "parameters": TAGS}),
        ],
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 60,
        "logit_bias": {str(tok[0]): 100},
        "stream": True,
    }
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=300) as r:
        raw = r.read().decode()
        rid = r.headers["x-request-id"]
    frames = [json.loads(x[6:]) for x in raw.split("\n\n") if x.startswith("data: {")]
    calls = [tc for f in frames for ch in f.get("choices", []) for tc in ch["delta"].get("tool_calls") or []]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"].startswith("call_")
    assert len(calls) >= 4 and {c["index"] for c in calls} == {0}  # the name, then the arguments in pieces
    args = json.loads("".join(c["function"].get("arguments", "") for c in calls))
    assert args == {"city": "Paris"}
    assert len(generated(events, rid)) == 1


def test_ollama_sends_each_call_in_its_own_line_as_it_completes(qwen_server):
    srv, _ = qwen_server
    body = {
        "model": "qwen",
        "messages": [{"role": "user", "content": "What is the weather like in Paris and in Rome?"}],
        "tools": [chat_tool(WEATHER_FUNCTION)],
        "options": {"temperature": 0, "num_predict": 120},
    }
    with httpx.stream("POST", srv.url + "/api/chat", json=body, timeout=300) as r:
        lines = [json.loads(line) for line in r.read().decode().splitlines()]
    with_calls = [line["message"]["tool_calls"] for line in lines if line["message"].get("tool_calls")]
    assert with_calls and all(len(c) == 1 for c in with_calls)  # one call a line
    assert [c[0]["function"]["index"] for c in with_calls] == list(range(len(with_calls)))
    assert all(c[0]["function"]["name"] == "get_weather" for c in with_calls)
    assert lines[-1]["done"] is True and "tool_calls" not in lines[-1]["message"]


# ------------------------------------------------------------ scripted timing
SLOW_CALL = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "', *(["Par"] * 30), 'is"}}\n</tool_call>']


@pytest.fixture()
def slow():
    """A scripted engine that enforces grammars (its script obeys the
    weather tool's) and writes one token every 0.1 s."""
    model = ScriptedModel(scripts=[Script(SLOW_CALL, delay=0.1)], enforces_grammars=True)
    obs = ListObserver()
    with Server(models=[model], observer=obs) as srv:
        yield srv


def test_arguments_reach_every_dialect_long_before_the_call_ends(slow):
    """The call takes over 3 s to write; its first argument bytes arrive in
    the first half of that (a buffered call sends them at its end), in every
    dialect that streams arguments."""
    weather = WEATHER_FUNCTION | {"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    bodies = {
        "/v1/chat/completions": {"model": "scripted", "messages": ASK, "tools": [chat_tool(weather)], "stream": True},
        "/v1/messages": {
            "model": "scripted",
            "messages": ASK,
            "tools": [anthropic_tool(weather)],
            "max_tokens": 200,
            "stream": True,
        },
        "/v1/responses": {"model": "scripted", "input": ASK, "tools": [responses_tool(weather)], "stream": True},
    }
    needles = {
        "/v1/chat/completions": b'"arguments":"{\\"city',
        "/v1/messages": b"input_json_delta",
        "/v1/responses": b"function_call_arguments.delta",
    }

    def timed(path: str) -> tuple[float | None, float, bytes]:
        start = time.monotonic()
        first = None
        with httpx.stream("POST", slow.url + path, json=bodies[path], timeout=60) as r:
            assert r.status_code == 200
            seen = b""
            for chunk in r.iter_bytes():
                seen += chunk
                if first is None and needles[path] in seen:
                    first = time.monotonic() - start
        return first, time.monotonic() - start, seen

    # the three at once (the script sleeps between tokens, so they do not
    # slow one another): one call's time instead of three
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = dict(zip(bodies, pool.map(timed, bodies)))
    for path, (first, total, seen) in results.items():
        assert first is not None, (path, seen[-400:])
        assert total > 3 and first < 0.5 * total, (path, first, total)


def test_ollama_keeps_talking_while_a_call_is_written(slow):
    """Ollama has no partial call: while the 3 s call is written, lines with
    empty content go out about every second, then the call's own line."""
    weather = WEATHER_FUNCTION | {"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    body = {"model": "scripted", "messages": ASK, "tools": [chat_tool(weather)]}
    with httpx.stream("POST", slow.url + "/api/chat", json=body, timeout=60) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    at = next(i for i, line in enumerate(lines) if line["message"].get("tool_calls"))
    assert lines[at]["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Par" * 30 + "is"}
    empty = [line for line in lines[:at] if line["message"]["content"] == "" and not line["done"]]
    assert len(empty) >= 2 and empty == lines[:at], lines[:at]


#: what the script below has written of the call when the engine fails
CUT_ARGS = '{"city": "' + "Par" * 5


def test_an_engine_failure_inside_a_streamed_call_ends_each_stream_in_its_shape():
    """The engine fails while a call's arguments stream: each dialect ends
    with its own error frame after the pieces already sent (Responses lists
    the call as ``incomplete`` with the arguments it had), and the request
    finishes with the error (no ``generated``)."""
    model = ScriptedModel(scripts=[Script(SLOW_CALL, fail_after=6)], enforces_grammars=True)
    obs = ListObserver()
    weather = WEATHER_FUNCTION | {"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    with Server(models=[model], observer=obs) as srv:
        chat = {"model": "scripted", "messages": ASK, "tools": [chat_tool(weather)], "stream": True}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat, timeout=60) as r:
            frames = [f for f in r.read().decode().split("\n\n") if f.strip()]
        assert frames[-1].startswith("event: error\ndata: ") and "[DONE]" not in frames[-2]
        deltas = [ch["delta"] for f in frames[:-1] for ch in json.loads(f[6:])["choices"]]
        calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
        assert calls[0]["function"]["name"] == "get_weather"
        assert "".join(c["function"].get("arguments", "") for c in calls) == CUT_ARGS

        client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        kinds: list[str] = []
        with pytest.raises(anthropic.APIStatusError):
            for event in client.messages.create(
                model="scripted", messages=ASK, tools=[anthropic_tool(weather)], max_tokens=200, stream=True
            ):
                kinds.append(event.type)
        assert kinds[:2] == ["message_start", "content_block_start"] and kinds.count("content_block_delta") >= 1
        assert "message_stop" not in kinds

        body = {"model": "scripted", "input": ASK, "tools": [responses_tool(weather)], "stream": True}
        with httpx.stream("POST", srv.url + "/v1/responses", json=body, timeout=60) as r:
            events = [json.loads(x[6:]) for x in r.read().decode().split("\n") if x.startswith("data: ")]
        assert events[-1]["type"] == "response.failed"
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
        assert deltas == CUT_ARGS
        output = events[-1]["response"]["output"]
        assert [(o["type"], o["status"], o["arguments"]) for o in output] == [("function_call", "incomplete", deltas)]
    finished = [e for e in obs.events if e.kind == "requestFinished"]
    assert len(finished) == 3 and all(e.error and "scripted failure" in e.error for e in finished)
    assert not [e for e in obs.events if e.kind == "generated"]


def test_ollama_sends_a_call_the_moment_it_is_complete():
    """Two calls, the second written slowly: the first call's line arrives
    long before the second is done (a line of all the calls at the end would
    arrive with it), and each call has a line of its own."""
    second = ['\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "', *(["Ro"] * 20), 'me"}}\n</tool_call>']
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    script = Script([first, *second], delay=0.1)
    model = ScriptedModel(scripts=[script], enforces_grammars=True)
    weather = WEATHER_FUNCTION | {"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    body = {"model": "scripted", "messages": ASK, "tools": [chat_tool(weather)], "stream": True}
    with Server(models=[model]) as srv:
        start = time.monotonic()
        arrivals: list[tuple[float, dict]] = []
        with httpx.stream("POST", srv.url + "/api/chat", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    arrivals.append((time.monotonic() - start, json.loads(line)))
    with_calls = [(t, line["message"]["tool_calls"]) for t, line in arrivals if line["message"].get("tool_calls")]
    cities = [[c["function"]["arguments"]["city"] for c in calls] for _, calls in with_calls]
    assert cities == [["Paris"], ["Ro" * 20 + "me"]]
    total = arrivals[-1][0]
    assert arrivals[-1][1]["done"] is True and total > 2
    assert with_calls[0][0] < 0.5 * total, (with_calls[0][0], total)
