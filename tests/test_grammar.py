"""Grammars for constrained decoding (tools/grammar.py, compiled by llguidance).

The grammars are checked with the engine's own matcher: ``Matcher`` feeds a
text's tokens through llguidance on the bundled SmolLM2 vocabulary and says
whether the grammar accepts exactly that text. The real-model tests then
generate with SmolLM2 (greedy) and check the output against the schema.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import random
import re
import urllib.parse

import jsonschema
import llguidance
import numpy as np
import pytest

from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.engine.types import CancelFlag, GenerationConfig, StopReason
from turbospark.models.catalog import resolve_model
from turbospark.tools.grammar import (
    DEFAULT_MAX_STRING,
    UnsupportedSchema,
    check_schema,
    json_object_grammar,
    json_schema_grammar,
    opening_call_grammar,
    tool_call_grammar,
)


@pytest.fixture(scope="module")
def model():
    path, _ = resolve_model("smollm2-135m")
    m = LlamaChatModel(ModelOptions(path=path, parallel=1, ctx=2048))
    yield m
    m.close()


class Matcher:
    """Does a grammar accept exactly this text? Asked of llguidance over the model's vocabulary."""

    def __init__(self, file) -> None:
        self.f = file
        self.tok = file.grammar_tokenizer()

    def matcher(self, grammar: str):
        m = llguidance.LLMatcher(self.tok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        assert not m.is_error(), f"llguidance refused the grammar: {m.get_error()}\n{grammar}"
        return m

    def accepts(self, grammar: str, text: str) -> bool:
        m = self.matcher(grammar)
        ids = self.f.tokenize(text, False, False)
        if m.validate_tokens(ids) != len(ids) or not m.consume_tokens(ids):
            return False
        if m.is_stopped():  # nothing but the end can follow
            return m.is_accepting()
        return m.validate_tokens([self.f.eos]) == 1  # end of generation allowed only when complete

    def walk(self, grammar: str, rng: random.Random, max_steps: int = 300) -> str | None:
        """A random text the grammar allows (random allowed short tokens, ending at random
        once the grammar is complete); None if it did not end within max_steps."""
        if not hasattr(self, "_short"):
            short = np.zeros(self.f.n_vocab, dtype=bool)
            for t in range(self.f.n_vocab):
                short[t] = 0 < len(self.f.token_text(t)) <= 2 and t not in self.f.eog_tokens
            self._short = short
        m = self.matcher(grammar)
        out: list[int] = []
        for _ in range(max_steps):
            if m.is_stopped():
                return self.f.detokenize(out)
            bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
            allowed = bits[: self.f.n_vocab].astype(bool)
            ok = np.flatnonzero(allowed & self._short)
            can_end = bool(allowed[self.f.eos])
            if can_end and (len(ok) == 0 or rng.random() < 0.35):
                return self.f.detokenize(out)
            if len(ok) == 0:
                forced = np.flatnonzero(allowed)
                if len(forced) == 0:
                    raise AssertionError(f"dead end after {self.f.detokenize(out)!r}")
                ok = forced
            tok = int(rng.choice(list(ok)))
            assert m.consume_token(tok)
            out.append(tok)
        return None


@pytest.fixture(scope="module")
def matcher(model) -> Matcher:
    return Matcher(model.file)


def validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


# RFC 3339: a leap second (60) and a lower-case z are allowed
_TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$")
_DUR_TIME = r"T(\d+H(\d+M(\d+S)?)?|\d+M(\d+S)?|\d+S)"
_DURATION = re.compile(rf"^P((\d+D|\d+M(\d+D)?|\d+Y(\d+M(\d+D)?)?)({_DUR_TIME})?|{_DUR_TIME}|\d+W)$")
_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def strict_format(fmt: str, value: str) -> bool:
    """RFC checks for the formats jsonschema skips without optional packages."""
    if fmt == "time":
        return bool(_TIME.match(value))
    if fmt == "date-time":
        date, _, time = value.replace("t", "T").partition("T")
        return bool(_TIME.match(time)) and datetime.date.fromisoformat(date) is not None
    if fmt == "duration":
        return bool(_DURATION.match(value))
    if fmt == "hostname":  # (llguidance bounds neither the label nor the name length)
        return all(_LABEL.match(p[:1] + p[-1:]) and re.fullmatch(r"[A-Za-z0-9-]+", p) for p in value.split("."))
    if fmt == "uri":  # RFC 3986: a scheme, then a hier-part (which may be a bare path)
        u = urllib.parse.urlparse(value)
        return bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", u.scheme))
    return True


def check_formats(value, schema) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            check_formats(v, schema.get("properties", {}).get(k, {}))
    elif isinstance(value, str) and "format" in schema:
        assert strict_format(schema["format"], value), (schema["format"], value)


# ---------------------------------------------------------------- check_schema
def _key(k: str) -> str:
    return f'"{k}"'


#: (schema, what llguidance's message says): refused, never loosened
REJECTED = [
    ({"$ref": "https://example.com/person.json"}, "not present in a registry"),
    ({"$ref": "person.json#/$defs/x"}, "not present in a registry"),
    ({"if": {"type": "string"}, "then": {"minLength": 1}, "else": {"type": "integer"}}, _key("if")),
    ({"not": {"type": "string"}}, _key("not")),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, _key("propertyNames")),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, _key("dependentRequired")),
    ({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}, _key("dependentSchemas")),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": ["b"]}}, _key("dependencies")),
    ({"properties": {"a": {"type": "string"}}, "unevaluatedProperties": False}, _key("unevaluatedProperties")),
    ({"prefixItems": [{"type": "string"}], "unevaluatedItems": False}, _key("unevaluatedItems")),
    ({"type": "array", "contains": {"type": "integer"}}, _key("contains")),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, _key("uniqueItems")),
    ({"$dynamicRef": "#meta"}, _key("$dynamicRef")),
    ({"type": "string", "format": "iri-reference"}, "Unknown format: iri-reference"),
    ({"type": "string", "pattern": "^(?=a)a+$"}, "look-around"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "backreferences"),
    ({"type": "string", "pattern": "\\bword\\b"}, "lookarounds"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "oneOf constraints are not supported"),
    ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, "oneOf constraints are not supported"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "incompatible types"),
    ({"$defs": {"a": {"$ref": "#/$defs/a", "type": "string"}}, "$ref": "#/$defs/a"}, "circular references"),
    (
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True, "minProperties": 1},
        "min/maxProperties",
    ),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, "required property 'a' is unsatisfiable"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "required property 'a' is unsatisfiable"),
    (False, "admits no value"),
    ({"type": "integer", "minimum": 5, "maximum": 2}, "minimum (5) is greater than maximum (2)"),
    ({"enum": ["a", "bb"], "minLength": 3}, "doesn't match length constraints"),
    ({"type": "strng"}, "Invalid type: strng"),
]


