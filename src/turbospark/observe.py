"""The one place turbospark reports what it is doing.

A request's facts come from two places because neither can see the other's:
the ASGI middleware knows method, path, status and wall duration for EVERY
request (404s, 401s and rejected bodies included) but nothing about tokens;
the generation path knows tokens and timings but nothing about HTTP. So a
request yields ``requestStarted``/``requestFinished`` from the middleware and
``requestRouted``/``generated`` from the handler and the model decorator, all
tied together by one id the middleware mints.

Token counts come off the engine's :class:`RawDecodeResult`, never off a count
of streamed chunks (special tokens render empty, partial UTF-8 is withheld,
reasoning goes elsewhere: a chunk count is wrong by a varying amount).

Sinks (JSONL, SSE, Prometheus, ...) live in their own modules and consume
these events; nothing else computes metrics on the side.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Protocol,
    TypeVar,
    dataclass_transform,
    runtime_checkable,
)

import orjson

if TYPE_CHECKING:
    from .engine.types import RawDecodeResult

log = logging.getLogger("turbospark.observe")

RequestId = int

#: Key under which the middleware stores the request id in the ASGI scope's
#: ``state`` dict (Starlette exposes it as ``request.state``). A namespaced
#: string so no other layer collides with it.
REQUEST_ID_KEY = "turbospark_request_id"


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


# --------------------------------------------------------------------------
# Events. Serialized as JSON objects tagged by "kind" with camelCase fields.
# --------------------------------------------------------------------------


class ServerEvent:
    """Base of every event; ``to_dict`` gives the wire shape."""

    kind: ClassVar[str]
    _fields: ClassVar[tuple[tuple[str, str], ...]]  # (attribute, camelCase)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for attr, key in self._fields:
            out[key] = getattr(self, attr)
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
        made._fields = tuple((f, _camel(f)) for f in made.__dataclass_fields__)
        return made

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

    def to_dict(self) -> dict[str, Any]:
        out = ServerEvent.to_dict(self)
        if not self.drafted_tokens:
            del out["draftedTokens"], out["acceptedTokens"]
        if self.reused_from is None:
            del out["reusedFrom"]
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

    def to_dict(self) -> dict[str, Any]:
        out = ServerEvent.to_dict(self)
        if self.error is None:
            del out["error"]
        return out


@_event("modelAttached")
class ModelAttached(ServerEvent):
    at_ms: int
    model: str


@_event("modelDetached")
class ModelDetached(ServerEvent):
    at_ms: int
    model: str


EVENT_TYPES: tuple[type[ServerEvent], ...] = (
    RequestStarted,
    RequestRouted,
    Generated,
    RequestFinished,
    ModelAttached,
    ModelDetached,
)


# --------------------------------------------------------------------------
# Observers.
# --------------------------------------------------------------------------


@runtime_checkable
class Observer(Protocol):
    """Where events go.

    ``record`` is called from request-handling code, including the engine's
    scheduler thread, so it must not block and should be cheap.
    """

    def record(self, event: ServerEvent) -> None: ...


def record(observer: Observer | None, build: Callable[[], ServerEvent]) -> None:
    """Build the event only when somebody listens, and never let an observer
    break the request that reported it."""
    if observer is None:
        return
    try:
        observer.record(build())
    except Exception:  # an observer must never break a request
        log.exception("observer raised; event dropped")


#: request headers handed to observers that join the caller's trace
TRACE_HEADERS = (b"traceparent", b"tracestate")


def trace_context(observer: Observer | None, rid: int, carrier: dict[str, str]) -> None:
    """Offer a request's W3C trace headers (``traceparent``/``tracestate``)
    to the observers that want them: those with a ``trace_context(id,
    carrier)`` method (the OpenTelemetry sink, to parent its span). Not an
    event: trace propagation is a tracing concern, and the events keep the
    schema every view shares. Called right after ``requestStarted``."""
    hook = getattr(observer, "trace_context", None)
    if hook is None:
        return
    try:
        hook(rid, carrier)
    except Exception:
        log.exception("observer raised on trace context; ignored")


def request_tenant(observer: Observer | None, rid: int | None, tenant: str) -> None:
    """Tell the observers that want it (those with a ``request_tenant(id,
    tenant)`` method: the live views, to show each tenant only its own
    requests) which tenant request ``rid`` runs for: ``tenant_of`` its key,
    never the key. Not an event: the event schema (CONTRACT §2) stays the
    same for every sink. Called by the auth middleware once the key is
    accepted, so right after ``requestStarted``; never for a refused
    request, nor when no keys are configured (one tenant, "")."""
    hook = getattr(observer, "request_tenant", None)
    if hook is None or rid is None:
        return
    try:
        hook(rid, tenant)
    except Exception:
        log.exception("observer raised on request tenant; ignored")


class FanOut:
    """Sends every event to several observers; one raising spoils nothing."""

    def __init__(self, observers: Iterable[Observer]) -> None:
        self.observers: tuple[Observer, ...] = tuple(observers)
        self._tracers = tuple(o for o in self.observers if getattr(o, "trace_context", None) is not None)
        if not self._tracers:  # nobody joins traces: no hook, so no header scan
            self.trace_context = None  # type: ignore[assignment]
        self._tenanted = tuple(o for o in self.observers if getattr(o, "request_tenant", None) is not None)
        if not self._tenanted:
            self.request_tenant = None  # type: ignore[assignment]

    def record(self, event: ServerEvent) -> None:
        for obs in self.observers:
            try:
                obs.record(event)
            except Exception:
                log.exception("observer %r raised; event dropped for it", obs)

    def trace_context(self, rid: int, carrier: dict[str, str]) -> None:
        for obs in self._tracers:
            trace_context(obs, rid, carrier)

    def request_tenant(self, rid: int, tenant: str) -> None:
        for obs in self._tenanted:
            request_tenant(obs, rid, tenant)


def combine(observers: Iterable[Observer | None]) -> Observer | None:
    """None when nobody listens (so no event is ever built), the observer
    itself when there is one, a :class:`FanOut` otherwise."""
    present = [o for o in observers if o is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    return FanOut(present)


@dataclass
class Drained:
    events: list[dict[str, Any]]
    dropped: int


class RingObserver:
    """A bounded ring for embedding hosts: by count and by serialized bytes.

    The oldest events are evicted first; :meth:`drain` hands each event out
    once and reports how many were dropped since the previous drain.
    """

    def __init__(self, max_events: int = 2000, max_bytes: int = 1 << 20) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("ring limits must be positive")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._ring: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self._dropped = 0
        self._lock = threading.Lock()

    def record(self, event: ServerEvent) -> None:
        data = event.to_dict()
        size = len(orjson.dumps(data))
        with self._lock:
            self._ring.append((data, size))
            self._bytes += size
            while len(self._ring) > self.max_events or (self._bytes > self.max_bytes and len(self._ring) > 1):
                _, old = self._ring.popleft()
                self._bytes -= old
                self._dropped += 1

    def drain(self, max_events: int | None = None) -> Drained:
        with self._lock:
            n = len(self._ring) if max_events is None else min(max_events, len(self._ring))
            items = [self._ring.popleft() for _ in range(n)]
            self._bytes -= sum(size for _, size in items)
            dropped, self._dropped = self._dropped, 0
        return Drained([data for data, _ in items], dropped)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ring)


@dataclass
class ListObserver:
    """Keeps every event in memory; for tests and short scripts."""

    events: list[ServerEvent] = field(default_factory=list)

    def record(self, event: ServerEvent) -> None:
        self.events.append(event)

    def of(self, request_id: RequestId) -> list[ServerEvent]:
        return [e for e in list(self.events) if getattr(e, "id", None) == request_id]


# --------------------------------------------------------------------------
# The reporting decorator around a model's one generation call.
# --------------------------------------------------------------------------


class Reporter:
    """Reports one request's generations: bound to the request by the route
    and handed to the generation core, which calls :meth:`generated` with
    each attempt's engine result (a guardrail re-ask is a second one). It
    also knows the request's engine runs still going, so the middleware can
    end the request only after the last ``generated`` (a cancelled run ends
    at the engine's next step, after the client is gone)."""

    __slots__ = ("observer", "request_id", "_runs")

    def __init__(self, observer: Observer | None, request_id: RequestId | None) -> None:
        self.observer = observer if request_id is not None else None
        self.request_id = request_id
        self._runs: set[Any] = set()

    def generated(self, model_id: str, result: RawDecodeResult) -> None:
        """Record one attempt's ``generated`` (a failed run has no result
        and is never reported: the middleware reports its status)."""
        if self.observer is None:
            return
        rid = self.request_id
        assert rid is not None
        record(
            self.observer,
            lambda: Generated(
                id=rid,
                model=model_id,
                prompt_tokens=result.prompt_tokens,
                new_tokens=result.new_tokens,
                prefill_seconds=result.prefill_seconds,
                decode_seconds=result.decode_seconds,
                stop_reason=result.reason.value,
                reused_prefix_tokens=result.reused_prefix_tokens,
                session_slot_evicted=result.session_slot_evicted,
                drafted_tokens=result.drafted_tokens,
                accepted_tokens=result.accepted_tokens,
                queue_seconds=result.queue_seconds,
                reused_from=result.reused_from,
            ),
        )

    def running(self, task: asyncio.Future[Any]) -> None:
        """An engine run of this request, until it ends."""
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)

    @property
    def idle(self) -> bool:
        """No engine run of this request is still going."""
        return not self._runs

    async def settled(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) for this request's engine runs to end."""
        if self._runs:
            await asyncio.wait(set(self._runs), timeout=timeout)


#: for work outside any request (nothing is reported)
NO_REPORTER = Reporter(None, None)
