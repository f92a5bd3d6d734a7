"""Tool calls a small model writes in the wrong shape (CONTRACT §8): an answer
that is exactly one JSON object valid for exactly one offered tool, or
``{"name": X, ...arguments beside it}``, becomes a call to that tool; any
other JSON answer stays the answer. The exact shapes come from a scripted
model (a real one cannot be made to write them on demand); the real Qwen
model is asked to write the bare-arguments shape too."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from tests.support import Script, scripted, stream_chat
from turbospark.tools.rescue import may_become_call, rescue_call


@pytest.fixture
def short_hold(monkeypatch: pytest.MonkeyPatch) -> float:
    """HOLD_SECONDS at 1 s for the scripted streams (the server runs in this
    process), so the slow calls that outlast it take seconds, not tens."""
    import turbospark.core.answer as answer

    monkeypatch.setattr(answer, "HOLD_SECONDS", 1.0)
    return 1.0


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


def test_a_long_json_answer_is_not_held_back_for_more_than_a_few_seconds(short_hold: float):
    """An answer that begins as a JSON object is held while it may be
    rescued as a call, but never longer than HOLD_SECONDS: one that takes
    longer to write streams as the text it is (the stream is never silent
    for long while tokens come)."""
    pieces = ['{"colour": "', *(["red, "] * 60), 'blue"}']
    srv, _, _ = scripted(Script(pieces, delay=0.07))  # about 4.3 s to write
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
    assert first is not None and short_hold <= first < short_hold + 1.5 < total - 1, (first, total)


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
    no re-ask is needed. (Told to, it does not write the name-beside shape
    here; the opening grammar holds it, below, and scripted tests cover it.)"""
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


@pytest.mark.parametrize("stream", [False, True])
def test_real_qwen_bare_arguments_become_a_call_over_responses(qwen_server, monkeypatch, stream: bool):
    """Codex's run: with its shell tool offered, Qwen2.5-Coder-0.5B answered
    with the bare arguments ``{"command": ["echo", "hi"]}`` (no name, no
    marker). Told in a system message that commands are run so, it answers
    that way here too, through the Responses API Codex uses: the answer is
    one JSON object valid for exactly one offered tool, so it is rescued as a
    call to it (the rescue's own verdict, spied on), streamed or not."""
    import openai

    import turbospark.core.answer as answer

    rescued: list[tuple[str, bool]] = []
    real = answer.rescue_call

    def spy(text, tools):
        call, why = real(text, tools)
        rescued.append((text, call is not None))
        return call, why

    monkeypatch.setattr(answer, "rescue_call", spy)
    srv, events = qwen_server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
    shell = {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
             "parameters": SHELL["function"]["parameters"]}  # fmt: skip
    ask = [
        {"role": "system", "content": 'To run a command, reply with a JSON object {"command": [argv...]}.'},
        {"role": "user", "content": "Run echo hi."},
    ]
    kw = {"model": "qwen", "input": ask, "tools": [shell], "temperature": 0, "max_output_tokens": 60}
    if stream:
        with client.responses.stream(**kw) as s:  # type: ignore[arg-type]
            done = [e.item for e in s if e.type == "response.output_item.done"]
            response = s.get_final_response()
    else:
        response = client.responses.create(**kw)  # type: ignore[arg-type]
        done = list(response.output)
    assert rescued and rescued[-1] == ('{"command": ["echo", "hi"]}', True), rescued
    assert [(o.type, o.name, json.loads(o.arguments)) for o in done] == [
        ("function_call", "shell", {"command": ["echo", "hi"]})
    ], done
    assert [o.type for o in response.output] == ["function_call"]


def test_the_speculative_reader_reads_objects_only_for_offered_names():
    """``CallReader(names=...)``: a call no grammar holds is read as it comes
    only when it names an offered tool and its arguments are an object
    (under their key, or beside the name); everything else fails the reader
    and is left whole to the parsers and the rescue."""
    from turbospark.tools.streaming import CallReader, Closed, Opened, Piece

    def read(text: str) -> tuple[CallReader, list]:
        reader = CallReader(names=("Bash", "shell"))
        events = [e for ch in text for e in reader.feed(ch)]  # a character at a time
        return reader, events

    for text, args in [
        ('{"name": "Bash", "command": "ls -l", "timeout": 5}', {"command": "ls -l", "timeout": 5}),
        ('{"name": "Bash", "arguments": {"command": "ls"}}', {"command": "ls"}),
        ('<tool_call>\n{"name": "Bash", "parameters": {"command": "ls"}}\n</tool_call>', {"command": "ls"}),
    ]:
        reader, events = read(text)
        assert not reader.failed and isinstance(events[0], Opened) and events[0].name == "Bash", text
        streamed = "".join(e.text for e in events if isinstance(e, Piece))
        closed = [e for e in events if isinstance(e, Closed)]
        assert len(closed) == 1 and closed[0].call.arguments == streamed and json.loads(streamed) == args, text
    for text in [
        '{"name": "shell", "arguments": ["echo", "hi"]}',  # positional: the rescue's to mend
        '{"name": "Other", "arguments": {"x": 1}}',  # not offered
        '{"command": "ls", "name": "Bash"}',  # the name not first: parsed at the end
    ]:
        reader, events = read(text + " " * 1100)
        assert reader.failed and not events, text
    # cut inside the call: the text as written, not the arguments object
    reader, _ = read('{"name": "Bash", "command": "l')
    assert reader.partial_text == '{"name": "Bash", "command": "l'


