"""Engine failures the real model cannot be made to produce, framed per
dialect (scripted model)."""

from __future__ import annotations

import json

import httpx

from turbospark import Server
from turbospark.engine.types import StopReason

from .fakes import Script, ScriptedModel


def test_openai_midstream_failure_is_one_error_frame_without_done(failing):
    srv, _, obs = failing
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    frames = [f for f in raw.split("\n\n") if f.strip()]
    assert frames[-1].startswith("event: error\ndata: ")
    err = json.loads(frames[-1].split("data: ", 1)[1])
    assert err["error"]["message"].startswith("engine error: scripted failure")
    assert err["error"]["type"] == "server_error"
    assert "[DONE]" not in raw
    texts = [json.loads(f[6:])["choices"][0]["delta"].get("content") for f in frames[:-1]]
    assert texts == [None, "one", " two"]  # the role chunk carries content null
    # a failed generation emits no `generated`
    assert not [e for e in obs.events if e.kind == "generated"]


def test_openai_non_stream_failure_is_500_in_shape(failing):
    srv, _, obs = failing
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=30,
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 500
    assert r.json()["error"]["message"].startswith("engine error")
    fin = [e for e in obs.events if e.kind == "requestFinished"][-1]
    assert fin.status == 500 and fin.error.startswith("engine error")
    assert not [e for e in obs.events if e.kind == "generated"]


def test_scripted_stop_reason_maps_to_finish_reason():
    model = ScriptedModel(scripts=[Script(["a", "b"], reason=StopReason.MAX_TOKENS)])
    with Server(models=[model]) as srv:
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            timeout=30,
            json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9},
        )
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["choices"][0]["message"]["content"] == "ab"
