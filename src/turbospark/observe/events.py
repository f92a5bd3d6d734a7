"""The event schema (CONTRACT §2): what a request, a model attach and a
detach look like to every sink. Frozen, slotted dataclasses serialized as JSON
objects tagged by ``kind`` with camelCase fields; the request ids that tie a
request's events together."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar, cast, dataclass_transform

import orjson

RequestId = int


def now_ms() -> int:
    """Milliseconds since the Unix epoch, to place an event on a timeline."""
    return time.time_ns() // 1_000_000


class RequestIds:
    """Monotonic id source, one per running server. Thread-safe.

    ``itertools.count`` advances atomically under the GIL, which is all that
    uniqueness needs.
    """

    def __init__(self, start: int = 1) -> None:
        self._counter = itertools.count(start)

    def next(self) -> RequestId:
        return next(self._counter)


class ServerEvent:
    """Base of every event; ``to_dict`` gives the wire shape."""

    kind: ClassVar[str]
    _fields: ClassVar[tuple[tuple[str, str], ...]]  # (attribute, camelCase)
    #: fields left out of the wire shape when they are None
    _optional: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for attr, key in self._fields:
            value = getattr(self, attr)
            if value is None and attr in self._optional:
                continue
            out[key] = value
        return out

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


_E = TypeVar("_E")


@dataclass_transform(frozen_default=True)
def _event(kind: str) -> Callable[[type[_E]], type[_E]]:
    """Class decorator: a slotted dataclass event with its camelCase map."""

    def wrap(cls: type[_E]) -> type[_E]:
        made: Any = dataclass(frozen=True, slots=True)(cls)
        made.kind = kind
        made._fields = tuple((f.name, _camel(f.name)) for f in fields(made))
        return cast("type[_E]", made)

    return wrap


@_event("requestStarted")
class RequestStarted(ServerEvent):
    """From the middleware, before any handler runs, for every request."""

    id: RequestId
    at_ms: int
    method: str
    path: str


@_event("requestRouted")
class RequestRouted(ServerEvent):
    """From a handler once the body is parsed and a model chosen.

    ``requested`` and ``served`` are separate because they differ on every
    single-model fallback (Claude Code asks for ``claude-sonnet-...``).
    """

    id: RequestId
    requested: str | None
    served: str
    stream: bool
    #: known client stamps taken out of the prompt (``--normalize-client-
    #: stamps``); omitted when none
    normalized_stamps: int = 0
    #: a stored response's id, and the one it continues (Responses API
    #: chains); omitted when none
    response_id: str | None = None
    previous_response_id: str | None = None
    _optional: ClassVar[frozenset[str]] = frozenset({"response_id", "previous_response_id"})

    def to_dict(self) -> dict[str, Any]:
        out = ServerEvent.to_dict(self)
        if not self.normalized_stamps:
            del out["normalizedStamps"]
        return out


@_event("generated")
class Generated(ServerEvent):
    """One completed generation, straight off the engine's result. Its times
    are the request's own wall-clock intervals (CONTRACT §2): queue =
    submitted → admitted, prefill = admitted → first token, decode = first →
    last token. There is deliberately no time-to-first-token field."""

    id: RequestId
    model: str
    prompt_tokens: int
    new_tokens: int
    prefill_seconds: float
    decode_seconds: float
    stop_reason: str
    reused_prefix_tokens: int
    session_slot_evicted: bool
    #: prompt-lookup speculation (CONTRACT §3 "anything more the engine
    #: measures"); both omitted when nothing was drafted
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    queue_seconds: float = 0.0
    #: where the reused prefix came from: "slot" (the request's own slot) or
    #: "copy" (copied from another slot's KV); omitted when nothing was reused
    reused_from: str | None = None
    #: the first prompt position that differed from the cached record that
    #: shared the most with the prompt; null when the prompt extended it
    #: whole or there was none (a client that changes its prompt's start,
    #: a cache-busting stamp, shows here)
    prefix_miss_at: int | None = None
    #: which of the request's choices (OpenAI ``n``) this run was; they run
    #: side by side, so their times overlap. Omitted for the first (0)
    choice: int = 0
    #: the prompt's media (images, sounds: one per item) and their tokens,
    #: which ``prompt_tokens`` includes; how many of them this run encoded
    #: (a reused prefix held the rest: 0 when it held them all) and the
    #: projector's seconds for that. All four omitted without media
    media_items: int = 0
    media_tokens: int = 0
    media_encoded: int = 0
    media_encode_seconds: float = 0.0
    _optional: ClassVar[frozenset[str]] = frozenset({"reused_from"})

    def to_dict(self) -> dict[str, Any]:
        out = ServerEvent.to_dict(self)
        if not self.drafted_tokens:
            del out["draftedTokens"], out["acceptedTokens"]
        if not self.choice:
            del out["choice"]
        if not self.media_items:
            del out["mediaItems"], out["mediaTokens"], out["mediaEncoded"], out["mediaEncodeSeconds"]
        return out


@_event("ranked")
class Ranked(ServerEvent):
    """One rerank, straight off the reranker's result: its (query,
    document) pairs, their tokens, and the request's own times on the
    reranker's engine thread: queue = submitted → its first step, compute =
    its first step → the end of its last (steps it shared with other
    requests' pairs included). ``truncated``: documents cut to fit
    (omitted when none). A rerank cancelled before its last pair (its
    client left, a drain's deadline) has ``stop_reason`` "cancelled" (else
    omitted), its pairs and tokens those scored until then."""

    id: RequestId
    model: str
    pairs: int
    prompt_tokens: int
    queue_seconds: float
    compute_seconds: float
    steps: int
    truncated: int = 0
    stop_reason: str | None = None
    _optional: ClassVar[frozenset[str]] = frozenset({"stop_reason"})

    def to_dict(self) -> dict[str, Any]:
        out = ServerEvent.to_dict(self)
        if not self.truncated:
            del out["truncated"]
        return out


@_event("requestFinished")
class RequestFinished(ServerEvent):
    """From the middleware, when the response is really over (its last byte
    sent, or the client gone), streams included: after every ``generated``
    of the request. ``error``: the error the client was sent (a mid-stream
    failure keeps its 200), or ``"client disconnected"``."""

    id: RequestId
    status: int
    duration_ms: int
    error: str | None = None
    _optional: ClassVar[frozenset[str]] = frozenset({"error"})


@_event("modelAttached")
class ModelAttached(ServerEvent):
    at_ms: int
    model: str


@_event("modelDetached")
class ModelDetached(ServerEvent):
    """A model left memory or routing; ``reason`` says why when it was not
    asked for (an engine failure, an eviction, its keep-alive) or came from
    the config file (a section removed or changed by a reload)."""

    at_ms: int
    model: str
    reason: str | None = None
    _optional: ClassVar[frozenset[str]] = frozenset({"reason"})


@_event("modelHealth")
class ModelHealth(ServerEvent):
    """The watchdog's finding about a resident model: ``stalled`` (no engine
    step for ``--stall-timeout`` while work waits) or ``ok`` again."""

    at_ms: int
    model: str
    state: str
    reason: str = ""


@_event("modelPull")
class ModelPull(ServerEvent):
    """A model download by a server (``/api/pull``, an attach that pulls):
    ``phase`` is ``started`` (once the name and the size are known;
    a plan that failed: just before its ``failed``), ``progress`` (at most
    twice a second), ``finished`` or ``failed`` (with ``reason``); every
    event of one pull carries the same ``model``. ``completed``/``total`` are
    bytes of the model's files; ``fetched`` the bytes that came over the
    network (less than ``completed`` when a download resumed)."""

    at_ms: int
    model: str
    phase: str
    completed: int = 0
    total: int = 0
    fetched: int = 0
    seconds: float | None = None
    reason: str | None = None
    _optional: ClassVar[frozenset[str]] = frozenset({"seconds", "reason"})


EVENT_TYPES: tuple[type[ServerEvent], ...] = (
    RequestStarted,
    RequestRouted,
    Generated,
    Ranked,
    RequestFinished,
    ModelAttached,
    ModelDetached,
    ModelHealth,
    ModelPull,
)
