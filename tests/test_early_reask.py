"""A call that names no offered tool is re-asked the moment its name is out
(CONTRACT §8): its run is stopped there rather than written to its end, and
the second attempt goes out as it comes. With no re-ask to come (guardrails
off, or the re-ask's own run) such a call is text at once, and so is a text
read on speculation that turns out to be no call: a stream is never silent
for long while tokens come. Exact shapes from a scripted model; the real
Qwen model is made to name a tool it was not offered."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from tests.support import Script, generated, scripted, stream_chat
from tests.test_tool_rescue import BASH
from turbospark.core.answer import after_call
from turbospark.engine.types import CancelFlag

#: a call to a tool nobody offered whose arguments take 100 pieces to write
MISNAMED = ['{"name": "UpdateConfig", ', '"arguments": {"value": "', *(["x "] * 100), '"}}']
GOOD = ['{"name": "Bash", "arguments": {"command": "ls"}}']


@pytest.fixture
def short_hold(monkeypatch: pytest.MonkeyPatch) -> float:
    import turbospark.core.answer as answer

    monkeypatch.setattr(answer, "HOLD_SECONDS", 1.0)
    return 1.0


def test_a_child_flag_follows_its_parent_and_stops_alone():
    parent = CancelFlag()
    alone = parent.child()
    alone.cancel("re-asked")
    assert alone.cancelled and not parent.cancelled
    child = parent.child()
    parent.fail(RuntimeError("server stopping"))
    assert child.cancelled and isinstance(child.error, RuntimeError)
    late = parent.child()  # made after the parent was set: set at once
    assert late.cancelled and late.error is parent.error


@pytest.mark.parametrize("stream", [True, False])
def test_a_misnamed_call_is_re_asked_once_its_name_is_out(stream: bool):
    """The first attempt stops a few pieces after the name (not after its
    100 pieces of arguments); the re-ask's valid call is the answer."""
    srv, model, obs = scripted(Script(MISNAMED, delay=0.02), Script(GOOD))
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "list"}], "tools": [BASH]}
        if stream:
            got = stream_chat(srv.url, body, timeout=60)
            assert got.names == ["Bash"] and json.loads(got.arguments) == {"command": "ls"}, got
            assert got.content == "" and got.finish == "tool_calls"
            rid = next(e.id for e in obs.events if e.kind == "generated")  # the one request
        else:
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
            msg = r.json()["choices"][0]["message"]
            assert msg["tool_calls"][0]["function"]["name"] == "Bash" and not msg["content"], msg
            rid = int(r.headers["x-request-id"])
        gens = generated(obs, rid)
    assert [g.stop_reason for g in gens] == ["cancelled", "endOfTurn"], gens
    assert gens[0].new_tokens < 10, gens[0]  # stopped near the name, not at the 102nd piece
    corrective = model.calls[-1]["messages"][-1]["content"]
    assert "unknown name 'UpdateConfig'" in corrective and "Bash" in corrective
    # the corrective turn asks for a call: the second attempt is held to one
    # from its first token (a forced grammar, no trigger), the first was lazy
    first, second = [c["config"] for c in model.calls if "config" in c]
    assert first.grammar_trigger is not None and second.grammar is not None and second.grammar_trigger is None


def test_a_misnamed_call_without_a_re_ask_streams_as_text():
    """Guardrails off: nothing can make it a call, so it is text as soon as
    its name shows it is none, and the rest streams as it is written."""
    srv, _, obs = scripted(Script(MISNAMED, delay=0.03), guardrails=False)  # about 3 s to write
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "list"}], "tools": [BASH]}
        got = stream_chat(srv.url, body, timeout=60)
    assert got.content == "".join(MISNAMED) and not got.names  # nothing lost, nothing doubled
    assert got.first_content_at is not None and got.first_content_at < got.total / 2, (got.first_content_at, got.total)
    assert len([e for e in obs.events if e.kind == "generated"]) == 1


