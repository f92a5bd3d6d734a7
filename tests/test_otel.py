"""OpenTelemetry: one span per request, built from the events, with the
``gen_ai.*`` attributes carrying the engine's exact token counts; streams end
at ``generated``; errors get the error status; OTLP/HTTP export for real."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from turbospark import ListObserver, Server  # noqa: E402
from turbospark.observe import Generated, Ranked, RequestFinished, RequestRouted, RequestStarted  # noqa: E402
from turbospark.sinks.otel import OtelSink, otel_wanted, traces_url  # noqa: E402

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def traced(server):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = OtelSink(provider)
    obs = ListObserver()
    with Server(models=[server.registry.models()[0]], observers=[obs, sink]) as srv:
        yield srv, obs, sink, exporter
    sink.close()


def span_of(sink: OtelSink, exporter: InMemorySpanExporter, rid: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sink.flush()
        spans = [s for s in exporter.get_finished_spans() if s.attributes["turbospark.request_id"] == int(rid)]
        if spans:
            assert len(spans) == 1, "one span per request"
            return spans[0]
        time.sleep(0.02)
    raise AssertionError(f"no span for request {rid}")


def events_of(obs: ListObserver, rid: str):
    rid_i = int(rid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        evs = obs.of(rid_i)
        if any(isinstance(e, Generated) for e in evs) and any(isinstance(e, RequestFinished) for e in evs):
            return evs
        time.sleep(0.02)
    raise AssertionError(f"events of {rid} incomplete: {obs.of(rid_i)}")


def test_non_streamed_span_carries_gen_ai_attributes(traced):
    srv, obs, sink, exporter = traced
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=120,
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6},
    )
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    span = span_of(sink, exporter, rid)
    started, routed, gen, finished = events_of(obs, rid)
    a = span.attributes
    assert span.name == f"chat {MODEL}"
    assert span.kind.name == "SERVER"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "turbospark"
    assert a["gen_ai.request.model"] == "gpt-4o" and a["gen_ai.response.model"] == MODEL  # a fallback
    assert a["gen_ai.usage.input_tokens"] == gen.prompt_tokens == r.json()["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == gen.new_tokens == 6
    assert a["gen_ai.usage.cache_read.input_tokens"] == gen.reused_prefix_tokens
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("maxTokens",)
    assert a["http.request.method"] == "POST" and a["http.route"] == "/v1/chat/completions"
    assert a["http.response.status_code"] == 200
    assert a["turbospark.prefill_seconds"] == gen.prefill_seconds
    assert a["turbospark.decode_seconds"] == gen.decode_seconds
    assert a["turbospark.time_to_first_token_from_arrival_seconds"] >= gen.prefill_seconds - 0.001  # atMs is ms
    assert a["turbospark.queue_seconds"] == gen.queue_seconds
    assert a["turbospark.overhead_seconds"] == pytest.approx(
        max(0.0, finished.duration_ms / 1000 - gen.queue_seconds - gen.prefill_seconds - gen.decode_seconds)
    )
    assert span.start_time == started.at_ms * 1_000_000
    assert span.end_time >= span.start_time + int((gen.prefill_seconds + gen.decode_seconds) * 1e9) - 1_000_000
    assert span.status.status_code is StatusCode.UNSET


def test_streamed_span_ends_at_request_finished_with_output_tokens(traced):
    srv, obs, sink, exporter = traced
    with httpx.stream(
        "POST",
        srv.url + "/v1/completions",
        timeout=120,
        json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 9, "stream": True},
    ) as r:
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        text = "".join(r.iter_text())
    assert "[DONE]" in text
    span = span_of(sink, exporter, rid)
    evs = events_of(obs, rid)
    kinds = [e.kind for e in evs]
    assert kinds == ["requestStarted", "requestRouted", "generated", "requestFinished"]
    gen = next(e for e in evs if isinstance(e, Generated))
    a = span.attributes
    assert span.name == f"text_completion {MODEL}" and a["gen_ai.operation.name"] == "text_completion"
    assert a["turbospark.stream"] is True
    assert a["gen_ai.usage.output_tokens"] == gen.new_tokens == 9
    assert a["gen_ai.usage.input_tokens"] == gen.prompt_tokens
    assert a["turbospark.queue_seconds"] == gen.queue_seconds  # the engine's, streams too
    # it covers the whole stream, not just the time to its first byte
    finished = next(e for e in evs if isinstance(e, RequestFinished))
    assert span.end_time - span.start_time >= int(gen.decode_seconds * 1e9)
    assert span.end_time - span.start_time >= finished.duration_ms * 1_000_000 - 1_000_000


def test_span_joins_the_callers_trace(traced):
    srv, _, sink, exporter = traced
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=120,
        headers={"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "vendor=x"},
        json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    )
    assert r.status_code == 200
    span = span_of(sink, exporter, r.headers["x-request-id"])
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == parent_id
    assert span.parent.is_remote and span.context.trace_state.get("vendor") == "x"
    # without the header, a root span of its own trace
    r = httpx.get(srv.url + "/v1/models")
    span = span_of(sink, exporter, r.headers["x-request-id"])
    assert span.parent is None and format(span.context.trace_id, "032x") != trace_id


def test_404_span_has_error_status(traced):
    srv, obs, sink, exporter = traced
    r = httpx.get(srv.url + "/v1/nothing/here")
    assert r.status_code == 404
    span = span_of(sink, exporter, r.headers["x-request-id"])
    assert span.name == "GET other"
    assert span.status.status_code is StatusCode.ERROR
    assert "no route for GET /v1/nothing/here" in span.status.description
    assert span.attributes["http.response.status_code"] == 404
    assert span.attributes["error.type"] == "404"
    assert "gen_ai.operation.name" not in span.attributes


def test_unrouted_bad_body_and_health_spans(traced):
    srv, obs, sink, exporter = traced
    bad = httpx.post(srv.url + "/v1/chat/completions", content=b"{nope")
    assert bad.status_code == 400
    span = span_of(sink, exporter, bad.headers["x-request-id"])
    assert span.status.status_code is StatusCode.ERROR and span.name == "POST /v1/chat/completions"
    ok = httpx.get(srv.url + "/health")
    span = span_of(sink, exporter, ok.headers["x-request-id"])
    assert span.status.status_code is StatusCode.UNSET and span.attributes["http.route"] == "/health"


# ------------------------------------------------------------------ unit
def memory_sink():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelSink(provider), exporter


def test_a_stream_that_failed_after_its_headers_ends_in_error():
    sink, exporter = memory_sink()
    sink.record(RequestStarted(id=1, at_ms=1000, method="POST", path="/api/chat"))
    sink.record(RequestRouted(id=1, requested=None, served="m", stream=True))
    sink.record(RequestFinished(id=1, status=200, duration_ms=3, error="engine error: boom"))
    sink.flush()
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat m" and span.status.status_code is StatusCode.ERROR
    assert span.status.description == "engine error: boom"
    assert "gen_ai.usage.output_tokens" not in span.attributes
    # its 200 says nothing of the error: the error's class does
    assert span.attributes["error.type"] == "stream_failed"
    sink.record(RequestStarted(id=2, at_ms=1000, method="POST", path="/api/chat"))
    sink.record(RequestFinished(id=2, status=200, duration_ms=3, error="client disconnected"))
    sink.flush()
    assert exporter.get_finished_spans()[-1].attributes["error.type"] == "client_disconnected"
    sink.close()


def test_a_request_still_open_at_close_is_ended_incomplete():
    sink, exporter = memory_sink()
    sink.record(RequestStarted(id=1, at_ms=1000, method="POST", path="/api/chat"))
    sink.record(RequestRouted(id=1, requested=None, served="m", stream=True))
    sink.flush()
    assert exporter.get_finished_spans() == ()
    sink.close()
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat m" and span.attributes["turbospark.incomplete"] is True


def test_a_rerank_span_carries_its_pairs_and_a_cut_one_says_cancelled():
    sink, exporter = memory_sink()
    for rid, stop in ((1, None), (2, "cancelled")):
        sink.record(RequestStarted(id=rid, at_ms=1000, method="POST", path="/v1/rerank"))
        sink.record(RequestRouted(id=rid, requested="rr", served="rr", stream=False))
        figures = {"pairs": 3, "prompt_tokens": 40, "queue_seconds": 0.1, "compute_seconds": 0.2, "steps": 1}
        sink.record(Ranked(id=rid, model="rr", stop_reason=stop, **figures))
        sink.record(RequestFinished(id=rid, status=200 if stop is None else 499, duration_ms=3))
    sink.flush()
    whole, cut = exporter.get_finished_spans()
    assert whole.attributes["turbospark.rerank.pairs"] == 3 and whole.attributes["gen_ai.usage.input_tokens"] == 40
    assert "gen_ai.response.finish_reasons" not in whole.attributes
    assert tuple(cut.attributes["gen_ai.response.finish_reasons"]) == ("cancelled",)
    sink.close()


def test_500_is_an_error_and_a_raising_event_does_not_kill_the_worker():
    sink, exporter = memory_sink()
    sink._queue.put((object(), 0))  # garbage: logged, skipped
    sink.record(RequestStarted(id=2, at_ms=5, method="POST", path="/v1/messages"))
    sink.record(RequestFinished(id=2, status=500, duration_ms=1, error="engine error: boom"))
    sink.flush()
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "engine error: boom"
    sink.close()


def test_enabling_rules():
    assert not otel_wanted(None, {})
    assert otel_wanted("http://collector:4318", {})
    assert otel_wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert otel_wanted(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not otel_wanted("http://c:4318", {"OTEL_SDK_DISABLED": "true"})
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


def test_a_collector_that_never_answers_does_not_hold_the_exit():
    """A collector that takes the connection and never answers: closing
    gives up on the last spans after its bound (the exporter alone waits
    ten seconds a batch, more with many requests)."""
    import socket

    hole = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(hole.accept()[0]), daemon=True).start()
    try:
        sink = OtelSink(endpoint=f"http://127.0.0.1:{hole.getsockname()[1]}")
        sink.record(RequestStarted(id=1, at_ms=10, method="GET", path="/v1/models"))
        sink.record(RequestFinished(id=1, status=200, duration_ms=1))
        t0 = time.monotonic()
        sink.close(timeout=0.5)
        assert time.monotonic() - t0 < 8  # (generous: the exporter's own wait is 10 s)
    finally:
        for s in [*held, hole]:
            s.close()


def test_otlp_http_export_reaches_a_collector(monkeypatch):
    """The real exporter, to a collector on loopback: protobuf over HTTP."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    got: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            got.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ts-test")
    try:
        sink = OtelSink(endpoint=f"http://127.0.0.1:{httpd.server_port}")
        sink.record(RequestStarted(id=3, at_ms=10, method="POST", path="/v1/chat/completions"))
        sink.record(RequestRouted(id=3, requested="a", served="m", stream=False))
        sink.record(
            Generated(
                id=3,
                model="m",
                prompt_tokens=11,
                new_tokens=5,
                prefill_seconds=0.1,
                decode_seconds=0.2,
                stop_reason="endOfTurn",
                reused_prefix_tokens=0,
                session_slot_evicted=False,
            )
        )
        sink.record(RequestFinished(id=3, status=200, duration_ms=400))
        assert sink.flush()
        sink.close()
    finally:
        httpd.shutdown()
    assert got and got[0][0] == "/v1/traces"
    req = ExportTraceServiceRequest.FromString(got[0][1])
    rs = req.resource_spans[0]
    assert {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"] == "ts-test"
    span = rs.scope_spans[0].spans[0]
    attrs = {a.key: a.value for a in span.attributes}
    assert span.name == "chat m"
    assert attrs["gen_ai.usage.input_tokens"].int_value == 11
    assert attrs["gen_ai.usage.output_tokens"].int_value == 5


def test_serve_flag_or_env_turns_tracing_on(monkeypatch):
    from turbospark.access.auth import Auth
    from turbospark.access.guard import BrowserPolicy
    from turbospark.cli import _traces_label, parser
    from turbospark.compose import assemble
    from turbospark.sinks.otel import otel_wanted

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    plain = parser().parse_args(["serve"])
    assert not otel_wanted(plain.otlp_endpoint) and _traces_label(plain) == "off"
    for args, env in [(["serve", "--otlp-endpoint", "http://127.0.0.1:9"], None), (["serve"], "http://127.0.0.1:9")]:
        if env:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", env)
        ns = parser().parse_args(args)
        assert otel_wanted(ns.otlp_endpoint) and _traces_label(ns).startswith("OTLP ")
        # what serve then assembles (cli._serve passes tracing=otel_wanted(...))
        built = assemble([], auth=Auth(), policy=BrowserPolicy(), tracing=True, otlp_endpoint=ns.otlp_endpoint)
        try:
            assert [type(s).__name__ for s in built.sinks] == ["OtelSink"]
        finally:
            built.close()
