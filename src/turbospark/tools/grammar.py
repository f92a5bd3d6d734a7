"""Grammars that make the engine write only valid output, for llguidance.

Three producers, each a Lark grammar in llguidance's dialect, with JSON
Schema inline (``%json {...}``) compiled by llguidance itself:

- :func:`json_schema_grammar`: one JSON value valid against a schema
  (OpenAI ``response_format`` json_schema, Ollama ``format: {schema}``);
- :func:`json_object_grammar`: any JSON object (``json_object``, Ollama ``"json"``);
- :func:`tool_call_grammar`: a tool call in a model family's text syntax,
  its arguments valid against the tool's parameters schema (forced calls, and
  the lazy grammar woken by the syntax's opening marker).

llguidance enforces every keyword it accepts and refuses the others by name
(:func:`check_schema` raises :class:`UnsupportedSchema` with its message), so
a schema is never silently loosened. The grammar accepts a *subset* of the
valid texts, chosen so that small models finish: properties in schema order
and only the declared ones, at most one space between tokens, numbers without
exponents and with at most 16 integer and 9 fraction digits, and in
``json_object`` mode strings of at most :data:`DEFAULT_MAX_STRING` characters.
Markers that are one special token in the model's vocabulary (Qwen's
``<tool_call>``) are named by token id (``specials``), so the model may write
either the token or its text.

Why llguidance and not our own JSON Schema → GBNF converter (the first
wave's, ~1.7k lines): ``bench/grammar_engines.py`` measured it covering every
keyword the converter did and more (multipleOf, min/maxProperties on maps)
at the same decode rate; llama.cpp's own llguidance build needs a Rust
toolchain at build time, so the engine drives the PyPI wheel from Python
(engine/sampling.py).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from .calls import HERMES_CLOSE, HERMES_OPEN, MISTRAL_MARK, SYNTAXES, function_part

__all__ = [
    "DEFAULT_MAX_STRING",
    "SYNTAXES",
    "UnsupportedSchema",
    "check_schema",
    "json_object_grammar",
    "json_schema_grammar",
    "opening_call_grammar",
    "tool_call_grammar",
]

#: the longest string ``json_object`` mode lets a model write
DEFAULT_MAX_STRING = 200

#: the JSON layout every grammar asks for: at most one space between tokens
_LAYOUT = {"whitespace_pattern": " ", "item_separator": ",", "key_separator": ":"}

#: characters a regex needs escaped (Lark's /.../ and the regex crate)
_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


class UnsupportedSchema(ValueError):
    """A schema the grammar cannot enforce (a keyword llguidance does not
    implement, or a schema no value satisfies); ``feature`` says which."""

    def __init__(self, feature: str, path: str = "#") -> None:
        self.feature = feature
        self.path = path
        super().__init__(f"unsupported JSON schema at {path}: {feature}")


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else "\\n" if c == "\n" else c for c in text)


_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames", "additionalItems")
#: numbers a model may write: at most 9 fraction digits and 16 integer digits
#: (a small model otherwise writes 48.2833333... until its budget runs out)
_FRACTION = 1e-9
_MAGNITUDE = 1e16


def _finishing(s: Any, in_all_of: bool = False) -> Any:
    """The subset of ``s`` that small models finish: objects with declared
    properties take only those (``additionalProperties`` false where the
    schema says nothing, except in ``allOf`` branches, which it would break),
    and numbers have bounded digits."""
    if isinstance(s, list):
        return [_finishing(v) for v in s]
    if not isinstance(s, dict):
        return s
    out = dict(s)
    for k in _MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {n: _finishing(v) for n, v in out[k].items()}
    for k in _LISTS:
        if isinstance(out.get(k), list):
            out[k] = [_finishing(v, k == "allOf") for v in out[k]]
    for k in _ONE:
        if isinstance(out.get(k), dict):
            out[k] = _finishing(out[k])
    if (
        isinstance(out.get("properties"), dict)
        and not in_all_of
        and not any(k in out for k in ("allOf", "additionalProperties", "patternProperties", "unevaluatedProperties"))
    ):
        out["additionalProperties"] = False
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if ("number" in types or "integer" in types) and "enum" not in out and "const" not in out:
        if "number" in types and "multipleOf" not in out:
            out["multipleOf"] = _FRACTION
        if not any(k in out for k in ("minimum", "exclusiveMinimum")):
            out["minimum"] = -_MAGNITUDE
        if not any(k in out for k in ("maximum", "exclusiveMaximum")):
            out["maximum"] = _MAGNITUDE
    return out


def _schema(schema: Any, path: str = "#", lenient: bool = False) -> dict[str, Any]:
    """``schema``, made finishing, with our layout (a client's ``x-guidance``
    is replaced); ``lenient``: keywords llguidance does not implement are
    ignored instead of refused."""
    if schema is True:
        schema = {}
    if schema is False:
        raise UnsupportedSchema("the schema false admits no value", path)
    if not isinstance(schema, dict):
        raise UnsupportedSchema(f"a schema must be an object, not {type(schema).__name__}", path)
    layout = {**_LAYOUT, "lenient": True} if lenient else _LAYOUT
    return {**_finishing(schema), "x-guidance": layout}


def _json(schema: Any, path: str = "#", lenient: bool = False) -> str:
    return "%json " + json.dumps(_schema(schema, path, lenient), ensure_ascii=False)


@functools.lru_cache(maxsize=256)
def _error(grammar: str) -> str:
    """llguidance's complaint about ``grammar`` ("" when it compiles); kept,
    since a dialect checks a schema and the core compiles it again."""
    import llguidance

    return str(llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar)))


def _validate(grammar: str) -> None:
    err = _error(grammar)
    if err:
        raise UnsupportedSchema(_first_error(err))


def _first_error(err: str) -> str:
    """llguidance's message, without its position and grammar listing."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    first = lines[0] if lines else err
    detail = [ln for ln in lines if ln.startswith("error:")]
    if first.endswith("regex parse error:") and detail:
        first += " " + detail[0].removeprefix("error:").strip()
    return re.sub(r"^at \d+\(\d+\): (failed to compile JSON schema: )?", "", first)


