"""The JSON Schema converter and the grammars built on it alone:
:func:`check_schema`, :func:`json_schema_grammar`, :func:`json_object_grammar`."""

from __future__ import annotations

import json
import math
from typing import Any

from .containers import _Containers
from .errors import UnsupportedSchema, _Empty
from .keywords import _IMPLIES, ASSERTING, JSON_TYPES, UNSUPPORTED, _json_eq, _overlap, _type_of
from .merge import _Flattener
from .numbers import _bound, _int_range, _number_range
from .pattern import _Enc, _Pattern
from .rules import FORMATS, _lit, _rep, _Rules, _seq

#: Length cap for strings without maxLength when the caller asks for bounded strings.
DEFAULT_MAX_STRING = 200


#: strings written as JSON string bodies
JSON_ENC = _Enc(json=True)


class _Converter(_Flattener, _Containers):
    """JSON Schema (one root document, local $refs) to GBNF rules in ``rules``."""

    def __init__(self, rules: _Rules, root: Any, bound_strings: bool) -> None:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for

        self.r = rules
        self.root = root
        self.bound = bound_strings
        self.ref_rules: dict[str, str] = {}
        self.left: set[str] = set()  # refs entered since the last written token
        if not isinstance(root, (dict, bool)):
            raise UnsupportedSchema(f"a schema must be an object or a boolean, not {type(root).__name__}")
        cls = validator_for(root, default=Draft202012Validator)
        try:
            cls.check_schema(root)
        except SchemaError as e:
            path = "#/" + "/".join(str(p) for p in e.absolute_path)
            raise UnsupportedSchema(f"invalid schema: {e.message}", path.rstrip("/")) from None
        self.validator = cls(root, format_checker=cls.FORMAT_CHECKER)

    # -- entry points
    def value(self, s: Any, path: str, hint: str) -> str:
        """A rule name for one JSON value valid against ``s``."""
        if s is True:
            return self.any_value()
        if s is False:
            raise _Empty("false schema (no value is valid)", path)
        if not isinstance(s, dict):
            raise UnsupportedSchema(f"a schema must be an object, not {type(s).__name__}", path)
        self._check_id(s, path)
        asserting = [k for k in s if k in ASSERTING]
        if asserting == ["$ref"]:
            return self.ref(s["$ref"], path, hint)
        s = self.flatten(s, path, ())
        for k in s:
            if k in UNSUPPORTED:
                raise UnsupportedSchema(UNSUPPORTED[k], path)
        if "const" in s or "enum" in s:
            return self.enum(s, path, hint, _Enc(json=True))
        if "anyOf" in s or "oneOf" in s:
            return self.union(s, path, hint)
        types = self.types(s, path)
        if types is None:
            return self.any_value()
        alts = [self.typed(s, t, path, hint) for t in types]
        return self.r.add(hint, " | ".join(dict.fromkeys(alts)))

    def inside(self, s: Any, path: str, hint: str) -> str:
        """A value nested after a written token (recursion through it is fine)."""
        saved, self.left = self.left, set()
        try:
            return self.value(s, path, hint)
        finally:
            self.left = saved

    def ref(self, ref: str, path: str, hint: str) -> str:
        if ref in self.left:
            raise UnsupportedSchema("circular $ref that writes nothing before recursing", path)
        name = self.ref_rules.get(ref)
        if name:
            return name
        target = self.resolve(ref, path)
        name = self.r.reserve("def-" + ref.rsplit("/", 1)[-1] if ref != "#" else "def-root")
        self.ref_rules[ref] = name
        self.left.add(ref)
        try:
            body = self.value(target, ref, name)
        finally:
            self.left.discard(ref)
        self.r.define(name, body)
        return name

    # -- combinators and constants
    def union(self, s: dict[str, Any], path: str, hint: str) -> str:
        key = "anyOf" if "anyOf" in s else "oneOf"
        rest = {k: v for k, v in s.items() if k != key}
        branches: list[tuple[Any, str]] = []
        for i, b in enumerate(s[key]):
            bpath = f"{path}/{key}/{i}"
            try:
                merged = b if not rest else self.merge(rest, self.flatten(b, bpath, ()), bpath)
                if key == "oneOf":
                    self.flatten(merged, bpath, ())  # raises _Empty for an unsatisfiable branch
            except _Empty:
                continue
            branches.append((merged, bpath))
        if not branches:
            raise _Empty(f"{key} where no alternative can be satisfied", path)
        if key == "oneOf":
            flat = [self.flatten(b, p, ()) for b, p in branches]
            for i in range(len(flat)):
                for j in range(i + 1, len(flat)):
                    if not self.disjoint(flat[i], flat[j]):
                        raise UnsupportedSchema("oneOf whose alternatives may overlap (use anyOf)", path)
        alts = []
        for i, (b, bpath) in enumerate(branches):
            try:
                alts.append(self.value(b, bpath, f"{hint}-{i}"))
            except _Empty:
                continue  # no value satisfies it: nothing to offer (and nothing to overlap)
        if not alts:
            raise _Empty(f"{key} where no alternative can be satisfied", path)
        return self.r.add(hint, " | ".join(dict.fromkeys(alts)))

    def sem_types(self, s: dict[str, Any]) -> set[str]:
        """The JSON types a flattened schema accepts (as validators see it)."""
        if "const" in s:
            return {_type_of(s["const"])}
        if "enum" in s:
            return {_type_of(v) for v in s["enum"]}
        t = s.get("type")
        own = set(JSON_TYPES) if t is None else ({t} if isinstance(t, str) else set(t))
        for key in ("anyOf", "oneOf"):
            if key in s:
                inner: set[str] = set()
                for b in s[key]:
                    try:
                        inner |= self.sem_types(self.flatten(b, "#", ()))
                    except _Empty:
                        pass
                own = _overlap(own, inner) if t is not None else inner
        return own

    def disjoint(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        common = _overlap(self.sem_types(a), self.sem_types(b))
        if not common:
            return True
        va = [a["const"]] if "const" in a else a.get("enum")
        vb = [b["const"]] if "const" in b else b.get("enum")
        if va is not None and vb is not None:
            return not any(_json_eq(x, y) for x in va for y in vb)
        if common <= {"object"}:
            pa, pb = a.get("properties", {}), b.get("properties", {})
            shared = set(pa) & set(pb) & set(a.get("required", ())) & set(b.get("required", ()))
            for k in shared:
                try:
                    if self.disjoint(self.flatten(pa[k], "#", ()), self.flatten(pb[k], "#", ())):
                        return True
                except _Empty:
                    return True
        return False

    def enum(self, s: dict[str, Any], path: str, hint: str, enc: _Enc) -> str:
        """Exactly the listed values that are valid against the whole (sub)schema."""
        values = [s["const"]] if "const" in s else list(s["enum"])
        check = self.validator.evolve(schema=s)
        kept: list[Any] = []
        for v in values:
            if any(_json_eq(v, k) for k in kept):
                continue
            try:
                ok = check.is_valid(v)
            except Exception as e:  # a $ref jsonschema cannot follow, ...
                raise UnsupportedSchema(f"enum/const that cannot be checked ({e})", path) from None
            if ok and (enc.json or isinstance(v, str)):
                kept.append(v)
        if not kept:
            raise _Empty("enum/const with no value valid against the rest of the schema", path)
        lits = [_lit(json.dumps(v, ensure_ascii=False) if enc.json else v) for v in kept]
        return self.r.add(hint, " | ".join(lits))

    # -- types
    def types(self, s: dict[str, Any], path: str) -> list[str] | None:
        t = s.get("type")
        if t is None:
            implied = [ty for ty, keys in _IMPLIES.items() if any(k in s for k in keys)]
            return implied or None
        types = [t] if isinstance(t, str) else list(dict.fromkeys(t))
        for ty in types:
            if ty not in JSON_TYPES:
                raise UnsupportedSchema(f"type {ty!r}", path)
        if "number" in types and "integer" in types:
            types.remove("integer")
        return types

    def typed(self, s: dict[str, Any], t: str, path: str, hint: str) -> str:
        if t == "null":
            return self.r.builtin("null")
        if t == "boolean":
            return self.r.builtin("boolean")
        if t in ("integer", "number"):
            return self.number(s, t == "integer", path, hint)
        if t == "string":
            return self.string(s, path, hint, _Enc(json=True))
        if t == "array":
            return self.array(s, path, hint)
        return self.object(s, path, hint)

    def any_value(self) -> str:
        r = self.r
        if "any-value" not in r.rules:
            r.rules["any-value"] = '""'  # placeholder while its parts refer back to it
            string = self.plain_string(0, None, "any-string")
            r.rules["any-object"] = (
                f'"{{" ws ({string} ws ":" ws any-value ws ("," ws {string} ws ":" ws any-value ws)*)? "}}"'
            )
            r.rules["any-array"] = '"[" ws (any-value ws ("," ws any-value ws)*)? "]"'
            r.builtin("ws")
            r.builtin("number")
            r.rules["any-value"] = f'any-object | any-array | {string} | number | "true" | "false" | "null"'
        return "any-value"

    def any_object(self) -> str:
        self.any_value()
        return "any-object"

    # -- numbers
    def number(self, s: dict[str, Any], integer: bool, path: str, hint: str) -> str:
        mult = s.get("multipleOf")
        if mult is not None:
            if mult == 1 or (integer and (1 / mult).is_integer()):
                integer = True
            else:
                raise UnsupportedSchema("multipleOf", path)
        lo, lo_x = _bound(s, "minimum", "exclusiveMinimum", lower=True)
        hi, hi_x = _bound(s, "maximum", "exclusiveMaximum", lower=False)
        if lo is None and hi is None:
            return self.r.builtin("integer" if integer else "number")
        if integer:
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
            alts = _int_range(ilo, ihi)
        else:
            alts = _number_range(lo, not lo_x, hi, not hi_x)
        if not alts:
            raise _Empty("a number range that holds no value", path)
        return self.r.add(hint + ("-int" if integer else "-num"), " | ".join(alts))

    # -- strings
    def plain_string(self, lo: int, hi: int | None, hint: str, enc: _Enc = JSON_ENC) -> str:
        if hi is None and self.bound:
            hi = max(DEFAULT_MAX_STRING, lo)
        char = self.r.builtin(enc.char)
        body = self.r.rep(char, lo, hi, f"{hint}-chars")
        if enc.json:
            body = _seq('"\\""', body, '"\\""')
        return self.r.add(hint, body)

    def string(self, s: dict[str, Any], path: str, hint: str, enc: _Enc) -> str:
        fmt, pat = s.get("format"), s.get("pattern")
        lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
        hi = None if hi is None else int(hi)
        if hi is not None and lo > hi:
            raise _Empty("minLength above maxLength", path)
        quote = '"\\""' if enc.json else ""
        if fmt is not None:
            if fmt not in FORMATS:
                raise UnsupportedSchema(f"format {fmt!r}", path)
            if pat is not None:
                raise UnsupportedSchema(f"format {fmt!r} together with pattern", path)
            rule, flo, fhi = FORMATS[fmt]
            if lo > flo or (hi is not None and (fhi is None or fhi > hi)):
                raise UnsupportedSchema(f"format {fmt!r} together with minLength/maxLength", path)
            return self.r.add(f"{hint}-{fmt}", _seq(quote, self.r.builtin(rule), quote))
        if pat is not None:
            if "minLength" in s or "maxLength" in s:
                raise UnsupportedSchema("pattern together with minLength/maxLength", path)
            cap = DEFAULT_MAX_STRING if self.bound else None
            char = self.r.builtin(enc.char)
            pad = _rep(char, 0, cap)
            body = _Pattern(pat, enc, cap, path, self.r, hint).convert(pad)
            return self.r.add(hint, _seq(quote, body, quote))
        return self.plain_string(lo, hi, hint, enc)

    # -- xml tool syntax: raw string parameters
    def raw_param(self, s: Any, path: str, hint: str) -> str | None:
        """A rule for a string parameter written raw (xml syntax), or None if it is not a plain string."""
        if not isinstance(s, dict):
            return None
        f = self.flatten(s, path, ())
        for k in f:
            if k in UNSUPPORTED:
                raise UnsupportedSchema(UNSUPPORTED[k], path)
        if "anyOf" in f or "oneOf" in f:
            return None
        if "const" in f or "enum" in f:
            values = [f["const"]] if "const" in f else f["enum"]
            if not all(isinstance(v, str) for v in values):
                return None
            return self.enum(f, path, hint, _Enc(json=False))
        if f.get("type") not in ("string", ["string"]):
            return None
        return self.string(f, path, hint, _Enc(json=False))


# ---------------------------------------------------------------- public API
def _convert(schema: Any, bound_strings: bool) -> str:
    rules = _Rules()
    conv = _Converter(rules, schema, bound_strings)
    try:
        root = conv.value(schema, "#", "json")
    except _Empty as e:
        raise UnsupportedSchema(e.feature, e.path) from None
    return rules.render(root)


def check_schema(schema: dict[str, Any]) -> None:
    """Raise :class:`UnsupportedSchema` naming the first feature the grammar cannot enforce.

    It runs the same conversion as :func:`json_schema_grammar`, so the two can
    never disagree about what is supported.
    """
    _convert(schema, bound_strings=False)


def json_schema_grammar(schema: dict[str, Any], *, bound_strings: bool = False) -> str:
    """GBNF (root rule ``root``) whose every output is one JSON value valid against ``schema``.

    ``bound_strings`` caps strings without maxLength (and open pattern repeats)
    at :data:`DEFAULT_MAX_STRING` characters, so a small model cannot ramble
    inside a string until max_tokens.
    """
    return _convert(schema, bound_strings)


def json_object_grammar(*, bound_strings: bool = False) -> str:
    """GBNF for any JSON object (OpenAI ``json_object``, Ollama ``format: "json"``)."""
    rules = _Rules()
    conv = _Converter(rules, True, bound_strings)
    return rules.render(conv.any_object())
