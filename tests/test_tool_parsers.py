"""Tool-call syntaxes (tools/calls.py) and the reasoning splitter
(tools/reasoning.py): pure functions checked exactly, plus one short check
against the real Qwen2.5-Coder model's tokenizer and output."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from turbospark.tools.calls import (
    SYNTAXES,
    Parsed,
    ToolCall,
    call_start,
    parse_tool_calls,
    render_call,
    syntax_for_template,
)
from turbospark.tools.reasoning import ReasoningSplitter, split_reasoning

OFFERED = ["get_weather", "search"]
WEATHER = {"city": "Paris"}


def calls_of(p: Parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in p.calls]


def check(
    text: str, syntax: str, calls: list[tuple[str, dict]], content: str = "", problems: list[str] | None = None
) -> Parsed:
    p = parse_tool_calls(text, OFFERED)
    assert calls_of(p) == calls, p
    assert p.syntax == syntax, p
    assert p.content == content, p
    assert p.problems == (problems or []), p
    return p


# ------------------------------------------------------------------ hermes
def test_hermes_single_several_and_surrounding_text():
    check(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "hermes",
        [("get_weather", WEATHER)],
    )
    check(
        'Sure, checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"q": "Zürich"}}</tool_call>\nOne moment.',
        "hermes",
        [("get_weather", WEATHER), ("search", {"q": "Zürich"})],
        "Sure, checking both.\n\nOne moment.",
    )


def test_hermes_variants():
    # a list body, "parameters", no closing tag at the end, blank lines
    check(
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search", "parameters": {}}]</tool_call>',  # noqa: E501
        "hermes",
        [("get_weather", WEATHER), ("search", {})],
    )
    check(
        '<tool_call>\n\n  {"name": "get_weather",\n "parameters": {"city": "Paris"}}\n\n',
        "hermes",
        [("get_weather", WEATHER)],
    )
    check(
        'Text <tool_call>{"name": "search", "arguments": {"q": 1}}<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}',  # noqa: E501
        "hermes",
        [("search", {"q": 1}), ("get_weather", WEATHER)],
        "Text",
    )
    # arguments as a JSON string holding an object; a missing last brace; a fence inside the block
    check(
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        "hermes",
        [("get_weather", WEATHER)],
    )
    check(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
        "hermes",
        [("get_weather", WEATHER)],
    )
    check(
        '<tool_call>\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n</tool_call>',
        "hermes",
        [("get_weather", WEATHER)],
    )
    # no arguments at all inside a marker means none
    check('<tool_call>{"name": "search"}</tool_call>', "hermes", [("search", {})])


def test_call_ids_are_unique_and_well_formed():
    p = parse_tool_calls("".join(render_call("hermes", "search", {"q": i}) for i in range(20)), OFFERED)
    ids = [c.id for c in p.calls]
    assert len(ids) == 20 == len(set(ids))
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)
    assert all(isinstance(c, ToolCall) for c in p.calls)


# ------------------------------------------------------------------ llama3
def test_llama3():
    check(
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "llama3", [("get_weather", WEATHER)]
    )
    check('{"name": "get_weather", "parameters": {"city": "Paris"}}', "llama3", [("get_weather", WEATHER)])
    several = [("get_weather", WEATHER), ("search", {"q": "x"})]
    check(
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "search", "parameters": {"q": "x"}}',
        "llama3",
        several,
    )
    check(
        '{"name": "get_weather", "parameters": {"city": "Paris"}}\n{"name": "search", "arguments": {"q": "x"}}',
        "llama3",
        several,
    )
    check(
        'Let me look.<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}};\n{"name": "search", "parameters": {"q": "x"}}',  # noqa: E501
        "llama3",
        several,
        "Let me look.",
    )


# ----------------------------------------------------------------- mistral
def test_mistral():
    check(
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "mistral", [("get_weather", WEATHER)]
    )
    check(
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123XYZ"}, '
        '{"name": "search", "arguments": "{}"}]',
        "mistral",
        [("get_weather", WEATHER), ("search", {})],
    )
    check(
        'I will check. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "mistral",
        [("get_weather", WEATHER)],
        "I will check.",
    )
    check(
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{"q": "x"}',
        "mistral",
        [("get_weather", WEATHER), ("search", {"q": "x"})],
    )


# -------------------------------------------------------------------- json
def test_bare_json_anywhere():
    check('{"name": "get_weather", "arguments": {"city": "Paris"}}', "json", [("get_weather", WEATHER)])
    check(
        'I will call {"name": "get_weather", "arguments": {"city": "Paris"}} now.',
        "json",
        [("get_weather", WEATHER)],
        "I will call  now.",
    )
    check(
        'Checking.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nDone.',
        "json",
        [("get_weather", WEATHER)],
        "Checking.\n\nDone.",
    )
    check(
        '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search", "arguments": {"q": "x"}}]\n```',  # noqa: E501
        "json",
        [("get_weather", WEATHER), ("search", {"q": "x"})],
    )
    check(
        '{"type": "function", "function": {"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}}',
        "json",
        [("search", {"q": "x"})],
    )
    # a JSON answer that is not call-shaped is content, and so is a code block
    check('{"city": "Paris", "temp": 21}', None, [], '{"city": "Paris", "temp": 21}')
    code = "```python\nprint({'name': 1})\n```\n```\nplain\n```"
    check(code, None, [], code)


# --------------------------------------------------------------------- xml
def test_xml():
    qwen3 = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        '<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{"metric": true}\n</parameter>\n</function>\n</tool_call>'
    )
    check(qwen3, "xml", [("get_weather", {"city": "Paris", "days": 3, "opts": {"metric": True}})])
    check(
        "Looking.\n<function=search><parameter=q>two words</parameter></function>\n"
        "<function=get_weather><parameter=city>Paris</parameter></function> ok",
        "xml",
        [("search", {"q": "two words"}), ("get_weather", WEATHER)],
        "Looking.\n ok",
    )
    # no closing tags at the end of the output; a multi-line string stays a string
    check("<function=search>\n<parameter=q>\nline one\n  line two", "xml", [("search", {"q": "line one\n  line two"})])


# --------------------------------------------------------------- rejection
def test_unknown_names_are_rejected_with_a_problem():
    text = '<tool_call>{"name": "delete_files", "arguments": {}}</tool_call>'
    check(text, None, [], text, ["unknown name 'delete_files' (offered: get_weather, search)"])
    # one good, one bad: the good one is kept, the bad one stays in the text
    p = check(
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        "hermes",
        [("get_weather", WEATHER)],
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        ["unknown name 'rm' (offered: get_weather, search)"],
    )
    assert len(p.calls) == 1
    for syntax in SYNTAXES:
        p = parse_tool_calls(render_call(syntax, "launch", {"x": 1}), OFFERED)
        assert p.calls == [] and p.syntax is None, (syntax, p)
        assert p.problems == ["unknown name 'launch' (offered: get_weather, search)"], (syntax, p)
    # "functions.NAME" is read as NAME
    check('<tool_call>{"name": "functions.search", "arguments": {}}</tool_call>', "hermes", [("search", {})])


def test_nothing_offered_means_no_calls():
    text = render_call("hermes", "get_weather", WEATHER)
    assert parse_tool_calls(text, []) == Parsed(content=text, calls=[], syntax=None, problems=[])
    assert parse_tool_calls(text, iter(["get_weather"])).calls[0].name == "get_weather"  # any iterable


def test_malformed_json_and_bad_arguments_are_reported():
    bad = '<tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>'
    p = check(bad, None, [], bad, ["bad JSON in a <tool_call> block: Expecting value at char 46 (near 'Paris}}')"])
    p = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": ["Paris"]}</tool_call>', OFFERED)
    assert p.calls == [] and p.problems == ["the arguments of 'get_weather' are not an object (got list)"]
    p = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": "Paris"}</tool_call>', OFFERED)
    assert p.calls == [] and p.problems[0].startswith("the arguments of 'get_weather' are a string that is not JSON")
    p = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"t": NaN}}</tool_call>', OFFERED)
    assert p.calls == [] and p.problems[0].startswith("bad JSON in a <tool_call> block")
    p = parse_tool_calls("<tool_call>\n</tool_call>", OFFERED)
    assert p.problems == ["bad JSON in a <tool_call> block: it is empty"]
    p = parse_tool_calls('<tool_call>["get_weather"]</tool_call>', OFFERED)
    assert p.problems == ["a <tool_call> block does not hold a call object (got str)"]
    p = parse_tool_calls('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": }}]', OFFERED)
    assert p.calls == [] and p.problems[0].startswith("bad JSON after [TOOL_CALLS]")
    p = parse_tool_calls("[TOOL_CALLS]get_weather[ARGS]{city: 1}", OFFERED)
    assert p.calls == [] and p.problems[0].startswith("bad JSON arguments after [TOOL_CALLS]get_weather[ARGS]")
    p = parse_tool_calls("<|python_tag|>brave_search.call(query='x')", OFFERED)
    assert p.calls == [] and p.problems[0].startswith("bad JSON after <|python_tag|>")
    p = parse_tool_calls('Here: {"name": "get_weather", "arguments": {"city": "Paris" "x"}} ok', OFFERED)
    assert p.calls == [] and p.content.startswith("Here:")
    assert p.problems[0].startswith("malformed JSON call object at char 6")


# -------------------------------------------------------------- round trip
ARGS = {
    "city": "Zürich",
    "days": 3,
    "opts": {"metric": True, "hours": [1, 2]},
    "note": "42",
    "empty": "",
    "none": None,
    "text": "two\nlines",
}


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_render_call_round_trips(syntax):
    text = render_call(syntax, "get_weather", ARGS)
    p = parse_tool_calls(text, OFFERED)
    assert p.syntax == syntax and p.content == "" and p.problems == [], (text, p)
    assert calls_of(p) == [("get_weather", ARGS)]
    assert p.calls[0].arguments == json.dumps(ARGS, ensure_ascii=False)
    # two calls rendered one after the other (how assistant turns are replayed)
    two = render_call(syntax, "get_weather", WEATHER) + "\n" + render_call(syntax, "search", {})
    assert calls_of(parse_tool_calls(two, OFFERED)) == [("get_weather", WEATHER), ("search", {})]
    with pytest.raises(ValueError):
        render_call("smoke-signals", "x", {})


@pytest.mark.parametrize("syntax", ["hermes", "mistral", "xml"])
def test_marker_syntaxes_keep_surrounding_text(syntax):
    text = "Let me check that.\n" + render_call(syntax, "get_weather", WEATHER) + "\nBack soon."
    check(text, syntax, [("get_weather", WEATHER)], "Let me check that.\n\nBack soon.")


def test_syntax_for_template():
    assert syntax_for_template("{% if tools %}<tool_call>\n{{ tool_call | tojson }}</tool_call>{% endif %}") == "hermes"
    assert syntax_for_template("{{ '[TOOL_CALLS]' + tool_calls | tojson }}") == "mistral"
    assert syntax_for_template("{{ '<|python_tag|>' }}{% if message.role == 'ipython' %}") == "llama3"
    assert syntax_for_template("<|start_header_id|>ipython<|end_header_id|>") == "llama3"
    assert syntax_for_template("<tool_call>\n<function=name>\n<parameter=x>") == "xml"  # Qwen3-Coder
    assert syntax_for_template("{{ message.content }}") == "hermes"
    assert syntax_for_template("") == "hermes"


# -------------------------------------------------------------- call_start
STREAMED = [
    ("Let me check the weather.\n", render_call("hermes", "get_weather", WEATHER)),
    ("Checking. ", render_call("mistral", "get_weather", WEATHER)),
    ("Checking. ", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
    ("", render_call("llama3", "get_weather", WEATHER)),
    ("Sure thing. ", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("", render_call("json", "get_weather", WEATHER)),
    ("I will look it up.\n", render_call("json", "get_weather", WEATHER)),
    ("I will look it up.\n  ", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("Here you go:\n", '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'),
    ("Working on it.\n", render_call("xml", "get_weather", WEATHER)),
    ("Working on it: ", "<function=get_weather><parameter=city>Paris</parameter></function>"),
]


@pytest.mark.parametrize("prose,call", STREAMED)
def test_call_start_on_every_prefix(prose, call):
    text = prose + call
    for k in range(len(text) + 1):
        got = call_start(text[:k])
        if k <= len(prose):
            assert got is None, (text[:k], got)
        else:  # from its first character on, the call is held back
            assert got == len(prose), (text[:k], got)


PROSE = [
    "The weather in Paris is mild today, around 21 degrees.",
    "Sure! Here are three tips:\n1. Drink water.\n2. Sleep well.\n3. Walk daily.",
    "Hello there, how can I help you?\n\nI am a helpful assistant.",
]


@pytest.mark.parametrize("text", PROSE)
def test_call_start_never_fires_on_prose(text):
    assert all(call_start(text[:k]) is None for k in range(len(text) + 1))


def test_call_start_releases_what_turns_out_to_be_prose():
    assert call_start("if a <") == 5 and call_start("if a < b then") is None
    assert call_start("see [") == 4 and call_start("see [1] and [2]") is None
    assert call_start('Use a dict like {"name": 1} here.') is None  # not at a line start
    assert call_start('{"city": "Paris"}') is None
    assert call_start("{") == 0 and call_start('{\n  "na') == 0 and call_start('{"type": 1}') is None
    code = "```python\nprint(1)\n```\nDone."
    assert call_start(code[:3]) == 0 and call_start(code[:5]) is None and call_start(code) is None
    assert call_start("```python\nx = 1\n```") is None  # a closing fence does not open a call
    assert call_start("Text\n<tool_") == 5 and call_start("Text\n<tool_call>") == 5
    assert call_start("Text <|python") == 5 and call_start("Text [TOOL_CA") == 5


# ------------------------------------------------------------- reasoning
REASONING_SAMPLES = [
    (
        "<think>\nThe user greets me.\nI should greet back.\n</think>\n\nHello! How can I help?",
        False,
        ("The user greets me.\nI should greet back.", "Hello! How can I help?"),
    ),
    ("\n<think>short</think>Answer.", False, ("short", "Answer.")),
    ("Okay, 2 + 2 is 4.\n</think>\n\nThe answer is 4.", True, ("Okay, 2 + 2 is 4.", "The answer is 4.")),
    ("<think>\n\n</think>\n\nNo thinking needed.", False, ("", "No thinking needed.")),
    ("Plain answer with a < sign and </thin text.", False, ("", "Plain answer with a < sign and </thin text.")),
    ("  Leading space kept.", False, ("", "  Leading space kept.")),
    ("<think>still thinking when the budget ran out  ", False, ("still thinking when the budget ran out", "")),
    ("thinking <think> more</think>done", True, ("thinking  more", "done")),
    ("answer</think>\n tail", False, ("", "answertail")),
]


@pytest.mark.parametrize("text,start,expected", REASONING_SAMPLES)
def test_split_reasoning(text, start, expected):
    assert split_reasoning(text, start_in_reasoning=start) == expected


def run_splitter(pieces: list[str], **kw) -> list[tuple[str, str]]:
    s = ReasoningSplitter(**kw)
    out = [part for p in pieces for part in s.feed(p)] + s.flush()
    assert all(text for _, text in out)
    assert all(kind in ("reasoning", "content") for kind, _ in out)
    return out


def joined(parts: list[tuple[str, str]]) -> tuple[str, str]:
    return "".join(t for k, t in parts if k == "reasoning"), "".join(t for k, t in parts if k == "content")


@pytest.mark.parametrize("text,start,expected", REASONING_SAMPLES)
def test_splitter_at_every_split_point_matches_split_reasoning(text, start, expected):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3):
            parts = run_splitter([text[:i], text[i:j], text[j:]], start_in_reasoning=start)
            assert joined(parts) == expected, (i, j, parts)
            for _, piece in parts:  # a tag is never leaked into either channel
                assert "<think>" not in piece and "</think>" not in piece
    one_by_one = run_splitter(list(text), start_in_reasoning=start)
    assert joined(one_by_one) == expected


def test_splitter_streams_in_order_and_holds_only_what_it_must():
    s = ReasoningSplitter()
    assert s.feed("<thi") == []
    assert s.feed("nk>Let me") == [("reasoning", "Let me")]
    assert s.feed(" think </th") == [("reasoning", " think")]
    assert s.feed("ink>\n\nIt is ") == [("content", "It is ")]
    assert s.feed("4.") == [("content", "4.")]
    assert s.flush() == []
    s = ReasoningSplitter("[THINK]", "[/THINK]")
    assert s.feed("[THINK]a[/THINK]b") == [("reasoning", "a"), ("content", "b")]
    assert split_reasoning("<|channel|>x<|end|>y", "<|channel|>", "<|end|>") == ("x", "y")


# --------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def qwen():
    from turbospark.engine.model import LlamaChatModel, ModelOptions
    from turbospark.models.catalog import resolve_model

    model = LlamaChatModel(
        ModelOptions(path=resolve_model("qwen2.5-coder-0.5b")[0], id="qwen-tools", parallel=1, ctx=2048)
    )
    yield model
    model.close()


def test_qwen_template_tokenizer_and_output(qwen):
    from turbospark.engine.types import CancelFlag, GenerationConfig

    assert syntax_for_template(qwen.file.chat_template()) == "hermes"
    # the rendered call is what the model's tokenizer knows: <tool_call> is one token, and the text survives
    text = render_call("hermes", "get_weather", WEATHER)
    ids = qwen.tokenize(text, add_special=False, parse_special=True)
    assert qwen.file.token_text(ids[0]) == "<tool_call>"
    assert calls_of(parse_tool_calls(qwen.detokenize(ids), ["get_weather"])) == [("get_weather", WEATHER)]
    # real output for a weather question, streamed: the call is held back from its first piece on
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    ids = qwen.render_chat([{"role": "user", "content": "What is the weather in Paris right now?"}], tools=tools)
    pieces: list[str] = []
    config = GenerationConfig(temperature=0, max_new_tokens=60)
    asyncio.run(qwen.run_completion(ids, config, None, CancelFlag(), lambda p: pieces.append(p.text)))
    out = "".join(pieces)
    p = parse_tool_calls(out, ["get_weather"])
    assert [c.name for c in p.calls] == ["get_weather"], out
    assert "paris" in json.loads(p.calls[0].arguments)["city"].lower()
    start = call_start(out)
    assert start is not None and out[:start].strip() == p.content


def test_the_engines_tool_calls_ending_stands_only_with_a_valid_call():
    from turbospark.core.request import Final
    from turbospark.engine.types import RawDecodeResult, StopReason
    from turbospark.tools.calls import ToolCall

    raw = RawDecodeResult(
        prompt_tokens=5, new_tokens=9, prefill_seconds=0.1, decode_seconds=0.2, reason=StopReason.TOOL_CALLS
    )
    final = Final(
        result=raw, text="", reasoning="", tool_calls=[], attempts=[raw], reasoning_tokens=0, problems=["bad"]
    )
    assert final.reason is StopReason.END_OF_TURN  # the call failed its schema: no call
    call = ToolCall(id="call_" + "0" * 24, name="get_weather", arguments='{"city": "Paris"}')
    final = Final(result=raw, text="", reasoning="", tool_calls=[call], attempts=[raw], reasoning_tokens=0, problems=[])
    assert final.reason is StopReason.TOOL_CALLS
