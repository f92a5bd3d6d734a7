"""An engine run's output, turned into what a response is made of.

The items every dialect renders: :class:`Delta` (answer text, with its
tokens' log-probabilities), :class:`ReasoningDelta` (thinking split off the
answer), :class:`ToolCallBegin` and :class:`ToolArgumentsDelta` (a call
streaming: its id and name, then its arguments as they are written) and
:class:`ToolCallDelta` (a complete call, or the close of a streamed one).

:class:`Router` turns one run's raw text into those items as it comes:
reasoning, answer text, and calls. Calls a grammar holds to their one shape
stream as they are written (tools/streaming.py); anything else that may be a
call is held back, for at most :data:`HOLD_SECONDS` in a stream, and left to
the parsers at the end, unless a reader can take it as it comes. The router
also says when the run need not go on: a call naming no offered tool
(``misnamed``) or repeating an answered one (``repeat``), so the generation
core (generation.py) can stop it and re-ask. :class:`Relayed` does the same
for an engine that splits reasoning and calls off itself (a remote one).
Nothing here knows the engine or a wire format.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from ..engine.types import OPENING_HELD, OPENING_OFF, OPENING_WATCHED, Progress, TokenProb
from ..tools import calls as toolcalls
from ..tools import grammar as grammars
from ..tools.guardrails import answered_arguments, canonical_arguments, validate_calls
from ..tools.reasoning import ReasoningSplitter
from ..tools.rescue import may_become_call, rescue_call
from ..tools.streaming import CallReader, Compact, Opened, Piece, XmlCallReader, head_name, past_keys
from .request import Prepared

#: the longest an answer that begins as a JSON object is held back while it
#: may still be rescued as a call (a silent stream trips clients' watchdogs)
HOLD_SECONDS = 3.0

#: the tag a template lists the offered tools under (Hermes, Qwen): a small
#: model sometimes echoes that listing as its answer, then calls
ECHO_OPEN, ECHO_CLOSE = "<tools>", "</tools>"


def echo_start(text: str, since: int = 0) -> int | None:
    """Where an echo of the template's tool listing (:data:`ECHO_OPEN` at a
    line start, or the start of one cut off at the end) begins in ``text``,
    at ``since`` or later."""
    i = text.rfind("\n", 0, since) + 1
    while i <= len(text):
        j = i + len(text[i:]) - len(text[i:].lstrip(" \t"))
        head = text[j : j + len(ECHO_OPEN)]
        if j >= since and head and ECHO_OPEN.startswith(head) and (head == ECHO_OPEN or j + len(head) == len(text)):
            return j
        nl = text.find("\n", i)
        if nl < 0:
            return None
        i = nl + 1
    return None


def past_echo(text: str) -> tuple[str, str]:
    """(the echoed listing, up to its close; what follows it): all of
    ``text`` is the listing while it is not closed."""
    k = text.find(ECHO_CLOSE)
    if k < 0:
        return text, ""
    k += len(ECHO_CLOSE)
    return text[:k], text[k:]


@dataclass
class Delta:
    """Answer text produced since the previous delta, with the
    log-probabilities of the tokens behind it (when asked for)."""

    text: str
    logprobs: Sequence[TokenProb] = ()
    #: which of the request's choices it belongs to (OpenAI ``n``)
    choice: int = 0
    #: the ids of the tokens behind it (llama-server's streamed ``tokens``:
    #: ``GenerationConfig.token_ids``; else empty)
    ids: Sequence[int] = ()


@dataclass
class ReasoningDelta:
    """Reasoning (thinking) text produced since the previous one."""

    text: str
    choice: int = 0


@dataclass
class ToolCallBegin:
    """A streamed call has begun: its id and name (arguments follow)."""

    index: int
    id: str
    name: str
    choice: int = 0


@dataclass
class ToolArgumentsDelta:
    """More of a streamed call's arguments (JSON text; the pieces of one
    call join into its ``arguments``)."""

    index: int
    text: str
    choice: int = 0


@dataclass
class ToolCallDelta:
    """One complete tool call (``call.arguments`` is JSON object text).
    ``streamed``: its :class:`ToolCallBegin` and arguments went out before
    it, and this closes it. ``cut``: the token budget ran out inside it (its
    arguments are incomplete, and it is not one of the turn's calls)."""

    index: int
    call: toolcalls.ToolCall
    choice: int = 0
    streamed: bool = False
    cut: bool = False


Routed = Delta | ReasoningDelta | ToolCallBegin | ToolArgumentsDelta | ToolCallDelta

#: what closes the last call read (its object, a list, the closing marker)
_CLOSERS = re.compile(r"\A[\s,}\]]*(?:</tool_call>)?\s*(?:`{1,3}(?!\S))?\s*")  # a fence cut short too


def after_call(rest: str) -> str:
    """What follows a call read on speculation, less what still belongs to
    it: keys after its arguments (``"id": …``), its closing brace, a list's
    bracket, the closing marker."""
    return _CLOSERS.sub("", rest[past_keys(rest) :], count=1)


@dataclass
class Outcome:
    """How a run's answer ends (:meth:`Router.finish`)."""

    #: to send now: calls closed or sent whole, text after them
    items: list[Routed] = field(default_factory=list)
    calls: list[toolcalls.ToolCall] = field(default_factory=list)
    #: why calls (if any) were not accepted
    problems: list[str] = field(default_factory=list)
    #: the calls were checked whole (not streamed) and go out whole at the end
    whole: bool = False
    #: the calls were read before anything of them was sent (the guardrails
    #: may check them and ask a second time)
    buffered: bool = False
    #: text after the calls, sent unless a second attempt replaces it
    leftover: str = ""


def calls_of(text: str, prepared: Prepared) -> tuple[list[toolcalls.ToolCall], list[str], str]:
    """(valid calls, problems, text that was not a call)."""
    if not text:
        return [], [], ""
    parsed = toolcalls.parse_tool_calls(text, prepared.offered)
    req = prepared.request
    tools = req.tools if req else None
    if not parsed.calls and req is not None:
        rescued, why = rescue_call(text, req.tools)
        if rescued is not None:
            return [rescued], [], ""
        if why is not None and not parsed.problems:
            return [], [why], text
    problems = list(parsed.problems) + validate_calls(parsed.calls, tools)
    valid = parsed.calls if not problems else [c for c in parsed.calls if not validate_calls([c], tools)]
    return valid, problems, parsed.content


class RepeatHold:
    """A streamed call to a tool whose result the conversation has
    (``answered``: name -> canonical arguments of its answered calls -> the
    same as written), held back until whole; ``repeat`` when it is one of
    them (the run can then stop for a re-ask that hands the result back)."""

    def __init__(self, answered: dict[str, dict[str, str]]) -> None:
        self.answered = answered
        self.call: list[Routed] = []
        self.since = 0.0
        #: the held call's arguments so far, compacted: while they begin an
        #: answered call's as written, it is held past HOLD_SECONDS
        self.text = Compact()
        self.repeat: toolcalls.ToolCall | None = None

    @property
    def holding(self) -> bool:
        """A call is held (or known to repeat one)."""
        return bool(self.call) or self.repeat is not None

    def feed(self, items: list[Routed]) -> list[Routed]:
        """An answer's first call, to a tool the conversation already has a
        result from, is held back until it is whole (a small model calls
        again instead of reading the result): the same call as one answered
        (key order and blanks aside) is ``repeat`` (the run stops and the
        result is handed back, ``answer_turn``), and what follows it is held
        too; any other goes out, and so does one still being written after
        :data:`HOLD_SECONDS`."""
        out: list[Routed] = []
        for item in items:
            if not self.call:
                if isinstance(item, ToolCallBegin) and item.index == 0 and item.name in self.answered:
                    self.call, self.since, self.text = [item], time.monotonic(), Compact()
                else:
                    out.append(item)
                continue
            self.call.append(item)
            if isinstance(item, ToolArgumentsDelta):
                self.text.feed(item.text)
            if self.repeat is None and isinstance(item, ToolCallDelta):
                first = self.call[0]
                assert isinstance(first, ToolCallBegin)
                if canonical_arguments(item.call.arguments) in self.answered[first.name]:
                    self.repeat = item.call
                else:
                    out += self.let_go()
        if self.call and self.repeat is None and time.monotonic() - self.since > HOLD_SECONDS:
            if not self._same_so_far():
                out += self.let_go()
        return out

    def _same_so_far(self) -> bool:
        """The held call's arguments so far begin one the conversation has a
        result for, character for character (blanks between tokens aside):
        a long repeat, held to its end however long that takes (no longer
        than the answered call took), let go the moment it differs."""
        first = self.call[0]
        assert isinstance(first, ToolCallBegin)
        text = self.text.text
        return bool(text) and any(t.startswith(text) for t in self.answered.get(first.name, {}).values())

    def let_go(self) -> list[Routed]:
        """What :meth:`feed` holds, to go out (no call is held
        after this)."""
        held, self.call, self.repeat, self.answered = self.call, [], None, {}
        return held


class Router:
    """Turns one run's raw text into reasoning, answer text and a tool-call
    tail, incrementally. The tail is buffered (parsed and validated at the
    end) unless a grammar holds the calls to their one shape: then they are
    read as they come (``reader``) and stream."""

    def __init__(
        self,
        prepared: Prepared,
        stream_calls: bool = True,
        live: bool = False,
        reask: bool = False,
        stops: bool = False,
    ) -> None:
        self.splitter = ReasoningSplitter(start_in_reasoning=prepared.think_open) if prepared.think else None
        self.tools = bool(prepared.offered)
        mode = prepared.call_grammar if stream_calls and self.tools else None
        self.prepared = prepared
        #: the calls' reader: from the start when the answer is the call,
        #: from the call marker on when the lazy grammar waits for it
        self.reader: CallReader | XmlCallReader | None = self._new_reader() if mode == "forced" else None
        self.trigger = toolcalls.CALL_TRIGGERS.get(prepared.syntax or "") if mode == "lazy" else None
        #: the trigger of the engine's opening grammar (a regex matched at the
        #: answer's start, ``GenerationConfig.opening_trigger``), while the
        #: answer may still match it
        opening = prepared.config.opening_trigger if mode == "lazy" else None
        self.opening = re.compile(opening) if opening else None
        self.opening_state = OPENING_WATCHED if self.opening is not None else OPENING_OFF
        #: an answer that begins as a JSON object is held back while it may
        #: still be a call in the wrong shape (tools/rescue.py), for at most
        #: :data:`HOLD_SECONDS`: a response never stays silent longer
        self.hold_json = self.tools and self.reader is None
        #: when what is held back began to be (None: nothing is held)
        self.held_since: float | None = None
        #: a client is reading as it comes (a stream): a call that no grammar
        #: holds and that is still being written after HOLD_SECONDS is read
        #: on speculation (its bytes stream; it is validated, not re-asked,
        #: at the end).
        self.live = live
        self.speculate = live and stream_calls and self.tools
        #: a guardrail re-ask may follow this answer: a call that names no
        #: offered tool is held whole (and the run stopped, ``misnamed``);
        #: without one it is text, as it comes
        self.reask = reask
        #: why the held call cannot be one (it names no offered tool), once
        #: its head is out: the run need not go on for a re-ask to be made
        self.misnamed: str | None = None
        #: the run can be stopped for a re-ask (``stops``) and a client reads
        #: as it comes: a repeat of an answered call is held (:class:`RepeatHold`)
        req = prepared.request
        repeats = stops and live and req is not None and req.tool_choice not in ("required", "named")
        self.hold = RepeatHold(answered_arguments(req.messages) if repeats and req is not None else {})
        self.pending = ""  # answer text not yet known to be free of a call start
        #: the answer echoes the template's tool listing (:data:`ECHO_OPEN`)
        #: and a re-ask may follow: held from there to the run's end, so a
        #: re-asked attempt's echo never goes out
        self.echo = False
        #: the text after the calls read on speculation is no call: it went
        #: out as text, and so does everything after it
        self.rest_streams = False
        self.tail = ""  # from the first call start on
        self.reasoning: list[str] = []
        self.content: list[str] = []

    def feed(self, text: str, opening: int = OPENING_OFF) -> list[Routed]:
        """Route ``text``; ``opening``: where the engine's opening grammar
        stands after it (``Progress.opening``)."""
        self.opening_state = opening
        parts = self.splitter.feed(text) if self.splitter else [("content", text)]
        return self._route(parts)

    @property
    def answer(self) -> str:
        """The answer text that went out (or will, at the end)."""
        return "".join(self.content)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def raw(self) -> str:
        """What the run wrote as its answer: text and the call tail."""
        return "".join(self.content) + self.tail

    def add_reasoning(self, text: str) -> ReasoningDelta:
        self.reasoning.append(text)
        return ReasoningDelta(text)

    def early_reask(self) -> tuple[list[str], list[toolcalls.ToolCall]] | None:
        """Why the run can stop now for a re-ask: a call that names no
        offered tool (its problem), or one repeating a call the conversation
        has a result for (the call)."""
        if self.misnamed is not None:
            return [self.misnamed], []
        if self.hold.repeat is not None:
            return [], [self.hold.repeat]
        return None

    def finish(self, relayed: Relayed | None) -> Outcome:
        """The end of the run's answer (after :meth:`flush`): its calls,
        read as they came, split off by the engine, or parsed from the tail
        now, with what is still to be sent."""
        req = self.prepared.request
        tools = req.tools if req else None
        if relayed is not None and relayed.calls:
            done = relayed.finish()  # calls the engine parsed itself went out as they came: closed here
            calls = [call for call, _ in done]
            out = Outcome([ToolCallDelta(i, c, streamed=s) for i, (c, s) in enumerate(done)], calls)
            out.problems = validate_calls(calls, tools)
            leftover = calls_of(self.tail, self.prepared)[2] if self.tail else ""
            if leftover.strip():
                out.items.append(self.text(leftover))
            return out
        if self.streamed_calls:
            return self._finish_streamed()
        if self.prepared.offered:
            listing, rest = past_echo(self.tail) if self.echo else ("", self.tail)
            calls, problems, leftover = calls_of(rest, self.prepared)
            return Outcome([], calls, problems, whole=True, buffered=True, leftover=listing + leftover)
        return Outcome()

    def _finish_streamed(self) -> Outcome:
        """Calls that went out as they were written (a grammar kept them
        valid, or they were read on speculation and are validated here)."""
        assert self.reader is not None
        req = self.prepared.request
        calls = list(self.reader.calls)
        out = Outcome([], calls, validate_calls(calls, req.tools if req else None))
        cut = self.reader.partial
        if cut is not None:  # the budget ran out inside it: closed as it is
            out.items.append(ToolCallDelta(len(calls), cut, streamed=True, cut=True))
            out.problems.append(f"the answer ended inside the call to {cut.name!r}")
            # a body that is not streamed keeps the unfinished call as text
            self.content.append(self.reader.partial_text)
        elif not self.rest_streams and (rest := after_call(self.reader.rest)).strip():
            # what followed the calls read (text a grammar would not have let
            # through): more calls, sent whole, and text
            more, more_problems, leftover = calls_of(rest, self.prepared)
            if req is not None and not req.parallel_tool_calls:
                more = []
            out.items += [ToolCallDelta(i, call) for i, call in enumerate(more, len(calls))]
            out.calls, out.problems = calls + more, out.problems + more_problems
            if leftover.strip():
                out.items.append(self.text(leftover))
        elif not self.live:
            # a client reading the whole answer at once has seen none of it:
            # the guardrails' checks (a grammar-held call may still repeat one
            # whose result the conversation has) and their re-ask
            out.buffered = True
        return out

    def flush(self) -> list[Routed]:
        out = self._route(self.splitter.flush()) if self.splitter else []
        out += self.hold.let_go()
        if self.echo and self.pending and not self.tail:  # the parsers read what follows the listing
            self.tail, self.pending = self.pending, ""
        if self.hold_json and self.pending and not self.content and not self.tail:
            # the whole answer was a JSON object: the call parsers decide
            self.tail, self.pending = self.pending, ""
        if self.pending and not self.tail:
            out.append(self.text(self.pending))
            self.pending = ""
        return out

    def _new_reader(self, names: tuple[str, ...] | None = None) -> CallReader | XmlCallReader:
        """The reader of this syntax's calls. ``names``: on speculation (no
        grammar), where the request's own limits are the reader's: the one
        tool a named ``tool_choice`` allows, one call without parallel calls."""
        req = self.prepared.request
        single = names is not None and req is not None and not req.parallel_tool_calls
        if names is not None and req is not None and req.tool_choice == "named" and req.tool_name:
            names = (req.tool_name,)
        if self.prepared.syntax == "xml":
            return XmlCallReader(grammars.xml_raw_parameters((req.tools if req else None) or []), names, single)
        return CallReader(names, single)

    def _held_too_long(self) -> bool:
        """What is held back has been for :data:`HOLD_SECONDS` since the
        last byte that went out (a long JSON answer is then text as it
        comes, a long call read as it comes: a rescue would need it whole)."""
        now = time.monotonic()
        if self.held_since is None:
            self.held_since = now
        return now - self.held_since > HOLD_SECONDS

    def _opening_gate(self) -> str:
        """What the answer so far is to the engine's opening grammar:
        "read" (the grammar holds it and its trigger has matched the text:
        a reader takes the call from the answer's start), "hold" (the engine
        still watches whether it opens a call, or holds one whose name is yet
        to arrive: nothing goes out, however long, or the call would go out
        as text) or "free" (no call of that shape: the usual rules apply).
        The engine decides (``Progress.opening``), so a match it did not take
        (a control token before it, invisible in the text) is left free."""
        assert self.opening is not None
        if self.content or self.reasoning:  # the engine watched the raw output: not this
            self.opening = None
            return "free"
        if self.opening_state == OPENING_HELD and self.opening.match(self.pending):
            self.opening = None
            self.reader = CallReader()  # the grammar's JSON shape, in every syntax
            return "read"
        if self.opening_state == OPENING_OFF:
            self.opening = None
            return "free"
        return "hold"

    @staticmethod
    def _is_call(text: str) -> bool:
        """A held-back start that is certainly a call (a complete marker, or
        enough JSON to see a "name" key); until then it stays pending."""
        return any(m in text for m in toolcalls.MARKERS) or '"name"' in text

    def text(self, text: str) -> Delta:
        """Answer text to send (counted in :attr:`answer`)."""
        self.content.append(text)
        self.held_since = None
        return Delta(text)

    @property
    def streamed_calls(self) -> bool:
        """Calls went out as they were written."""
        return self.reader is not None and (bool(self.reader.calls) or self.reader.reading)

    def _read_calls(self, text: str) -> list[Routed]:
        assert self.reader is not None
        out: list[Routed] = []
        for event in self.reader.feed(text):
            if isinstance(event, Opened):
                out.append(ToolCallBegin(event.index, event.id, event.name))
            elif isinstance(event, Piece):
                out.append(ToolArgumentsDelta(event.index, event.text))
            else:
                out.append(ToolCallDelta(event.index, event.call, streamed=True))
        return self.hold.feed(out) if self.hold.answered else out

    def _to_tail(self, text: str) -> list[Routed]:
        """Text from the first call start on: buffered, and read as calls
        when they stream (the lazy grammar's marker opens the tail; a call
        held for :data:`HOLD_SECONDS` is read on speculation)."""
        fresh = not self.tail
        self.tail += text
        if self.rest_streams:
            return [self.text(text)]
        if self.reader is None and fresh and self.trigger is not None and text.lstrip().startswith(self.trigger):
            self.reader = self._new_reader()
        elif self.reader is None and self.speculate and self._held_too_long():
            self.reader = self._new_reader(self.prepared.offered)
            return self._released(self._read_calls(self.tail))
        return self._released(self._read_calls(text)) if self.reader is not None else []

    def _released(self, out: list[Routed]) -> list[Routed]:
        """A text read on speculation that is no call after all (no head of
        an offered tool's call where one had to be) is text, from its start
        and as it comes: a response is never silent for long. Only a call
        that names no offered tool and will be re-asked stays held."""
        reader = self.reader
        if reader is None or not reader.failed or reader.reading or reader.names is None:
            return out  # (a call that went out in part is closed as it is at the end)
        if self.hold.holding:
            return out  # (a repeat held for a re-ask: nothing after it goes out before it)
        if reader.calls:  # after the calls read: prose, and all that follows, as it comes
            if not reader.prose:
                return out  # (more calls the reader cannot take: the parsers', at the end)
            self.rest_streams = True
            rest = after_call(reader.rest)
            return [*out, self.text(rest)] if rest else out
        if self.misnamed is None:
            self.misnamed = self._unknown_name(self.tail)
        if self.reask and self.misnamed is not None:
            return out
        text, self.tail, self.reader, self.speculate = self.tail, "", None, False
        return [*out, self.text(text)]

    def _unknown_name(self, held: str) -> str | None:
        """Why ``held`` is no call: its head names no offered tool (else None)."""
        if self.echo:  # the listing names tools: the call after it counts
            held = past_echo(held)[1].lstrip()
        name = head_name(held) if held else None
        if name is None or toolcalls.resolve_name(name, self.prepared.offered) is not None:
            return None
        return f"unknown name {name!r} (offered: {', '.join(self.prepared.offered)})"

    def _watch_name(self) -> list[Routed]:
        """A held start whose head names no offered tool is no call: with a
        re-ask to come it is held whole (``misnamed``: the run can stop
        now), else it is text as soon as it is known to be none."""
        held = self.tail or self.pending
        self.misnamed = self._unknown_name(held)
        if self.misnamed is None:
            return []
        if self.reask:
            self.tail, self.pending = held, ""
            return []
        return self._as_text()

    def _as_text(self) -> list[Routed]:
        """What is held back is no call: text, as what follows it will be
        (when a client reads as it comes; else the parsers decide at the end)."""
        if not self.speculate:
            return []
        held, self.tail, self.pending = self.tail + self.pending, "", ""
        self.reader, self.speculate, self.hold_json = None, False, False
        return [self.text(held)] if held else []

    def _hold_echo(self, at: int) -> list[Routed]:
        """From ``at`` in what is pending: an echo of the template's tool
        listing (held to the run's end once its tag is whole: what follows
        the listing is read as any answer at the end, and a re-ask replaces
        it all), or what may begin one (held for more text, as a call's
        start is)."""
        out: list[Routed] = [self.text(self.pending[:at])] if at > 0 else []
        self.pending = self.pending[at:]
        if self.pending.startswith(ECHO_OPEN):
            self.echo = True
        elif self._held_too_long():
            out.append(self.text(self.pending))
            self.pending = ""
        return out

    def no_reask(self) -> list[Routed]:
        """The re-ask this router held a call for cannot be made (no room
        for it): what was held goes out."""
        self.reask = False
        out = self.hold.let_go()
        return out + self._as_text() if self.misnamed is not None else out

    def _route(self, parts: list[tuple[str, str]]) -> list[Routed]:
        out: list[Routed] = []
        for channel, text in parts:
            if not text:
                continue
            if channel == "reasoning":
                out.append(self.add_reasoning(text))
            elif self.tail or self.reader is not None:
                out += self._to_tail(text)
            elif not self.tools:
                out.append(self.text(text))
            else:
                out += self._answer(text)
            if self.misnamed is None and (self.tail or self.pending) and (self.reader is None or self.reader.failed):
                out += self._watch_name()
        return out

    def _answer(self, text: str) -> list[Routed]:
        """Answer text while tools are offered and no call has started:
        ``call_start`` wants the whole answer so far (line starts matter); a
        possible start is held back until it is decided."""
        out: list[Routed] = []
        self.pending += text
        if self.echo:
            return out
        gate = self._opening_gate() if self.opening is not None else "free"
        if gate == "read":
            out += self._to_tail(self.pending)
            self.pending = ""
        if gate != "free":
            return out
        if self.hold_json and not self.content:
            if may_become_call(self.pending) and not self._held_too_long():
                return out
            self.hold_json = False
        sent = "".join(self.content)
        start = toolcalls.call_start(sent + self.pending, len(sent))
        echo = echo_start(sent + self.pending, len(sent)) if self.reask else None
        if echo is not None and (start is None or echo <= start):
            return out + self._hold_echo(echo - len(sent))
        if start is None:
            out.append(self.text(self.pending))
            self.pending = ""
            return out
        start = max(0, start - len(sent))
        if start > 0:
            out.append(self.text(self.pending[:start]))
        rest = self.pending[start:]
        self.pending = ""
        if self._is_call(rest):
            out += self._to_tail(rest)
        elif self._held_too_long():  # no call has shown itself: text
            out.append(self.text(rest))
        else:
            self.pending = rest  # maybe a call: decide with more text
        return out


class Relayed:
    """Reasoning and tool calls an engine split off itself (a remote
    engine's ``reasoning_content`` and ``tool_calls`` deltas), relayed as
    they come.

    The renderers hold one streamed call open at a time (an Anthropic
    content block, a Responses item), while the OpenAI stream names each
    piece's call by index, and upstreams send several calls one after the
    other or even interleaved. So the first call streams live (its first
    piece with a name opens it, :class:`ToolCallBegin`; the rest are
    argument pieces, in any order with the others'), and the calls after it
    are gathered and sent whole at the end, in the order they began."""

    def __init__(self) -> None:
        #: by index, in the order the calls began
        self.calls: dict[int, _RelayedCall] = {}
        #: the index of the call streaming live, once it has begun
        self._live: int | None = None
        self._sent = 0  # pieces of the live call's arguments sent

    def feed(self, item: Progress, router: Router) -> list[Routed]:
        out: list[Routed] = []
        if item.reasoning:
            out.append(router.add_reasoning(item.reasoning))
        piece = item.call
        if piece is None:
            return out
        call = self.calls.get(piece.index)
        if call is None:
            call = self.calls[piece.index] = _RelayedCall(piece.id or toolcalls.new_call_id())
        call.name = call.name or piece.name or ""
        if piece.arguments:
            call.pieces.append(piece.arguments)
        first = next(iter(self.calls))
        if piece.index != first:
            return out  # sent whole at the end
        if self._live is None and call.name:
            self._live = first
            out.append(ToolCallBegin(0, call.id, call.name))
        if self._live is not None:
            out += [ToolArgumentsDelta(0, text) for text in call.pieces[self._sent :]]
            self._sent = len(call.pieces)
        return out

    def finish(self) -> list[tuple[toolcalls.ToolCall, bool]]:
        """Every call, and whether it went out streaming (to be closed)."""
        out = []
        for index, call in self.calls.items():
            try:
                parsed = orjson.loads("".join(call.pieces) or "{}")
            except orjson.JSONDecodeError:
                parsed = None
            # arguments that are not a JSON object are none (the renderers
            # and validation read them as one)
            text = orjson.dumps(parsed if isinstance(parsed, dict) else {}).decode()
            out.append((toolcalls.ToolCall(call.id, call.name, text), index == self._live))
        return out


@dataclass
class _RelayedCall:
    """One call an engine parsed itself, as its pieces came."""

    id: str
    name: str = ""
    pieces: list[str] = field(default_factory=list)


class ProbsCarrier:
    """Gives each answer delta the log-probabilities (and, when asked for,
    the ids) of the tokens behind it: those of the progress it came from,
    plus any of earlier progress whose text was held back (a possible stop
    string or tool call, a split character). Tokens that became reasoning
    carry none."""

    def __init__(self) -> None:
        self.carry: list[TokenProb] = []
        self.ids: list[int] = []

    def attach(self, logprobs: Sequence[TokenProb], deltas: list[Routed], ids: Sequence[int] = ()) -> list[Routed]:
        self.carry += logprobs
        self.ids += ids
        if not self.carry and not self.ids:
            return deltas
        answer = [d for d in deltas if isinstance(d, Delta)]
        if answer:
            answer[0].logprobs, answer[0].ids = self.carry, self.ids
            self.carry, self.ids = [], []
        elif deltas:  # reasoning or calls only
            self.carry, self.ids = [], []
        return deltas
