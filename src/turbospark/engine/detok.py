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

    def flush(self) -> str:
        return self._decoder.decode(b"", True)


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