def test_a_re_asked_stream_sends_its_second_attempt_as_it_comes():
    """The re-ask's own text streams (it is no longer collected whole)."""
    answer = ["I ", "cannot ", "change ", "the ", "configuration", *([" here"] * 60), "."]
    srv, _, _ = scripted(Script(MISNAMED[:3]), Script(answer, delay=0.04))  # the second: about 2.6 s
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "list"}], "tools": [BASH]}
        got = stream_chat(srv.url, body, timeout=60)
    assert got.content == "".join(answer) and not got.names
    assert got.first_content_at is not None and got.first_content_at < got.total / 2, (got.first_content_at, got.total)


def test_a_speculative_read_that_is_no_call_is_text_from_then_on(short_hold: float):
    """An offered name whose arguments are a plain string (no object: no
    reader can stream it): once the hold is over it is text as it comes,
    not held to the end."""
    pieces = ['{"name": "Bash", ', '"arguments": "', *(["echo hi; "] * 80), '"}']
    srv, _, _ = scripted(Script(pieces, delay=0.04), guardrails=False)  # about 3.3 s
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "run"}], "tools": [BASH]}
        got = stream_chat(srv.url, body, timeout=60)
    assert got.content == "".join(pieces) and not got.names
    assert got.first_content_at is not None and got.first_content_at < short_hold + 1.5 < got.total - 0.5, got


def test_the_router_holds_a_misnamed_call_only_for_a_re_ask():
    from tests.fakes import ScriptedModel
    from turbospark.core.answer import Router
    from turbospark.core.generation import prepare
    from turbospark.core.request import ChatRequest
    from turbospark.models.local import LocalBackend

    req = ChatRequest(messages=[{"role": "user", "content": "x"}], tools=[BASH])
    prepared = prepare(LocalBackend(ScriptedModel()), req)
    head = '{"name": "UpdateConfig", "arguments": {'
    held = Router(prepared, live=True, reask=True)
    assert held.feed(head) == [] and held.misnamed is not None and "UpdateConfig" in held.misnamed
    assert held.feed('"value": 1}}') == [] and held.tail == head + '"value": 1}}'
    free = Router(prepared, live=True, reask=False)
    out = free.feed(head)
    assert [d.text for d in out] == [head]
    assert [d.text for d in free.feed('"value": 1}}')] == ['"value": 1}}']
    offered = Router(prepared, live=True, reask=True)  # a qualified offered name is no misnaming
    assert offered.feed('{"name": "functions.Bash", "arguments": {') == [] and offered.misnamed is None


def test_real_qwen_a_call_to_a_tool_not_offered_is_re_asked_early(qwen_server):
    """Told to answer with a call to ``UpdateConfig`` while only ``Bash`` is
    offered, Qwen2.5-Coder-0.5B writes it; the run is stopped within a few
    steps of the name (its arguments would take 150 tokens more) and re-asked.
    The second attempt is held to a valid call by a grammar (the corrective
    turn asks for one), so the answer is a Bash call, streamed or not."""
    srv, events = qwen_server
    value = "a long value " * 50  # about 150 tokens: the whole call would take more than 160
    ask = "Answer with only this JSON object and nothing else: " + json.dumps(
        {"name": "UpdateConfig", "arguments": {"key": "theme", "value": value}}
    )
    body = {"model": "qwen", "messages": [{"role": "user", "content": ask}], "tools": [BASH],
            "temperature": 0, "max_tokens": 300}  # fmt: skip
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    gens = generated(events, r.headers["x-request-id"])
    assert len(gens) == 2 and gens[0].stop_reason == "cancelled", gens
    # stopped soon after the name (prompt-lookup drafts let a step take many
    # tokens, and the step goes on while the re-ask is prepared)
    assert gens[0].new_tokens < 80, gens[0]
    msg = r.json()["choices"][0]["message"]
    # the re-ask is held to a valid call by a grammar: the one offered tool
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["Bash"], msg
    assert isinstance(json.loads(msg["tool_calls"][0]["function"]["arguments"])["command"], str)
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as s:
        text = s.read().decode()
    gens = generated(events, s.headers["x-request-id"])
    assert len(gens) == 2 and gens[0].stop_reason == "cancelled" and gens[0].new_tokens < 80, gens
    streamed = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    names = [c["function"].get("name") for f in streamed for c in f["choices"][0]["delta"].get("tool_calls") or []]
    assert [n for n in names if n] == ["Bash"] and text.rstrip().endswith("data: [DONE]"), text[-300:]