def check_schema(schema: Any) -> None:
    """Raise :class:`UnsupportedSchema` when ``schema`` cannot be enforced,
    naming what (the same compilation :func:`json_schema_grammar` gets)."""
    _validate(json_schema_grammar(schema))


def json_schema_grammar(schema: Any) -> str:
    """A grammar whose every output is one JSON value valid against ``schema``."""
    return f"start: {_json(schema)}\n"


def json_object_grammar() -> str:
    """Any JSON object, strings bounded (OpenAI ``json_object``, Ollama ``"json"``)."""
    value = {"$ref": "#/$defs/v"}
    schema = {
        "$defs": {
            "v": {
                "anyOf": [
                    {"type": "string", "maxLength": DEFAULT_MAX_STRING},
                    {"type": ["number", "boolean", "null"]},
                    {"type": "array", "items": value},
                    {"type": "object", "additionalProperties": value},
                ]
            }
        },
        "type": "object",
        "additionalProperties": value,
    }
    return json_schema_grammar(schema)


# ------------------------------------------------------------------ tool calls
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


def tool_call_grammar(
    tools: list[dict[str, Any]],
    syntax: str,
    name: str | None = None,
    *,
    many: bool = False,
    specials: dict[str, int] | None = None,
    lenient: bool = False,
) -> str:
    """A grammar for a call to one of ``tools`` (or exactly ``name``), its
    arguments valid against that tool's schema; ``many``: one or more calls,
    separated by blanks (parallel calls).

    Syntaxes: ``hermes`` ``<tool_call>\\n{"name": "N", "arguments": A}\\n</tool_call>``;
    ``llama3`` ``{"name": "N", "parameters": A}``; ``json`` ``{"name": "N", "arguments": A}``;
    ``mistral`` ``[TOOL_CALLS][{"name": "N", "arguments": A}]``; ``xml`` (Qwen3-Coder)
    ``<tool_call>\\n<function=N>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>``
    with string parameters raw (never containing ``<``) and the others JSON.
    ``specials``: marker text → token id, for markers that are one special
    token in the model's vocabulary. ``lenient`` (the lazy grammar of
    ``tool_choice`` auto): a tool whose schema the grammar cannot take
    entirely (Claude Code's task tools use ``propertyNames``) is held to what
    it can enforce, or to any object, instead of costing every tool its
    grammar; its calls are validated after the fact.
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
    specials = specials or {}

    def mark(text: str) -> str:
        return f"({_lit(text)} | <[{specials[text]}]>)" if text in specials else _lit(text)

    rules = _every_call(specs, lambda i, f, p, s: _call_rules(i, f, p, syntax, mark, s), lenient)
    calls = " | ".join(f"call_{i}" for i in range(len(specs)))
    start = "start: call (CALL_GAP call)*\nCALL_GAP: /[ \\n]*/" if many else "start: call"
    grammar = "\n".join([start, f"call: {calls}", *rules]) + "\n"
    _check_calls(grammar, tuple(n for n, _ in specs))
    return grammar


def _every_call(specs: list[tuple[str, Any]], own: Any, lenient: bool) -> list[str]:
    """The rules of every call (``own(i, name, params, strictness)`` writes
    one tool's, ``call_i`` first); ``lenient``: a tool whose schema the
    grammar cannot take entirely is held to what it can enforce, else to any
    object."""
    rules: list[str] = []
    for i, (fname, params) in enumerate(specs):
        try:
            mine = own(i, fname, params, 0)
            if lenient and not _compiles("\n".join([f"start: call_{i}", *mine])):
                # beyond the grammar: enforce what it can, then any object
                mine = own(i, fname, params, 1)
                if not _compiles("\n".join([f"start: call_{i}", *mine])):
                    mine = own(i, fname, {"type": "object"}, 1)
        except UnsupportedSchema as e:
            raise UnsupportedSchema(f"tool {fname!r}: {e.feature}", e.path) from None
        rules += mine
    return rules


#: blanks between the tokens of an opening call (bounded, as the grammar's)
_OW = r"[ \t\r\n]{0,16}"
#: how an answer that opens as a bare JSON call begins, up to its name:
#: blanks, an optional ```json fence, then ``{"name": `` in any sane
#: spacing, the grammar's exactly (so the trigger matches only what the
#: grammar takes)
_OPENING_HEAD = (
    r"[ \t\r\n]{0,32}(?:```(?:json)?[ \t]{0,8}\n[ \t\r\n]{0,32})?"
    rf'\{{{_OW}(?:"type"{_OW}:{_OW}"function"{_OW},{_OW})?(?:"function"{_OW}:{_OW}\{{{_OW})?"name"{_OW}:{_OW}'
)


def opening_call_grammar(tools: list[dict[str, Any]]) -> tuple[str, str]:
    """For ``tool_choice`` auto, in every syntax: an answer that *opens* as
    a bare JSON call, the shape small models fall back to (``{"name": N,
    "arguments": A}``, ``"parameters"`` as Llama 3 writes it, in a ```json
    fence or not, any spacing), held from its tool's name on to a valid call
    of that tool. Returns the grammar (from the output's first byte) and
    the trigger, a regex matched at the output's start that ends at the
    name's closing quote: only an offered name wakes it, so a JSON answer
    of the user's own (``{"name": "Alice"}``) stays free. Every text the
    trigger matches the grammar accepts as a prefix (the engine also feeds
    the grammar every token it watches and tells the router, through
    ``Progress.opening``, whether it holds). A model writing the
    arguments beside the name (``{"name": "Bash", "command": …}``) is held
    to ``"arguments"`` once the name is out: the call comes out valid.
    One call, and the answer ends there: a small model that opens this way
    would otherwise repeat the call until its budget runs out (parallel
    calls have the syntax's marker)."""
    specs = [_tool_spec(t) for t in tools]
    names = [n for n, _ in specs]
    if not specs or len(set(names)) != len(names):
        raise ValueError("tool names must be present and unique")
    rules = _every_call(specs, _opening_rules, lenient=True)
    calls = " | ".join(f"call_{i}" for i in range(len(specs)))
    grammar = "\n".join(
        [
            "start: OPEN_LEAD (OPEN_FENCE call OPEN_FENCE_END | call)",
            # blanks are bounded, so a model writing nothing but blanks is let
            # go (the engine watches the opening only while the grammar takes it)
            "OPEN_LEAD: /[ \\t\\r\\n]{0,32}/",
            "OPEN_FENCE: /```(json)?[ \\t]{0,8}\\n[ \\t\\r\\n]{0,32}/",
            "OPEN_FENCE_END: /[ \\t\\r\\n]{0,32}```/",
            f"call: {calls}",
            *rules,
        ]
    )
    _check_calls(grammar + "\n", tuple(names))
    quoted = "|".join(re.escape(json.dumps(n, ensure_ascii=False)) for n in names)
    return grammar + "\n", f"{_OPENING_HEAD}(?:{quoted})"


