"""GBNF grammars that make llama.cpp's sampler write only valid output.

Three producers share one JSON Schema converter:

- :func:`json_schema_grammar`: one JSON value valid against a schema
  (OpenAI ``response_format`` json_schema, Ollama ``format: {schema}``);
- :func:`json_object_grammar`: any JSON object (``json_object``, Ollama ``"json"``);
- :func:`tool_call_grammar`: exactly one tool call in a model family's text syntax
  (``tool_choice`` required / named, Anthropic ``any`` / ``tool``).

Why not ``llama_cpp.llama_grammar.json_schema_to_gbnf``: it silently ignores
minimum/maximum, treats oneOf as anyOf, lets strings hold raw control
characters (invalid JSON) and merges allOf loosely. Here every keyword is either
enforced or makes :func:`check_schema` raise :class:`UnsupportedSchema` naming
it. The grammar accepts a *subset* of the valid texts, chosen so that small
models finish: properties in schema order and only the declared ones, at most
one space between tokens, numbers without exponents and with at most 16 integer
and 15 fraction digits, optionally bounded strings (``bound_strings``).
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

#: Length cap for strings without maxLength when the caller asks for bounded strings.
DEFAULT_MAX_STRING = 200
MAX_INT_DIGITS = 16
MAX_FRACTION_DIGITS = 15
SYNTAXES = ("hermes", "llama3", "json", "mistral", "xml")


class UnsupportedSchema(ValueError):
    """A schema feature the grammar cannot enforce (or a schema no value satisfies)."""

    def __init__(self, feature: str, path: str = "#") -> None:
        self.feature = feature
        self.path = path
        super().__init__(f"unsupported JSON schema feature at {path}: {feature}")


# ---------------------------------------------------------------- keywords
#: Assertions we do not enforce: their presence rejects the schema.
UNSUPPORTED = {
    "not": "not",
    "if": "if/then/else",
    "patternProperties": "patternProperties",
    "propertyNames": "propertyNames",
    "dependencies": "dependencies",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "unevaluatedProperties": "unevaluatedProperties",
    "unevaluatedItems": "unevaluatedItems",
    "contains": "contains",
    "minContains": "contains",
    "maxContains": "contains",
    "$dynamicRef": "$dynamicRef",
    "$recursiveRef": "$recursiveRef",
}
#: Assertions we enforce. Every other keyword is an annotation (ignored, as validators do).
HANDLED = {
    "type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf",
    "properties", "required", "additionalProperties", "minProperties", "maxProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
    "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
}
ASSERTING = HANDLED | set(UNSUPPORTED)
JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
#: Keywords that imply a type when "type" is absent (we then write that type).
_IMPLIES = {
    "object": ("properties", "required", "additionalProperties", "minProperties", "maxProperties"),
    "array": ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}
_OBJECT_SHAPE = ("properties", "additionalProperties")


class _Empty(UnsupportedSchema):
    """No value satisfies this (sub)schema; an anyOf branch like this is dropped."""


# ---------------------------------------------------------------- GBNF text helpers
def _lit(text: str) -> str:
    """A GBNF string literal."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _cls_char(o: int) -> str:
    if o < 0x80 and chr(o).isalnum():
        return chr(o)
    if o < 0x100:
        return f"\\x{o:02X}"
    if o < 0x10000:
        return f"\\u{o:04X}"
    return f"\\U{o:08X}"


def _cls(ranges: list[tuple[int, int]], negate: bool = False) -> str:
    """A GBNF character class from code point ranges."""
    body = "".join(_cls_char(a) if a == b else f"{_cls_char(a)}-{_cls_char(b)}" for a, b in ranges)
    return f"[{'^' if negate else ''}{body}]"


def _rep(atom: str, lo: int, hi: int | None) -> str:
    """``atom`` repeated lo..hi times (hi None: unbounded); ``atom`` must be one GBNF element."""
    if hi is not None and hi <= 0:
        return '""'
    if (lo, hi) == (0, None):
        return f"{atom}*"
    if (lo, hi) == (1, None):
        return f"{atom}+"
    if (lo, hi) == (0, 1):
        return f"{atom}?"
    if (lo, hi) == (1, 1):
        return atom
    if hi is None:
        return f"{atom}{{{lo},}}"
    if lo == hi:
        return f"{atom}{{{lo}}}"
    return f"{atom}{{{lo},{hi}}}"


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p and p != '""') or '""'