def test_real_qwen_concurrent_re_asks_each_end_once_and_free_the_slot(qwen_server):
    """Three clients at once (two streams, one whole body) each get the
    misnamed call of the test above: every request is stopped and re-asked
    on its own (the queue of a one-slot server between them), each answers
    with one Bash call, each finishes once, and no run is left holding the
    slot."""
    from concurrent.futures import ThreadPoolExecutor

    srv, events = qwen_server
    ask = "Answer with only this JSON object and nothing else: " + json.dumps(
        {"name": "UpdateConfig", "arguments": {"key": "theme", "value": "a long value " * 30}}
    )
    body = {"model": "qwen", "messages": [{"role": "user", "content": ask}], "tools": [BASH],
            "temperature": 0, "max_tokens": 200}  # fmt: skip

    def one(stream: bool) -> tuple[str, list[str]]:
        if not stream:
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            return r.headers["x-request-id"], [
                c["function"]["name"] for c in r.json()["choices"][0]["message"]["tool_calls"]
            ]
        got = stream_chat(srv.url, body)
        assert got.done, got
        return got.rid, got.names

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, [True, True, False]))
    for rid, names in results:
        assert names == ["Bash"], (rid, names)
        gens = generated(events, rid)
        assert len(gens) == 2 and gens[0].stop_reason == "cancelled", gens
        assert [e.kind for e in events.of(int(rid))].count("requestFinished") == 1
    slots = httpx.get(srv.url + "/v1/slots", timeout=30).json()["data"]
    assert slots and not any(s["state"] == "busy" for s in slots), slots


# ----------------------------------------------------------------- repeats
#: Codex's shell tool as the real-model repeat tests offer it
SHELL = {"type": "function", "function": {"name": "shell", "description": "Run a command",
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"]}}}  # fmt: skip
LS = [
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.txt b.txt"},
]  # fmt: skip


def _grammar_model(*scripts: Script):
    from tests.fakes import ScriptedModel
    from tests.support import Server
    from turbospark.observe.memory import ListObserver

    model = ScriptedModel(scripts=list(scripts), enforces_grammars=True)
    obs = ListObserver()
    return Server(models=[model], observer=obs), model, obs


def test_a_streamed_call_that_repeats_an_answered_one_is_re_asked_with_its_result():
    """A stream's grammar-held call that is exactly one the conversation
    already has a result for is held while it may be that call; once whole
    and the same, nothing of it has gone out: the run stops and the result
    is handed back (the answer is the second attempt's text)."""
    again = ["<tool_call>\n", '{"name": "Bash", ', '"arguments": {"command": "', "ls", '"}}\n</tool_call>']
    answer = ["The ", "files ", "are ", "a.txt ", "and ", "b.txt."]
    srv, model, obs = _grammar_model(Script([*again, *(["\n"] * 60)], delay=0.02), Script(answer))
    with srv:
        body = {"model": "scripted", "messages": LS, "tools": [BASH]}
        got = stream_chat(srv.url, body, timeout=60)
    assert got.content == "".join(answer) and not got.names and got.finish == "stop", got
    gens = [e for e in obs.events if e.kind == "generated"]
    assert [g.stop_reason for g in gens] == ["cancelled", "endOfTurn"] and gens[0].new_tokens < 20, gens
    assert "The function result is: a.txt b.txt" in model.calls[-1]["messages"][-1]["content"]


def test_a_call_to_an_answered_tool_with_new_arguments_streams(short_hold: float):
    """A call to an answered tool is held until it is whole, but a long one
    no longer than the hold: then it streams (and is no repeat)."""
    call = ["<tool_call>\n", '{"name": "Bash", ', '"arguments": {"command": "', "ls", " -l", *([" ."] * 60), '"}}',
            "\n</tool_call>"]  # fmt: skip
    srv, _, obs = _grammar_model(Script(call, delay=0.05))  # about 3.3 s
    with srv:
        got = stream_chat(srv.url, {"model": "scripted", "messages": LS, "tools": [BASH]}, timeout=60)
    assert got.names == ["Bash"] and json.loads(got.arguments) == {"command": "ls -l" + " ." * 60}, got
    assert got.first_call_at is not None and got.first_call_at < got.total - 1, (got.first_call_at, got.total)
    assert len([e for e in obs.events if e.kind == "generated"]) == 1


#: a long command the conversation already ran (Claude Code's run: the
#: model called its Agent tool ten times with the same 400-token input)
LONG_COMMAND = "echo " + " ".join(f"word{i}" for i in range(60))
LONG_LS = [
    LS[0],
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "Bash", "arguments": json.dumps({"command": LONG_COMMAND})}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "word0 word1 …"},
]  # fmt: skip