@pytest.mark.parametrize("schema,feature", REJECTED, ids=[f"{i}-{f}" for i, (_, f) in enumerate(REJECTED)])
def test_check_schema_rejects_with_the_feature_named(schema, feature):
    with pytest.raises(UnsupportedSchema) as info:
        check_schema(schema)
    assert feature in info.value.feature
    assert feature in str(info.value)
    if schema is not False:  # the engine refuses the grammar too: never one that allows invalid output
        grammar = llguidance.LLMatcher.grammar_from_lark(json_schema_grammar(schema))
        assert llguidance.LLMatcher.validate_grammar(grammar)


def test_unsupported_feature_deep_inside_is_named():
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"type": "object", "properties": {"a": {"type": "array", "items": {"not": {}}}}})
    assert '"not"' in info.value.feature
    assert "at 1(" not in info.value.feature  # llguidance's position in our grammar text is left out


# (schema, texts it must accept, texts it must refuse). Every accepted text
# is also checked valid by jsonschema, so the table cannot lie.
ACCEPTED = {
    "type": ({"type": "boolean"}, ["true", "false"], ["1", "null", "True"]),
    "null": ({"type": "null"}, ["null"], ["None", "{}"]),
    "properties+required": (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean"}},
            "required": ["b"],
        },
        ['{"b": 1}', '{"a": "x", "b": 2}', '{"a":"x","b":2,"c":true}', '{ "b": 1, "c": false }'],
        ["{}", '{"a": "x"}', '{"b": 1, "a": "x"}', '{"b": 1,}', '{"b": 1, "d": 2}'],
    ),
    "all optional": (
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        ["{}", '{"a": 1}', '{"b": 2}', '{"a": 1, "b": 2}'],
        ['{"b": 2, "a": 1}', '{,"b": 2}', '{"a": 1 "b": 2}'],
    ),
    "enum": (
        {"enum": ["red", "green", 3, None, {"k": [1]}]},
        ['"red"', '"green"', "3", "null", '{"k": [1]}'],
        ['"blue"', "4"],
    ),
    "const": ({"const": "fixed"}, ['"fixed"'], ['"fixe"', '"fixedd"']),
    "enum filtered by type": ({"type": "string", "enum": ["a", 1, "b"]}, ['"a"', '"b"'], ["1"]),
    "items min/max": (
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        ["[1]", "[1, 2]", "[1,2,3]", "[ 1 ]"],
        ["[]", "[1, 2, 3, 4]", '["a"]', "[1,]"],
    ),
    "integer range": (
        {"type": "integer", "minimum": -5, "maximum": 12},
        ["-5", "0", "7", "12"],
        ["-6", "13", "007", "1.5"],
    ),
    "exclusive range": (
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        ["0.5", "0.001", "0.999"],
        ["0", "1", "1.5", "-0.5"],
    ),
    "string length": (
        {"type": "string", "minLength": 2, "maxLength": 4},
        ['"ab"', '"abcd"', '"ét\\n"', '"\\"\\\\"'],
        ['"a"', '"abcde"', '"ab\ncd"', '"\\ud83d\\ude00"'],
    ),
    "unicode counts code points": ({"type": "string", "maxLength": 2}, ['"é😀"'], ['"é😀x"']),
    "anyOf": (
        {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string", "maxLength": 1}]},
        ["10", "99", '"x"'],
        ["9", '"xy"'],
    ),
    "oneOf disjoint types": ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, ["3", '"s"'], ["true"]),
    "oneOf discriminated": (
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                    "required": ["kind"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
                    "required": ["kind"],
                },
            ]
        },
        ['{"kind": "a", "x": 1}', '{"kind": "b", "y": "z"}', '{"kind": "a"}'],
        ['{"kind": "a", "y": "z"}', '{"kind": "c"}'],
    ),
    # OpenAPI's "nullable" is not JSON Schema: validators ignore it, so null is never written (valid either way)
    "nullable keyword": ({"type": "string", "nullable": True, "maxLength": 2}, ['"ab"'], ["null"]),
    "nullable type list": ({"type": ["string", "null"], "maxLength": 3}, ['"abc"', "null"], ['"abcd"', "0"]),
    "$defs/$ref": (
        {
            "$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
            "type": "object",
            "properties": {"from": {"$ref": "#/$defs/p"}, "to": {"$ref": "#/$defs/p"}},
            "required": ["from", "to"],
        },
        ['{"from": {"x": 1}, "to": {"x": 2}}'],
        ['{"from": {"x": 1}}', '{"from": {}, "to": {"x": 2}}'],
    ),
    "recursive $ref": (
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["v"],
                }
            },
            "$ref": "#/$defs/node",
        },
        ['{"v": 1}', '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}'],
        ['{"v": 1, "kids": [{}]}'],
    ),
    "definitions (draft 7)": (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"c": {"enum": ["x", "y"]}},
            "type": "array",
            "items": {"$ref": "#/definitions/c"},
            "maxItems": 2,
        },
        ['["x", "y"]', "[]"],
        ['["z"]', '["x", "x", "x"]'],
    ),
    "additionalProperties false": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
        ['{"a": 1}'],
        ['{"a": 1, "b": 2}'],
    ),
    "map of values": (
        {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}, "maxProperties": 2},
        ["{}", '{"x": 1}', '{"x": 1, "y": 2}'],
        ['{"x": -1}', '{"x": 1, "y": 2, "z": 3}'],
    ),
    "allOf merged": (
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"a": {"maximum": 3}, "b": {"type": "string"}}, "required": ["b"]},
            ]
        },
        ['{"a": 3, "b": "x"}'],
        ['{"a": 4, "b": "x"}', '{"a": 1}'],
    ),
    "$ref with siblings": (
        {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2},
        ['"ab"'],
        ['"abc"'],
    ),
    "tuple": (
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": False, "minItems": 1},
        ['["a"]', '["a", 1.5]'],
        ["[]", "[1]", '["a", 1, 2]'],
    ),
    "format date": (
        {"type": "string", "format": "date"},
        ['"2024-02-29"', '"2000-02-29"', '"2023-12-31"', '"1999-04-30"'],
        # llguidance checks dates by shape and month length, not leap years
        ['"2023-04-31"', '"2023-13-01"', '"23-01-01"'],
    ),
    "format time": (
        {"type": "string", "format": "time"},
        ['"13:45:00Z"', '"23:59:59.123+02:00"'],
        ['"24:00:00Z"', '"13:45:00"'],
    ),
    "format date-time": (
        {"type": "string", "format": "date-time"},
        ['"2024-05-01T08:30:00Z"'],
        ['"2024-05-01 08:30:00Z"'],
    ),
    "format uuid": (
        {"type": "string", "format": "uuid"},
        ['"123e4567-e89b-12d3-a456-426614174000"'],
        ['"123e4567e89b12d3a456426614174000"', '"123e4567-e89b-12d3-a456-42661417400"'],
    ),
    "format email": ({"type": "string", "format": "email"}, ['"ann.lee@example.com"'], ['"ann"', '"@example.com"']),
    "format ipv4": ({"type": "string", "format": "ipv4"}, ['"192.168.0.255"'], ['"256.1.1.1"', '"1.2.3"']),
    "format ipv6": (
        {"type": "string", "format": "ipv6"},
        ['"2001:db8:0:0:0:0:0:1"'],
        ['"2001:db8::1:2:3:4:5:6:7"', '"1.2.3.4"'],
    ),
    "format hostname": (
        {"type": "string", "format": "hostname"},
        ['"api.example.com"', '"localhost"'],
        ['"-bad.example"', '"a..b"'],
    ),
    "format duration": (
        {"type": "string", "format": "duration"},
        ['"P3D"', '"PT1H30M"', '"P1Y2M10DT2H30M"', '"P2W"'],
        ['"P"', '"PT"', '"P1H"', '"P1W2D"'],
    ),
    "format uri": (
        {"type": "string", "format": "uri"},
        ['"https://example.com/a/b.html"', '"http://x.org"'],
        ['"example.com"'],  # llguidance lets "https://" (no host) through
    ),
    "pattern": (
        {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,4}$"},
        ['"AB-123"', '"ZZ-0000"'],
        ['"ab-123"', '"AB-12"', '"AB-12345"'],
    ),
    "pattern unanchored": ({"type": "string", "pattern": "ab+c"}, ['"abc"', '"xxabbbcyy"'], ['"ac"']),
    "pattern classes": (
        {"type": "string", "pattern": '^[^,"]+(,[^,"]+)*$'},
        ['"a,b,c"', '"x y"'],
        ['",a"', '"a,,b"'],  # (llguidance lets an escaped quote through a [^"] class)
    ),
    "annotations ignored": (
        {
            "title": "T",
            "description": "d",
            "default": 1,
            "examples": [1],
            "x-foo": 1,
            "type": "integer",
            "minimum": 1,
            "maximum": 1,
        },
        ["1"],
        ["2"],
    ),
    # beyond the first wave's converter, enforced by llguidance
    "$anchor ref": ({"$defs": {"a": {"$anchor": "x", "type": "string"}}, "$ref": "#x"}, ['"s"'], ["1"]),
    "minProperties over declared properties": (
        {"properties": {"a": {"type": "string"}}, "minProperties": 1},
        ['{"a": "x"}'],
        ["{}"],
    ),
    "patternProperties": (
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        ["{}", '{"xa": "s"}'],
        ['{"xa": 1}'],
    ),
    "multipleOf integer": ({"type": "integer", "multipleOf": 3}, ["3", "0", "-9"], ["4", "10"]),
    "multipleOf number": ({"type": "number", "multipleOf": 0.5}, ["1.5", "2"], ["1.25"]),
    "format with pattern": ({"type": "string", "format": "date", "pattern": "^2"}, ['"2024-01-01"'], ['"1999-01-01"']),
    "format with maxLength": (
        {"type": "string", "format": "email", "maxLength": 20},
        ['"a@example.com"'],
        ['"averyverylongname@example.com"'],
    ),
    "alternation with anchors": ({"type": "string", "pattern": "^a|b$"}, ['"ax"', '"xb"'], ['"xa"']),
    "pattern with maxLength": (
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
        ['"abc"'],
        ['"abcdef"', '"AB"'],
    ),
    "allOf of two patterns": (
        {"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}]},
        ['"ab"', '"axb"'],
        ['"ba"'],
    ),
    "$id inside": (
        {"properties": {"a": {"$id": "https://x.example/a", "type": "string"}}},
        ['{"a": "s"}'],
        ['{"a": 1}'],
    ),
    "circular $ref writing nothing": ({"anyOf": [{"type": "null"}, {"$ref": "#"}]}, ["null"], ["1"]),
    "empty schema": ({}, ['{"a": [1, "x", null, true]}', "3.5", '"s"'], ["nul", "[1,]"]),
    "integer number type list": ({"type": ["integer", "number"], "minimum": 0, "maximum": 2}, ["1.5", "2"], ["2.5"]),
}


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_grammar_language(matcher, name):
    schema, good, bad = ACCEPTED[name]
    check_schema(schema)
    g = json_schema_grammar(schema)
    v = validator(schema)
    for text in good:
        assert v.is_valid(json.loads(text)), f"test table: {text} is not valid"
        check_formats(json.loads(text), schema)
        assert matcher.accepts(g, text), f"{name}: grammar refuses {text}\n{g}"
    for text in bad:
        assert not matcher.accepts(g, text), f"{name}: grammar accepts {text}\n{g}"