def _opening_rules(i: int, fname: str, params: Any, strictness: int) -> list[str]:
    """Call ``i``: ``{"name": N, "arguments": A}``, optionally with
    ``"type": "function"`` first, or OpenAI's ``{"function": {...}}``
    wrapper around it."""
    name = _lit(json.dumps(fname, ensure_ascii=False))
    args = _json(params, lenient=strictness > 0)
    ow = f"/{_OW}/"  # any sane spacing between the tokens
    key = '/"(arguments|parameters)"/'
    kind = f'("\\"type\\"" {ow} ":" {ow} "\\"function\\"" {ow} "," {ow})?'
    inner = f'"\\"name\\"" {ow} ":" {ow} {name} {ow} "," {ow} {key} {ow} ":" {ow} {args} {ow} "}}"'
    wrapped = f'"\\"function\\"" {ow} ":" {ow} "{{" {ow} opening_{i} {ow} "}}"'
    return [f'call_{i}: "{{" {ow} {kind} (opening_{i} | {wrapped})', f"opening_{i}: {inner}"]


def _call_rules(i: int, fname: str, params: Any, syntax: str, mark: Any, strictness: int) -> list[str]:
    """The rules of call ``i`` (``call_i`` first); ``strictness`` 1: lenient schemas."""
    rules: list[str] = []
    lenient = strictness > 0
    if syntax == "xml":
        body = _xml_call(rules, i, fname, params, mark, lenient)
    else:
        key = "parameters" if syntax == "llama3" else "arguments"
        head = _lit(f'{{"name": {json.dumps(fname, ensure_ascii=False)}, "{key}": ')
        body = f'{head} {_json(params, lenient=lenient)} "}}"'
        if syntax == "hermes":
            body = f'{mark(HERMES_OPEN)} "\\n" {body} "\\n" {mark(HERMES_CLOSE)}'
        elif syntax == "mistral":
            body = f'{mark(MISTRAL_MARK)} "[" {body} "]"'
    return [f"call_{i}: {body}", *rules]