def _long_call(command: str) -> list[str]:
    words = command.split(" ")
    return ["<tool_call>\n", '{"name": "Bash", ', '"arguments": {"command": "', words[0],
            *[" " + w for w in words[1:]], '"}}', "\n</tool_call>"]  # fmt: skip


def test_a_long_repeat_is_held_past_the_hold_while_it_stays_the_same(short_hold: float):
    """Written slowly (3 s, three times the hold), the call stays the same as
    the answered one character for character: it is held to its end and is
    a repeat (nothing of it goes out, the result is handed back)."""
    answer = ["It ", "printed ", "the ", "words."]
    srv, model, obs = _grammar_model(Script(_long_call(LONG_COMMAND), delay=0.05), Script(answer))
    with srv:
        got = stream_chat(srv.url, {"model": "scripted", "messages": LONG_LS, "tools": [BASH]}, timeout=60)
    assert got.content == "".join(answer) and not got.names, got
    assert len([e for e in obs.events if e.kind == "generated"]) == 2
    assert "The function result is: word0 word1" in model.calls[-1]["messages"][-1]["content"]


def test_a_long_call_that_differs_late_goes_out_when_it_differs(short_hold: float):
    """The same call until its 40th word, then another: it is held while it
    may be the repeat and goes out (whole so far, then as it comes) the
    moment it differs, not at its end."""
    changed = LONG_COMMAND.replace("word40", "other40")
    srv, _, obs = _grammar_model(Script([*_long_call(changed), *(["\n"] * 20)], delay=0.05))
    with srv:
        got = stream_chat(srv.url, {"model": "scripted", "messages": LONG_LS, "tools": [BASH]}, timeout=60)
    assert got.names == ["Bash"] and json.loads(got.arguments) == {"command": changed}, got
    # out at the 40th word (about 2.2 s in), well before the answer's end (4 s)
    assert got.first_call_at is not None and got.first_call_at < got.total - 1, (got.first_call_at, got.total)
    assert len([e for e in obs.events if e.kind == "generated"]) == 1


def test_a_repeat_with_its_keys_in_another_order_is_a_repeat():
    """Claude Code sends a call's input back as it parsed it: the repeat is
    compared as JSON (key order and blanks aside), not as text."""
    history = [dict(m) for m in LS]
    history[1] = {**LS[1], "tool_calls": [{"id": "c1", "type": "function",
                  "function": {"name": "Bash", "arguments": {"timeout": 5, "command": "ls"}}}]}  # fmt: skip
    again = ["<tool_call>\n", '{"name": "Bash", ', '"arguments": {"command":"ls",  "timeout": 5}}\n</tool_call>']
    srv, _, obs = _grammar_model(Script(again), Script(["Two ", "files."]))
    with srv:
        got = stream_chat(srv.url, {"model": "scripted", "messages": history, "tools": [BASH]}, timeout=60)
    assert got.content == "Two files." and not got.names, got
    assert len([e for e in obs.events if e.kind == "generated"]) == 2


