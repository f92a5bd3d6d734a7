"""Tool calls written as text, in the syntaxes small models actually emit.

A model offered tools answers with a call in whatever syntax its training (or
its chat template) taught it. This module recognises those syntaxes, keeps
only calls to OFFERED functions (everything else becomes a human-readable
problem the guardrails can feed back to the model) and returns the text with
the recognised calls cut out.

Syntaxes, tried in this order (the first one whose marker is present decides;
bare JSON is the fallback):

- ``xml``:     ``<function=NAME><parameter=KEY>VALUE</parameter></function>``,
               optionally inside ``<tool_call>`` (Qwen3-Coder)
- ``hermes``:  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen, Hermes)
- ``mistral``: ``[TOOL_CALLS][{...}]`` or ``[TOOL_CALLS]name[ARGS]{...}``
- ``llama3``:  ``<|python_tag|>{...}``, or a whole output of ``{"name", "parameters"}`` objects
- ``json``:    ``{"name": ..., "arguments": ...}`` (or a list of them) anywhere,
               also inside a ```json fence

Only calls that were accepted are removed from ``content``: a rejected call
(unknown name, broken JSON) stays in the text, so nothing the model wrote is
silently lost, and ``syntax`` is None when no call was accepted.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CALL_TRIGGERS",
    "SYNTAXES",
    "Parsed",
    "ToolCall",
    "call_start",
    "new_call_id",
    "parse_tool_calls",
    "render_call",
    "syntax_for_template",
]

SYNTAXES = ("hermes", "llama3", "mistral", "json", "xml")

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_MARK = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"
XML_FUNCTION = "<function="
#: markers whose appearance in a streamed text means a call has begun
MARKERS = (HERMES_OPEN, XML_FUNCTION, MISTRAL_MARK, PYTHON_TAG)
#: the text that opens a call in each syntax that has one: a lazy grammar
#: switched on by it makes every call the model starts a valid one
CALL_TRIGGERS = {"hermes": HERMES_OPEN, "mistral": MISTRAL_MARK, "xml": HERMES_OPEN}


@dataclass
class ToolCall:
    id: str  # "call_" + 24 hex chars, unique
    name: str
    arguments: str  # canonical JSON object text


@dataclass
class Parsed:
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    syntax: str | None = None
    problems: list[str] = field(default_factory=list)


def function_part(entry: dict[str, Any]) -> dict[str, Any]:
    """The function object of an OpenAI-style tool or call
    (``{"function": {...}}``), or the entry itself for the flat shapes."""
    fn = entry.get("function")
    return fn if isinstance(fn, dict) else entry


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# ------------------------------------------------------------------ JSON bits
def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)
_WS = " \t\r\n"
#: closers tried when a bounded call body does not parse (small models often
#: drop the last brace or bracket)
_REPAIRS = ("}", "}}", "]", "}]", "}}]", "}}}")


def _error_text(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at char {exc.pos} (near {exc.doc[exc.pos : exc.pos + 16]!r})"
    return str(exc)


def _decode_at(text: str, pos: int, repair: bool) -> tuple[Any, int]:
    """One JSON value starting at ``pos``; with ``repair``, a value that runs
    to the end of ``text`` may be completed with a few closing brackets."""
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError as exc:
        # only a value cut short by the end of the text can be completed
        if repair and isinstance(exc, json.JSONDecodeError) and exc.pos >= len(text.rstrip()):
            body = text[pos:].rstrip()
            for closer in _REPAIRS:
                try:
                    value, end = _DECODER.raw_decode(body + closer)
                except ValueError:
                    continue
                if end == len(body) + len(closer):
                    return value, len(text)
        raise exc


def _decode_sequence(text: str, pos: int, repair: bool) -> tuple[list[tuple[int, int, Any]], int, str | None]:
    """JSON values separated by whitespace, ``;`` or ``,`` from ``pos``.
    Returns (values with spans, where reading stopped, error or None)."""
    values: list[tuple[int, int, Any]] = []
    while True:
        while pos < len(text) and (text[pos] in _WS or (values and text[pos] in ";,")):
            pos += 1
        if pos >= len(text):
            return values, pos, None
        try:
            value, end = _decode_at(text, pos, repair)
        except ValueError as exc:
            return values, pos, _error_text(exc)
        values.append((pos, end, value))
        pos = end


# ------------------------------------------------------------- candidates
@dataclass
class _Item:
    """One candidate call (or the reason it is not one)."""

    name: str | None = None
    args: Any = None
    key: str | None = None  # "arguments" | "parameters" | None
    problem: str | None = None


@dataclass
class _Found:
    """A stretch of text holding candidate calls; removed from the content
    when at least one of its calls is accepted."""

    start: int
    end: int
    items: list[_Item]


def _item_from_object(obj: Any, need_args: bool) -> _Item | None:
    """A call-shaped object as an item; None if it is not call-shaped.
    Accepts OpenAI's ``{"type": "function", "function": {...}}`` wrapper."""
    if not isinstance(obj, dict):
        return None
    if "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str):
        return None
    key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if key is None and need_args:
        return None
    if key is None:  # inside a call marker: the arguments may sit beside the name
        return _Item(name=name, args={k: v for k, v in obj.items() if k not in _NOT_ARGUMENTS})
    return _Item(name=name, args=obj.get(key), key=key)


