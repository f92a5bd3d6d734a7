"""Lazy grammars in the engine (the ground for tool calls that stream): the
output is free until the model writes the trigger, and from there it must
follow the grammar, on the real Qwen2.5-Coder model (whose ``<tool_call>`` is
one special token, so a logit bias can make the model open a call)."""

from __future__ import annotations

import asyncio
import json

import pytest

from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.engine.types import CancelFlag, GenerationConfig
from turbospark.models.catalog import resolve_model

#: the call with Qwen's marker tokens (151657, 151658) named by id
CALL = 'start: <[151657]> "\\n{\\"name\\": \\"ping\\"}\\n" <[151658]>'

#: the same with the markers as text (SmolLM2 has no such tokens)
CALL_TEXT = 'start: "<tool_call>" "\\n{\\"name\\": \\"ping\\"}\\n" "</tool_call>"'


@pytest.fixture(scope="module")
def qwen(qwen_server):
    """The shared Qwen server's own engine model (not a second load of the
    file): these tests run it directly, one generation at a time."""
    srv, _ = qwen_server
    return srv.registry.lookup("qwen").model.engine


def run(model, ids, **cfg):
    cfg.setdefault("max_new_tokens", 24)
    config = GenerationConfig(temperature=0, **cfg)
    return asyncio.run(model.run_completion(ids, config, None, CancelFlag(), lambda p: None))


def test_untriggered_the_output_is_free(qwen):
    ids = qwen.render_chat([{"role": "user", "content": "Say hello."}])
    free = run(qwen, ids)
    lazy = run(qwen, ids, grammar=CALL, grammar_trigger="<tool_call>")
    assert lazy.text == free.text and "ping" not in lazy.text


def test_once_triggered_the_grammar_holds(qwen):
    ids = qwen.render_chat([{"role": "user", "content": "Say hello."}])
    trigger = qwen.tokenize("<tool_call>", False, True)
    assert len(trigger) == 1  # one special token in Qwen's vocabulary
    # the model is made to open a call at once; the rest is the grammar's
    r = run(qwen, ids, grammar=CALL, grammar_trigger="<tool_call>", logit_bias={trigger[0]: 100.0})
    assert r.text == '<tool_call>\n{"name": "ping"}\n</tool_call>'
    assert r.reason.value in ("endOfTurn", "eos")
    # without the grammar the same start goes elsewhere
    loose = run(qwen, ids, logit_bias={trigger[0]: 100.0})
    assert loose.text != r.text


def test_a_call_the_model_opens_is_held_to_the_schema(qwen_server):
    """tool_choice auto: once Qwen opens a call (made to, here, by a logit
    bias on its ``<tool_call>`` token) the lazy grammar holds the call to the
    offered schema, so it is valid at the first attempt (one ``generated``,
    no re-ask), here an integer that must be exactly 1000."""
    import httpx

    srv, events = qwen_server
    tok = httpx.post(srv.url + "/tokenize", json={"content": "<tool_call>", "parse_special": True}).json()["tokens"]
    tool = {
        "type": "function",
        "function": {
            "name": "set_code",
            "description": "Set the code",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "integer", "minimum": 1000, "maximum": 1000}},
                "required": ["code"],
            },
        },
    }
    body = {
        "model": "qwen",
        "messages": [{"role": "user", "content": "Set the code to 7."}],
        "tools": [tool],
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 40,
        "logit_bias": {str(tok[0]): 100},
    }
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300)
    msg = r.json()["choices"][0]["message"]
    calls = msg.get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == ["set_code"], msg
    import json

    assert json.loads(calls[0]["function"]["arguments"]) == {"code": 1000}
    gens = [e for e in events.of(int(r.headers["x-request-id"])) if e.kind == "generated"]
    assert len(gens) == 1


def test_a_trigger_written_over_several_tokens_and_after_other_text():
    """SmolLM2 writes ``<tool_call>`` as five tokens, the first of them
    `` <`` (a space before the marker): the grammar takes over from there."""
    model = LlamaChatModel(ModelOptions(path=resolve_model("smollm2-135m")[0], id="s", ctx=1024, parallel=1))
    try:
        assert len(model.tokenize("<tool_call>", False, True)) > 1
        ids = model.prompt_ids("A: <tool_call>\nB: <tool_call>\nC: <tool_call>\nD:")
        free = run(model, ids, max_new_tokens=30)
        assert free.text.startswith(" <tool_call>\nE:")  # the model's own continuation
        held = asyncio.run(
            model.run_completion(
                ids,
                GenerationConfig(temperature=0, max_new_tokens=30, grammar=CALL_TEXT, grammar_trigger="<tool_call>"),
                None,
                CancelFlag(),
            )
        )
        assert held.text == ' <tool_call>\n{"name": "ping"}\n</tool_call>'
    finally:
        model.close()


BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}