def test_real_qwen_a_repeated_call_in_a_stream_gets_its_result_back(qwen_server):
    """Codex's run: after its shell call's result, Qwen2.5-Coder-0.5B calls
    the same command again (four times in a row there). In a stream the
    call is held while it repeats, so the result is handed back and the
    answer is text, not the same call once more."""
    srv, events = qwen_server
    echo = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command": ["echo", "hi"]}'}}
    msgs = [
        {"role": "user", "content": "Run echo hi in the shell and tell me what it printed."},
        {"role": "assistant", "content": None, "tool_calls": [echo]},
        {"role": "tool", "tool_call_id": "c1", "content": "hi\n"},
    ]
    got = stream_chat(
        srv.url, {"model": "qwen", "messages": msgs, "tools": [SHELL], "temperature": 0, "max_tokens": 100}
    )
    assert not got.names and "hi" in got.content, got
    gens = generated(events, got.rid)
    assert len(gens) == 2, gens  # the repeat (held, never sent), then the answer


def test_real_qwen_a_long_repeat_is_held_to_its_end(qwen_server, monkeypatch: pytest.MonkeyPatch):
    """Claude Code's run, on the real model: after a long call's result
    Qwen2.5-Coder-0.5B writes the same 166-token call again. It takes far
    longer than the hold (0.2 s here) but stays the same as the answered
    call as it comes, so it is held to its end, found a repeat, and the
    result is handed back: no call goes out (without the longer hold the
    call streamed after the hold and went out)."""
    import turbospark.core.answer as answer

    monkeypatch.setattr(answer, "HOLD_SECONDS", 0.2)
    srv, events = qwen_server
    words = ["echo"] + [f"line{i}" for i in range(40)]
    call = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": json.dumps({"command": words})}}
    msgs = [
        {
            "role": "user",
            "content": "Run echo with the words line0 to line39 in the shell and tell me what it printed.",
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": " ".join(words[1:]) + "\n"},
    ]
    got = stream_chat(
        srv.url, {"model": "qwen", "messages": msgs, "tools": [SHELL], "temperature": 0, "max_tokens": 300}
    )
    assert not got.names and "line39" in got.content, got
    gens = generated(events, got.rid)
    assert len(gens) == 2 and gens[0].new_tokens > 100, gens  # the long repeat (held, never sent), the answer


def test_a_misnamed_head_that_comes_after_the_hold_is_still_re_asked(short_hold: float):
    """The speculative reader is already reading when the name turns out to
    be no offered tool's: the held text is re-asked, not sent as text."""
    pieces = ['{"name": "', *(["Up"] * 40), 'date", ', '"arguments": {"v": 1}}']  # the name after about 2 s
    answer = ["No ", "such ", "tool."]
    srv, _, obs = scripted(Script(pieces, delay=0.05), Script(answer))
    with srv:
        got = stream_chat(srv.url, {"model": "scripted", "messages": [{"role": "user", "content": "x"}],
                                    "tools": [BASH]}, timeout=60)  # fmt: skip
    assert got.content == "".join(answer) and not got.names, got
    assert len([e for e in obs.events if e.kind == "generated"]) == 2


def test_only_the_answers_first_call_is_held_as_a_repeat():
    """A new call went out first: a repeat after it is not held (the turn
    does new work), and both calls stream."""
    first = ["<tool_call>\n", '{"name": "Bash", "arguments": {"command": "pwd"}}', "\n</tool_call>"]
    again = ["\n<tool_call>\n", '{"name": "Bash", "arguments": {"command": "ls"}}', "\n</tool_call>"]
    srv, _, obs = _grammar_model(Script([*first, *again]))
    with srv:
        got = stream_chat(srv.url, {"model": "scripted", "messages": LS, "tools": [BASH]}, timeout=60)
    assert got.names == ["Bash", "Bash"] and got.calls[1] == '{"command": "ls"}', got
    assert len([e for e in obs.events if e.kind == "generated"]) == 1


def test_heads_the_readers_know():
    from turbospark.tools.streaming import CallReader, Opened, head_name

    assert head_name("<tool_call>\n<function=UpdateConfig>\n<parameter=a>") == "UpdateConfig"
    assert head_name('{"id": "call_1", "name": "X", "arguments": {') == "X"
    assert head_name('{"name": "X", "command": "ls"') is None  # the beside shape: JSON data, maybe
    reader = CallReader(names=("Bash",))
    events = reader.feed('{"id": "call_1", "name": "Bash", "arguments": {"command": "ls"}}')
    assert not reader.failed and isinstance(events[0], Opened) and reader.calls[0].arguments == '{"command": "ls"}'
    reader = CallReader(names=("Bash",))
    assert reader.feed('{"id": "call_1", "arguments": {') == [] and reader.failed  # no name first: none coming


@pytest.mark.parametrize("parallel", [True, False])
def test_prose_after_a_call_read_on_speculation_streams(short_hold: float, parallel: bool):
    """A call no grammar holds, read on speculation, then an explanation:
    the explanation is text as it is written, not held to the answer's end
    (it can open no other call), with parallel calls or one call only."""
    call = '{"name": "Bash", "arguments": {"command": "ls"}}'
    prose = ["\nThis ", "lists ", "the ", "files", *([" here"] * 60), "."]
    srv, _, _ = scripted(Script([call[:20], call[20:], *prose], delay=0.05), guardrails=False)  # about 3.3 s
    body = {"model": "scripted", "messages": [{"role": "user", "content": "run"}], "tools": [BASH],
            "parallel_tool_calls": parallel}  # fmt: skip
    # the stream and the whole answer at once (the script sleeps between
    # pieces, so they do not slow one another): one answer's time
    with srv, ThreadPoolExecutor(2) as pool:
        streamed = pool.submit(stream_chat, srv.url, body, timeout=60)
        plain = pool.submit(httpx.post, srv.url + "/v1/chat/completions", json=body, timeout=60)
        got, whole = streamed.result(), plain.result().json()["choices"][0]["message"]
    assert got.names == ["Bash"] and json.loads(got.arguments) == {"command": "ls"}, got
    assert got.content == "".join(prose).lstrip("\n") == whole["content"], (got.content, whole)
    assert got.first_content_at is not None and got.first_content_at < got.total - 1, got


@pytest.mark.parametrize(
    "text,single",
    [
        # a key after the arguments, then prose
        ('{"name": "Bash", "arguments": {"command": "ls"}, "id": "call_1"}\nThis lists the files.', False),
        # one call only (parallel_tool_calls false): prose after it
        ('{"name": "Bash", "arguments": {"command": "ls"}}\nThis lists the files.', True),
        ('<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>\nThis lists the files.', True),
    ],
)
def test_prose_after_a_call_read_on_speculation_fails_the_reader_as_it_comes(text: str, single: bool):
    """What the router streams as text the moment it is known (a key that
    still belongs to the call, or one call only, does not keep prose held
    to the answer's end); a second call in either case is no prose."""
    from turbospark.tools.streaming import CallReader

    reader = CallReader(names=("Bash",), single=single)
    cut = text.index("This") + 1
    for ch in text[:cut]:
        reader.feed(ch)
    assert reader.prose and reader.failed and len(reader.calls) == 1, reader.rest
    assert after_call(reader.rest).startswith("T")
    reader = CallReader(names=("Bash",), single=single)
    reader.feed(text[: text.index("This")] + '\n{"name": "Bash", "arguments": {"command": "pwd"}}')
    assert not reader.prose and (len(reader.calls) == 1 or not single)  # (held for the parsers, or read)


def test_a_number_after_the_arguments_is_no_prose_until_it_ends():
    """``, "confidence": 0`` then ``.9``: the ``.`` is the number's, not
    prose (a value is whole only once what follows it says so)."""
    from turbospark.tools.streaming import CallReader

    reader = CallReader(names=("Bash",))
    for piece in ['{"name": "Bash", "arguments": {"command": "ls"}', ', "confidence": 0', ".", "9}"]:
        reader.feed(piece)
        assert not reader.failed, piece
    reader.feed("\nDone.")
    assert reader.prose and after_call(reader.rest) == "Done."


def test_prose_after_an_xml_call_read_on_speculation_fails_the_reader_as_it_comes():
    from turbospark.tools.grammar import xml_raw_parameters
    from turbospark.tools.streaming import XmlCallReader

    ls = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}
    call = "<tool_call>\n<function=ls>\n<parameter=path>\n/tmp\n</parameter>\n</function>\n</tool_call>\n"
    for single in (False, True):
        reader = XmlCallReader(xml_raw_parameters([ls]), ("ls",), single)
        for ch in call + "T":
            reader.feed(ch)
        assert reader.prose and reader.failed and len(reader.calls) == 1
        assert after_call(reader.rest) == "T"
        reader = XmlCallReader(xml_raw_parameters([ls]), ("ls",), single)
        reader.feed(call + "<tool_call>\n<function=ls>\n")
        assert not reader.prose and not reader.failed