def _slow_bash_call() -> tuple[list[str], dict]:
    """A name-beside call that takes about 6 s to write."""
    pieces = ['{"name": "Bash", ', '"command": "', *(["echo hi; "] * 60), 'true", "timeout": 5}']
    return pieces, {"command": "echo hi; " * 60 + "true", "timeout": 5}


def test_a_long_call_no_grammar_holds_streams_after_the_hold(short_hold: float):
    """A call in a shape no grammar holds (here the name beside its
    arguments) is held back while it may be mended whole, but once it has
    been written for HOLD_SECONDS it is read as it comes: its name and
    argument bytes stream in OpenAI's and Anthropic's shapes before it ends,
    and the call is the same as the one a non-streamed request gets."""
    hold = short_hold
    pieces, args = _slow_bash_call()
    srv, _, _ = scripted(Script(pieces, delay=0.07))  # about 4.4 s
    body = {"model": "scripted", "messages": [{"role": "user", "content": "run"}], "tools": [BASH]}
    a_tools = [{"name": "Bash", "input_schema": BASH["function"]["parameters"]}]
    a_body = {"model": "scripted", "max_tokens": 400, "messages": body["messages"], "tools": a_tools, "stream": True}

    def anthropic_stream() -> tuple[float | None, float, str, str | None]:
        start, first, partial, stop = time.monotonic(), None, "", None
        with httpx.stream("POST", srv.url + "/v1/messages", json=a_body, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    e = orjson.loads(line[6:])
                    if e["type"] == "content_block_start":
                        assert e["content_block"]["type"] == "tool_use" and e["content_block"]["name"] == "Bash"
                        first = time.monotonic() - start
                    elif e["type"] == "content_block_delta":
                        partial += e["delta"]["partial_json"]
                    elif e["type"] == "message_delta":
                        stop = e["delta"]["stop_reason"]
        return first, time.monotonic() - start, partial, stop

    def whole() -> dict:
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        return r.json()["choices"][0]["message"]

    # the three requests at once (the script sleeps between pieces, so they
    # do not slow one another): one call's time instead of three
    with srv, ThreadPoolExecutor(3) as pool:
        streamed = pool.submit(stream_chat, srv.url, body, timeout=60)
        anthropic, plain = pool.submit(anthropic_stream), pool.submit(whole)
        got, (a_first, a_total, partial, stop), message = streamed.result(), anthropic.result(), plain.result()
    first, total = got.first_call_at, got.total
    assert got.content == "" and got.names == ["Bash"] and got.finish == "tool_calls"
    assert json.loads(got.arguments) == args
    assert first is not None and hold <= first < hold + 1.5 < total - 1, (first, total)

    assert json.loads(partial) == args and stop == "tool_use"
    assert a_first is not None and a_first < a_total - 1

    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [args]


def test_json_after_text_is_not_held_back_for_long():
    """A JSON object after some text (never rescued: not the whole answer)
    is held only while a call's name may still show in it, for at most
    HOLD_SECONDS; then it and everything after it go out as they come (no
    second hold for the line already sent)."""
    from turbospark.core.answer import HOLD_SECONDS

    pieces = ["Here:\n", '{"function": "x", ', *(['"v": 1, '] * 40), '"w": 2}\n', *(["more text "] * 30)]
    srv, _, _ = scripted(Script(pieces, delay=0.1))  # about 7 s to write
    with srv:
        body = {
            "model": "scripted",
            "messages": [{"role": "user", "content": "json"}],
            "tools": [SHELL],
            "stream": True,
        }
        start, arrivals, content = time.monotonic(), [], ""
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    text = orjson.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                    if text:
                        arrivals.append((time.monotonic() - start, content + text))
                    content += text
        total = time.monotonic() - start
    assert content == "".join(pieces)
    json_at = next(t for t, so_far in arrivals if "{" in so_far)
    assert json_at < total - 2, (json_at, total)
    after = [t for t, _ in arrivals if t >= json_at]
    gaps = [b - a for a, b in zip(after, after[1:])]
    assert len(after) > 20 and max(gaps) < HOLD_SECONDS - 1, gaps


def test_calls_and_text_after_a_call_read_on_speculation_are_kept(short_hold: float):
    """A stream read on speculation has no grammar to stop the model after
    its call: a second call (JSON text, or a list's next item) and prose
    after the calls reach the client too (the prose as text), and
    ``parallel_tool_calls: false`` keeps to one call."""
    first = '{"name": "Bash", "arguments": {"command": "' + "echo hi; " * 80 + 'true"}, "id": "c1"}'
    pieces = [first[i : i + 12] for i in range(0, len(first), 12)] + [
        '\n{"name": "Bash", "arguments": {"command": "ls"}}',
        "\nDone.",
    ]
    srv, _, _ = scripted(Script(pieces, delay=0.05))  # about 3.3 s
    cases = ((True, ["echo hi; " * 80 + "true", "ls"]), (False, ["echo hi; " * 80 + "true"]))

    def run(parallel: bool) -> Any:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "run"}], "tools": [BASH],
                "stream": True, "parallel_tool_calls": parallel}  # fmt: skip
        return stream_chat(srv.url, body, timeout=60)

    # both at once (the script sleeps between pieces): one stream's time
    with srv, ThreadPoolExecutor(len(cases)) as pool:
        streams = list(pool.map(run, [parallel for parallel, _ in cases]))
    for (parallel, expected), got in zip(cases, streams):
        assert [json.loads(got.calls[i])["command"] for i in sorted(got.calls)] == expected, parallel
        assert got.content.strip() == "Done.", got.content  # the key after the arguments is no text
        first = got.first_call_at
        assert first is not None and first < got.total - 1  # the first call streamed