def test_random_walks_through_grammars_are_valid(matcher):
    """Whatever path a sampler takes through a grammar, the finished text is valid."""
    rng = random.Random(11)
    n_done = 0
    for schema, _, _ in ACCEPTED.values():
        g = json_schema_grammar(schema)
        v = validator(schema)
        for _ in range(4):
            text = matcher.walk(g, rng)
            if text is None:
                continue
            n_done += 1
            value = json.loads(text)
            assert v.is_valid(value), (schema, text)
            check_formats(value, schema)
    assert n_done > 100
    params = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for syntax in ("hermes", "json", "mistral"):
        g = tool_call_grammar([WEATHER, TIME], syntax)
        for _ in range(4):
            text = matcher.walk(g, rng)
            if text is None:
                continue
            body = {
                "hermes": lambda t: t[len("<tool_call>\n") : -len("\n</tool_call>")],
                "json": lambda t: t,
                "mistral": lambda t: t[len("[TOOL_CALLS]") :],
            }[syntax](text)
            call = json.loads(body)
            call = call[0] if syntax == "mistral" else call
            validator(params[call["name"]]).validate(call["arguments"])


def pydantic_owner():
    import enum
    import uuid
    from typing import Annotated, Literal

    from pydantic import BaseModel, Field, conint, constr

    class Color(str, enum.Enum):
        red = "red"
        blue = "blue"

    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: conint(ge=0, le=9)

    class Dog(BaseModel):
        kind: Literal["dog"]
        good: bool

    class Owner(BaseModel):
        name: constr(max_length=12)
        age: int | None = None
        color: Color
        pet: Annotated[Cat | Dog, Field(discriminator="kind")]
        tags: list[Annotated[str, Field(max_length=8)]] = Field(max_length=3)
        scores: dict[str, float]
        point: tuple[int, str]
        born: datetime.date
        seen: datetime.datetime
        id: uuid.UUID
        ratio: float = Field(gt=0, lt=1)

    return Owner