def test_a_second_call_the_reader_cannot_take_is_still_parsed_at_the_end(short_hold: float):
    """After a call read on speculation, a second call in a shape the reader
    does not stream (its name after its arguments) is no prose: it is held
    and parsed at the end, sent whole, not sent as text."""
    first = '{"name": "Bash", "arguments": {"command": "' + "echo hi; " * 30 + 'true"}}'
    pieces = [first[i : i + 12] for i in range(0, len(first), 12)] + [
        '\n{"arguments": {"command": "ls"}, "name": "Bash"}'
    ]
    srv, _, _ = scripted(Script(pieces, delay=0.05), guardrails=False)  # about 1.5 s
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "run"}], "tools": [BASH]}
        got = stream_chat(srv.url, body, timeout=60)
    assert got.content.strip() == "" and got.names == ["Bash", "Bash"], got
    assert json.loads(got.calls[1]) == {"command": "ls"}


def test_prose_after_a_held_repeat_does_not_go_out_before_the_re_ask(short_hold: float):
    """Read on speculation, the repeated call and prose after it come in one
    piece: the prose belongs to the abandoned attempt and never reaches the
    client."""
    call = '{"name": "Bash", "arguments": {"command": "ls"}}'
    pieces = [call[:20], call[20:], "\nDone", *([" and more"] * 40)]
    answer = ["The ", "files ", "are ", "a.txt ", "and ", "b.txt."]
    srv, _, obs = scripted(Script(pieces, delay=0.05), Script(answer))
    with srv:
        got = stream_chat(srv.url, {"model": "scripted", "messages": LS, "tools": [BASH]}, timeout=60)
    assert got.content == "".join(answer) and not got.names, got
    assert len([e for e in obs.events if e.kind == "generated"]) == 2