def _alt(parts: list[str]) -> str:
    parts = list(dict.fromkeys(parts))
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def _normalize(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _subtract(ranges: list[tuple[int, int]], minus: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, b in _normalize(ranges):
        for c, d in _normalize(minus):
            if d < a or c > b:
                continue
            if c > a:
                out.append((a, c - 1))
            a = d + 1
            if a > b:
                break
        if a <= b:
            out.append((a, b))
    return out


_NAME_RE = re.compile(r"[^a-zA-Z0-9]+")
#: One GBNF element that llama.cpp counts as a single rule when repeated.
_SIMPLE_RE = re.compile(r'^([a-zA-Z0-9-]+|"([^"\\]|\\.)*"|\[([^\]\\]|\\.)*\])$')
_REP_LIMIT = 1000  # llama.cpp: repetition x rule count must stay under 2000
_CHUNK = 100
_MAX_COUNT = _CHUNK * _REP_LIMIT
#: JSON string content: one code point per element (no raw control characters,
#: no surrogate escapes, so minLength/maxLength count exactly).
_JCHAR = (
    r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))'
)
#: Names written directly (root, the any-value family) that reserve() never hands out.
_RESERVED = {"root", "any-value", "any-object", "any-array"}
_INT_PART = f'("0" | [1-9] [0-9]{{0,{MAX_INT_DIGITS - 1}}})'
_BUILTINS: dict[str, str] = {
    "ws": '" "?',
    "jchar": _JCHAR,
    "rawchar": "[^<]",
    "integer": f'"-"? {_INT_PART}',
    "number": f'"-"? {_INT_PART} ("." [0-9]{{1,{MAX_FRACTION_DIGITS}}})?',
    "boolean": '"true" | "false"',
    "null": '"null"',
    # formats (ASCII only; valid per RFC 3339 / jsonschema's checkers)
    "fmt-year": "[1-9] [0-9]{3}",
    "fmt-leap-year": '[1-9] [0-9] ("0" [48] | [2468] [048] | [13579] [26]) | ([2468] [048] | [13579] [26]) "00"',
    "fmt-date": (
        'fmt-year "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])'
        ' | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30")'
        ' | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])) | fmt-leap-year "-02-29"'
    ),
    "fmt-hour": '[01] [0-9] | "2" [0-3]',
    "fmt-time": (
        'fmt-hour ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] fmt-hour ":" [0-5] [0-9])'
    ),
    "fmt-date-time": 'fmt-date "T" fmt-time',
    "fmt-uuid": '[0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}',
    "fmt-ipv4-octet": '"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]',
    "fmt-ipv4": 'fmt-ipv4-octet ("." fmt-ipv4-octet){3}',
    "fmt-host-label": "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,18} [a-zA-Z0-9])?",
    "fmt-hostname": 'fmt-host-label ("." fmt-host-label){0,3}',
    "fmt-ipv6": '[0-9a-f]{1,4} (":" [0-9a-f]{1,4}){7}',
    "fmt-dur-n": "[0-9]{1,4}",
    "fmt-dur-time": (
        '"T" (fmt-dur-n "H" (fmt-dur-n "M" (fmt-dur-n "S")?)? | fmt-dur-n "M" (fmt-dur-n "S")? | fmt-dur-n "S")'
    ),
    "fmt-duration": (
        '"P" ((fmt-dur-n "D" | fmt-dur-n "M" (fmt-dur-n "D")? | fmt-dur-n "Y" (fmt-dur-n "M" (fmt-dur-n "D")?)?)'
        ' fmt-dur-time? | fmt-dur-time | fmt-dur-n "W")'
    ),
    "fmt-uri": '("https" | "http") "://" fmt-hostname ("/" [a-zA-Z0-9._~-]{1,30}){0,5} "/"?',
    "fmt-email-atom": "[a-zA-Z0-9_+-]{1,20}",
    "fmt-email-label": "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,20} [a-zA-Z0-9])?",
    "fmt-email": (
        'fmt-email-atom ("." fmt-email-atom){0,3} "@" fmt-email-label ("." fmt-email-label){0,2} "." [a-z]{2,10}'
    ),
}
#: format -> (builtin rule, min length, max length or None)
FORMATS = {
    "date": ("fmt-date", 10, 10),
    "time": ("fmt-time", 9, 21),
    "date-time": ("fmt-date-time", 20, 32),
    "uuid": ("fmt-uuid", 36, 36),
    "ipv4": ("fmt-ipv4", 7, 15),
    "email": ("fmt-email", 6, None),
    "hostname": ("fmt-hostname", 1, 83),
    "ipv6": ("fmt-ipv6", 15, 39),
    "duration": ("fmt-duration", 3, None),
    "uri": ("fmt-uri", 10, None),
}


class _Rules:
    """The grammar being built: named rules, identical bodies shared."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}

    def reserve(self, hint: str) -> str:
        base = _NAME_RE.sub("-", hint).strip("-").lower()[:40].strip("-") or "r"
        name, i = base, 1
        while name in self.rules or name in _BUILTINS or name in _RESERVED:
            i += 1
            name = f"{base}-{i}"
        self.rules[name] = '""'
        return name

    def define(self, name: str, body: str) -> None:
        self.rules[name] = body
        self._by_body.setdefault(body, name)

    def add(self, hint: str, body: str) -> str:
        if body in self.rules:  # already a rule name: no alias rule needed
            return body
        found = self._by_body.get(body)
        if found:
            return found
        name = self.reserve(hint)
        self.define(name, body)
        return name

    def rep(self, atom: str, lo: int, hi: int | None, hint: str = "rep") -> str:
        """``atom`` repeated lo..hi times in a form llama.cpp's parser accepts.

        llama.cpp refuses a repetition above 2000, and a repeated group whose
        inner rule count times the repetition reaches 2000. So a compound atom
        becomes a named rule first, and large counts are written exactly as
        chunks of ``_CHUNK`` (counts above ``_MAX_COUNT`` are capped: a subset).
        """
        if not _SIMPLE_RE.match(atom):
            atom = self.add(hint, atom)
        if hi is not None:
            hi = min(hi, _MAX_COUNT)
        if lo > _MAX_COUNT:
            raise UnsupportedSchema(f"a minimum length or count above {_MAX_COUNT}")
        if lo <= _REP_LIMIT and (hi is None or hi <= _REP_LIMIT):
            return _rep(atom, lo, hi)
        chunk = self.add(f"{hint}-chunk", _rep(atom, _CHUNK, _CHUNK))

        def exactly(m: int) -> str:
            q, r = divmod(m, _CHUNK)
            return _seq(_rep(chunk, q, q), _rep(atom, r, r))

        def up_to(n: int) -> str:
            q, r = divmod(n, _CHUNK)
            if q == 0:
                return _rep(atom, 0, r)
            return (f"({_seq(_rep(chunk, 0, q - 1), _rep(atom, 0, _CHUNK - 1))}"
                    f" | {_seq(_rep(chunk, q, q), _rep(atom, 0, r))})")

        return _seq(exactly(lo), _rep(atom, 0, None) if hi is None else up_to(hi - lo))

    def builtin(self, name: str) -> str:
        if name not in self.rules:
            body = _BUILTINS[name]
            self.rules[name] = body
            for dep in re.findall(r"\b(fmt-[a-z0-9-]+|jchar)\b", body):
                if dep != name and dep in _BUILTINS:
                    self.builtin(dep)
        return name

    def render(self, root: str) -> str:
        lines = [f"root ::= {root}"]
        lines += [f"{n} ::= {b}" for n, b in self.rules.items()]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- values
def _type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _json_eq(a: Any, b: Any) -> bool:
    """JSON Schema equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _overlap(ta: set[str], tb: set[str]) -> set[str]:
    out = set()
    for x in ta:
        for y in tb:
            if x == y or {x, y} == {"integer", "number"}:
                out.add("integer" if "integer" in (x, y) else x)
    return out