def test_pydantic_schema_walks_validate_in_pydantic(matcher):
    """A typical pydantic v2 schema ($defs, anyOf null, discriminated oneOf, tuple, map,
    formats, exclusive bounds) is supported, and its outputs load back into the model."""
    owner = pydantic_owner()
    schema = owner.model_json_schema()
    check_schema(schema)
    g = json_schema_grammar(schema)
    rng = random.Random(5)
    done = 0
    for _ in range(10):
        text = matcher.walk(g, rng, max_steps=1500)
        if text is None:
            continue
        done += 1
        validator(schema).validate(json.loads(text))
        check_formats(json.loads(text), schema)
        if not re.search(r"T\d\d:\d\d:60", text, re.I):
            # a leap second is RFC 3339 (and llguidance allows it); pydantic refuses it
            owner.model_validate_json(text)
    assert done >= 3


def test_xml_tool_call_walks_parse(matcher):
    alarm = {
        "type": "function",
        "function": {
            "name": "set_alarm",
            "parameters": {
                "type": "object",
                "properties": {
                    "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                    "label": {"type": "string", "maxLength": 10},
                    "days": {"type": "array", "items": {"enum": ["mon", "tue"]}, "maxItems": 2},
                },
                "required": ["hour"],
            },
        },
    }
    params = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, alarm)}
    g = tool_call_grammar([WEATHER, alarm], "xml")
    call_re = re.compile(r"<tool_call>\n<function=([^>\n]+)>\n(.*)</function>\n</tool_call>", re.S)
    param_re = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n", re.S)
    rng = random.Random(2)
    for _ in range(8):
        text = matcher.walk(g, rng)
        if text is None:
            continue
        m = call_re.fullmatch(text)
        assert m, text
        schema = params[m.group(1)]
        args = {}
        for k, raw in param_re.findall(m.group(2)):
            prop = schema["properties"][k]
            args[k] = raw if prop.get("type") == "string" else json.loads(raw)  # strings are written raw
        assert param_re.sub("", m.group(2)) == ""
        validator(schema).validate(args)