#: keys of a call object that are never its arguments
_NOT_ARGUMENTS = ("name", "type", "id")


def _items_from_value(value: Any, where: str) -> list[_Item]:
    """Items from a value found inside a call marker (object or list)."""
    values = value if isinstance(value, list) else [value]
    if not values:
        return [_Item(problem=f"empty call list in {where}")]
    out = []
    for v in values:
        item = _item_from_object(v, need_args=False)
        if item is None:
            what = type(v).__name__ if not isinstance(v, dict) else "an object without a string 'name'"
            out.append(_Item(problem=f"{where} does not hold a call object (got {what})"))
        else:
            out.append(item)
    return out


def _strip_fence(body: str) -> str:
    s = body.strip()
    if s.startswith("```"):
        nl = s.find("\n")
        s = s[nl + 1 :] if nl >= 0 else ""
        if s.rstrip().endswith("```"):
            s = s.rstrip()[:-3]
    return s


# ---------------------------------------------------------------- parsers
Parser = Callable[[str], "list[_Found] | None"]
#: syntax -> parser, in the order they are tried; a parser returns None
#: when its syntax is absent, else what it found (possibly only problems)
PARSERS: dict[str, Parser] = {}


def _register(syntax: str) -> Callable[[Parser], Parser]:
    def deco(fn: Parser) -> Parser:
        PARSERS[syntax] = fn
        return fn

    return deco


_FUNCTION_RE = re.compile(r"<function=([^>\n]*)>")
_PARAM_RE = re.compile(r"<parameter=([^>\n]*)>")