def test_the_speculative_reader_leaves_what_follows_its_calls():
    from turbospark.tools.streaming import CallReader, Closed

    reader = CallReader(names=("a",))
    text = '[{"name": "a", "arguments": {"x": 1}}, {"name": "a", "arguments": {"x": 2}}]'
    events = [e for ch in text for e in reader.feed(ch)]
    assert [json.loads(e.call.arguments) for e in events if isinstance(e, Closed)] == [{"x": 1}, {"x": 2}]
    # a call the reader does not take stays whole for the parsers at the end
    reader = CallReader(names=("a",))
    text = (
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}'
    )
    [reader.feed(ch) for ch in text]
    assert len(reader.calls) == 1 and reader.rest.endswith('{"name": "b", "arguments": {}}')
    assert reader.rest.lstrip("}\n").startswith("</tool_call>\n<tool_call>")


@pytest.fixture
def no_speculation(monkeypatch: pytest.MonkeyPatch) -> None:
    """HOLD_SECONDS beyond any test: nothing is read on speculation, so what
    streams is what a grammar holds."""
    import turbospark.core.answer as answer

    monkeypatch.setattr(answer, "HOLD_SECONDS", 10_000.0)


def test_real_qwen_long_bare_json_call_streams(qwen_server, no_speculation: None):
    """Asked for a long file as a bare JSON call (no ``<tool_call>`` tags),
    Qwen2.5-Coder-0.5B writes ``{"name": "write_file", "arguments": {...``
    for a few hundred tokens. Before the opening grammar the stream sent
    nothing until the budget ran out (then the cut JSON as text); later the
    speculative reader sent it after HOLD_SECONDS. Now the offered name
    wakes the opening grammar and the reader takes the call from its first
    bytes: it streams with speculation out of reach."""
    srv, _ = qwen_server
    write = {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a text file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    }
    ask = (
        "Call write_file to save a file named poem.txt whose content is a numbered list of the first 40 US "
        'states, one per line. Answer with only the JSON object {"name": "write_file", "arguments": {...}}, '
        "no tool_call tags."
    )
    body = {"model": "qwen", "messages": [{"role": "user", "content": ask}], "tools": [write],
            "temperature": 0, "max_tokens": 160, "stream": True}  # fmt: skip
    got = stream_chat(srv.url, body)
    first, total = got.first_call_at, got.total
    assert got.content == "" and got.names == ["write_file"], (got.content[:200], got.names)
    assert got.arguments.startswith('{"path": "poem.txt", "content": "1. Alabama'), got.arguments[:100]
    assert first is not None and first < total / 2, (first, total)  # streamed, not sent at the end


