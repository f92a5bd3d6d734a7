"""A client that leaves stops its generation and frees the engine."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from turbospark import ListObserver, Server
from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.models.catalog import resolve_model

from .support import wait_event

LONG = [{"role": "user", "content": "Write a very long and detailed story about a dragon who learns to cook."}]


def start_stream(base_url: str, max_tokens: int = 3000):
    client = httpx.Client(timeout=60)
    cm = client.stream(
        "POST",
        base_url + "/v1/chat/completions",
        json={
            "model": "m",
            "messages": LONG,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        },
    )
    r = cm.__enter__()
    lines = r.iter_lines()
    first = next(lines)
    assert first.startswith("data: ")
    r.lines = lines  # keep the iterator alive: collecting it closes the stream
    return client, cm, r


def test_cut_stream_frees_engine(base_url, hub, oai):
    client, cm, r = start_stream(base_url)
    rid = r.headers["x-request-id"]
    cm.__exit__(None, None, None)  # the client goes away after the first chunk
    client.close()
    cut_at = time.monotonic()
    gen = hub.wait_kind(rid, "generated", timeout=10)
    assert gen.stop_reason == "cancelled"
    assert gen.new_tokens < 3000
    assert time.monotonic() - cut_at < 10  # generous (noisy 2-core CI): the contract is about one second

    raw = oai.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    nid = raw.headers["x-request-id"]
    assert raw.parse().choices[0].message.content is not None
    g2 = hub.wait_kind(nid, "generated")
    queued_ms = g2.queue_seconds * 1000  # the engine's own submitted → admitted
    assert queued_ms < 2000, f"the next request waited {queued_ms:.0f} ms for the engine"


@pytest.fixture(scope="module")
def single():
    """A server whose model runs one sequence at a time, so requests queue."""
    path, _ = resolve_model("smollm2-135m")
    model = LlamaChatModel(ModelOptions(path=path, id="single", parallel=1))
    obs = ListObserver()
    srv = Server(models=[model], observer=obs).start()
    yield srv, obs
    srv.stop()
    model.close()


def test_queued_request_whose_client_left_never_runs(single):
    """B waits behind A, and its client leaves while the engine is inside a
    long step (a stuck one here: a big prefill would do the same): B gives
    its place in the wait list back at once, not at the engine's next step,
    and is recorded as a 499 the client left, not as an answer."""
    srv, hub = single
    base_url = srv.url
    client, cm, r = start_stream(base_url, max_tokens=400)
    a_id = int(r.headers["x-request-id"])
    srv.registry.lookup("single").model.engine.scheduler.inject(pause=8.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            base_url + "/v1/chat/completions",
            timeout=0.5,
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "queued"}],
                "max_tokens": 50,
            },
        )
    b_id = min(e.id for e in list(hub.events) if e.kind == "requestStarted" and e.id > a_id)
    gen_b = wait_event(hub, b_id, "generated", timeout=5)  # (the engine is stuck for 8 s)
    assert gen_b.stop_reason == "cancelled" and gen_b.new_tokens == 0
    assert gen_b.prefill_seconds == 0 and gen_b.decode_seconds == 0
    # recorded as the client's leaving, not as an answer it got
    done = wait_event(hub, b_id, "requestFinished", timeout=5)
    assert (done.status, done.error) == (499, "client disconnected")
    # counted as a client that left, whatever its status
    errors = [
        (s.labels["kind"], s.value)
        for f in text_string_to_metric_families(httpx.get(base_url + "/metrics", timeout=30).text)
        if f.name == "turbospark_request_errors"
        for s in f.samples
        if s.labels.get("path") == "/v1/chat/completions" and s.name.endswith("_total")
    ]
    assert errors == [("disconnected", 1.0)], errors
    # A was never disturbed by B leaving
    assert not any(e.kind == "generated" for e in hub.of(a_id))
    cm.__exit__(None, None, None)
    client.close()
    assert wait_event(hub, a_id, "generated").stop_reason == "cancelled"


def test_non_stream_client_timeout_cancels(base_url, hub):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            base_url + "/v1/chat/completions",
            timeout=0.7,
            json={
                "model": "m",
                "messages": LONG,
                "max_tokens": 3000,
                "temperature": 0,
            },
        )
    rid = max(e.id for e in list(hub.events) if e.kind == "requestStarted")
    gen = hub.wait_kind(rid, "generated", timeout=10)
    assert gen.stop_reason == "cancelled"
    assert 0 < gen.new_tokens < 3000
    # the answer rendered after it left went nowhere: not recorded as a clean 200
    assert hub.wait_kind(rid, "requestFinished").error == "client disconnected"
    metrics = httpx.get(base_url + "/metrics", timeout=30).text
    assert 'turbospark_request_errors_total{kind="disconnected"' in metrics
