"""Engine failure is contained and healed; a stuck engine is noticed
(issue 16 point 2). Faults are injected into the real model's own scheduler
thread (``Scheduler.inject``): an exception escaping its loop, or a step that
does not return."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from turbospark import ListObserver, Server
from turbospark.models.registry import MAX_FAILURES

from .support import wait_until

ASK = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]


def kinds(obs: ListObserver, kind: str) -> list[dict[str, Any]]:
    return [e.to_dict() for e in obs.events if e.kind == kind]


@pytest.fixture()
def healthy():
    obs = ListObserver()
    srv = Server(observer=obs, model_defaults={"ctx": 2048, "parallel": 2}, stall_timeout=1.0).start()
    try:
        yield srv, obs
    finally:
        srv.stop()


def scheduler_of(srv: Server):
    (model,) = srv.registry.models()
    return model.engine.scheduler


def test_an_engine_failure_fails_in_flight_streams_degrades_health_and_the_next_request_reloads(healthy):
    srv, obs = healthy
    url = srv.url
    first_model = srv.registry.models()[0]
    out: dict[str, Any] = {}
    started = threading.Event()

    def streamer() -> None:
        body = {"model": "m", "messages": ASK, "max_tokens": 400, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            out["status"] = r.status_code
            text = ""
            for chunk in r.iter_text():
                text += chunk
                started.set()
            out["text"] = text

    t = threading.Thread(target=streamer, daemon=True)
    t.start()
    assert started.wait(60)
    scheduler_of(srv).inject(RuntimeError("injected engine fault"))
    t.join(60)
    # the stream in flight got an error frame, not a cut connection
    errors = [
        json.loads(frame.split("\ndata: ", 1)[1])
        for frame in out["text"].split("\n\n")
        if frame.startswith("event: error\n")
    ]
    assert out["status"] == 200 and errors, out["text"][-400:]
    assert "injected engine fault" in errors[0]["error"]["message"]
    assert "[DONE]" not in out["text"]
    # health says which model failed and why; the model lists show it
    health = wait_until(
        lambda: (r := httpx.get(url + "/health")).status_code == 503 and r, what="health degraded"
    ).json()
    assert health["status"] == "degraded"
    assert health["models"][0]["state"] == "failed" and "injected engine fault" in health["models"][0]["error"]
    card = httpx.get(url + "/v1/models").json()["data"][0]
    assert card["state"] == "failed" and "injected engine fault" in card["error"]
    ps = httpx.get(url + "/api/ps").json()["models"]
    assert ps and ps[0]["state"] == "failed"
    detached = kinds(obs, "modelDetached")
    assert detached and "injected engine fault" in detached[-1]["reason"]
    # the next request (after the first backoff, 1 s) reloads it and succeeds;
    # Ollama's load_duration is that reload
    time.sleep(1.1)
    r = httpx.post(
        url + "/api/chat",
        json={"model": "m", "messages": ASK, "stream": False, "options": {"num_predict": 8}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["done"] and r.json()["load_duration"] > 0
    assert srv.registry.models()[0] is not first_model
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert kinds(obs, "modelAttached")  # the reload announced itself
    assert httpx.get(url + "/v1/models").json()["data"][0]["state"] == "loaded"


def test_a_failed_model_backs_off_then_gives_up_after_repeated_failures(healthy):
    srv, _ = healthy
    url = srv.url
    entry = srv.registry.entries()[0]
    scheduler_of(srv).inject(RuntimeError("boom"))
    r = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": ASK, "max_tokens": 4}, timeout=60)
    assert r.status_code == 500 and "boom" in r.json()["error"]["message"]
    # after a failure it backs off (1 s after the first, doubling): meanwhile
    # requests get 503 with Retry-After, not a reload
    wait_until(lambda: entry.state == "failed", what="failed state")
    assert entry.failures == 1
    entry.retry_at = time.monotonic() + 30  # hold the backoff open, however slow this machine is
    r = httpx.post(url + "/v1/messages", json={"model": "m", "max_tokens": 4, "messages": ASK}, timeout=60)
    assert r.status_code == 503 and r.headers["retry-after"].isdigit()
    assert r.json()["type"] == "error" and "boom" in r.json()["error"]["message"]
    # after MAX_FAILURES in a row it is no longer reloaded
    entry.failures = MAX_FAILURES
    entry.retry_at = 0.0
    r = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": ASK, "max_tokens": 4}, timeout=60)
    assert r.status_code == 503 and "attached anew" in r.json()["error"]["message"]


def test_a_stalled_engine_trips_the_watchdog_and_clears_when_it_steps_again(healthy):
    srv, obs = healthy
    url = srv.url
    scheduler_of(srv).inject(pause=4.0)  # the next step hangs for 4 s (stall timeout: 1 s)
    out: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: out.update(
            r=httpx.post(
                url + "/v1/chat/completions", json={"model": "m", "messages": ASK, "max_tokens": 4}, timeout=120
            )
        ),
        daemon=True,
    )
    t.start()
    health = wait_until(
        lambda: (r := httpx.get(url + "/health")).status_code == 503 and r, timeout=30, what="stall noticed"
    ).json()
    assert health["status"] == "degraded" and health["models"][0]["state"] == "stalled"
    assert "no engine step" in health["models"][0]["error"]
    stalled = wait_until(lambda: [e for e in kinds(obs, "modelHealth") if e["state"] == "stalled"])
    assert stalled[0]["model"] == "smollm2-135m"
    t.join(120)
    assert out["r"].status_code == 200  # the request itself completes once the engine steps again
    wait_until(lambda: httpx.get(url + "/health").status_code == 200, what="health back to ok")
    assert any(e["state"] == "ok" for e in kinds(obs, "modelHealth"))
