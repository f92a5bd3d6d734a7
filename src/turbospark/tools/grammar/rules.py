"""GBNF text: literals, character classes and repetitions, the builtin rules
(JSON string characters, plain numbers, string formats) and :class:`_Rules`,
the grammar being built."""

from __future__ import annotations

import re

from .errors import UnsupportedSchema

MAX_INT_DIGITS = 16
MAX_FRACTION_DIGITS = 15


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
_JCHAR = r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))'
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
    "fmt-time": ('fmt-hour ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] fmt-hour ":" [0-5] [0-9])'),
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
            return (
                f"({_seq(_rep(chunk, 0, q - 1), _rep(atom, 0, _CHUNK - 1))}"
                f" | {_seq(_rep(chunk, q, q), _rep(atom, 0, r))})"
            )

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