def test_real_qwen_arguments_beside_the_name_come_out_a_streamed_call(qwen_server, no_speculation: None):
    """Claude Code's run: Qwen answered ``{"name": "Bash", "command": …}``,
    the arguments beside the name. Told to write exactly that, with the
    timeout quoted (a string where the schema wants an integer: no rescue
    takes that, so without a grammar it is re-asked), through the Anthropic
    SDK: the opening grammar holds it to ``"arguments"`` once the name is
    out and to an integer after ``"timeout":``, so the call is valid at the
    first attempt (one ``generated``, no re-ask) and its input streams."""
    import anthropic

    srv, events = qwen_server
    client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
    tool = {"name": "Bash", "description": "Run a shell command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                              "timeout": {"type": "integer"}},
                             "required": ["command"]}}  # fmt: skip
    ask = 'Run echo hi. Answer with only the JSON object {"name": "Bash", "command": "echo hi", "timeout": "120000"}.'
    deltas = 0
    with client.messages.stream(
        model="qwen", max_tokens=80, tools=[tool], messages=[{"role": "user", "content": ask}],
        extra_body={"temperature": 0},
    ) as s:  # fmt: skip
        for e in s:
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta":
                deltas += 1
        msg = s.get_final_message()
        rid = s.response.headers["x-request-id"]
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and [u.name for u in uses] == ["Bash"], msg
    assert uses[0].input == {"command": "echo hi", "timeout": 120000}
    assert deltas >= 2, deltas
    assert len([e for e in events.of(int(rid)) if e.kind == "generated"]) == 1


def test_real_qwen_an_answer_cut_while_it_may_still_open_a_call_keeps_its_text(qwen_server):
    """The budget runs out inside the head of a bare JSON call (the engine
    still watching whether it opens one, so the router held it): nothing is
    lost, streamed or not; the cut head comes back as the answer's text."""
    srv, _ = qwen_server
    ask = 'Run echo hi. Answer with only the JSON object {"name": "Bash", "command": "echo hi"}.'
    body = {"model": "qwen", "messages": [{"role": "user", "content": ask}], "tools": [BASH],
            "temperature": 0, "max_tokens": 3}  # fmt: skip
    got = stream_chat(srv.url, body)
    whole = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300).json()["choices"][0]
    assert got.finish == whole["finish_reason"] == "length" and not got.names
    assert got.content.startswith("{") and got.content == whole["message"]["content"], (got.content, whole)
    assert not whole["message"].get("tool_calls")


#: a ChatML template that teaches Llama 3's tool syntax (it names
#: ``<|python_tag|>``), so Qwen is served with the ``llama3`` syntax: no call
#: marker, only a bare ``{"name": …, "parameters": …}`` answer
LLAMA3_STYLE = (
    "{%- if tools %}<|im_start|>system\nTo call a function, answer with only the JSON object "
    '{"name": function name, "parameters": its arguments}. Functions: {{ tools | tojson }}<|im_end|>\n'
    "{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{#- Llama 3 calls built-in tools after <|python_tag|> (role ipython) #}"
)


def test_real_qwen_llama3_syntax_calls_stream(no_speculation: None):
    """A model whose template teaches the Llama 3 syntax has no call marker
    for a lazy grammar to wait for: its calls are the whole answer. The
    opening grammar is its trigger (anchored at the answer's start), so a
    long call streams from its name on, with speculation out of reach."""
    from tests.support import Server
    from turbospark.engine.model import ModelOptions
    from turbospark.models.catalog import resolve_model

    options = ModelOptions(path=resolve_model("qwen2.5-coder-0.5b")[0], id="qwen-l3", ctx=2048, parallel=1,
                           chat_template=LLAMA3_STYLE)  # fmt: skip
    with Server(models=[options]) as srv:
        write = {"type": "function", "function": {"name": "write_file", "description": "Write a text file",
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                "content": {"type": "string"}}, "required": ["path", "content"]}}}  # fmt: skip
        ask = "Save a file named poem.txt whose content is a numbered list of the first 40 US states, one per line."
        body = {"model": "qwen-l3", "messages": [{"role": "user", "content": ask}], "tools": [write],
                "temperature": 0, "max_tokens": 160}  # fmt: skip
        got = stream_chat(srv.url, body)
    assert got.content == "" and got.names == ["write_file"], (got.content[:200], got.names)
    assert got.arguments.startswith('{"path": "poem.txt", "content": "1. Ala'), got.arguments[:100]
    assert got.first_call_at is not None and got.first_call_at < got.total / 2, (got.first_call_at, got.total)