def _compiles(grammar: str) -> bool:
    return not _error(grammar)


def _check_calls(grammar: str, names: tuple[str, ...]) -> None:
    """Compile the call grammar; on an error, name the first tool whose own
    grammar fails."""
    try:
        _validate(grammar)
    except UnsupportedSchema as whole:
        for i, fname in enumerate(names):
            own = (f"call_{i}:", f"param_{i}_", f"P_{i}_", f"opening_{i}:")
            lines = [ln for ln in grammar.splitlines() if ln.startswith(own)]
            try:
                _validate("\n".join([f"start: call_{i}", *lines]))
            except UnsupportedSchema as e:
                raise UnsupportedSchema(f"tool {fname!r}: {e.feature}", e.path) from None
        raise whole from None


def _xml_call(rules: list[str], i: int, fname: str, params: Any, mark: Any, lenient: bool = False) -> str:
    """The xml syntax: each parameter its own block, in schema order
    (optional ones may be left out); strings raw, other values JSON."""
    if not isinstance(params, dict) or any(k in params for k in ("anyOf", "oneOf", "allOf", "$ref", "enum", "const")):
        raise UnsupportedSchema("the xml tool syntax needs a plain object parameters schema")
    if params.get("type", "object") not in ("object", ["object"]):
        raise UnsupportedSchema("the xml tool syntax needs a plain object parameters schema")
    defs = {k: params[k] for k in ("$defs", "definitions") if k in params}
    props = _xml_properties(params)
    required = list(params.get("required") or ())
    parts = []
    for j, (pname, ps) in enumerate(props.items()):
        path = f"#/properties/{pname}"
        close = _regex_escape("\n</parameter>\n")
        raw = _raw_string(ps, path)
        if raw is not None:
            value = f"P_{i}_{j}"
            rules.append(f"{value}: /{raw}{close}/")
        else:
            value = f'{_json({**ps, **defs} if isinstance(ps, dict) else ps, path, lenient)} "\\n</parameter>\\n"'
        rule = f"param_{i}_{j}"
        rules.append(f"{rule}: {_lit(f'<parameter={pname}>' + chr(10))} {value}")
        parts.append(rule if pname in required else f"{rule}?")
    head = f"{mark(HERMES_OPEN)} {_lit(f'{chr(10)}<function={fname}>{chr(10)}')}"
    return " ".join([head, *parts, _lit("</function>\n"), mark(HERMES_CLOSE)])