def test_a_tool_beyond_the_forced_grammar_is_re_asked_unforced():
    """The forced re-ask's grammar cannot take a schema keyword the lazy one
    works around (``propertyNames``): the re-ask is made all the same,
    unforced, rather than dropped."""
    schema = {"type": "object", "properties": {"command": {"type": "string"}}, "propertyNames": {"pattern": "^[a-z]+$"}}
    loose = {"type": "function", "function": {"name": "Bash", "parameters": schema}}
    srv, model, obs = scripted(Script(MISNAMED[:3]), Script(GOOD))
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "list"}], "tools": [loose]}
        msg = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"]["name"] == "Bash", msg
    assert len([e for e in obs.events if e.kind == "generated"]) == 2
    second = [c["config"] for c in model.calls if "config" in c][-1]
    assert second.grammar_trigger is not None  # the lazy grammar again, not the forced one


def test_a_client_gone_during_the_re_ask_stops_it():
    """The client leaves while the second attempt streams: that run is
    cancelled too (no engine time leaks), and the request ends once, as a
    disconnect, after both runs' ``generated``."""
    answer = ["I ", "cannot ", *(["wait "] * 200)]
    srv, _, obs = scripted(Script(MISNAMED[:3]), Script(answer, delay=0.05))  # the second: 10 s
    with srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "x"}], "tools": [BASH], "stream": True}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as s:
            rid = int(s.headers["x-request-id"])
            for line in s.iter_lines():
                if '"content":"cannot "' in line:
                    break  # gone mid-way through the re-ask
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(e.kind == "requestFinished" for e in obs.of(rid)):
            time.sleep(0.05)
        time.sleep(0.2)  # anything recorded late would show now
        kinds = [e.kind for e in obs.of(rid)]
    gens = [e for e in obs.of(rid) if e.kind == "generated"]
    # (the first, three pieces long, may end before the stop reaches it)
    assert len(gens) == 2 and gens[1].stop_reason == "cancelled" and gens[1].new_tokens < 100, gens
    assert kinds.count("requestFinished") == 1 and kinds[-1] == "requestFinished", kinds
    assert obs.of(rid)[-1].error == "client disconnected"