def test_a_re_asked_answer_is_not_doubled():
    """A call-shaped answer naming no offered tool is re-asked; what the
    first attempt wrote from its call on is replaced by the second answer,
    never sent before it (Claude Code once printed the fenced JSON twice),
    and the corrective turn quotes the first answer once."""
    text = '```json\n{"name": "Check the status line", "arguments": {"query": "cars"}}\n```'
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    srv, model, obs = scripted(Script(pieces), Script(pieces), Script(pieces), Script(pieces))
    with srv:
        a_tools = [{"name": "Bash", "input_schema": BASH["function"]["parameters"]}]
        a_body = {"model": "scripted", "max_tokens": 200, "messages": [{"role": "user", "content": "hi"}],
                  "tools": a_tools, "stream": True}  # fmt: skip
        out = ""
        with httpx.stream("POST", srv.url + "/v1/messages", json=a_body, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    e = orjson.loads(line[6:])
                    if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
                        out += e["delta"]["text"]
        rid = int(s.headers["x-request-id"])
        assert out == text
        assert len([e for e in obs.of(rid) if e.kind == "generated"]) == 2  # it was re-asked
        corrective = model.calls[-1]["messages"]
        assert sum(str(m.get("content")).count('"Check the status line"') for m in corrective) == 1
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "tools": [BASH]}
        msg = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
        assert msg["content"] == text and not msg.get("tool_calls")


def test_the_speculative_reader_takes_fenced_calls_and_quoted_arguments():
    """Two shapes small models write: a call in a ```json fence, and
    arguments written as a JSON string of the object (decoded as they
    stream, so the pieces join into the object's text)."""
    from turbospark.tools.streaming import CallReader, Closed, Opened, Piece

    cases = [
        ('```json\n{"name": "Bash", "arguments": {"command": "ls"}}\n```', {"command": "ls"}),
        (
            '{"name": "Bash", "arguments": "{\\"command\\": \\"echo \\\\\\"hi\\\\\\" \\\\u00e9\\\\ud83d\\\\ude00\\"}"}',
            {"command": 'echo "hi" \u00e9\U0001f600'},
        ),
        (
            '{"name": "Bash", "arguments": "{\\"command\\": \\"caf\\u00e9 \\ud83d\\ude00\\"}"}',
            {"command": "caf\u00e9 \U0001f600"},
        ),
    ]
    for text, args in cases:
        reader = CallReader(names=("Bash",))
        events = [e for ch in text for e in reader.feed(ch)]
        assert not reader.failed and [e.name for e in events if isinstance(e, Opened)] == ["Bash"], text
        streamed = "".join(e.text for e in events if isinstance(e, Piece))
        closed = [e for e in events if isinstance(e, Closed)]
        assert len(closed) == 1 and closed[0].call.arguments == streamed and json.loads(streamed) == args, text
        assert len([e for e in events if isinstance(e, Piece)]) > 5  # as it comes, not at the end


def test_a_long_call_with_quoted_arguments_streams_after_the_hold(short_hold: float):
    args = {"command": "echo hi; " * 60 + "true"}
    text = '{"name": "Bash", "arguments": ' + json.dumps(json.dumps(args)) + "}"
    srv, _, _ = scripted(Script([text[i : i + 10] for i in range(0, len(text), 10)], delay=0.05))  # about 3.5 s
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "run"}], "tools": [BASH], "stream": True}
        got = stream_chat(srv.url, body, timeout=60)
    assert got.content == "" and json.loads(got.arguments) == args
    assert got.first_call_at is not None and got.first_call_at < got.total - 1, (got.first_call_at, got.total)


def test_quoted_arguments_that_are_no_object_are_left_to_the_parsers():
    """Only a string that holds an object streams as arguments; a lone
    surrogate escape in one becomes U+FFFD (JSON any encoder takes), a
    broken escape is dropped."""
    from turbospark.tools.streaming import CallReader, Closed

    for text in ('{"name": "Bash", "arguments": "ls -la"}', '{"name": "Bash", "arguments": ""}'):
        reader = CallReader(names=("Bash",))
        assert not [e for ch in text for e in reader.feed(ch)] and reader.failed, text
    text = '{"name": "Bash", "arguments": "{\\"command\\": \\"a\\ud83d b\\udc00 c\\u00zz\\"}"}'
    reader = CallReader(names=("Bash",))
    closed = [e for ch in text for e in reader.feed(ch) if isinstance(e, Closed)]
    assert len(closed) == 1 and orjson.loads(closed[0].call.arguments) == {"command": "a\ufffd b\ufffd czz"}