def test_an_answer_that_opens_as_a_bare_call_is_held_from_its_name(qwen):
    """The opening grammar (tools/grammar.opening_call_grammar): Qwen told to
    answer with Claude Code's botched shape, the arguments beside the name,
    writes exactly that without it; with it, the name wakes the grammar and
    the same answer comes out as a valid call. A JSON answer that names no
    offered tool, and plain text, stay free; the ``<tool_call>`` marker's
    own lazy grammar still takes a call that opens with the marker."""
    from turbospark.engine.types import OPENING_HELD, OPENING_OFF, OPENING_WATCHED
    from turbospark.tools.grammar import opening_call_grammar, tool_call_grammar

    opening, trigger = opening_call_grammar([BASH])
    marker = tool_call_grammar([BASH], "hermes", specials={"<tool_call>": 151657, "</tool_call>": 151658})
    both = {"opening_grammar": opening, "opening_trigger": trigger, "grammar": marker, "grammar_trigger": "<tool_call>"}

    def answer(ask, **cfg):
        return run(qwen, qwen.render_chat([{"role": "user", "content": ask}]), max_new_tokens=60, **cfg)

    ask = 'Run echo hi. Answer with only the JSON object {"name": "Bash", "command": "echo hi", "timeout": 120000}.'
    loose = answer(ask)
    assert '"command"' in loose.text and '"arguments"' not in loose.text  # the botched shape, as told
    held = answer(ask, **both)
    assert json.loads(held.text) == {"name": "Bash", "arguments": {"command": "echo hi", "timeout": 120000}}
    assert held.reason.value == "endOfTurn"
    # the engine tells the router (Progress.opening) from the name on
    said: list[tuple[str, int]] = []
    ids = qwen.render_chat([{"role": "user", "content": ask}])
    config = GenerationConfig(temperature=0, max_new_tokens=60, **both)
    asyncio.run(qwen.run_completion(ids, config, None, CancelFlag(), lambda p: said.append((p.text, p.opening))))
    first = next(i for i, (_, state) in enumerate(said) if state == OPENING_HELD)
    assert all(h == OPENING_HELD for _, h in said[first:])
    assert all(h == OPENING_WATCHED for _, h in said[:first]) and '"Bash"' in "".join(t for t, _ in said[: first + 1])
    assert '"Bash"' not in "".join(t for t, _ in said[:first])
    for free in ("Give me a JSON object describing a person named Alice, aged 30.", "Say hello."):
        assert answer(free, **both).text == answer(free).text
        # the engine lets the router go as soon as no call can begin so
        states: list[int] = []
        ids = qwen.render_chat([{"role": "user", "content": free}])
        config = GenerationConfig(temperature=0, max_new_tokens=30, **both)
        asyncio.run(qwen.run_completion(ids, config, None, CancelFlag(), lambda p, st=states: st.append(p.opening)))
        assert OPENING_HELD not in states and states[-1] == OPENING_OFF
        assert states.count(OPENING_WATCHED) <= (10 if "Alice" in free else 0), states  # up to "A
    tok = qwen.tokenize("<tool_call>", False, True)
    marked = answer("Say hello.", logit_bias={tok[0]: 100.0}, **both)
    assert marked.text.startswith('<tool_call>\n{"name": "Bash", "arguments": {"command": "')


def test_the_router_reads_an_opening_call_only_when_the_engine_says_its_grammar_holds():
    """The router opens its reader on the trigger's match only with the
    engine's word (``Progress.opening``) that the opening grammar took hold:
    a match the engine did not take (a Llama 3 ``<|python_tag|>`` control
    token before it, invisible in the text; a token the grammar refused)
    stays with the hold and the parsers, as an unheld call."""
    from turbospark.core.answer import Delta, Router, ToolArgumentsDelta, ToolCallBegin
    from turbospark.core.request import Prepared
    from turbospark.engine.types import OPENING_HELD, OPENING_OFF, OPENING_WATCHED
    from turbospark.tools.grammar import opening_call_grammar

    _, trigger = opening_call_grammar([BASH])
    config = GenerationConfig(opening_trigger=trigger)
    prepared = Prepared([], config, None, "llama3", ("Bash",), call_grammar="lazy")
    text = '```json\n{"type": "function", "name": "Bash", "parameters": {"command": "ls -la'
    held = Router(prepared)
    # while the engine watches, nothing goes out, however long it takes (a
    # slow engine's first tokens: the hold's time limit does not apply)
    assert held.feed(text[:30], OPENING_WATCHED) == [] and held.feed(text[30:38], OPENING_HELD) == []
    out = held.feed(text[38:], OPENING_HELD)
    assert isinstance(out[0], ToolCallBegin) and out[0].name == "Bash"
    assert "".join(d.text for d in out if isinstance(d, ToolArgumentsDelta)) == '{"command": "ls -la'
    free = Router(prepared)
    assert free.feed(text, OPENING_OFF) == [] and free.reader is None  # held back, read at the end
    after = Router(prepared)  # the engine watches the answer's start only
    out = after.feed("Sure. ", OPENING_OFF) + after.feed(text[8:], OPENING_HELD)
    assert not any(isinstance(d, ToolCallBegin) for d in out) and after.reader is None
    plain = Router(prepared)
    assert plain.feed("Hello", OPENING_OFF) == [Delta("Hello")]


def test_what_closes_a_call_is_not_left_as_text():
    """After a call read as it came, what still belongs to it (its closing
    brace, the closing marker, a fence, even one the budget cut short) is
    not text; what follows it is."""
    from turbospark.core.answer import after_call

    assert after_call("}\n```") == ""
    assert after_call("}\n``") == ""  # the budget ran out inside the fence
    assert after_call("}\n</tool_call>\nDone.") == "Done."
    assert after_call(', "id": 3}\n`code` is next') == "`code` is next"  # a key after the arguments
    assert after_call('}, "type": "function"}\nok') == "ok"  # a key of a wrapper around the call
