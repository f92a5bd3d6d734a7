"""String content as written (JSON-escaped or raw) and the regex-subset
converter behind ``pattern``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import UnsupportedSchema
from .rules import _alt, _cls, _lit, _normalize, _Rules, _seq, _subtract


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
