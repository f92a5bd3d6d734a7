"""Tool-call grammars: exactly one call, in a model family's text syntax, with
arguments valid against the tool's parameters schema."""

from __future__ import annotations

import json
from typing import Any

from ..calls import HERMES_OPEN, MISTRAL_MARK, SYNTAXES, XML_FUNCTION, function_part
from .errors import UnsupportedSchema, _Empty
from .keywords import UNSUPPORTED
from .rules import _cls, _lit, _Rules, _seq
from .schema import _Converter


def _tool_spec(tool: Any) -> tuple[str, Any]:
    """(name, parameters schema) of an OpenAI-style tool (Anthropic/flat shapes accepted too)."""
    if not isinstance(tool, dict):
        raise ValueError(f"a tool must be an object, not {type(tool).__name__}")
    fn = function_part(tool)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("every tool needs a non-empty name")
    params = fn.get("parameters", fn.get("input_schema"))
    if params is None:
        params = {"type": "object", "properties": {}}
    return name, params


def _text_without(rules: _Rules, markers: list[str], hint: str) -> str:
    """A rule for any text (possibly empty) that contains none of ``markers``.

    An Aho-Corasick automaton over the markers, one rule per state, so the text
    is exact: e.g. ``<<tool_call>`` is refused, ``<tool`` at the end is fine.
    """
    prefixes = sorted({m[:i] for m in markers for i in range(len(m))}, key=len)
    chars = sorted({c for m in markers for c in m})
    names = {p: rules.reserve(f"{hint}-{i}") for i, p in enumerate(prefixes)}

    def step(state: str, c: str) -> str | None:
        t = state + c
        if any(t.endswith(m) for m in markers):
            return None
        for k in range(len(t) + 1):
            if t[k:] in names:
                return t[k:]
        return ""

    for p in prefixes:
        alts = ['""']
        for c in chars:
            nxt = step(p, c)
            if nxt is not None:
                alts.append(f"{_lit(c)} {names[nxt]}")
        others = _cls([(ord(c), ord(c)) for c in chars] + [(0, 0)], negate=True)
        alts.append(f"{others} {names['']}")
        rules.define(names[p], " | ".join(alts))
    return names[""]


def tool_call_grammar(
    tools: list[dict[str, Any]],
    syntax: str,
    name: str | None = None,
    allow_text: bool = False,
    *,
    bound_strings: bool = False,
    many: bool = False,
) -> str:
    """GBNF for one call to one of ``tools`` (or exactly ``name``), arguments valid against its schema.

    Syntaxes: ``hermes`` ``<tool_call>\\n{"name": "N", "arguments": A}\\n</tool_call>``;
    ``llama3`` ``{"name": "N", "parameters": A}``; ``json`` ``{"name": "N", "arguments": A}``;
    ``mistral`` ``[TOOL_CALLS][{"name": "N", "arguments": A}]``; ``xml`` (Qwen3-Coder)
    ``<tool_call>\\n<function=N>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>``
    with string parameters raw (never containing ``<``) and the others JSON.

    ``allow_text=False``: the call and nothing else. ``allow_text=True``: free
    text that never starts a call, optionally followed by a valid call (for
    ``llama3``/``json``: either a call or text not starting with ``{``).
    ``many``: one or more calls, separated by blanks (parallel calls).
    """
    if syntax not in SYNTAXES:
        raise ValueError(f"unknown tool-call syntax {syntax!r}; expected one of {', '.join(SYNTAXES)}")
    specs = [_tool_spec(t) for t in tools]
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise ValueError("tool names must be unique")
    if name is not None:
        specs = [(n, p) for n, p in specs if n == name]
        if not specs:
            raise ValueError(f"no tool named {name!r} among the offered tools")
    if not specs:
        raise ValueError("no tools to call")
    rules = _Rules()
    calls = []
    for fname, params in specs:
        conv = _Converter(rules, params, bound_strings)
        try:
            if syntax == "xml":
                body = _xml_call(conv, fname, params)
            else:
                args = conv.value(params, "#", f"{fname}-args")
                key = "parameters" if syntax == "llama3" else "arguments"
                head = _lit(f'{{"name": {json.dumps(fname, ensure_ascii=False)}, "{key}": ')
                body = _seq(head, args, '"}"')
                if syntax == "hermes":
                    body = _seq('"<tool_call>\\n"', body, '"\\n</tool_call>"')
                elif syntax == "mistral":
                    body = _seq('"[TOOL_CALLS]["', body, '"]"')
        except _Empty as e:
            raise UnsupportedSchema(f"tool {fname!r}: {e.feature}", e.path) from None
        except UnsupportedSchema as e:
            raise UnsupportedSchema(f"tool {fname!r}: {e.feature}", e.path) from None
        calls.append(rules.add(f"call-{fname}", body))
    call = rules.add("call", " | ".join(calls))
    if many:
        call = rules.add("calls", f"{call} ([ \\n]* {call})*")
    if not allow_text:
        return rules.render(call)
    if syntax in ("llama3", "json"):
        text = rules.add("text", "([^{ \\t\\n\\r] [^\\x00]*)?")
        return rules.render(f"{call} | {text}")
    markers = {"hermes": [HERMES_OPEN], "mistral": [MISTRAL_MARK], "xml": [HERMES_OPEN, XML_FUNCTION]}[syntax]
    text = _text_without(rules, markers, "text")
    return rules.render(f"{text} {call}?")


def _xml_call(conv: _Converter, fname: str, params: Any) -> str:
    r = conv.r
    s = conv.flatten(params, "#", ())
    for k in s:
        if k in UNSUPPORTED:
            raise UnsupportedSchema(UNSUPPORTED[k], "#")
    if any(k in s for k in ("anyOf", "oneOf", "enum", "const")) or s.get("type", "object") not in (
        "object",
        ["object"],
    ):
        raise UnsupportedSchema("the xml tool syntax needs a plain object parameters schema", "#")
    props = dict(s.get("properties", {}))
    required = list(s.get("required", ()))
    ap = s.get("additionalProperties", True)
    for pname in required:
        if pname not in props:
            if ap is False:
                raise _Empty(f"required property {pname!r} forbidden by additionalProperties", "#")
            props[pname] = ap
    parts = []
    for pname, ps in props.items():
        ppath, hint = f"#/properties/{pname}", f"{fname}-{pname}"
        req = pname in required
        try:
            saved, conv.left = conv.left, set()
            try:
                v = conv.raw_param(ps, ppath, hint) or conv.value(ps, ppath, hint)
            finally:
                conv.left = saved
        except _Empty:
            if req:
                raise
            continue
        item = _seq(_lit(f"<parameter={pname}>\n"), v, _lit("\n</parameter>\n"))
        item = r.add(f"{hint}-param", item)
        parts.append(item if req else f"{item}?")
    return _seq(_lit(f"<tool_call>\n<function={fname}>\n"), *parts, _lit("</function>\n</tool_call>"))