def test_whitespace_is_bounded(matcher):
    g = json_schema_grammar({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})
    assert matcher.accepts(g, '{ "a" : [ 1 , 2 ] }')
    for text in ['{  "a": [1]}', '{"a":  [1]}', '{"a": [1]  }', '{\n"a": [1]}', '{"a":\t[1]}', ' {"a": [1]}']:
        assert not matcher.accepts(g, text), text
    obj = json_object_grammar()
    assert matcher.accepts(obj, '{ "a" : { "b" : [ 1 , "x" ] } }')
    assert not matcher.accepts(obj, '{"a":  1}')
    assert not matcher.accepts(obj, '{"a": 1}\n')


def test_json_object_strings_are_bounded(matcher):
    at, over = "x" * DEFAULT_MAX_STRING, "x" * (DEFAULT_MAX_STRING + 1)
    obj = json_object_grammar()
    assert matcher.accepts(obj, json.dumps({"k": at, "l": [at]}))
    assert not matcher.accepts(obj, json.dumps({"k": over}))
    assert not matcher.accepts(obj, json.dumps({"k": [over]}))


def test_large_lengths_and_counts(matcher):
    g = json_schema_grammar({"type": "string", "minLength": 1500, "maxLength": 5000})
    for n in (1500, 3333, 5000):
        assert matcher.accepts(g, json.dumps("a" * n)), n
    for n in (1499, 5001):
        assert not matcher.accepts(g, json.dumps("a" * n)), n
    arr = json_schema_grammar({"type": "array", "items": {"const": 1}, "maxItems": 2500})
    assert matcher.accepts(arr, json.dumps([1] * 2500))
    assert not matcher.accepts(arr, json.dumps([1] * 2501))
    nested = json_schema_grammar({"type": "string", "pattern": "^(\\d{1,300}-){0,300}$"})
    assert matcher.accepts(nested, '"12-345-"')


def test_numbers_exact_against_jsonschema(matcher):
    """Every text a bounded-number grammar accepts is valid; plain forms of valid numbers are accepted."""
    rng = random.Random(7)
    schemas = [
        {"type": "number", "minimum": 0.1, "maximum": 0.9},
        {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 3.75},
        {"type": "number", "minimum": 12.3},
        {"type": "number", "exclusiveMaximum": -0.5},
        {"type": "integer", "exclusiveMinimum": -3.5, "maximum": 17},
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "number",
            "minimum": 0,
            "exclusiveMinimum": True,
            "maximum": 1,
        },
    ]
    texts = {"0", "1", "0.1", "0.9", "-2.5", "3.75", "12.3", "-0.5", "-3", "17", "1e3", "-0"}
    for _ in range(200):
        i = rng.choice([0, 1, 2, 3, 9, 12, 13, 17, 18, 99, 123])
        f = rng.choice(["", "05", "1", "25", "3", "45", "5", "75", "9", "99", "0001"])
        texts.add(f"{rng.choice(['', '-'])}{i}" + (f".{f}" if f else ""))
    for schema in schemas:
        g = json_schema_grammar(schema)
        v = validator(schema)
        for t in sorted(texts):
            valid = v.is_valid(json.loads(t))
            if matcher.accepts(g, t):
                assert valid, f"{schema}: accepts invalid {t}"
            elif valid:
                assert "e" in t or t == "-0" or (schema["type"] == "number" and t.endswith("0") and "." in t), (
                    f"{schema}: refuses valid {t}"
                )


def test_integer_ranges_exhaustive(matcher):
    for lo, hi in [(-17, 123), (0, 9), (10, 10), (95, 1005), (None, -7), (-250, None)]:
        schema = {"type": "integer"}
        if lo is not None:
            schema["minimum"] = lo
        if hi is not None:
            schema["maximum"] = hi
        g = json_schema_grammar(schema)
        wrong = [
            n
            for n in range(-300, 1100)
            if matcher.accepts(g, str(n)) != ((lo is None or n >= lo) and (hi is None or n <= hi))
        ]
        assert not wrong, f"{schema}: {wrong[:10]}"


def test_patterns_sound_against_python_re(matcher):
    rng = random.Random(3)
    alphabet = 'aAbz09-_. ,"\\@'
    for pattern in [
        "^[a-z]+@[a-z]+\\.(com|org)$",
        "^\\d{2,3}(-\\d+)?$",
        "^(ab|c)*$",
        "x.y",
        "^[^a-c]{2}$",
        "^\\w+\\s\\W$",
    ]:
        g = json_schema_grammar({"type": "string", "pattern": pattern})
        for _ in range(150):
            s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
            if matcher.accepts(g, json.dumps(s)):
                assert re.search(pattern, s), f"{pattern} accepts {s!r}"
    g = json_schema_grammar({"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"})
    assert matcher.accepts(g, '"ann@example.org"')