@pytest.mark.parametrize("drain", [30.0, 0.5])
def test_a_shutdown_during_the_re_ask_lets_it_finish_or_cuts_it_cleanly(drain: float):
    """``Server.stop()`` (what SIGTERM does) while the second attempt
    streams: within the drain timeout the re-ask's answer is whole; past it
    the stream ends with the shutdown's error frame. Either way both runs
    report ``generated`` and the request finishes once."""
    import threading

    from tests.fakes import ScriptedModel
    from tests.support import Server
    from turbospark.observe.memory import ListObserver

    answer = ["I ", "cannot ", *(["wait "] * (40 if drain > 1 else 200)), "."]  # 2 s, or 10 s
    model = ScriptedModel(scripts=[Script(MISNAMED[:3]), Script(answer, delay=0.05)])
    obs = ListObserver()
    srv = Server(models=[model], observer=obs, drain_timeout=drain).start()
    body = {"model": "scripted", "messages": [{"role": "user", "content": "x"}], "tools": [BASH], "stream": True}
    lines: list[str] = []
    re_asking = threading.Event()
    got: dict[str, int] = {}

    def read() -> None:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as s:
            got["rid"] = int(s.headers["x-request-id"])
            for line in s.iter_lines():
                lines.append(line)
                if '"content":"cannot "' in line:
                    re_asking.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        assert re_asking.wait(60), lines
    finally:
        srv.stop()
    thread.join(30)
    text = "\n".join(lines).rstrip()
    content = "".join(
        c for line in lines if line.startswith("data: {")
        for c in [(orjson.loads(line[6:]).get("choices") or [{}])[0].get("delta", {}).get("content") or ""]
    )  # fmt: skip
    rid = got["rid"]
    gens = generated(obs, rid)
    kinds = [e.kind for e in obs.of(rid)]
    assert len(gens) == 2 and kinds.count("requestFinished") == 1 and kinds[-1] == "requestFinished", kinds
    if drain > 1:
        assert content == "".join(answer) and text.endswith("data: [DONE]"), text[-300:]
        assert obs.of(rid)[-1].error is None
    else:
        assert "shutting_down" in text and "data: [DONE]" not in text, text[-300:]
        assert gens[1].new_tokens < 200 and obs.of(rid)[-1].error, gens