def _xml_value(raw: str) -> Any:
    """A parameter's text: one newline of padding each side is layout; a
    value that parses as JSON is that JSON value, else the string."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    try:
        return _DECODER.decode(raw.strip())
    except ValueError:
        return raw


@_register("xml")
def _parse_xml(text: str) -> list[_Found] | None:
    starts = [m for m in _FUNCTION_RE.finditer(text)]
    if not starts:
        return None
    found = []
    for i, m in enumerate(starts):
        limit = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        close = text.find("</function>", m.end(), limit)
        body_end = close if close >= 0 else limit
        end = close + len("</function>") if close >= 0 else limit
        # a missing </function> at the end of a block: stop at </tool_call>
        if close < 0:
            tc = text.find(HERMES_CLOSE, m.end(), limit)
            if tc >= 0:
                body_end = end = tc
        body = text[m.end() : body_end]
        name = m.group(1).strip()
        args: dict[str, Any] = {}
        params = list(_PARAM_RE.finditer(body))
        for j, p in enumerate(params):
            stop = params[j + 1].start() if j + 1 < len(params) else len(body)
            pclose = body.find("</parameter>", p.end(), stop)
            args[p.group(1).strip()] = _xml_value(body[p.end() : pclose if pclose >= 0 else stop])
        start = m.start()
        # the optional <tool_call> wrapper belongs to the call
        before = re.search(r"<tool_call>\s*\Z", text[:start])
        if before:
            start = before.start()
            after = re.match(r"\s*</tool_call>", text[end:])
            if after:
                end += after.end()
        item = (
            _Item(problem="a <function=...> block has no name")
            if not name
            else _Item(name=name, args=args, key="arguments")
        )
        found.append(_Found(start, end, [item]))
    return found


@_register("hermes")
def _parse_hermes(text: str) -> list[_Found] | None:
    if HERMES_OPEN not in text:
        return None
    found = []
    pos = text.find(HERMES_OPEN)
    while pos >= 0:
        body_start = pos + len(HERMES_OPEN)
        nxt = text.find(HERMES_OPEN, body_start)
        close = text.find(HERMES_CLOSE, body_start, nxt if nxt >= 0 else len(text))
        body_end = close if close >= 0 else (nxt if nxt >= 0 else len(text))
        end = close + len(HERMES_CLOSE) if close >= 0 else body_end
        body = _strip_fence(text[body_start:body_end])
        values, _, error = _decode_sequence(body, 0, repair=True)
        if not values:
            what = error or "it is empty"
            found.append(_Found(pos, end, [_Item(problem=f"bad JSON in a <tool_call> block: {what}")]))
        else:
            items = [it for _, _, v in values for it in _items_from_value(v, "a <tool_call> block")]
            found.append(_Found(pos, end, items))
        pos = nxt
    return found


_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.:\-]+)\s*(?:\[CALL_ID\]\s*[^\[\s]*\s*)?\[ARGS\]")


@_register("mistral")
def _parse_mistral(text: str) -> list[_Found] | None:
    if MISTRAL_MARK not in text:
        return None
    found = []
    pos = text.find(MISTRAL_MARK)
    while pos >= 0:
        after = pos + len(MISTRAL_MARK)
        nxt = text.find(MISTRAL_MARK, after)
        limit = nxt if nxt >= 0 else len(text)
        segment = text[:limit]
        named = _MISTRAL_NAMED.match(segment, after)
        start = after
        while start < limit and text[start] in _WS:
            start += 1
        if named:
            try:
                args, end = _decode_at(segment, named.end() + _skip_ws(segment, named.end()), repair=True)
                found.append(_Found(pos, end, [_Item(name=named.group(1), args=args, key="arguments")]))
            except ValueError as exc:
                problem = f"bad JSON arguments after {MISTRAL_MARK}{named.group(1)}[ARGS]: {_error_text(exc)}"
                found.append(_Found(pos, limit, [_Item(problem=problem)]))
        elif start < limit and text[start] in "[{":
            try:
                value, end = _decode_at(segment, start, repair=True)
                found.append(_Found(pos, end, _items_from_value(value, MISTRAL_MARK)))
            except ValueError as exc:
                found.append(_Found(pos, limit, [_Item(problem=f"bad JSON after {MISTRAL_MARK}: {_error_text(exc)}")]))
        else:
            found.append(_Found(pos, limit, [_Item(problem=f"no call list or name[ARGS] after {MISTRAL_MARK}")]))
        pos = nxt
    return found


def _skip_ws(text: str, pos: int) -> int:
    n = 0
    while pos + n < len(text) and text[pos + n] in _WS:
        n += 1
    return n


@_register("llama3")
def _parse_llama3(text: str) -> list[_Found] | None:
    tag = text.find(PYTHON_TAG)
    if tag >= 0:
        values, _, error = _decode_sequence(text, tag + len(PYTHON_TAG), repair=True)
        if not values:
            return [
                _Found(tag, len(text), [_Item(problem=f"bad JSON after {PYTHON_TAG}: {error or 'nothing follows it'}")])
            ]
        # text after the last value that is not JSON stays content
        where = f"the text after {PYTHON_TAG}"
        return [_Found(tag if i == 0 else s, e, _items_from_value(v, where)) for i, (s, e, v) in enumerate(values)]
    # no tag: the WHOLE output must be call objects, at least one using
    # Llama's "parameters" (a lone {"name", "arguments"} is the json syntax)
    values, _, error = _decode_sequence(text, 0, repair=False)
    if error or not values:
        return None
    items = [_item_from_object(v, need_args=True) for _, _, v in values]
    if any(it is None for it in items) or not any(it.key == "parameters" for it in items if it):
        return None
    return [_Found(s, e, [it]) for (s, e, _), it in zip(values, items) if it]


@_register("json")
def _parse_json(text: str) -> list[_Found] | None:
    found: list[_Found] = []
    pos = 0
    while True:
        pos = _next_bracket(text, pos)
        if pos < 0:
            return found
        try:
            value, end = _decode_at(text, pos, repair=True)
        except ValueError as exc:
            if text[pos] == "{" and re.match(r'\{\s*"name"\s*:', text[pos:]):
                found.append(
                    _Found(pos, pos, [_Item(problem=f"malformed JSON call object at char {pos}: {_error_text(exc)}")])
                )
            pos += 1
            continue
        values = value if isinstance(value, list) else [value]
        items = [_item_from_object(v, need_args=True) for v in values]
        if values and all(items):
            found.append(_Found(pos, end, items))  # type: ignore[arg-type]
            pos = end
        else:
            pos += 1


def _next_bracket(text: str, pos: int) -> int:
    a, b = text.find("{", pos), text.find("[", pos)
    if a < 0:
        return b
    return a if b < 0 else min(a, b)


# ------------------------------------------------------------- the parse
def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Arguments as an object: a JSON string holding an object is decoded."""
    if raw is None:
        return {}, None
    if isinstance(raw, str):
        if not raw.strip():
            return {}, None
        try:
            raw = _DECODER.decode(raw.strip())
        except ValueError as exc:
            return None, f"are a string that is not JSON ({_error_text(exc)})"
    if not isinstance(raw, dict):
        return None, f"are not an object (got {type(raw).__name__})"
    return raw, None


