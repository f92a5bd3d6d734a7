"""``GET /metrics``: Prometheus counters fed only by events move by exactly
the engine's numbers; auth and ``--metrics-auth off``; the sink's folding on
synthetic events."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from turbospark import ListObserver, Server
from turbospark.access.auth import Auth
from turbospark.access.guard import BrowserPolicy
from turbospark.cli import _model_options, parser
from turbospark.compose import assemble
from turbospark.observe import (
    Generated,
    ModelAttached,
    ModelDetached,
    RequestFinished,
    RequestRouted,
    RequestStarted,
)
from turbospark.sinks.paths import UNMATCHED, default_templates
from turbospark.sinks.prometheus import EngineLoadCollector, PrometheusSink

KEY = "sk-metrics-test"
MODEL = "smollm2-135m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 5, "temperature": 0}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    r = httpx.get(url + "/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def exported(samples: Samples, name: str, **labels: str) -> float:
    """Like :func:`value`, but the sample must be there (a gauge that is
    never exported must not read as 0)."""
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not exported"
    return samples[key]


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture(scope="module")
def own(server):
    """A server of its own over the session's loaded model: no other test's
    generation can reach its sink."""
    obs = ListObserver()
    with Server(models=[server.registry.models()[0]], observer=obs) as srv:
        yield srv, obs


def generated_of(obs: ListObserver, rid: str) -> Generated:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        gens = [e for e in obs.of(int(rid)) if isinstance(e, Generated)]
        if gens:
            return gens[0]
        time.sleep(0.02)
    raise AssertionError(f"no generated event for request {rid}")


def test_counters_move_by_exactly_the_generated_tokens(own):
    srv, obs = own
    before = scrape(srv.url)

    plain = httpx.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=120)
    assert plain.status_code == 200
    with httpx.stream(
        "POST", srv.url + "/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 7}, timeout=120
    ) as streamed:
        assert streamed.status_code == 200
        body = "".join(streamed.iter_text())
    assert body.rstrip().endswith("data: [DONE]")
    legacy = httpx.post(
        srv.url + "/v1/completions", json={"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 4}, timeout=120
    )
    assert legacy.status_code == 200
    missing = httpx.get(srv.url + "/v1/no/such/route/42")
    assert missing.status_code == 404
    model_info = httpx.get(srv.url + "/v1/models/" + MODEL)
    assert model_info.status_code == 200

    rids = [plain.headers["x-request-id"], streamed.headers["x-request-id"], legacy.headers["x-request-id"]]
    gens = [generated_of(obs, rid) for rid in rids]
    after = scrape(srv.url)

    m = {"model": MODEL}
    assert delta(before, after, "turbospark_prompt_tokens_total", **m) == sum(g.prompt_tokens for g in gens)
    assert delta(before, after, "turbospark_generation_tokens_total", **m) == sum(g.new_tokens for g in gens)
    assert delta(before, after, "turbospark_prompt_tokens_cached_total", **m) == sum(
        g.reused_prefix_tokens for g in gens
    )
    assert gens[0].new_tokens == plain.json()["usage"]["completion_tokens"] == 5
    assert gens[1].new_tokens == 7 and gens[2].new_tokens == 4
    assert delta(before, after, "turbospark_spec_decode_num_draft_tokens_total", **m) == sum(
        g.drafted_tokens for g in gens
    )
    assert delta(before, after, "turbospark_spec_decode_num_accepted_tokens_total", **m) == sum(
        g.accepted_tokens for g in gens
    )
    assert delta(before, after, "turbospark_session_slot_evictions_total", **m) == sum(
        g.session_slot_evicted for g in gens
    )
    assert delta(before, after, "turbospark_request_success_total", model=MODEL, finished_reason="maxTokens") == 3

    # time to first token from arrival: one observation per generating
    # request, and never less than the engine's prefill
    assert delta(before, after, "turbospark_time_to_first_token_from_arrival_seconds_count", **m) == 3
    ttft_sum = delta(before, after, "turbospark_time_to_first_token_from_arrival_seconds_sum", **m)
    assert ttft_sum >= sum(g.prefill_seconds for g in gens)
    assert ttft_sum < 120  # sanity only
    assert delta(before, after, "turbospark_request_prefill_time_seconds_sum", **m) == pytest.approx(
        sum(g.prefill_seconds for g in gens)
    )
    assert delta(before, after, "turbospark_request_decode_time_seconds_sum", **m) == pytest.approx(
        sum(g.decode_seconds for g in gens)
    )
    assert delta(before, after, "turbospark_request_prefill_time_seconds_count", **m) == 3
    # e2e for the three generating requests; the engine's queue time for
    # every generation, streamed or not
    assert delta(before, after, "turbospark_e2e_request_latency_seconds_count", **m) == 3
    assert delta(before, after, "turbospark_request_queue_time_seconds_count", **m) == 3
    assert delta(before, after, "turbospark_request_queue_time_seconds_sum", **m) == pytest.approx(
        sum(g.queue_seconds for g in gens)
    )

    # requests by route TEMPLATE (no raw ids in labels), method and status
    assert (
        delta(before, after, "turbospark_requests_total", path="/v1/chat/completions", method="POST", status="200") == 2
    )
    assert delta(before, after, "turbospark_requests_total", path="/v1/completions", method="POST", status="200") == 1
    assert delta(before, after, "turbospark_requests_total", path=UNMATCHED, method="GET", status="404") == 1
    assert (
        delta(before, after, "turbospark_requests_total", path="/v1/models/{model_id:path}", method="GET", status="200")
        == 1
    )
    assert not any("42" in dict(labels).get("path", "") or MODEL in dict(labels).get("path", "") for _, labels in after)

    # state read at scrape time, and the models gauge from attach events
    assert exported(after, "turbospark_num_requests_running", **m) == 0
    assert exported(after, "turbospark_num_requests_waiting", **m) == 0
    assert exported(after, "turbospark_models_loaded") == 1


def test_metrics_need_the_key_unless_opened():
    with Server(models=[], api_keys=[KEY]) as srv:
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert scrape(srv.url, {"authorization": f"Bearer {KEY}"})
    with Server(models=[], api_keys=[KEY], metrics_auth=False) as srv:
        assert scrape(srv.url)
        assert httpx.get(srv.url + "/v1/models").status_code == 401  # only /metrics opens
        assert httpx.post(srv.url + "/metrics").status_code == 401


def test_auth_metrics_flag_unit():
    closed, opened = Auth(("k",)), Auth(("k",), metrics_open=True)
    assert not closed.check("GET", "/metrics", {}).allowed
    assert opened.check("GET", "/metrics", {}).allowed
    assert not opened.check("GET", "/v1/models", {}).allowed
    assert Auth().check("GET", "/metrics", {}).allowed  # no keys: nothing is closed


def test_the_composition_root_builds_the_sinks(tmp_path):
    """``serve`` and ``Server`` both assemble here: Prometheus and the live
    feed always, the event log when asked; a log that cannot be opened is an
    OSError naming it, with nothing left open."""
    args = parser().parse_args(["serve", "--metrics-auth", "off", "--event-log", str(tmp_path / "e.jsonl")])
    assert args.metrics_auth == "off" and args.otlp_endpoint is None
    built = assemble([], auth=Auth(), policy=BrowserPolicy(), event_log=args.event_log)
    try:
        assert isinstance(built.metrics, PrometheusSink)
        assert [type(s).__name__ for s in built.sinks] == ["JsonlSink"]
        assert [type(o).__name__ for o in built.observer.observers] == ["PrometheusSink", "JsonlSink", "LiveEvents"]
        assert built.app.state.turbospark.registry is built.registry
    finally:
        built.close()
    assert built.sinks == []
    with pytest.raises(OSError) as err:
        assemble([], auth=Auth(), policy=BrowserPolicy(), event_log=str(tmp_path / "missing" / "e.jsonl"))
    assert err.value.filename == str(tmp_path / "missing" / "e.jsonl")
    args = parser().parse_args(["serve"])
    _model_options(args)  # flags not given take the config file's value, else the default
    assert args.metrics_auth == "on"


# ------------------------------------------------------------------ unit
def gen(rid: int, model: str = "m", **kw) -> Generated:
    base = dict(
        id=rid,
        model=model,
        prompt_tokens=10,
        new_tokens=4,
        prefill_seconds=0.25,
        decode_seconds=0.5,
        stop_reason="endOfTurn",
        reused_prefix_tokens=3,
        session_slot_evicted=False,
    )
    base.update(kw)
    return Generated(**base)


def samples_of(sink: PrometheusSink) -> Samples:
    return parse(sink.exposition()[0].decode())


def test_sink_streamed_request_closes_at_request_finished():
    sink = PrometheusSink()
    sink.record(RequestStarted(id=1, at_ms=0, method="POST", path="/v1/chat/completions"))
    sink.record(RequestRouted(id=1, requested="x", served="m", stream=True))
    sink.record(gen(1, drafted_tokens=6, accepted_tokens=2, session_slot_evicted=True, queue_seconds=0.125))
    s = samples_of(sink)
    assert value(s, "turbospark_e2e_request_latency_seconds_count", model="m") == 0  # not over yet
    assert value(s, "turbospark_time_to_first_token_from_arrival_seconds_count", model="m") == 1
    sink.record(RequestFinished(id=1, status=200, duration_ms=1500))  # its last byte went out
    s = samples_of(sink)
    assert value(s, "turbospark_requests_total", path="/v1/chat/completions", method="POST", status="200") == 1
    assert value(s, "turbospark_e2e_request_latency_seconds_sum", model="m") == pytest.approx(1.5)
    assert value(s, "turbospark_request_queue_time_seconds_sum", model="m") == pytest.approx(0.125)
    assert value(s, "turbospark_spec_decode_num_draft_tokens_total", model="m") == 6
    assert value(s, "turbospark_spec_decode_num_accepted_tokens_total", model="m") == 2
    assert value(s, "turbospark_session_slot_evictions_total", model="m") == 1
    assert value(s, "turbospark_prompt_tokens_cached_total", model="m") == 3
    assert not sink._open  # nothing left behind


def test_sink_counts_failed_streams_and_disconnects_as_errors():
    sink = PrometheusSink()
    for rid, status, error in (
        (1, 200, "engine error: boom"),
        (2, 200, "client disconnected"),
        (3, 503, "the wait list is full"),
        (4, 200, None),
    ):
        sink.record(RequestStarted(id=rid, at_ms=0, method="POST", path="/v1/messages"))
        sink.record(RequestFinished(id=rid, status=status, duration_ms=5, error=error))
    s = samples_of(sink)
    for kind in ("stream", "disconnected", "status"):
        assert value(s, "turbospark_request_errors_total", path="/v1/messages", method="POST", kind=kind) == 1
    assert value(s, "turbospark_requests_total", path="/v1/messages", method="POST", status="200") == 3


def test_sink_queue_time_is_the_engines_and_ttft_counts_once():
    sink = PrometheusSink()
    sink.record(RequestStarted(id=7, at_ms=0, method="POST", path="/api/chat"))
    sink.record(RequestRouted(id=7, requested=None, served="m", stream=False))
    sink.record(gen(7, queue_seconds=0.5))
    sink.record(gen(7, queue_seconds=0.25))  # a re-ask is real work: tokens count twice, TTFT once
    sink.record(RequestFinished(id=7, status=200, duration_ms=2000))
    s = samples_of(sink)
    assert value(s, "turbospark_generation_tokens_total", model="m") == 8
    assert value(s, "turbospark_time_to_first_token_from_arrival_seconds_count", model="m") == 1
    assert value(s, "turbospark_request_queue_time_seconds_sum", model="m") == pytest.approx(0.75)
    assert value(s, "turbospark_e2e_request_latency_seconds_sum", model="m") == pytest.approx(2.0)


def test_sink_labels_stay_bounded_and_models_gauge_from_events():
    sink = PrometheusSink()
    for i, (method, path) in enumerate(
        [
            ("GET", "/v1/models/a"),
            ("GET", "/v1/models/b/c"),
            ("BREW", "/x/1"),
            ("DELETE", "/v1/admin/models/q"),
            ("GET", "/.env"),
        ]
    ):
        sink.record(RequestStarted(id=i, at_ms=0, method=method, path=path))
        sink.record(RequestFinished(id=i, status=200 if i < 2 else 404, duration_ms=1))
    sink.record(RequestFinished(id=99, status=500, duration_ms=1))  # never seen starting
    s = samples_of(sink)
    assert value(s, "turbospark_requests_total", path="/v1/models/{model_id:path}", method="GET", status="200") == 2
    assert value(s, "turbospark_requests_total", path=UNMATCHED, method="other", status="404") == 1
    assert (
        value(s, "turbospark_requests_total", path="/v1/admin/models/{model_id:path}", method="DELETE", status="404")
        == 1
    )
    assert value(s, "turbospark_requests_total", path=UNMATCHED, method="GET", status="404") == 1
    assert value(s, "turbospark_requests_total", path=UNMATCHED, method="other", status="500") == 1
    for ev in [
        ModelAttached(at_ms=0, model="a"),
        ModelAttached(at_ms=0, model="b"),
        ModelDetached(at_ms=0, model="a"),
        ModelDetached(at_ms=0, model="a"),
        ModelDetached(at_ms=0, model="never-loaded"),
    ]:
        sink.record(ev)
    assert value(samples_of(sink), "turbospark_models_loaded") == 1


def test_route_templates():
    t = default_templates()
    assert t.of("/v1/chat/completions") == "/v1/chat/completions"
    assert t.of("/v1/models/smollm2-135m") == "/v1/models/{model_id:path}"
    assert t.of("/metrics") == "/metrics"
    assert t.of("/nope/123") == UNMATCHED


def test_engine_load_collector_reads_state_and_survives_a_closing_model():
    class M:
        def __init__(self, mid, load):
            self.model_id, self._load = mid, load

        def load(self):
            return self._load()

    def closing():
        raise RuntimeError("closed")

    class Reg:
        def models(self):
            return [M("a", lambda: {"running": 2, "waiting": 3}), M("b", closing), object()]

    running, waiting = EngineLoadCollector(Reg()).collect()
    assert [(s.labels, s.value) for s in running.samples] == [({"model": "a"}, 2.0)]
    assert [(s.labels, s.value) for s in waiting.samples] == [({"model": "a"}, 3.0)]


def test_two_sinks_in_one_process_do_not_share_numbers():
    a, b = PrometheusSink(), PrometheusSink()
    a.record(gen(1))
    assert value(samples_of(a), "turbospark_generation_tokens_total", model="m") == 4
    assert value(samples_of(b), "turbospark_generation_tokens_total", model="m") == 0
    json.dumps(list(samples_of(a)))  # plain data
