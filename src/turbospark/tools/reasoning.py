"""Reasoning apart from the answer, for models that think between tags.

Models like Qwen3 and DeepSeek-R1 write ``<think>…</think>`` before the
answer; some templates open ``<think>`` in the generation prompt, so the
output starts inside reasoning and only holds the close tag
(``start_in_reasoning=True``). The splitter works on a stream: text that might
be the start of a tag is held back until it is decided, so a tag cut across
two pieces never leaks into either channel.

Layout rules (identical however the text is chunked):

- whitespace right after an open tag, and right after a close tag, is dropped;
- whitespace right before a close tag is dropped;
- whitespace at the very start of the output is dropped when an open tag
  follows it;
- a second open tag inside reasoning, and a stray close tag in the answer,
  are dropped (never shown as text).
"""

from __future__ import annotations

_WS = " \t\r\n"

REASONING = "reasoning"
CONTENT = "content"


class ReasoningSplitter:
    """Feed text pieces; get ``("reasoning"|"content", text)`` pieces back."""

    def __init__(
        self, open_tag: str = "<think>", close_tag: str = "</think>", start_in_reasoning: bool = False
    ) -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._tags = [t for t in (open_tag, close_tag) if t]
        self.in_reasoning = start_in_reasoning
        self._buf = ""
        self._skip_ws = start_in_reasoning  # drop whitespace before what follows
        self._at_start = not start_in_reasoning  # no content emitted yet

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buf += text
        return self._drain(final=False)

    def flush(self) -> list[tuple[str, str]]:
        """The held-back rest, at the end of the output."""
        return self._drain(final=True)

    # ---------------------------------------------------------------- inner
    def _next_tag(self) -> tuple[int, str] | None:
        hits = [(i, t) for t in self._tags if (i := self._buf.find(t)) >= 0]
        return min(hits, key=lambda h: (h[0], -len(h[1]))) if hits else None

    def _partial_tag(self) -> int:
        """Length of the longest end of the buffer that could begin a tag."""
        best = 0
        for tag in self._tags:
            for k in range(min(len(tag) - 1, len(self._buf)), best, -1):
                if self._buf.endswith(tag[:k]):
                    best = k
                    break
        return best

    def _drain(self, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while self._buf:
            if self._skip_ws:
                rest = self._buf.lstrip(_WS)
                if not rest:
                    self._buf = ""
                    break
                self._buf, self._skip_ws = rest, False
            if self._at_start and not self.in_reasoning:
                rest = self._buf.lstrip(_WS)
                if self.open_tag and rest.startswith(self.open_tag):
                    self._buf = rest
                elif not final and (not rest or (self.open_tag and self.open_tag.startswith(rest))):
                    break  # cannot tell yet whether a tag follows
            hit = self._next_tag()
            if hit is not None:
                i, tag = hit
                before, self._buf = self._buf[:i], self._buf[i + len(tag) :]
                if self.in_reasoning:
                    if tag == self.close_tag:
                        self._emit(out, REASONING, before.rstrip(_WS))
                        self.in_reasoning = False
                        self._skip_ws = True
                    else:
                        self._emit(out, REASONING, before)
                else:
                    self._emit(out, CONTENT, before)
                    self.in_reasoning = tag == self.open_tag
                    self._skip_ws = True
                continue
            if final:
                text = self._buf.rstrip(_WS) if self.in_reasoning else self._buf
                self._emit(out, REASONING if self.in_reasoning else CONTENT, text)
                self._buf = ""
                break
            hold = self._partial_tag()
            if self.in_reasoning:  # whitespace that a close tag may follow
                head = self._buf[: len(self._buf) - hold]
                hold += len(head) - len(head.rstrip(_WS))
            cut = len(self._buf) - hold
            self._emit(out, REASONING if self.in_reasoning else CONTENT, self._buf[:cut])
            self._buf = self._buf[cut:]
            break
        return out

    def _emit(self, out: list[tuple[str, str]], kind: str, text: str) -> None:
        if not text:
            return
        if kind == CONTENT:
            self._at_start = False
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))


def split_reasoning(
    text: str, open_tag: str = "<think>", close_tag: str = "</think>", start_in_reasoning: bool = False
) -> tuple[str, str]:
    """``(reasoning, content)`` of a whole output."""
    splitter = ReasoningSplitter(open_tag, close_tag, start_in_reasoning)
    parts = splitter.feed(text) + splitter.flush()
    reasoning = "".join(t for kind, t in parts if kind == REASONING)
    content = "".join(t for kind, t in parts if kind == CONTENT)
    return reasoning, content