def _bound(s: dict, plain: str, excl: str, lower: bool) -> tuple[float | None, bool]:
    """The tighter of ``minimum``/``exclusiveMinimum`` (both drafts' spellings)."""
    best: tuple[float | None, bool] = (None, False)
    cands = []
    if plain in s:
        cands.append((s[plain], s.get(excl) is True))
    if excl in s and not isinstance(s[excl], bool):
        cands.append((s[excl], True))
    for v, ex in cands:
        b = best[0]
        if b is None or (v > b if lower else v < b) or (v == b and ex):
            best = (v, ex)
    return best


# ---------------------------------------------------------------- integers
def _same_len_range(a: str, b: str) -> list[str]:
    """Alternatives for digit strings of one length between a and b."""
    if a == b:
        return [_lit(a)]
    i = 0
    while a[i] == b[i]:
        i += 1
    pre = _lit(a[:i]) if i else ""
    a, b = a[i:], b[i:]
    rest = len(a) - 1
    dcls = lambda x, y: f'"{x}"' if x == y else f"[{x}-{y}]"  # noqa: E731
    if rest == 0:
        return [_seq(pre, dcls(a[0], b[0]))]
    out: list[str] = []
    lo, hi = int(a[0]), int(b[0])
    if a[1:] != "0" * rest:
        out += [_seq(pre, f'"{a[0]}"', x) for x in _same_len_range(a[1:], "9" * rest)]
        lo += 1
    high: list[str] = []
    if b[1:] != "9" * rest:
        high = [_seq(pre, f'"{b[0]}"', x) for x in _same_len_range("0" * rest, b[1:])]
        hi -= 1
    if lo <= hi:
        out.append(_seq(pre, dcls(lo, hi), _rep("[0-9]", rest, rest)))
    return out + high