def resolve_name(name: str, offered: Sequence[str]) -> str | None:
    """The offered function ``name`` means (``functions.get_weather`` is
    ``get_weather``), or None."""
    if name in offered:
        return name
    short = name.rsplit(".", 1)[-1].strip()  # "functions.get_weather"
    return short if short in offered else None


def _without(text: str, spans: list[tuple[int, int]]) -> str:
    """The text with the spans cut out; neighbouring spans separated only by
    whitespace/``;``/``,`` go together, and a ```json fence holding nothing
    else goes with them."""
    merged: list[list[int]] = []
    for s, e in sorted(spans):
        if merged and not text[merged[-1][1] : s].strip(_WS + ";,"):
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    out, last = [], 0
    for s, e in merged:
        opener = re.search(r"```[ \t]*(?:json)?[ \t]*\n[ \t\r\n]*\Z", text[last:s], re.IGNORECASE)
        closer = re.match(r"[ \t\r\n]*```", text[e:])
        if opener and closer and text[: last + opener.start()].count("```") % 2 == 0:
            s, e = last + opener.start(), e + closer.end()
        out.append(text[last:s])
        last = e
    out.append(text[last:])
    return "".join(out).strip()


def parse_tool_calls(text: str, offered: Iterable[str]) -> Parsed:
    """The calls to offered functions in a model's output, the remaining
    text, and why any candidate call was rejected. Nothing offered: nothing
    is a call."""
    names = list(dict.fromkeys(offered))
    if not names or not text:
        return Parsed(content=text.strip())
    for syntax, parser in PARSERS.items():
        found = parser(text)
        if found is None or (syntax == "json" and not found):
            continue
        calls: list[ToolCall] = []
        problems: list[str] = []
        spans: list[tuple[int, int]] = []
        for f in found:
            accepted = False
            for item in f.items:
                if item.problem is not None:
                    problems.append(item.problem)
                    continue
                name = resolve_name(item.name or "", names)
                if name is None:
                    problems.append(f"unknown name {item.name!r} (offered: {', '.join(names)})")
                    continue
                args, why = _arguments(item.args)
                if args is None:
                    problems.append(f"the arguments of {name!r} {why}")
                    continue
                calls.append(ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False)))
                accepted = True
            if accepted:
                spans.append((f.start, f.end))
        return Parsed(
            content=_without(text, spans),
            calls=calls,
            syntax=syntax if calls else None,
            problems=list(dict.fromkeys(problems)),
        )
    return Parsed(content=text.strip())


# ------------------------------------------------------------- streaming
_KEYS = ('"name"', '"function"')
#: a line whose first non-blank character could open a bare call
_LINE_START = re.compile(r'^[ \t]*(?=\{\s*(?:"|\Z)|\[\s*(?:\{|\Z)|`)', re.MULTILINE)


def _plausible_object(s: str) -> bool:
    """``s`` starts with ``{``: could it be the start of a call object?"""
    t = s[1:].lstrip()
    return not t or any(k.startswith(t[: len(k)]) for k in _KEYS)


