"""OpenTelemetry traces: one span per request, built from its events.

Optional (``pip install 'turbospark[otel]'``); ``opentelemetry`` is imported
only when a sink is made. ``turbospark serve --otlp-endpoint URL`` or the
standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
variables turn it on (OTLP over HTTP); ``OTEL_SERVICE_NAME`` names the
service (default ``turbospark``). Nothing is enabled when none is set.

A span starts at ``requestStarted``'s ``atMs`` and ends at
``requestFinished``, which comes when the response is really over, streams
included (CONTRACT §2); a status ≥ 500 or an ``error`` (a stream that failed
after its headers, a client that left) sets the span's error status.
Attributes follow the OpenTelemetry ``gen_ai.*`` and HTTP semantic
conventions, plus the engine's timings under ``turbospark.*`` (summed by the
shared :class:`~turbospark.views.usage.Usage`); the time to first token is measured
from arrival (receipt of the first ``generated`` - its ``decodeSeconds`` -
``atMs``) and named so.

A request that arrives with W3C ``traceparent`` / ``tracestate`` headers gets
its span parented there (through the configured propagators), so the server
span joins the client's trace; the middleware hands those headers over with
``trace_context``, beside the events.

``record`` only enqueues; one worker thread folds the events and talks to the
OpenTelemetry SDK, so a slow exporter never touches a request.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..observe import Generated, Ranked, RequestFinished, RequestRouted, RequestStarted, ServerEvent
from ..views.usage import Usage
from .paths import RouteTemplates, default_templates

log = logging.getLogger("turbospark.sinks")
#: the longest a shutdown waits for the collector to take the last spans
CLOSE_SECONDS = 3.0

#: ``gen_ai.provider.name`` / ``gen_ai.system``
PROVIDER = "turbospark"
#: requests whose ``requestFinished`` has not come yet, kept at most (the
#: oldest is ended, marked incomplete, when more arrive)
MAX_OPEN = 10_000
ENV_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")

#: route template -> gen_ai.operation.name
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/messages": "chat",
    "/v1/responses": "chat",
    "/responses": "chat",
    "/api/chat": "chat",
    "/v1/completions": "text_completion",
    "/completions": "text_completion",
    "/api/generate": "text_completion",
    "/v1/embeddings": "embeddings",
    "/embeddings": "embeddings",
    "/api/embed": "embeddings",
    "/api/embeddings": "embeddings",
    "/v1/rerank": "rerank",
    "/rerank": "rerank",
    "/v1/reranking": "rerank",
    "/v2/rerank": "rerank",
}

_STOP = object()
_FLUSH = object()
_CARRIER = object()


def otel_wanted(endpoint: str | None, env: Mapping[str, str] = os.environ) -> bool:
    """True when an endpoint was given or the standard variables name one
    (and ``OTEL_SDK_DISABLED`` does not say otherwise)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(endpoint) or any(env.get(k) for k in ENV_ENDPOINTS)


def traces_url(endpoint: str) -> str:
    """``--otlp-endpoint`` takes the collector's base URL, like
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; the traces path is added unless given."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


@dataclass(slots=True)
class _Request:
    """A request's facts, gathered until its span can be written."""

    id: int
    start_ns: int
    method: str
    path: str
    route: str
    requested: str | None = None
    served: str | None = None
    stream: bool = False
    usage: Usage = field(default_factory=Usage)
    ttft: float | None = None
    stop_reasons: list[str] = field(default_factory=list)
    #: a rerank's ``ranked``
    ranked: Ranked | None = None
    status: int | None = None
    duration_ms: int | None = None
    error: str | None = None
    #: the caller's W3C trace headers, when it sent any: the span's parent
    carrier: dict[str, str] | None = None