def _natural_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for naturals in [lo, hi] without leading zeros (hi None: up to MAX_INT_DIGITS digits)."""
    n_lo = len(str(lo))
    if hi is None:
        alts = _same_len_range(str(lo), "9" * n_lo)
        if n_lo < MAX_INT_DIGITS:
            alts.append(f"[1-9] {_rep('[0-9]', n_lo, MAX_INT_DIGITS - 1)}")
        return alts
    alts = []
    for n in range(n_lo, len(str(hi)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        if a <= b:
            alts += _same_len_range(str(a), str(b))
    return alts


_BIG = 10**MAX_INT_DIGITS - 1


def _int_range(lo: int | None, hi: int | None) -> list[str]:
    """Alternatives for integers in [lo, hi] (None: unbounded on that side)."""
    lo = None if lo is not None and lo < -_BIG else lo
    hi = None if hi is not None and hi > _BIG else hi
    if lo is not None and hi is not None and lo > hi:
        return []
    alts = []
    if lo is None or lo < 0:
        m_lo = max(1, -hi) if hi is not None else 1
        m_hi = -lo if lo is not None else None
        if m_hi is None or m_lo <= m_hi:
            alts.append(_seq('"-"', _alt(_natural_range(m_lo, m_hi))))
    if hi is None or hi >= 0:
        alts += _natural_range(max(lo, 0) if lo is not None else 0, hi)
    return alts


def _decimal(v: float | int) -> Decimal:
    return Decimal(v) if isinstance(v, int) else Decimal(repr(float(v)))


def _split(d: Decimal) -> tuple[int, str]:
    """|d| as (integer part, fraction digits without trailing zeros)."""
    i, _, f = format(abs(d), "f").partition(".")
    return int(i), f.rstrip("0")


def _frac(lo: str | None, hi: str | None, lo_incl: bool, hi_incl: bool, budget: int, nonempty: bool = False) -> list[str]:
    """Alternatives for fraction digit strings f (no trailing zero, at most ``budget`` digits,
    empty meaning .0) with lo <= 0.f <= hi; None: that side is free (>= 0, < 1).

    Digit strings compare like numbers once padded with zeros, so this walks
    the bounds digit by digit.
    """
    alts = []
    if not nonempty and (lo is None or (lo == "" and lo_incl)) and (hi is None or hi != "" or hi_incl):
        alts.append('""')
    if budget == 0 or hi == "":
        return alts
    lo_free, hi_free = lo is None or lo == "", hi is None
    l0 = 0 if lo_free else int(lo[0])  # type: ignore[index]
    u0 = 9 if hi_free else int(hi[0])  # type: ignore[index]
    free = [d for d in range(10) if (lo_free or d > l0) and (hi_free or d < u0)]
    any_rest = _seq(_rep("[0-9]", 0, budget - 2), "[1-9]") if budget >= 2 else None
    if nz := [d for d in free if d]:
        cls = f'"{nz[0]}"' if len(nz) == 1 else _cls(_normalize([(48 + d, 48 + d) for d in nz]))
        alts.append(_seq(cls, f"({any_rest})?" if any_rest else ""))
    if 0 in free and any_rest:
        alts.append(_seq('"0"', f"({any_rest})"))
    for d in sorted({d for d in (None if lo_free else l0, None if hi_free else u0) if d is not None}):
        if d in free or (not lo_free and d < l0) or (not hi_free and d > u0):
            continue
        sub_lo = lo[1:] if not lo_free and d == l0 else None  # type: ignore[index]
        sub_hi = hi[1:] if not hi_free and d == u0 else None  # type: ignore[index]
        rest = _frac(sub_lo, sub_hi, lo_incl, hi_incl, budget - 1, nonempty=d == 0)
        if rest:
            alts.append(_seq(f'"{d}"', _alt(rest)))
    return alts


def _with_point(fracs: list[str]) -> str:
    """Fraction alternatives (``""`` for none) as the text after the integer part."""
    nonempty = [f for f in fracs if f != '""']
    if not nonempty:
        return '""'
    body = _seq('"."', _alt(nonempty))
    return f"({body})?" if '""' in fracs else body


def _magnitude_range(lo: Decimal | None, lo_incl: bool, hi: Decimal | None, hi_incl: bool, budget: int) -> list[str]:
    """Alternatives for decimals y >= 0 written plainly with lo <= y <= hi (None: unbounded)."""
    li, lf = _split(lo) if lo is not None else (0, "")
    if lo is None:
        lo_incl = True
    if hi is None:
        alts = [_seq(_lit(str(li)), _with_point(_frac(lf, None, lo_incl, True, budget)))]
        if li < _BIG:
            mid = _natural_range(li + 1, None)
            alts.append(_seq(_alt(mid), _with_point(_frac(None, None, True, True, budget))))
        return alts
    hi_i, hf = _split(hi)
    if li > hi_i:
        return []
    if li == hi_i:
        fr = _frac(lf, hf, lo_incl, hi_incl, budget)
        return [_seq(_lit(str(li)), _with_point(fr))] if fr else []
    alts = []
    fr = _frac(lf, None, lo_incl, True, budget)
    if fr:
        alts.append(_seq(_lit(str(li)), _with_point(fr)))
    if li + 1 <= hi_i - 1:
        alts.append(_seq(_alt(_natural_range(li + 1, hi_i - 1)), _with_point(_frac(None, None, True, True, budget))))
    fr = _frac(None, hf, True, hi_incl, budget)
    if fr:
        alts.append(_seq(_lit(str(hi_i)), _with_point(fr)))
    return alts


def _number_range(lo: Any, lo_incl: bool, hi: Any, hi_incl: bool) -> list[str]:
    """Alternatives for plain decimals (no exponent) between lo and hi, exactly.

    Fractions get at most 15 significant digits in all near a bound, so two
    distinct written decimals never parse to the same double (an exclusive
    bound stays exclusive after parsing).
    """
    dlo = None if lo is None else _decimal(lo)
    dhi = None if hi is None else _decimal(hi)
    if dlo is not None and dlo < -_BIG:
        dlo = None
    if dhi is not None and dhi > _BIG:
        dhi = None
    int_digits = [len(str(_split(d)[0])) for d in (dlo, dhi) if d is not None]
    budget = max(1, MAX_FRACTION_DIGITS - max(int_digits, default=0))
    alts = []
    # x >= 0
    if dhi is None or dhi > 0 or (dhi == 0 and hi_incl):
        if dlo is None or dlo < 0:
            alts += _magnitude_range(Decimal(0), True, dhi, hi_incl, budget)
        else:
            alts += _magnitude_range(dlo, lo_incl, dhi, hi_incl, budget)
    # x = -y < 0, y in [-hi, -lo], y > 0
    if dlo is None or dlo < 0:
        if dhi is None or dhi >= 0:
            y_lo, y_lo_incl = Decimal(0), False
        else:
            y_lo, y_lo_incl = -dhi, hi_incl
        neg = _magnitude_range(y_lo, y_lo_incl, None if dlo is None else -dlo, lo_incl, budget)
        if neg:
            alts.append(_seq('"-"', _alt(neg)))
    return alts


# ---------------------------------------------------------------- text encodings
@dataclass(frozen=True)
class _Enc:
    """How string content is written: JSON-escaped (inside quotes) or raw (xml tool syntax)."""

    json: bool

    @property
    def char(self) -> str:
        return "jchar" if self.json else "rawchar"

    def text(self, s: str) -> str:
        """The characters of ``s`` as they appear in the output."""
        if not self.json:
            return s
        return json.dumps(s, ensure_ascii=False)[1:-1]

    @property
    def excluded(self) -> list[tuple[int, int]]:
        """Characters open classes never produce (they would need escaping or end the value)."""
        if self.json:
            return [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
        return [(0, 0x08), (0x0B, 0x1F), (0x3C, 0x3C)]

    def escaped(self, o: int) -> str | None:
        """A GBNF literal for an excluded code point that can still be written, else None."""
        if self.json:
            return _lit(self.text(chr(o)))
        return None


_ASCII_PRINTABLE = [(0x20, 0x7E)]
_SHORTHAND = {
    "d": [(0x30, 0x39)],
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "s": [(0x20, 0x20)],
}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}
_QUANT_RE = re.compile(r"\{(\d*)(,(\d*))?\}")


class _Pattern:
    """An ECMA/Python regex (the common subset) to GBNF over a string's written content.

    Open classes (negations, ``.``, ``\\D``) never produce characters that need
    escaping, so they are a subset of what the regex allows; everything outside
    the subset (lookaround, backreferences, flags, ...) is rejected.
    """

    def __init__(self, pattern: str, enc: _Enc, cap: int | None, path: str, rules: _Rules, hint: str) -> None:
        self.src, self.enc, self.cap, self.path = pattern, enc, cap, path
        self.rules, self.hint = rules, hint
        self.i = 0

    def fail(self, what: str) -> UnsupportedSchema:
        return UnsupportedSchema(f"pattern {self.src!r}: {what}", self.path)

    def convert(self, pad: str) -> str:
        p = self.src
        start = p.startswith("^")
        end = p.endswith("$") and not _escaped_at(p, len(p) - 1)
        body_src = p[1 if start else 0 : len(p) - 1 if end else len(p)]
        self.src_body = body_src
        self.i = 0
        top_alts = []
        while True:
            top_alts.append(self.sequence())
            if self.i < len(body_src) and body_src[self.i] == "|":
                self.i += 1
                continue
            break
        if self.i != len(body_src):
            raise self.fail("unbalanced ')'")
        if len(top_alts) > 1 and (start or end):
            raise self.fail("alternation with ^/$ anchors outside a group")
        body = _alt(top_alts)
        return _seq("" if start else pad, body, "" if end else pad)

    # -- recursive descent over self.src_body
    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.src_body[j] if j < len(self.src_body) else ""

    def sequence(self) -> str:
        items = []
        while self.i < len(self.src_body) and self.peek() not in "|)":
            items.append(self.quantified(self.atom()))
        return _seq(*items)

    def quantified(self, atom: str) -> str:
        c = self.peek()
        if c == "*":
            lo, hi = 0, None
            self.i += 1
        elif c == "+":
            lo, hi = 1, None
            self.i += 1
        elif c == "?":
            lo, hi = 0, 1
            self.i += 1
        elif c == "{" and (m := _QUANT_RE.match(self.src_body, self.i)) and (m.group(1) or m.group(3)):
            lo = int(m.group(1) or 0)
            hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if hi is not None and hi < lo:
                raise self.fail("quantifier {m,n} with m > n")
            self.i = m.end()
        else:
            return atom
        if self.peek() == "?":
            self.i += 1  # lazy: same language
        elif self.peek() == "+":
            raise self.fail("possessive quantifier")
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and _QUANT_RE.match(self.src_body, self.i)):
            raise self.fail("repeated quantifier")
        if hi is None and self.cap is not None:
            hi = max(self.cap, lo)
        return self.rules.rep(atom, lo, hi, f"{self.hint}-rep")

    def atom(self) -> str:
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.peek() == "?":
                if self.peek(1) == ":":
                    self.i += 2
                elif self.peek(1) == "P" and self.peek(2) == "<":
                    close = self.src_body.find(">", self.i)
                    if close < 0:
                        raise self.fail("unterminated group name")
                    self.i = close + 1
                elif self.peek(1) == "<" and self.peek(2) not in ("=", "!"):
                    close = self.src_body.find(">", self.i)
                    if close < 0:
                        raise self.fail("unterminated group name")
                    self.i = close + 1
                else:
                    raise self.fail("(?...) group (lookaround, flags or conditionals)")
            alts = [self.sequence()]
            while self.peek() == "|":
                self.i += 1
                alts.append(self.sequence())
            if self.peek() != ")":
                raise self.fail("unbalanced '('")
            self.i += 1
            return "(" + " | ".join(alts) + ")"
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return _cls(_normalize(self.enc.excluded + [(0x0A, 0x0A)]), negate=True)
        if c in "^$":
            raise self.fail(f"'{c}' anchor inside the pattern")
        if c in "*+?":
            raise self.fail("quantifier with nothing to repeat")
        if c == "\\":
            return self.escape()
        self.i += 1
        return self.literal(ord(c))

    def literal(self, o: int) -> str:
        return _lit(self.enc.text(chr(o)))

    def escape(self) -> str:
        d = self.peek(1)
        if d in _SHORTHAND:
            self.i += 2
            return self.positive(_SHORTHAND[d])
        if d in ("D", "W", "S"):
            self.i += 2
            return self.positive(_subtract(_ASCII_PRINTABLE, _SHORTHAND[d.lower()]))
        o = self.char_escape()
        return self.literal(o)

    def char_escape(self) -> int:
        """One escaped character at self.i (a backslash); returns its code point."""
        d = self.peek(1)
        if not d:
            raise self.fail("trailing backslash")
        if d == "0" and self.peek(2).isdigit():
            raise self.fail("octal escape")
        if d in _CONTROL_ESCAPES:
            self.i += 2
            return ord(_CONTROL_ESCAPES[d])
        for letter, n in (("x", 2), ("u", 4), ("U", 8)):
            if d == letter:
                digits = self.src_body[self.i + 2 : self.i + 2 + n]
                if len(digits) != n or not all(ch in "0123456789abcdefABCDEF" for ch in digits):
                    raise self.fail(f"bad \\{letter} escape")
                self.i += 2 + n
                return int(digits, 16)
        if d.isalnum():
            raise self.fail(f"escape \\{d} (word boundaries, backreferences, anchors ...)")
        self.i += 2
        return ord(d)

    def char_class(self) -> str:
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        shorthand = False
        first = True
        while True:
            c = self.peek()
            if not c:
                raise self.fail("unterminated [...]")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "\\" and self.peek(1) in _SHORTHAND:
                ranges += _SHORTHAND[self.peek(1)]
                shorthand = True
                self.i += 2
                continue
            if c == "\\" and self.peek(1) in ("D", "W", "S"):
                raise self.fail(f"\\{self.peek(1)} inside [...]")
            lo = self.char_escape() if c == "\\" else self.take()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                if self.peek() == "\\" and self.peek(1) in _SHORTHAND:
                    raise self.fail("range ending in a class shorthand")
                hi = self.char_escape() if self.peek() == "\\" else self.take()
                if hi < lo:
                    raise self.fail("bad range in [...]")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        if not negate:
            return self.positive(ranges)
        if shorthand:  # exact within printable ASCII, where \d \w \s have their ASCII meaning
            return self.positive(_subtract(_ASCII_PRINTABLE, ranges))
        return _cls(_normalize(ranges + self.enc.excluded), negate=True)

    def take(self) -> int:
        c = self.peek()
        self.i += 1
        return ord(c)

    def positive(self, ranges: list[tuple[int, int]]) -> str:
        """Exactly the characters of ``ranges`` that can be written."""
        plain = _subtract(ranges, self.enc.excluded)
        alts = [_cls(plain)] if plain else []
        for a, b in _normalize(ranges):
            for ex_a, ex_b in self.enc.excluded:
                for o in range(max(a, ex_a), min(b, ex_b) + 1):
                    lit = self.enc.escaped(o)
                    if lit:
                        alts.append(lit)
        if not alts:
            raise self.fail("a character class with no writable character")
        return _alt(alts)


def _escaped_at(s: str, j: int) -> bool:
    n = 0
    while j - 1 - n >= 0 and s[j - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


# ---------------------------------------------------------------- the converter
class _Converter:
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

    # -- $ref, allOf
    def _check_id(self, s: dict, path: str) -> None:
        if "$id" in s and s is not self.root:
            raise UnsupportedSchema("$id inside a schema (changes $ref resolution)", path)

    def resolve(self, ref: Any, path: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            what = "$ref to a remote URL" if isinstance(ref, str) and "://" in ref else "$ref to another document"
            raise UnsupportedSchema(what, path)
        frag = ref[1:]
        if frag == "":
            return self.root
        if not frag.startswith("/"):
            raise UnsupportedSchema("$ref to an $anchor", path)
        node = self.root
        for part in frag[1:].split("/"):
            part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise UnsupportedSchema(f"$ref {ref} that points nowhere", path)
        return node

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

    def flatten(self, s: Any, path: str, stack: tuple[str, ...]) -> dict:
        """``s`` with top-level $ref and allOf merged in, annotations dropped."""
        if s is True:
            return {}
        if s is False:
            raise _Empty("false schema (no value is valid)", path)
        if not isinstance(s, dict):
            raise UnsupportedSchema(f"a schema must be an object, not {type(s).__name__}", path)
        self._check_id(s, path)
        out = {k: v for k, v in s.items() if k in ASSERTING and k not in ("$ref", "allOf")}
        if "$ref" in s:
            ref = s["$ref"]
            if ref in stack:
                raise UnsupportedSchema("circular $ref", path)
            out = self.merge(out, self.flatten(self.resolve(ref, path), ref, (*stack, ref)), path)
        for i, part in enumerate(s.get("allOf", ())):
            out = self.merge(out, self.flatten(part, f"{path}/allOf/{i}", stack), path)
        return out

    def merge(self, a: dict, b: dict, path: str) -> dict:
        """The conjunction of two flattened schemas, where it is a schema we can write down."""
        out = dict(a)
        for k, v in b.items():
            if k not in out:
                out[k] = v
                continue
            u = out[k]
            if k in _OBJECT_SHAPE or _json_eq(u, v):
                continue
            if k == "type":
                ta = [u] if isinstance(u, str) else list(u)
                tb = [v] if isinstance(v, str) else list(v)
                both = list(dict.fromkeys(t for x in ta for y in tb for t in _overlap({x}, {y})))
                if not both:
                    raise _Empty(f"allOf with incompatible types {u!r} and {v!r}", path)
                out[k] = both
            elif k == "required":
                out[k] = list(dict.fromkeys([*u, *v]))
            elif k in ("minimum", "minLength", "minItems", "minProperties") or (
                k == "exclusiveMinimum" and not isinstance(u, bool) and not isinstance(v, bool)
            ):
                out[k] = max(u, v)
            elif k in ("maximum", "maxLength", "maxItems", "maxProperties") or (
                k == "exclusiveMaximum" and not isinstance(u, bool) and not isinstance(v, bool)
            ):
                out[k] = min(u, v)
            elif k == "enum":
                out[k] = [x for x in u if any(_json_eq(x, y) for y in v)]
            elif k == "const":
                raise _Empty("allOf with two different const values", path)
            elif k == "items" and isinstance(u, (dict, bool)) and isinstance(v, (dict, bool)) and not (
                {"prefixItems", "additionalItems"} & (a.keys() | b.keys())
            ):
                out[k] = {"allOf": [u, v]}
            else:
                raise UnsupportedSchema(f"allOf combining two different {k!r}", path)
        if any(k in a for k in _OBJECT_SHAPE) and any(k in b for k in _OBJECT_SHAPE):
            out.pop("properties", None)
            out.pop("additionalProperties", None)
            out.update(self._merge_objects(a, b))
        return out

    @staticmethod
    def _merge_objects(a: dict, b: dict) -> dict:
        pa, pb = a.get("properties", {}), b.get("properties", {})
        apa, apb = a.get("additionalProperties", True), b.get("additionalProperties", True)
        props: dict[str, Any] = {}
        for name in [*pa, *(n for n in pb if n not in pa)]:
            parts = []
            for p, ap in ((pa, apa), (pb, apb)):
                if name in p:
                    parts.append(p[name])
                elif ap is not True:
                    parts.append(ap)
            if any(x is False for x in parts):
                props[name] = False
            else:
                parts = [x for x in parts if x is not True]
                props[name] = True if not parts else parts[0] if len(parts) == 1 else {"allOf": parts}
        out: dict[str, Any] = {}
        if "properties" in a or "properties" in b:
            out["properties"] = props
        if apa is True or apb is True:
            ap = apb if apa is True else apa
        elif apa is False or apb is False:
            ap = False
        else:
            ap = {"allOf": [apa, apb]}
        if ap is not True:
            out["additionalProperties"] = ap
        return out

    # -- combinators and constants
    def union(self, s: dict, path: str, hint: str) -> str:
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

    def sem_types(self, s: dict) -> set[str]:
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

    def disjoint(self, a: dict, b: dict) -> bool:
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

    def enum(self, s: dict, path: str, hint: str, enc: _Enc) -> str:
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
    def types(self, s: dict, path: str) -> list[str] | None:
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

    def typed(self, s: dict, t: str, path: str, hint: str) -> str:
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
            r.rules["any-object"] = f'"{{" ws ({string} ws ":" ws any-value ws ("," ws {string} ws ":" ws any-value ws)*)? "}}"'
            r.rules["any-array"] = '"[" ws (any-value ws ("," ws any-value ws)*)? "]"'
            r.builtin("ws")
            r.builtin("number")
            r.rules["any-value"] = f'any-object | any-array | {string} | number | "true" | "false" | "null"'
        return "any-value"

    def any_object(self) -> str:
        self.any_value()
        return "any-object"

    # -- numbers
    def number(self, s: dict, integer: bool, path: str, hint: str) -> str:
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
    def plain_string(self, lo: int, hi: int | None, hint: str, enc: _Enc = _Enc(json=True)) -> str:
        if hi is None and self.bound:
            hi = max(DEFAULT_MAX_STRING, lo)
        char = self.r.builtin(enc.char)
        body = self.r.rep(char, lo, hi, f"{hint}-chars")
        if enc.json:
            body = _seq('"\\""', body, '"\\""')
        return self.r.add(hint, body)

    def string(self, s: dict, path: str, hint: str, enc: _Enc) -> str:
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

    # -- arrays
    def array(self, s: dict, path: str, hint: str) -> str:
        ws = self.r.builtin("ws")
        items = s.get("items")
        if isinstance(items, list):  # draft 4-2019 tuples
            prefix, extra = items, s.get("additionalItems", True)
        else:
            prefix, extra = s.get("prefixItems", []), True if items is None else items
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        hi = None if hi is None else int(hi)
        if extra is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if s.get("uniqueItems") is True and (hi is None or hi > 1):
            raise UnsupportedSchema("uniqueItems", path)
        if hi is not None and lo > hi:
            raise _Empty("minItems above maxItems (or more items than the schema allows)", path)
        extra_rule = None
        if extra is not False and (hi is None or hi > len(prefix)):
            try:
                extra_rule = self.inside(extra, f"{path}/items", f"{hint}-item")
            except _Empty:
                if lo > len(prefix):
                    raise
                hi = len(prefix)
        prefix_rules = []
        for i, p in enumerate(prefix[: hi if hi is not None else len(prefix)]):
            try:
                prefix_rules.append(self.inside(p, f"{path}/prefixItems/{i}", f"{hint}-{i}"))
            except _Empty:
                if i < lo:
                    raise
                break
        if len(prefix_rules) < len(prefix):  # an impossible or capped prefix item ends the array there
            hi = len(prefix_rules) if hi is None else min(hi, len(prefix_rules))
            extra_rule = None

        def rest(i: int) -> str:
            """Items from position i on (each preceded by a comma when i > 0)."""
            if hi is not None and i >= hi:
                return ""
            sep = f'"," {ws}' if i > 0 else ""
            if i >= len(prefix_rules):
                if extra_rule is None:
                    return ""
                n_lo, n_hi = max(lo - i, 0), None if hi is None else hi - i
                if i == 0:
                    return self.sep_list(f"{extra_rule} {ws}", n_lo, n_hi)
                return self.r.rep(f'"," {ws} {extra_rule} {ws}', n_lo, n_hi, f"{hint}-more")
            node = _seq(sep, prefix_rules[i], ws, rest(i + 1))
            return node if i < lo else f"({node})?"

        return self.r.add(hint, _seq(f'"[" {ws}', rest(0), '"]"'))

    def sep_list(self, item: str, lo: int, hi: int | None) -> str:
        """lo..hi comma-separated ``item`` s (item includes its trailing ws)."""
        ws = self.r.builtin("ws")
        if hi == 0:
            return ""
        more = self.r.rep(f'"," {ws} {item}', max(lo - 1, 0), None if hi is None else hi - 1, "more")
        one = _seq(item, more)
        return one if lo > 0 else f"({one})?"

    # -- objects
    def object(self, s: dict, path: str, hint: str) -> str:
        ws = self.r.builtin("ws")
        props = s.get("properties")
        required = list(s.get("required", ()))
        ap = s.get("additionalProperties", True)
        if props is None and not required:
            return self.map(s, ap, path, hint)
        props = dict(props or {})
        for name in required:
            if name not in props:
                if ap is False:
                    raise _Empty(f"required property {name!r} forbidden by additionalProperties", path)
                props[name] = ap
        n_min, n_max = s.get("minProperties"), s.get("maxProperties")
        if n_min is not None and n_min > len(required):
            raise UnsupportedSchema("minProperties above the number of required properties", path)
        members: list[tuple[str, bool]] = []
        for name, ps in props.items():
            req = name in required
            try:
                v = self.inside(ps, f"{path}/properties/{name}", f"{hint}-{name}")
            except _Empty:
                if req:
                    raise
                continue  # a property no value satisfies is simply never written
            key = _lit(json.dumps(name, ensure_ascii=False))
            members.append((self.r.add(f"{hint}-{name}-kv", f'{key} {ws} ":" {ws} {v} {ws}'), req))
        if n_max is not None and n_max < len(members):
            if n_max < len(required):
                raise _Empty("maxProperties below the number of required properties", path)
            raise UnsupportedSchema("maxProperties below the number of properties", path)
        return self.r.add(hint, _seq(f'"{{" {ws}', self.members(members), '"}"'))

    def members(self, members: list[tuple[str, bool]]) -> str:
        """Members in order, required ones always, with commas between those written."""
        ws = self.r.builtin("ws")
        n = len(members)
        if not n:
            return ""
        after = [""] * (n + 1)  # members i.. when one was already written
        for i in reversed(range(n)):
            kv, req = members[i]
            item = f'"," {ws} {kv}'
            after[i] = _seq(item if req else f"({item})?", after[i + 1])
            if 0 < i < n - 1:  # named, so the text stays linear in the number of members
                after[i] = self.r.add(f"{kv}-rest", after[i])
        first: str | None = None  # members i.. when none was written yet (non-empty)
        for i in reversed(range(n)):
            kv, req = members[i]
            head = _seq(kv, after[i + 1])
            first = head if req or first is None else f"({head} | {first})"
        assert first is not None
        any_required = any(req for _, req in members)
        return first if any_required else f"({first})?"

    def map(self, s: dict, ap: Any, path: str, hint: str) -> str:
        ws = self.r.builtin("ws")
        lo, hi = int(s.get("minProperties", 0)), s.get("maxProperties")
        if lo > 1:
            raise UnsupportedSchema("minProperties above 1 on an object without properties", path)
        if ap is True and lo == 0 and hi is None:
            return self.any_object()
        if ap is False:
            if lo > 0:
                raise _Empty("minProperties on an object that allows no property", path)
            return self.r.add(hint, f'"{{" {ws} "}}"')
        try:
            v = self.inside(ap, f"{path}/additionalProperties", f"{hint}-value")
        except _Empty:
            if lo > 0:
                raise
            return self.r.add(hint, f'"{{" {ws} "}}"')
        key = self.plain_string(0, None, "key")
        kv = self.r.add(f"{hint}-kv", f'{key} {ws} ":" {ws} {v} {ws}')
        return self.r.add(hint, _seq(f'"{{" {ws}', self.sep_list(kv, lo, None if hi is None else int(hi)), '"}"'))

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


def check_schema(schema: dict) -> None:
    """Raise :class:`UnsupportedSchema` naming the first feature the grammar cannot enforce.

    It runs the same conversion as :func:`json_schema_grammar`, so the two can
    never disagree about what is supported.
    """
    _convert(schema, bound_strings=False)


def json_schema_grammar(schema: dict, *, bound_strings: bool = False) -> str:
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


def _tool_spec(tool: Any) -> tuple[str, Any]:
    """(name, parameters schema) of an OpenAI-style tool (Anthropic/flat shapes accepted too)."""
    if not isinstance(tool, dict):
        raise ValueError(f"a tool must be an object, not {type(tool).__name__}")
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
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
    tools: list[dict],
    syntax: str,
    name: str | None = None,
    allow_text: bool = False,
    *,
    bound_strings: bool = False,
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
    if not allow_text:
        return rules.render(call)
    if syntax in ("llama3", "json"):
        text = rules.add("text", '([^{ \\t\\n\\r] [^\\x00]*)?')
        return rules.render(f"{call} | {text}")
    markers = {"hermes": ["<tool_call>"], "mistral": ["[TOOL_CALLS]"], "xml": ["<tool_call>", "<function="]}[syntax]
    text = _text_without(rules, markers, "text")
    return rules.render(f"{text} {call}?")


def _xml_call(conv: _Converter, fname: str, params: Any) -> str:
    r = conv.r
    s = conv.flatten(params, "#", ())
    for k in s:
        if k in UNSUPPORTED:
            raise UnsupportedSchema(UNSUPPORTED[k], "#")
    if any(k in s for k in ("anyOf", "oneOf", "enum", "const")) or s.get("type", "object") not in ("object", ["object"]):
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


__all__ = [
    "DEFAULT_MAX_STRING",
    "SYNTAXES",
    "UnsupportedSchema",
    "check_schema",
    "json_object_grammar",
    "json_schema_grammar",
    "tool_call_grammar",
]
