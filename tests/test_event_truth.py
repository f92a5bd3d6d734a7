"""Events that stay true under concurrency, streams and failures (CONTRACT
§2): every request is requestStarted → [requestRouted] → [generated…] →
requestFinished, streamed or not, cancelled or failed; the sinks end a
request there; the model the generation core sees is the real one."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from turbospark import ListObserver, Server
from turbospark.core.request import ChatRequest
from turbospark.models.prompt import render
from turbospark.sinks.prometheus import PrometheusSink
from turbospark.tools.prompting import inline_tools, template_knows_tools

from .fakes import Script, ScriptedModel
from .test_metrics import parse, value

STORY = "Write a long story about a lighthouse keeper."


def _bodies(n: int, long: set[int]) -> list[tuple[str, dict[str, Any]]]:
    """Streams in every dialect, of different lengths (``long``: 400 tokens)."""
    msg = [{"role": "user", "content": STORY}]
    shapes = [
        (
            "/v1/chat/completions",
            lambda k: {"model": "m", "messages": msg, "max_tokens": k, "stream": True, "ignore_eos": True},
        ),
        (
            "/v1/completions",
            lambda k: {"model": "m", "prompt": "Once upon a time", "max_tokens": k, "stream": True, "ignore_eos": True},
        ),
        ("/v1/responses", lambda k: {"model": "m", "input": STORY, "max_output_tokens": k, "stream": True}),
        ("/v1/messages", lambda k: {"model": "m", "messages": msg, "max_tokens": k, "stream": True}),
        ("/api/chat", lambda k: {"model": "m", "messages": msg, "options": {"num_predict": k}}),
        ("/api/generate", lambda k: {"model": "m", "prompt": STORY, "options": {"num_predict": k}}),
    ]
    return [
        (shapes[i % len(shapes)][0], shapes[i % len(shapes)][1](400 if i in long else 16 + 12 * i)) for i in range(n)
    ]


def test_eight_mixed_streams_two_cut_each_end_once_after_their_generated(server, hub):
    results: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()

    def run(i: int, path: str, body: dict[str, Any], cut: bool) -> None:
        with httpx.Client(timeout=180) as c, c.stream("POST", server.url + path, json=body) as r:
            rid = int(r.headers["x-request-id"])
            lines = r.iter_lines()
            got = 0
            for line in lines:
                if line.strip():
                    got += 1
                if cut and got >= 4:
                    break  # the client goes away mid-stream
            with lock:
                results[i] = {"rid": rid, "status": r.status_code, "cut": cut}

    cut = {2, 5}
    bodies = _bodies(8, cut)
    threads = [threading.Thread(target=run, args=(i, p, b, i in cut)) for i, (p, b) in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert len(results) == 8
    for i, res in results.items():
        evs = hub.wait_for(lambda es: any(e.kind == "requestFinished" for e in es), res["rid"], timeout=60)
        time.sleep(0.05)  # anything recorded late would show now
        evs = hub.of(res["rid"])
        kinds = [e.kind for e in evs]
        assert kinds[:2] == ["requestStarted", "requestRouted"], kinds
        assert kinds.count("requestFinished") == 1 and kinds[-1] == "requestFinished", (i, kinds)
        assert kinds.count("generated") == 1, (i, kinds)
        fin, gen = evs[-1], next(e for e in evs if e.kind == "generated")
        assert fin.status == 200
        if res["cut"]:
            assert gen.stop_reason == "cancelled" and fin.error == "client disconnected", (i, gen, fin)
        else:
            assert fin.error is None, (i, fin)
            # the request's own wall clock: all of the engine's time fits in it
            engine = gen.queue_seconds + gen.prefill_seconds + gen.decode_seconds
            assert fin.duration_ms >= 1000 * engine - 1, (i, fin.duration_ms, engine)


def test_a_failed_stream_carries_its_error_frames_message(failing):
    srv, _, obs = failing
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
        raw = r.read().decode()
        rid = int(r.headers["x-request-id"])
    frame = json.loads([f for f in raw.split("\n\n") if f.strip()][-1].split("data: ", 1)[1])
    evs = [e for e in obs.events if getattr(e, "id", None) == rid]
    assert [e.kind for e in evs] == ["requestStarted", "requestRouted", "requestFinished"]
    assert evs[-1].status == 200 and evs[-1].error == frame["error"]["message"]


@pytest.mark.parametrize(
    "path,body",
    [
        ("/api/chat", {"model": "x", "messages": [{"role": "user", "content": "hi"}]}),
        (
            "/v1/messages",
            {"model": "x", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/v1/responses", {"model": "x", "input": "hi", "stream": True}),
    ],
)
def test_a_failed_stream_is_an_error_in_every_dialect_and_sink(path, body):
    model = ScriptedModel(scripts=[Script(["one", " two", " three"], fail_after=2)])
    obs = ListObserver()
    with Server(models=[model], observer=obs) as srv:
        r = httpx.post(srv.url + path, json=body, timeout=30)
        rid = int(r.headers["x-request-id"])
        fin = next(e for e in obs.events if e.kind == "requestFinished" and e.id == rid)
        assert r.status_code == fin.status == 200 and fin.error and "scripted failure" in fin.error
        assert fin.error in r.text  # the message the client was sent, not a re-parse
        samples = parse(srv.metrics.exposition()[0].decode())
        assert value(samples, "turbospark_request_errors_total", path=path, method="POST", kind="stream") == 1
        stats = httpx.get(srv.url + "/v1/stats").json()
        assert stats["errors"] == 1
        rec = next(x for x in stats["records"] if x["id"] == rid)
        assert rec["error"] == fin.error and rec["state"] == "done"


def test_ttft_from_arrival_is_the_clients_first_token(server):
    """With wall-clock decode times, receipt of generated − decodeSeconds −
    arrival is the moment the first token was sampled."""
    sink: PrometheusSink = server.metrics
    name = "turbospark_time_to_first_token_from_arrival_seconds_sum"
    model = server.registry.models()[0].model_id
    before = value(parse(sink.exposition()[0].decode()), name, model=model)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": STORY}],
        "max_tokens": 40,
        "stream": True,
        "ignore_eos": True,
    }
    sent = time.perf_counter()
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        first = None
        for line in r.iter_lines():
            if first is None and line.startswith("data:") and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter()
    assert first is not None
    client_ttft = first - sent
    deadline = time.monotonic() + 10
    while (after := value(parse(sink.exposition()[0].decode()), name, model=model)) == before:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    ttft = after - before
    # the server's arrival is after the client sent, and its first token
    # reaches the client a little later: never later than the client saw it
    assert client_ttft - 0.25 <= ttft <= client_ttft + 0.02, (ttft, client_ttft)


def test_a_served_tools_request_is_rendered_by_the_templates_own_tool_section(qwen_server):
    """No proxy hides the template any more: Qwen's chat template renders
    the offered tools itself (its <tools> section), not the Hermes inline
    fallback used for templates that ignore tools."""
    srv, events = qwen_server
    model = srv.registry.models()[0].engine
    assert template_knows_tools(model.template.source)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=120,
        json={"model": "qwen", "messages": messages, "tools": tools, "max_tokens": 4},
    )
    assert r.status_code == 200
    gen = events.wait_kind(r.headers["x-request-id"], "generated")
    own = render(model, ChatRequest(messages=messages, tools=tools))
    inline = model.render_chat(inline_tools(messages, tools, "hermes"), tools=None)
    assert len(own) != len(inline)
    assert gen.prompt_tokens == len(own)  # the first attempt's (a re-ask would add a second)
    assert "<tools>" in model.detokenize(own)


def test_stats_show_each_requests_overhead(server):
    r = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=120,
        json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    rid = int(r.headers["x-request-id"])
    deadline = time.monotonic() + 10
    while True:
        stats = httpx.get(server.url + "/v1/stats", params={"requests": 1000}).json()
        rec = next((x for x in stats["records"] if x["id"] == rid), None)
        if rec is not None and rec["state"] == "done" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rec is not None and rec["state"] == "done"
    engine_ms = rec["queuedMs"] + rec["prefillMs"] + rec["decodeMs"]
    assert rec["overheadMs"] == pytest.approx(max(0.0, rec["durationMs"] - engine_ms))
    assert rec["durationMs"] >= engine_ms - 1  # the engine's time fits in the request's
    assert stats["overheadMs"]["n"] >= 1


def test_after_a_reask_the_answer_counts_and_times_the_answered_attempt_alone():
    """(issue 42, item 14) the rejected first attempt is in the events (its
    own ``generated``), not in the answer's counts: every rate is the
    answered attempt's tokens over its times."""
    from turbospark.core.request import Final
    from turbospark.dialects.ollama import stats
    from turbospark.dialects.openai_chat import timings
    from turbospark.engine.types import RawDecodeResult, StopReason

    first = RawDecodeResult(
        prompt_tokens=100,
        new_tokens=10,
        prefill_seconds=1.0,
        decode_seconds=1.0,
        reason=StopReason.END_OF_TURN,
        queue_seconds=0.5,
    )
    second = RawDecodeResult(
        prompt_tokens=150,
        new_tokens=30,
        prefill_seconds=0.5,
        decode_seconds=1.0,
        reason=StopReason.END_OF_TURN,
        reused_prefix_tokens=100,
        queue_seconds=0.25,
    )
    final = Final(result=second, text="", attempts=[first, second])
    t = timings(final)
    assert t["predicted_n"] == 30 and t["predicted_per_second"] == pytest.approx(29 / 1.0)  # (decode steps)
    assert t["prompt_n"] == 50 and t["cache_n"] == 100 and t["prompt_per_second"] == pytest.approx(50 / 0.5)
    o = stats(final, wall_ns=0)
    assert o["eval_count"] == 30 and o["eval_duration"] == 1_000_000_000
    assert o["prompt_eval_count"] == 150 and o["prompt_eval_duration"] == 500_000_000
    assert o["total_duration"] == 1_750_000_000
    assert stats(final, wall_ns=5_000_000_000)["total_duration"] == 5_000_000_000  # the wall: both attempts