def test_json_object_grammar(matcher):
    g = json_object_grammar()
    for text in ["{}", '{"a": 1}', '{"a": {"b": [1, 2.5, -3, "x", true, false, null]}, "c": "é"}']:
        assert matcher.accepts(g, text), text
    for text in ["[]", "1", '"s"', "null", '{"a": 1,}', "{'a': 1}", '{"a": 1e5}', '{"a": "\n"}']:
        assert not matcher.accepts(g, text), text


# ---------------------------------------------------------------- tool calls
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"],
        },
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "ping", "description": "Ping"}}

ARGS = '{"location": "Paris", "unit": "celsius"}'
CALL_TEXTS = {
    "hermes": f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>',
    "json": f'{{"name": "get_weather", "arguments": {ARGS}}}',
    "llama3": f'{{"name": "get_weather", "parameters": {ARGS}}}',
    "mistral": f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {ARGS}}}]',
    "xml": "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n"
    "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>",
}


@pytest.mark.parametrize("syntax", list(CALL_TEXTS))
def test_tool_call_syntaxes(matcher, syntax):
    g = tool_call_grammar([WEATHER, TIME], syntax)
    assert matcher.accepts(g, CALL_TEXTS[syntax])
    bad_args = CALL_TEXTS[syntax].replace("celsius", "kelvin")
    assert not matcher.accepts(g, bad_args)
    assert not matcher.accepts(g, CALL_TEXTS[syntax].replace("get_weather", "get_wether"))
    assert not matcher.accepts(g, "Sure! " + CALL_TEXTS[syntax])  # nothing else
    assert not matcher.accepts(g, "")
    only_time = tool_call_grammar([WEATHER, TIME], syntax, name="get_time")
    assert not matcher.accepts(only_time, CALL_TEXTS[syntax])


OPENINGS = [
    f'{{"name": "get_weather", "arguments": {ARGS}}}',
    f'{{"name": "get_weather", "parameters": {ARGS}}}',  # Llama 3's key
    f'\n  {{\n  "name":"get_weather",\n  "arguments" :  {ARGS} }}',  # any spacing around the head
    f'```json\n{{"name": "get_weather", "arguments": {ARGS}}}\n```',
    '```\n{"name": "get_time", "arguments": {"timezone": "UTC"}}```',
    f'{{"type": "function", "name": "get_weather", "parameters": {ARGS}}}',  # as Llama 3.x may write it
    f'{{"type": "function", "function": {{"name": "get_weather", "arguments": {ARGS}}}}}',  # OpenAI's wrapper
    f'{{"function":{{"name": "get_weather", "arguments": {ARGS}}} }}',
]


@pytest.mark.parametrize("text", OPENINGS)
def test_opening_call_grammar_takes_bare_json_calls(matcher, text):
    """The grammar of an answer that opens as a bare JSON call (tool_choice
    auto, every syntax) takes the shapes small models write, and its trigger
    matches each of them at its name; every prefix the trigger matches, the
    grammar can go on from (the engine feeds it exactly those tokens)."""
    g, trigger = opening_call_grammar([WEATHER, TIME])
    assert matcher.accepts(g, text)
    m = re.match(trigger, text)
    assert m is not None and m.group(0).endswith(('"get_weather"', '"get_time"'))
    # the reader the router opens on the match takes the call as written
    from turbospark.tools.streaming import CallReader, Closed

    closed = [e for e in CallReader().feed(text) if isinstance(e, Closed)]
    assert [(c.call.name, json.loads(c.call.arguments)) for c in closed[:1]] == [(m.group(0).split('"')[-2],
        json.loads(ARGS) if "weather" in text else {"timezone": "UTC"})]  # fmt: skip
    prefix = matcher.matcher(g)
    ids = matcher.f.tokenize(m.group(0), False, False)
    assert prefix.consume_tokens(ids) and not prefix.is_stopped()


def test_opening_call_grammar_holds_the_call_to_its_tool(matcher):
    g, trigger = opening_call_grammar([WEATHER, TIME])
    assert not matcher.accepts(g, OPENINGS[0].replace("celsius", "kelvin"))
    # a small model's arguments beside the name are not a call of this grammar:
    # once the name is out, the engine holds the model to "arguments"
    assert not matcher.accepts(g, '{"name": "get_weather", "location": "Paris"}')
    assert not matcher.accepts(g, OPENINGS[0] + " Done.")  # nothing after the call
    assert not matcher.accepts(g, OPENINGS[-1][:-1])  # a wrapper is closed
    assert not matcher.accepts(g, OPENINGS[0][:-1] + "}}")  # and only a wrapper
    # blanks are bounded: an answer of nothing but blanks is soon let go
    assert not matcher.accepts(g, " " * 40 + OPENINGS[0]) and matcher.accepts(g, " " * 20 + OPENINGS[0])
    assert not matcher.accepts(g, OPENINGS[0] + "\n" + OPENINGS[0])  # one call (a loop ends there)
    # only an offered name wakes it: a JSON answer of the user's own stays free
    for free in ['{"name": "Alice", "age": 30}', '{"name": "get_weathers"', 'Sure: {"name": "get_weather"',
                 '{"city": "Paris"}', '{"arguments": {}, "name": "get_weather"}']:  # fmt: skip
        assert re.match(trigger, free) is None, free
    assert re.match(trigger, '{"name": "get_weather"') is not None
    with pytest.raises(ValueError):
        opening_call_grammar([WEATHER, WEATHER])