class OtelSink:
    """An observer that exports one span per request.

    ``tracer_provider`` lets a host (or a test, with an in-memory exporter)
    bring its own SDK set-up; without one the sink builds a provider that
    exports OTLP/HTTP to ``endpoint`` or where the ``OTEL_*`` variables say,
    and owns it (shut down by :meth:`close`).
    """

    def __init__(
        self,
        tracer_provider: Any = None,
        *,
        endpoint: str | None = None,
        templates: RouteTemplates | None = None,
    ) -> None:
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._kind, self._status, self._code = SpanKind.SERVER, Status, StatusCode
        self._extract = extract  # the configured propagators (W3C trace context by default)
        self._owned = tracer_provider is None
        self.provider = tracer_provider if tracer_provider is not None else _otlp_provider(endpoint)
        self.tracer = self.provider.get_tracer("turbospark", _version())
        self._templates = templates
        self._open: OrderedDict[int, _Request] = OrderedDict()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="turbospark-otel", daemon=True)
        self._thread.start()

    # -- the observer ------------------------------------------------------------
    def record(self, event: ServerEvent) -> None:
        if isinstance(event, (RequestStarted, RequestRouted, Generated, Ranked, RequestFinished)):
            self._queue.put((event, time.time_ns()))

    def trace_context(self, rid: int, carrier: dict[str, str]) -> None:
        """The request's ``traceparent``/``tracestate`` (see
        ``observe.trace_context``): its span joins the caller's trace."""
        self._queue.put((_CARRIER, (rid, carrier)))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event recorded so far is folded into spans and
        the provider has exported the finished ones."""
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        if not done.wait(timeout):
            return False
        flush = getattr(self.provider, "force_flush", None)
        return bool(flush(int(timeout * 1000))) if flush is not None else True

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """End what is still open, stop the worker, shut an owned provider:
        its last spans are exported for at most ``timeout`` seconds (a
        collector that takes the connection and never answers would hold the
        exit ten seconds a batch), then given up, and the loss logged."""
        self._queue.put((_STOP, None))
        self._thread.join(10)
        if self._owned:
            closing = threading.Thread(target=self.provider.shutdown, name="turbospark-otel-close", daemon=True)
            closing.start()
            closing.join(timeout)
            if closing.is_alive():
                log.warning("the OpenTelemetry collector did not take the last spans in %.0f s; they are lost", timeout)

    # -- the worker --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item, arg = self._queue.get()
            if item is _STOP:
                for req in list(self._open.values()):
                    self._end(req, time.time_ns(), incomplete=True)
                self._open.clear()
                return
            if item is _FLUSH:
                arg.set()
                continue
            if item is _CARRIER:
                target = self._open.get(arg[0])
                if target is not None:
                    target.carrier = arg[1]
                continue
            try:
                self._fold(item, arg)
            except Exception:  # pragma: no cover - a bad event must not kill the thread
                log.exception("otel sink failed on %r", item)

    def _route(self, path: str) -> str:
        if self._templates is None:
            self._templates = default_templates()
        return self._templates.of(path)

    def _fold(self, event: ServerEvent, at_ns: int) -> None:
        if isinstance(event, RequestStarted):
            self._open[event.id] = _Request(
                event.id, event.at_ms * 1_000_000, event.method, event.path, self._route(event.path)
            )
            while len(self._open) > MAX_OPEN:
                _, old = self._open.popitem(last=False)
                self._end(old, at_ns, incomplete=True)
            return
        req = self._open.get(getattr(event, "id", -1))
        if req is None:  # started before this sink, or evicted
            return
        if isinstance(event, RequestRouted):
            req.requested, req.served, req.stream = event.requested, event.served, event.stream
        elif isinstance(event, Generated):
            if req.usage.generations == 0:
                req.ttft = max(0.0, (at_ns - req.start_ns) / 1e9 - event.decode_seconds)
            req.usage.add(event.to_dict())
            req.served = event.model
            req.stop_reasons.append(event.stop_reason)
        elif isinstance(event, Ranked):
            req.ranked, req.served = event, event.model
        elif isinstance(event, RequestFinished):
            req.status, req.duration_ms, req.error = event.status, event.duration_ms, event.error
            del self._open[event.id]
            self._end(req, at_ns)

    def _end(self, req: _Request, end_ns: int, incomplete: bool = False) -> None:
        """Write the span. ``incomplete``: its closing event never came (the
        sink closed, or too many requests were open)."""
        op = OPERATIONS.get(req.route)
        model = req.served
        name = f"{op} {model}" if op and model else f"{req.method} {req.route}"
        parent = self._extract(req.carrier) if req.carrier else None
        span = self.tracer.start_span(
            name, context=parent, kind=self._kind, start_time=req.start_ns, attributes=_attributes(req, op)
        )
        if req.status is not None and (req.status >= 500 or req.error):
            # the status when it says the error; a response whose headers
            # said 200 says nothing: the error's class (semantic conventions)
            kind = "client_disconnected" if req.error == "client disconnected" else "stream_failed"
            span.set_attribute("error.type", str(req.status) if req.status >= 400 else kind)
            span.set_status(self._status(self._code.ERROR, req.error or f"HTTP {req.status}"))
        if incomplete:
            span.set_attribute("turbospark.incomplete", True)
        span.end(end_time=max(end_ns, req.start_ns))


def _attributes(req: _Request, op: str | None) -> dict[str, Any]:
    a: dict[str, Any] = {
        "turbospark.request_id": req.id,  # the x-request-id header, the events' id
        "http.request.method": req.method,
        "http.route": req.route,
        "url.path": req.path,
    }
    if req.status is not None:
        a["http.response.status_code"] = req.status
    if req.served is not None or req.usage.generations:
        a["gen_ai.provider.name"] = PROVIDER
        a["gen_ai.system"] = PROVIDER
        if op:
            a["gen_ai.operation.name"] = op
        if req.requested is not None:
            a["gen_ai.request.model"] = req.requested
        if req.served is not None:
            a["gen_ai.response.model"] = req.served
        a["turbospark.stream"] = req.stream
    if req.ranked is not None:
        a.update(_rerank_attributes(req.ranked))
    u = req.usage
    if u.generations:
        a.update(
            {
                "gen_ai.usage.input_tokens": u.prompt_tokens,
                "gen_ai.usage.output_tokens": u.new_tokens,
                "gen_ai.usage.cache_read.input_tokens": u.reused_tokens,
                "gen_ai.response.finish_reasons": list(req.stop_reasons),
                "turbospark.generations": u.generations,
                # (the request's own: its longest choice's when it had several)
                "turbospark.queue_seconds": u.request_seconds[0],
                "turbospark.prefill_seconds": u.request_seconds[1],
                "turbospark.decode_seconds": u.request_seconds[2],
                "turbospark.session_slot_evicted": bool(u.evictions),
            }
        )
        if req.ttft is not None:
            a["turbospark.time_to_first_token_from_arrival_seconds"] = req.ttft
        if u.drafted_tokens:
            a["turbospark.speculative.drafted_tokens"] = u.drafted_tokens
            a["turbospark.speculative.accepted_tokens"] = u.accepted_tokens
        if u.media_items:  # (their tokens are in gen_ai.usage.input_tokens)
            a["turbospark.media.items"] = u.media_items
            a["turbospark.media.tokens"] = u.media_tokens
            a["turbospark.media.encoded"] = u.media_encoded
            a["turbospark.media.encode_seconds"] = u.media_encode_seconds
        overhead = u.overhead_ms(req.duration_ms)
        if overhead is not None:
            a["turbospark.overhead_seconds"] = overhead / 1000.0
    return a


def _otlp_provider(endpoint: str | None) -> Any:
    """A provider exporting in batches over OTLP/HTTP, named by
    ``OTEL_SERVICE_NAME`` (default ``turbospark``)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "turbospark"}))
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint)) if endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _version() -> str:
    """turbospark's version, as installed (the sinks import no layer above them)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turbospark")
    except PackageNotFoundError:
        return "unknown"


def _rerank_attributes(k: Ranked) -> dict[str, Any]:
    """A rerank's pairs, their tokens and its times on the reranker's engine
    thread; one cut short (``stop_reason``) says so as a cut generation does."""
    out: dict[str, Any] = {
        "gen_ai.usage.input_tokens": k.prompt_tokens,
        "turbospark.rerank.pairs": k.pairs,
        "turbospark.queue_seconds": k.queue_seconds,
        "turbospark.rerank.compute_seconds": k.compute_seconds,
    }
    if k.stop_reason is not None:
        out["gen_ai.response.finish_reasons"] = [k.stop_reason]
    return out
