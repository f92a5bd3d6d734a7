"""Incremental detokenization and stop strings.

Two rules: never emit broken UTF-8 (a multi-byte character split across
tokens is held until complete), and never leak a stop string (text that might
be the start of one is held back until it is known not to be).
"""

from __future__ import annotations

import codecs


class Utf8Stream:
    """Bytes in, complete characters out."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data, False) if data else ""

    def flush(self, cut: bool = False) -> str:
        """The end of the text. ``cut``: the generation was stopped from
        outside (``max_tokens``, a cancel), so a character it stopped inside
        is left out rather than shown as U+FFFD: no client can use half a
        character, and the text stays a prefix of what an uncut generation
        writes. Bytes the model ended on by itself, or that no byte could
        complete, are U+FFFD."""
        held = self._decoder.getstate()[0]
        if cut and held and _completable(held):
            self._decoder.reset()
            return ""
        return self._decoder.decode(b"", True)


def _completable(held: bytes) -> bool:
    """``held`` (the 1 to 3 bytes the decoder holds back) is the start of a
    character some bytes could still complete. Not always: CPython holds
    ``ED A0``..``ED BF`` too, the start of a surrogate, which never is one."""
    lead = held[0]
    rest = (2 if lead < 0xE0 else 3 if lead < 0xF0 else 4) - len(held)
    for nxt in range(0x80, 0xC0):  # only the byte after the lead is narrowed
        try:
            (held + bytes([nxt]) + b"\x80" * (rest - 1)).decode("utf-8")
        except UnicodeDecodeError:
            continue
        return True
    return False


class StopMatcher:
    """Finds the earliest stop string in the generated text and withholds any
    tail that could still become one."""

    __slots__ = ("stops", "_buf", "matched")

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._buf = ""
        #: The stop string that ended the text (the earliest in it; on a tie
        #: the first listed), so a dialect can name it (Anthropic
        #: ``stop_sequence``).
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buf = self._buf + text
        hit = -1
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and (hit == -1 or i < hit):
                hit = i
                self.matched = s
        if hit != -1:
            self._buf = ""
            return buf[:hit], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        if hold:
            self._buf = buf[-hold:]
            return buf[:-hold], False
        self._buf = ""
        return buf, False

    def flush(self) -> str:
        out, self._buf = self._buf, ""
        return out


class IndentStop:
    """llama.cpp's ``n_indent``: after the first line, the text ends where a
    line starts (its first character that is not a space or a tab, a blank
    line's newline included) indented less than ``n`` characters; the
    indentation before it stays. The first line is never judged."""

    __slots__ = ("n", "_at_start", "_indent")

    def __init__(self, n: int) -> None:
        self.n = n
        self._at_start = False  # inside a line's indentation (after a newline)
        self._indent = 0

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text to emit, whether the text ends here)."""
        if self.n <= 0:
            return text, False
        for i, c in enumerate(text):
            if self._at_start:
                if c in " \t":
                    self._indent += 1
                    continue
                if self._indent < self.n:
                    return text[:i], True
                self._at_start = c == "\n"  # (a line of only indentation: the next starts here)
                self._indent = 0
            elif c == "\n":
                self._at_start, self._indent = True, 0
        return text, False