def test_tool_call_required_arguments_and_no_parameters(matcher):
    g = tool_call_grammar([WEATHER, NO_PARAMS], "hermes")
    assert not matcher.accepts(
        g, '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "celsius"}}\n</tool_call>'
    )
    assert matcher.accepts(g, '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>')
    assert not matcher.accepts(g, '<tool_call>\n{"name": "ping", "arguments": {"x": 1}}\n</tool_call>')
    x = tool_call_grammar([WEATHER], "xml")
    assert not matcher.accepts(x, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>")
    assert not matcher.accepts(x, CALL_TEXTS["xml"].replace("Paris", "Pa<ris"))  # raw strings never hold '<'


def test_tool_call_errors():
    with pytest.raises(ValueError, match="no tool named"):
        tool_call_grammar([WEATHER], "hermes", name="nope")
    with pytest.raises(ValueError, match="unknown tool-call syntax"):
        tool_call_grammar([WEATHER], "yaml")
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}
    with pytest.raises(UnsupportedSchema, match="tool 'f': Unimplemented keys.*not"):
        tool_call_grammar([bad], "hermes")


def test_lenient_call_grammar_keeps_the_tools_it_can_hold(matcher):
    """The lazy grammar of tool_choice auto: a tool beyond the grammar is
    held to what it can enforce instead of costing every tool its grammar."""
    tags = {
        "type": "function",
        "function": {
            "name": "tag",
            "parameters": {
                "type": "object",
                "properties": {"tags": {"type": "object", "propertyNames": {"maxLength": 3}}},
                "required": ["tags"],
            },
        },
    }
    with pytest.raises(UnsupportedSchema, match="tool 'tag'"):
        tool_call_grammar([WEATHER, tags], "hermes")
    g = tool_call_grammar([WEATHER, tags], "hermes", lenient=True)
    assert matcher.accepts(g, CALL_TEXTS["hermes"])
    assert not matcher.accepts(g, CALL_TEXTS["hermes"].replace("celsius", "kelvin"))  # the others stay strict
    assert matcher.accepts(g, '<tool_call>\n{"name": "tag", "arguments": {"tags": {"long": 1}}}\n</tool_call>')
    assert not matcher.accepts(g, '<tool_call>\n{"name": "tag", "arguments": {}}\n</tool_call>')  # still required


def test_claude_codes_recorded_tools_get_a_lazy_grammar(matcher):
    """Claude Code's own tool list (recorded, tests/fixtures/agents/) has
    schemas beyond the grammar; the lenient call grammar still compiles."""
    from pathlib import Path

    lines = (Path(__file__).parent / "fixtures" / "agents" / "claude-code.jsonl").read_text().splitlines()
    tools = next(
        b["tools"] for b in (json.loads(x).get("body") or {} for x in lines) if isinstance(b, dict) and b.get("tools")
    )
    tools = [t for t in tools if "input_schema" in t]
    assert len(tools) > 10
    with pytest.raises(UnsupportedSchema):
        tool_call_grammar(tools, "hermes", many=True)
    matcher.matcher(tool_call_grammar(tools, "hermes", many=True, lenient=True))


def test_anthropic_shaped_tools_accepted(matcher):
    tool = {"name": "get_weather", "description": "w", "input_schema": WEATHER["function"]["parameters"]}
    g = tool_call_grammar([tool], "hermes")
    assert matcher.accepts(g, CALL_TEXTS["hermes"])


def test_every_produced_grammar_compiles(matcher):
    grammars = [json_object_grammar()]
    for schema, _, _ in ACCEPTED.values():
        grammars.append(json_schema_grammar(schema))
    for syntax in CALL_TEXTS:
        for many in (False, True):
            grammars.append(tool_call_grammar([WEATHER, TIME, NO_PARAMS], syntax, many=many))
            grammars.append(tool_call_grammar([WEATHER, TIME], syntax, name="get_time", many=many))
    for _, schema in GENERATION:
        grammars.append(json_schema_grammar(schema))
    for g in grammars:
        matcher.matcher(g)  # asserts llguidance compiled it


