"""Tool calls read as they are written, so their bytes can stream.

When a grammar holds the model to valid calls (the lazy tool-call grammar
once a call marker is out, or the grammar of a required/named call), every
call has the one fixed shape the grammar writes::

    [<tool_call>\\n | [TOOL_CALLS][] {"name": "N", "arguments": ARGS} ...

so a call's name is known the moment its ``"name"`` string closes, and its
arguments can be handed on character by character: :class:`CallReader`
turns the text into :class:`Opened` (id and name), :class:`Piece` (more of
the arguments' JSON text) and :class:`Closed` (the whole call) as it comes.
Pure text in, events out: nothing here knows the engine or a wire format.

The arguments streamed are the model's own JSON text, and the closed call's
``arguments`` are exactly their concatenation (what a client that joins the
deltas holds).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .calls import ToolCall, new_call_id, resolve_name

#: the head of one call, up to where its arguments begin: what closed the
#: call before it (braces, brackets, the closing marker), a ```json fence, an
#: optional call marker (and mistral's list bracket), ``"type": "function"``
#: and OpenAI's ``{"function": {`` wrapper, the name, the arguments key
_LEAD = (
    r"[\s,}\]]*(?:</tool_call>)?\s*(?:```\s*)?(?:```(?:json)?\s*)?"
    r'(?:<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>)?\s*\[?\s*\{\s*(?:"id"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*)?'
    r'(?:"type"\s*:\s*"function"\s*,\s*)?(?:"function"\s*:\s*\{\s*)?"name"\s*:\s*'
)
_NAME = r'"((?:[^"\\]|\\.)*)"\s*,\s*'
_HEAD = re.compile(_LEAD + _NAME + r'"(?:arguments|parameters)"\s*:\s*')
#: the heads of a call written without a grammar (read on speculation, see
#: :class:`CallReader`): arguments that are an object, under their key, or
#: the object's other keys beside the name (``{"name": "N", "command": ...}``,
#: a small model's shape; the next key is whole before it is told apart)
_FREE_HEAD = re.compile(_LEAD + _NAME + r'"(?:arguments|parameters)"\s*:\s*(?=\{|"\s*\{)')
_BESIDE = re.compile(_LEAD + _NAME + r'(?="(?!(?:arguments|parameters)")(?:[^"\\]|\\.)*"\s*:)')
#: a head not found in this much text is not coming (the reader gives up)
_HEAD_LIMIT = 1024
#: after a call, text that can open no other (read on speculation: prose
#: after the last call, which the reader leaves at once; a quote may be a
#: key after the arguments)
_NO_MORE = re.compile(r"[\s,}\]]*(?:</tool_call>\s*)?(?:```[ \t]*(?:\n\s*|(?=[^\s`j])))?" r'[^\s,}\]`<\[{"]')
#: the same after an xml call (a tag may open the next one)
_XML_NO_MORE = re.compile(r"\s*(?:</function>\s*)?(?:</tool_call>\s*)?[^\s<]")
#: a key after a call's arguments (``"id": …``), of the call or (past its
#: closing brace) of a wrapper around it
_OTHER_KEY = re.compile(r'[\s}]*,\s*"(?:[^"\\]|\\.)*"\s*:\s*')
_DECODER = json.JSONDecoder()
#: what may follow a whole value inside an object
_VALUE_ENDS = frozenset(" \t\r\n,}]")


def past_keys(rest: str) -> int:
    """Where the text after a call's arguments is past the whole keys that
    still belong to the call (``, "id": "call_1"``). A value is whole only
    once what follows it shows it ended (a number's ``0`` may go on as
    ``0.9``)."""
    i = 0
    while (m := _OTHER_KEY.match(rest, i)) is not None:
        try:
            _, end = _DECODER.raw_decode(rest, m.end())
        except ValueError:
            break
        if end >= len(rest) or rest[end] not in _VALUE_ENDS:
            break
        i = end
    return i


#: an object whose first key (after an id and a type) says no head is coming (read on speculation:
#: ``{"arguments": …, "name": …}`` fails the reader at once)
_NO_HEAD = re.compile(
    r"[\s,}\]]*(?:</tool_call>)?\s*(?:```(?:json)?\s*)?(?:<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>)?"
    r'\s*\[?\s*\{\s*(?:"id"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*)?(?:"type"\s*:\s*"function"\s*,\s*)?'
    r'"(?!(?:name|type|function|id)")(?:[^"\\]|\\.)*"\s*:'
)


def head_name(text: str) -> str | None:
    """The name of the call ``text`` opens, once its head is whole (the
    name and its arguments key in any JSON shape the readers take, or the
    xml syntax's ``<function=N>`` line), else None."""
    if (x := _XML_HEAD.match(text)) is not None:
        return x.group(1).strip() or None
    m = _HEAD.match(text)
    if m is None:
        return None
    try:
        name = json.loads(f'"{m.group(1)}"')
    except ValueError:
        return None
    return name if isinstance(name, str) else None


@dataclass
class Opened:
    """A call began: its id and name are known, its arguments are not yet."""

    index: int
    id: str
    name: str


@dataclass
class Piece:
    """More of call ``index``'s arguments (JSON text)."""

    index: int
    text: str


@dataclass
class Closed:
    """Call ``index`` is complete."""

    index: int
    call: ToolCall


Event = Opened | Piece | Closed


class _Strings:
    """Whether each character of JSON text, read one at a time, belongs to a
    string (its quotes included)."""

    def __init__(self) -> None:
        self.inside = False
        self._escape = False

    def step(self, ch: str) -> bool:
        if self.inside:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self.inside = False
            return True
        self.inside = ch == '"'
        return self.inside


class _Value:
    """Where one JSON value ends, read a character at a time."""

    def __init__(self) -> None:
        self.depth = 0
        self.strings = _Strings()
        self.started = False
        self.scalar = False

    def step(self, ch: str) -> bool:
        """Take ``ch``; False when ``ch`` is past the value (not part of it)."""
        if self.strings.inside:
            return self.strings.step(ch)
        if not self.started:
            self.started = True
            if ch in "{[":
                self.depth = 1
            elif not self.strings.step(ch):
                self.scalar = True
            return True
        if self.depth == 0:  # a scalar, or a string that has closed
            return self.scalar and ch not in ",}] \t\r\n"
        if self.strings.step(ch):
            pass
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
        return True

    @property
    def done(self) -> bool:
        return self.started and self.depth == 0 and not self.strings.inside and not self.scalar


class Compact:
    """JSON text fed in pieces, less the blanks between its tokens (those
    inside strings kept): a call's arguments as it comes, in the form
    ``guardrails.answered_arguments`` gives the answered ones."""

    def __init__(self) -> None:
        self.text = ""
        self._strings = _Strings()

    def feed(self, piece: str) -> str:
        kept = (ch for ch in piece if self._strings.step(ch) or ch not in " \t\r\n")
        self.text += "".join(kept)
        return self.text


class _Reader:
    """What both readers share: the calls closed so far, the one being read,
    the text after the last call, and how a piece or a call goes out."""

    def __init__(self, names: tuple[str, ...] | None, single: bool) -> None:
        self.calls: list[ToolCall] = []
        self.buffer = ""  # text not yet placed
        self.failed = False  # no call where one had to be: not a call text
        #: it failed on prose after its calls (text that can open no other call)
        self.prose = False
        self.names = names  # read on speculation: only calls to these
        self.single = single  # one call at most: what follows it is left as text
        self._rest = ""  # the text after the last closed call
        self._settled = False  # what follows the one call is left to the parsers
        self._open: tuple[str, str] | None = None  # (id, name) of the call being read
        self._args: list[str] = []

    @property
    def reading(self) -> bool:
        """A call is open (begun, not closed)."""
        return self._open is not None

    @property
    def partial(self) -> ToolCall | None:
        """The open call as far as it got (when the text stopped inside it)."""
        if self._open is None:
            return None
        return ToolCall(self._open[0], self._open[1], "".join(self._args))

    @property
    def rest(self) -> str:
        """The text after the last closed call, as written: what a stream
        read on speculation leaves to the parsers at the end."""
        return self._rest

    def _is_prose(self, text: str) -> bool:
        """``text`` follows calls read on speculation and can open no other
        call (this syntax's ``no_more``): prose, which fails the reader at
        once (it goes out as text)."""
        raise NotImplementedError

    def _after_single(self, text: str) -> None:
        """One call at most, and it is read: what follows it (``text``) is no
        call of this answer; prose fails the reader (and streams), anything
        else waits for the parsers at the end (which drop more calls). Not
        decided within :data:`_HEAD_LIMIT` characters, it is left to them."""
        if self._settled or len(text) > _HEAD_LIMIT:
            self._settled = True
        elif self._is_prose(text):
            self.prose = self.failed = True

    def _emit(self, out: list[Event], piece: str) -> None:
        self._args.append(piece)
        out.append(Piece(len(self.calls), piece))

    def _close(self, out: list[Event], rest: str) -> None:
        """The open call is complete; ``rest`` is what follows it so far."""
        assert self._open is not None
        call = ToolCall(self._open[0], self._open[1], "".join(self._args))
        self.calls.append(call)
        self._open, self._rest = None, rest
        out.append(Closed(len(self.calls) - 1, call))


class CallReader(_Reader):
    """Reads calls of the grammar's shape from text fed in pieces.

    ``names``: read on speculation, with no grammar behind the text (a call
    that has been held back long enough, ``answer.Router``). Then a call
    opens only for one of these names and only when its arguments are an
    object (under their key, or as the keys beside the name, which become
    the arguments object); anything else fails the reader: the text is no
    call it can stream (``head_name`` says whether it named an unknown tool).
    """

    def __init__(self, names: tuple[str, ...] | None = None, single: bool = False) -> None:
        super().__init__(names, single)
        self._head_text = ""  # the open call's text before its arguments
        self._beside = False  # the arguments are the keys beside the name
        self._value = _Value()
        #: the arguments are written as a JSON string (of the object's text):
        #: its content is what streams, decoded
        self._quoted: _Unquote | None = None
        self._raw: list[str] = []  # the quoted arguments as written

    @property
    def partial_text(self) -> str:
        """The open call's text as the model wrote it so far."""
        if self._open is None:
            return ""
        if self._quoted is not None:
            return self._head_text + "".join(self._raw)
        args = "".join(self._args)
        return self._head_text + (args[1:] if self._beside else args)

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self._open is None:  # (an open call's text is its own: its close sets what follows it)
            self._rest += text
        while text and not self.failed:
            if self._open is None:
                if self.single and self.calls:
                    self._after_single(self._rest)
                    break
                text = self._head(self.buffer + text, out)
            else:
                text = self._arguments(text, out)
        return out

    def _is_prose(self, text: str) -> bool:
        return self.names is not None and bool(self.calls) and _NO_MORE.match(text, past_keys(text)) is not None

    def _head(self, text: str, out: list[Event]) -> str:
        beside = False
        if self.names is None:
            m = _HEAD.match(text)
        else:
            m = _FREE_HEAD.match(text)
            if m is None and (m := _BESIDE.match(text)) is not None:
                beside = True
            elif m is None and (h := _HEAD.match(text)) is not None and not _undecided(text[h.end() :]):
                self.buffer, self.failed = text, True  # arguments that are not an object: the rescue's
                return ""
        if m is None:
            self.buffer = text
            self.prose = self._is_prose(text)
            hopeless = self.prose or (self.names is not None and _NO_HEAD.match(text) is not None)
            self.failed = hopeless or len(text.lstrip()) > _HEAD_LIMIT
            return ""
        try:
            name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            name = None
        if name is not None and self.names is not None:
            name = resolve_name(name, self.names)
        if name is None:
            self.buffer, self.failed = text, True
            return ""
        self.buffer = ""
        self._open = (new_call_id(), name)
        self._head_text = m.group(0).lstrip(",}] \t\r\n").removeprefix("</tool_call>").lstrip()
        self._args, self._value, self._beside = [], _Value(), beside
        quoted = self.names is not None and not beside and text[m.end() : m.end() + 1] == '"'
        self._quoted = _Unquote() if quoted else None
        self._raw = []
        out.append(Opened(len(self.calls), self._open[0], name))
        if beside:  # the call's own object, less its name, is the arguments
            self._value.step("{")
            self._emit(out, "{")
        return text[m.end() :]

    def _arguments(self, text: str, out: list[Event]) -> str:
        if self._quoted is not None:
            return self._unquote(text, out)
        value = self._value
        if not value.started:
            text = text.lstrip()  # the space after the key, when it came late
        end = len(text)
        for i, ch in enumerate(text):
            if not value.step(ch):
                end = i
                break
            if value.done:
                end = i + 1
                break
        if text[:end]:
            self._emit(out, text[:end])
        if value.done or end < len(text):
            self._close(out, text[end:])
            return text[end:]
        return ""

    def _unquote(self, text: str, out: list[Event]) -> str:
        """Arguments written as a JSON string: its decoded content streams."""
        quoted = self._quoted
        assert quoted is not None and self._open is not None
        end, decoded = len(text), []
        for i, ch in enumerate(text):
            piece = quoted.step(ch)
            if piece is None:
                end = i
                break
            decoded.append(piece)
            if quoted.done:
                end = i + 1
                break
        self._raw.append(text[:end])
        if piece := "".join(decoded):
            self._emit(out, piece)
        if quoted.done:
            self._quoted = None
            self._close(out, text[end:])
            return text[end:]
        return ""


def _undecided(value: str) -> bool:
    """An arguments value begun like this may still be an object (or a
    string holding one)."""
    return value == "" or (value[0] == '"' and not value[1:].strip())


class _Unquote:
    """A JSON string's content, decoded a character at a time. A surrogate
    escape without its pair becomes U+FFFD (what goes out is always text
    any JSON encoder takes); a broken ``\\u`` escape is dropped."""

    _ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
    _HEX = frozenset("0123456789abcdefABCDEF")

    def __init__(self) -> None:
        self.started = self.done = self.escape = False
        self.hex: str | None = None
        self.high = False  # a high surrogate waiting for its pair
        self._high = 0

    def step(self, ch: str) -> str | None:
        """The text ``ch`` adds ("" for syntax), None when ``ch`` is past the string."""
        if self.done:
            return None
        if not self.started:
            self.started = True
            return ""
        if self.hex is not None:
            if ch not in self._HEX:  # a broken escape: dropped, ``ch`` read as itself
                self.hex = None
                return self.step(ch)
            self.hex += ch
            return self._code() if len(self.hex) == 4 else ""
        if self.escape:
            self.escape = False
            if ch == "u":
                self.hex = ""
                return ""
            return self._lone() + self._ESCAPES.get(ch, ch)
        if ch == "\\":
            self.escape = True
            return ""
        if ch == '"':
            self.done = True
            return self._lone()
        return self._lone() + ch

    def _lone(self) -> str:
        """A high surrogate left without its pair."""
        if not self.high:
            return ""
        self.high = False
        return "\ufffd"

    def _code(self) -> str:
        code, self.hex = int(self.hex or "0", 16), None
        if 0xD800 <= code < 0xDC00:
            lone = self._lone()
            self.high, self._high = True, code
            return lone
        if 0xDC00 <= code < 0xE000:
            if not self.high:
                return "\ufffd"
            self.high = False
            return chr(0x10000 + ((self._high - 0xD800) << 10) + (code - 0xDC00))
        return self._lone() + chr(code)


#: an xml call's head: what closed the call before it, the optional
#: ``<tool_call>`` wrapper, ``<function=NAME>`` and the one newline after it
#: (known once the next character is there; a tag, not prose, follows)
_XML_HEAD = re.compile(
    r"\s*(?:</function>\s*)?(?:</tool_call>\s*)?(?:<tool_call>\s*)?<function=([^>\n]*)>(?:\n|(?=[ \t]*<))", re.S
)
_XML_PARAM = re.compile(r"\s*<parameter=([^>\n]*)>(?:\n|(?=.))", re.S)
#: a call's end: its ``</function>``, or a ``</tool_call>`` that closes it without one
_XML_END = re.compile(r"\s*</function>|\s*(?=</tool_call>)")
_XML_TAGS = ("<parameter=", "</function>", "</tool_call>")
_PARAM_CLOSE = "</parameter>"


class XmlCallReader(_Reader):
    """Reads calls of the xml syntax (Qwen3-Coder's ``<function=N>``
    ``<parameter=K>`` blocks) as they are written, turning each into the
    same events as :class:`CallReader`: its arguments stream as the JSON
    object they make. A parameter written raw (``raw[name]``, plain strings)
    streams as a JSON string as its characters come; the others are JSON
    text, handed on whole when their block closes. ``names``: read on
    speculation (no grammar behind the text), only calls to these names."""

    def __init__(
        self, raw: dict[str, frozenset[str]], names: tuple[str, ...] | None = None, single: bool = False
    ) -> None:
        super().__init__(names, single)
        self._raw = raw
        self._text: list[str] = []  # the open call's text as written
        self._param: str | None = None  # the parameter being read
        self._params = 0  # parameters of the open call so far

    @property
    def partial_text(self) -> str:
        return "".join(self._text) + self.buffer if self._open is not None else ""

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self.buffer += text
        if self._open is None:  # (an open call's text is its own: its close sets what follows it)
            self._rest += text
        while not self.failed:
            before = (self.buffer, self._open, self._param)
            if self._open is None:
                if self.single and self.calls:
                    self._after_single(self.buffer)
                    break
                self._head(out)
            elif self._param is None:
                self._next(out)
            else:
                self._value(out)
            if (self.buffer, self._open, self._param) == before:  # nothing more to read yet
                break
        return out

    def _is_prose(self, text: str) -> bool:
        return self.names is not None and bool(self.calls) and _XML_NO_MORE.match(text) is not None

    def _take(self, n: int) -> str:
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        self._text.append(taken)
        return taken

    def _head(self, out: list[Event]) -> None:
        m = _XML_HEAD.match(self.buffer)
        if m is None:
            self.prose = self._is_prose(self.buffer)
            self.failed = self.prose or len(self.buffer.lstrip()) > _HEAD_LIMIT
            return
        name: str | None = m.group(1).strip()
        if name and self.names is not None:
            name = resolve_name(name, self.names)
        if not name:
            self.failed = True
            return
        self._text = []
        self._take(m.end())
        self._text = [self._text[0].lstrip().removeprefix("</function>").lstrip().removeprefix("</tool_call>").lstrip()]
        self._open, self._args, self._params = (new_call_id(), name), [], 0
        out.append(Opened(len(self.calls), self._open[0], name))
        self._emit(out, "{")

    def _next(self, out: list[Event]) -> None:
        """Between parameters: the next one opens, or the call ends."""
        assert self._open is not None
        if (m := _XML_PARAM.match(self.buffer)) is not None:
            self._take(m.end())
            self._param = m.group(1).strip()
            key = json.dumps(self._param, ensure_ascii=False)
            self._emit(out, ("" if not self._params else ", ") + key + ": ")
            self._params += 1
            if self._param in self._raw.get(self._open[1], ()):
                self._emit(out, '"')
        elif (m := _XML_END.match(self.buffer)) is not None:
            self._take(m.end())
            self._emit(out, "}")
            self._close(out, self.buffer)
        elif self.buffer.strip() and not any(tag.startswith(self.buffer.lstrip()[: len(tag)]) for tag in _XML_TAGS):
            self.failed = True  # neither a parameter nor the end: not a call the reader knows

    def _value(self, out: list[Event]) -> None:
        """Inside a parameter: a raw string streams, escaped, up to where
        its closing tag may begin; JSON waits for the tag."""
        assert self._open is not None and self._param is not None
        raw = self._param in self._raw.get(self._open[1], ())
        end = self.buffer.find(_PARAM_CLOSE)
        if end < 0:
            if raw:
                keep = _close_start(self.buffer)
                if keep > 0:
                    self._emit(out, json.dumps(self._take(keep), ensure_ascii=False)[1:-1])
            return
        value = self._take(end)
        self._take(len(_PARAM_CLOSE))
        value = value[:-1] if value.endswith("\n") else value  # the newline before the tag is layout
        if raw:
            self._emit(out, json.dumps(value, ensure_ascii=False)[1:-1] + '"')
        else:
            self._emit(out, json.dumps(_xml_value(value), ensure_ascii=False))
        self._param = None


def _close_start(text: str) -> int:
    """How much of a raw value can go out: all but a tail that may still
    become the newline and tag that close it."""
    for i in range(max(0, len(text) - len(_PARAM_CLOSE) - 1), len(text)):
        if ("\n" + _PARAM_CLOSE).startswith(text[i:]) or _PARAM_CLOSE.startswith(text[i:]):
            return i
    return len(text)


def _xml_value(raw: str) -> object:
    """A non-raw parameter's JSON value (a string when it is not JSON, or
    when it is one of Python's extra constants, NaN and Infinity)."""
    try:
        return _JSON.decode(raw.strip())
    except ValueError:
        return raw


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


_JSON = json.JSONDecoder(parse_constant=_no_constants)