def _xml_properties(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters an xml call may write, each with its schema: the
    declared ones, and required ones left undeclared (under
    ``additionalProperties``)."""
    props = dict(params.get("properties") or {})
    for pname in params.get("required") or ():
        props.setdefault(pname, params.get("additionalProperties", True))
    return props


def _raw_string(ps: Any, path: str) -> str | None:
    """The regex of a string parameter written raw, or None when the value is not a plain string."""
    if not isinstance(ps, dict):
        return None
    values = [ps["const"]] if "const" in ps else ps.get("enum")
    if values is not None:
        if not all(isinstance(v, str) and "<" not in v for v in values):
            return None
        return "(" + "|".join(_regex_escape(v) for v in values) + ")"
    if ps.get("type") not in ("string", ["string"]) or any(k in ps for k in ("anyOf", "oneOf", "allOf", "$ref")):
        return None
    if "pattern" in ps or "format" in ps:
        raise UnsupportedSchema("the xml tool syntax writes strings raw: no pattern or format", path)
    lo, hi = int(ps.get("minLength", 0)), ps.get("maxLength")
    if hi is not None and lo > int(hi):
        raise UnsupportedSchema("minLength above maxLength", path)
    if lo == 0 and hi is None:
        return "[^<]*"
    return f"[^<]{{{lo},{'' if hi is None else int(hi)}}}"


def xml_raw_parameters(tools: list[dict[str, Any]]) -> dict[str, frozenset[str]]:
    """For the xml syntax: each tool's parameters whose values are written
    raw (plain strings, string enums), as :func:`tool_call_grammar` writes
    them; the others are JSON. Read by ``tools/streaming.XmlCallReader``."""
    out: dict[str, frozenset[str]] = {}
    for tool in tools:
        try:
            name, params = _tool_spec(tool)
        except ValueError:
            continue
        if not isinstance(params, dict) or not isinstance(params.get("properties") or {}, dict):
            continue
        raw = set()
        for pname, ps in _xml_properties(params).items():
            try:
                if _raw_string(ps, "") is not None:
                    raw.add(pname)
            except UnsupportedSchema:  # a pattern or format: still a string written raw
                raw.add(pname)
        out[name] = frozenset(raw)
    return out