# ---------------------------------------------------------------- real generation (SmolLM2, greedy)
S40 = {"type": "string", "maxLength": 40}
GENERATION = [
    (
        "Describe a person named Alice who is 30 years old.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
            },
            "required": ["name", "age"],
        },
    ),
    (
        "Give the postal address of a bakery in Paris.",
        {
            "type": "object",
            "properties": {
                "street": S40,
                "city": S40,
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"enum": ["US", "UK", "FR", "DE"]},
            },
            "required": ["street", "city", "zip", "country"],
            "additionalProperties": False,
        },
    ),
    (
        "Describe a laptop for sale.",
        {
            "type": "object",
            "properties": {
                "name": S40,
                "price": {"type": "number", "minimum": 0, "maximum": 10000},
                "in_stock": {"type": "boolean"},
            },
            "required": ["name", "price", "in_stock"],
        },
    ),
    (
        "Plan a birthday party event.",
        {
            "type": "object",
            "properties": {
                "title": S40,
                "date": {"type": "string", "format": "date"},
                "guests": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["title", "date", "guests"],
        },
    ),
    (
        "Give me a short todo list for today.",
        {
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {"title": {"type": "string", "maxLength": 20}, "done": {"type": "boolean"}},
                        "required": ["title", "done"],
                    },
                }
            },
            "required": ["todos"],
        },
    ),
    ("What is the sentiment of: 'I love this phone'?", {"type": "string", "enum": ["positive", "negative", "neutral"]}),
    (
        "What is the temperature in Oslo in winter, in Celsius?",
        {
            "type": "object",
            "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 60}},
            "required": ["celsius"],
        },
    ),
    (
        "Write a 2x2 matrix of small digits.",
        {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
            },
        },
    ),
    (
        "Describe a user; the nickname may be unknown.",
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "maxLength": 20},
                "nickname": {"type": ["string", "null"], "maxLength": 20},
            },
            "required": ["username", "nickname"],
        },
    ),
    (
        "How many legs does a spider have?",
        {
            "type": "object",
            "properties": {
                "result": {
                    "anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "string", "maxLength": 10}]
                }
            },
            "required": ["result"],
        },
    ),
    (
        "Describe a circle or a square.",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "circle"},
                        "radius": {"type": "number", "minimum": 0, "maximum": 100},
                    },
                    "required": ["kind", "radius"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "square"},
                        "side": {"type": "number", "minimum": 0, "maximum": 100},
                    },
                    "required": ["kind", "side"],
                    "additionalProperties": False,
                },
            ]
        },
    ),
    (
        "Give the start and end points of a line.",
        {
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {
                        "x": {"type": "integer", "minimum": -100, "maximum": 100},
                        "y": {"type": "integer", "minimum": -100, "maximum": 100},
                    },
                    "required": ["x", "y"],
                }
            },
            "type": "object",
            "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
            "required": ["start", "end"],
        },
    ),
    (
        "Create a record with an id and a label.",
        {
            "type": "object",
            "properties": {"id": {"type": "string", "format": "uuid"}, "label": {"type": "string", "maxLength": 12}},
            "required": ["id", "label"],
        },
    ),
    (
        "Is water wet? Answer with your confidence.",
        {
            "type": "object",
            "properties": {"answer": {"type": "boolean"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
            "required": ["answer", "confidence"],
        },
    ),
    (
        "List the ingredients of a pancake recipe.",
        {
            "type": "object",
            "properties": {
                "ingredients": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 20}},
                "minutes": {"type": "integer", "minimum": 1, "maximum": 300},
            },
            "required": ["ingredients", "minutes"],
        },
    ),
    (
        "Describe a famous book.",
        {
            "type": "object",
            "properties": {
                "title": S40,
                "year": {"type": "integer", "minimum": 1000, "maximum": 2025},
                "isbn": {"type": "string", "pattern": "^978-[0-9]{10}$"},
            },
            "required": ["title", "year", "isbn"],
        },
    ),
    (
        "Give the RGB values of the color orange.",
        {
            "type": "object",
            "properties": {c: {"type": "integer", "minimum": 0, "maximum": 255} for c in "rgb"},
            "required": ["r", "g", "b"],
            "additionalProperties": False,
        },
    ),
    (
        "Schedule a meeting for next Monday morning.",
        {
            "type": "object",
            "properties": {
                "topic": {"type": "string", "maxLength": 20},
                "when": {"type": "string", "format": "date-time"},
            },
            "required": ["topic", "when"],
        },
    ),
    (
        "Give the contact details of a support team.",
        {
            "type": "object",
            "properties": {
                "team": {"type": "string", "maxLength": 40},
                "email": {"type": "string", "format": "email", "maxLength": 40},
            },
            "required": ["team", "email"],
        },
    ),
    (
        "Give a city with its latitude and longitude.",
        {
            "type": "array",
            "prefixItems": [
                {"type": "string", "maxLength": 20},
                {"type": "number", "minimum": -90, "maximum": 90},
                {"type": "number", "minimum": -180, "maximum": 180},
            ],
            "items": False,
            "minItems": 3,
        },
    ),
    (
        "Score three students out of 100.",
        {
            "type": "object",
            "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 100},
            "maxProperties": 3,
        },
    ),
]


def generate(model, prompt: str, grammar: str, max_new: int = 160):
    ids = model.render_chat([{"role": "user", "content": prompt + " Answer in JSON."}])
    cfg = GenerationConfig(grammar=grammar, max_new_tokens=max_new, temperature=0)
    return asyncio.run(model.run_completion(ids, cfg, None, CancelFlag(), lambda p: None))


@pytest.mark.parametrize(
    "i", range(len(GENERATION)), ids=[p.split()[0] + str(i) for i, (p, _) in enumerate(GENERATION)]
)
def test_json_schema_generation_smollm2(model, i):
    prompt, schema = GENERATION[i]
    g = json_schema_grammar(schema)
    r = generate(model, prompt, g)
    assert r.reason in (StopReason.END_OF_TURN, StopReason.EOS), (r.reason, r.text)
    value = json.loads(r.text)
    validator(schema).validate(value)
    check_formats(value, schema)


def parse_hermes(text: str) -> dict:
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"), text
    return json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")])


@pytest.mark.parametrize("name", [None, "get_time"])
def test_tool_call_forced_from_smollm2(model, name):
    tools = [WEATHER, TIME]
    g = tool_call_grammar(tools, "hermes", name=name)
    ids = model.render_chat([{"role": "user", "content": "What's the weather like in Paris right now?"}], tools=tools)
    cfg = GenerationConfig(grammar=g, max_new_tokens=120, temperature=0)
    r = asyncio.run(model.run_completion(ids, cfg, None, CancelFlag(), lambda p: None))
    assert r.reason in (StopReason.END_OF_TURN, StopReason.EOS), (r.reason, r.text)
    call = parse_hermes(r.text)
    assert set(call) == {"name", "arguments"}
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert call["name"] in by_name and (name is None or call["name"] == name)
    validator(by_name[call["name"]]).validate(call["arguments"])
