"""How events travel: the observer protocol, building an event only when
somebody listens, fanning out to several sinks (one raising spoils nothing),
the side channels that are not events (trace context, tenant), and the
per-request :class:`Reporter` the generation core reports engine runs to."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .events import Generated, Ranked, RequestId, ServerEvent

if TYPE_CHECKING:
    from ..engine.types import Ranking, RawDecodeResult

log = logging.getLogger("turbospark.observe")


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


class Reporter:
    """Reports one request's generations: bound to the request by the route
    and handed to the generation core, which calls :meth:`generated` with
    each attempt's engine result (a guardrail re-ask is a second one). It
    also knows the request's engine runs still going, so the middleware can
    end the request only after the last ``generated`` (a cancelled run ends
    at the engine's next step, after the client is gone)."""

    __slots__ = ("observer", "request_id", "_runs", "choice")

    def __init__(self, observer: Observer | None, request_id: RequestId | None, choice: int = 0) -> None:
        self.observer = observer if request_id is not None else None
        self.request_id = request_id
        self._runs: set[Any] = set()
        #: the choice (OpenAI ``n``) whose runs this reports
        self.choice = choice

    def for_choice(self, index: int) -> Reporter:
        """The same request's reporter for one of its choices (its runs
        are the request's: :meth:`settled` waits for every choice's)."""
        other = Reporter(self.observer, self.request_id, index)
        other._runs = self._runs
        return other

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
                prefix_miss_at=result.prefix_miss_at,
                choice=self.choice,
                media_items=result.media_items,
                media_tokens=result.media_tokens,
                media_encoded=result.media_encoded,
                media_encode_seconds=result.media_encode_seconds,
            ),
        )

    def ranked(self, model_id: str, ranking: Ranking) -> None:
        """Record a rerank's ``ranked``: its pairs, tokens and times."""
        if self.observer is None:
            return
        rid = self.request_id
        assert rid is not None
        record(
            self.observer,
            lambda: Ranked(
                id=rid,
                model=model_id,
                pairs=len(ranking.scores),
                prompt_tokens=ranking.total_tokens,
                queue_seconds=ranking.queue_seconds,
                compute_seconds=ranking.compute_seconds,
                steps=ranking.steps,
                truncated=ranking.truncated,
                stop_reason="cancelled" if ranking.cancelled else None,
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