def _plausible_json(s: str) -> bool:
    if not s:
        return True
    if s[0] == "{":
        return _plausible_object(s)
    if s[0] == "[":
        t = s[1:].lstrip()
        return not t or (t[0] == "{" and _plausible_object(t))
    return False


def _plausible_line(text: str, p: int) -> bool:
    """Does the line content starting at ``p`` begin a bare call (an object,
    a list of objects, or a ```json fence around one)?"""
    r = text[p:]
    if r.startswith("`") and "```".startswith(r[:3]):
        if len(r) < 3:
            return True
        if text[:p].count("```") % 2:  # this closes a fence
            return False
        rest = r[3:]
        nl = rest.find("\n")
        if nl < 0:
            return "json".startswith(rest.strip(" \t\r").lower())
        if rest[:nl].strip().lower() not in ("", "json"):
            return False
        return _plausible_json(rest[nl + 1 :].lstrip())
    return r[:1] in ("{", "[") and _plausible_json(r)


def call_start(text: str, since: int = 0) -> int | None:
    """Where a tool call begins in a partial streamed text (the whole text
    so far), at ``since`` or later (what is before it has been sent): a
    complete marker, a marker cut off at the end, or a ``{`` / ``[`` /
    ```json fence at the start of a line that may open a call object. A
    streamer emits ``text[:i]`` and holds the rest; a later call may return
    None again once the held text turns out to be prose."""
    best: int | None = None
    for marker in MARKERS:
        i = text.find(marker, since)
        if i >= 0 and (best is None or i < best):
            best = i
        for k in range(len(marker) - 1, 0, -1):  # longest partial first
            if text.endswith(marker[:k]) and len(text) - k >= since:
                i = len(text) - k
                if best is None or i < best:
                    best = i
                break
    line = text.rfind("\n", 0, since) + 1  # a line's indent may have been sent
    for m in _LINE_START.finditer(text, line, len(text) if best is None else best):
        if m.end() >= since and _plausible_line(text, m.end()):
            return m.end()
    return best


# ------------------------------------------------------------- rendering
def _xml_param(value: Any) -> str:
    """A parameter value as the xml syntax writes it: strings raw unless
    they would read back as JSON (then quoted), everything else as JSON."""
    if isinstance(value, str):
        try:
            _DECODER.decode(value.strip())
        except ValueError:
            return value
    return json.dumps(value, ensure_ascii=False)


def render_call(syntax: str, name: str, arguments: dict[str, Any]) -> str:
    """One call as a model using ``syntax`` writes it (to put assistant calls
    back into prompts for templates that cannot render ``tool_calls``)."""
    args = json.dumps(arguments, ensure_ascii=False)
    quoted = json.dumps(name, ensure_ascii=False)
    if syntax == "hermes":
        return f'{HERMES_OPEN}\n{{"name": {quoted}, "arguments": {args}}}\n{HERMES_CLOSE}'
    if syntax == "llama3":
        return f'{{"name": {quoted}, "parameters": {args}}}'
    if syntax == "mistral":
        return f'{MISTRAL_MARK}[{{"name": {quoted}, "arguments": {args}}}]'
    if syntax == "json":
        return f'{{"name": {quoted}, "arguments": {args}}}'
    if syntax == "xml":
        items = arguments.items() if isinstance(arguments, dict) else [("arguments", arguments)]
        params = "".join(f"<parameter={k}>\n{_xml_param(v)}\n</parameter>\n" for k, v in items)
        return f"{HERMES_OPEN}\n<function={name}>\n{params}</function>\n{HERMES_CLOSE}"
    raise ValueError(f"unknown tool-call syntax {syntax!r} (known: {', '.join(SYNTAXES)})")


def syntax_for_template(template_source: str) -> str:
    """The call syntax a chat template teaches its model. ``<function=`` is
    checked first: Qwen3-Coder's template also mentions ``<tool_call>``."""
    src = template_source or ""
    if XML_FUNCTION in src:
        return "xml"
    if MISTRAL_MARK in src:
        return "mistral"
    if HERMES_OPEN in src:
        return "hermes"
    if PYTHON_TAG in src or "ipython" in src:
        return "llama3"
    return "hermes"
