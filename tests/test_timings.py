"""Per-response timings: llama.cpp's opt-in ``timings`` object on Chat
Completions and Completions, and Ollama's always-present nanosecond fields,
all equal to the request's ``generated`` event."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

MODEL = "smollm2-135m"
TIMING_KEYS = {
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
    "cache_n",
}


def check_timings(t: dict, gen) -> None:
    assert set(t) == TIMING_KEYS
    assert t["predicted_n"] == gen.new_tokens
    assert t["cache_n"] == gen.reused_prefix_tokens
    assert t["prompt_n"] == gen.prompt_tokens - gen.reused_prefix_tokens
    assert t["prompt_ms"] == gen.prefill_seconds * 1000
    assert t["predicted_ms"] == gen.decode_seconds * 1000
    # over decode steps, as llama-server counts: the first token comes from the prompt's last batch
    steps = t["predicted_n"] - 1
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / steps if steps else 0.0)
    assert t["predicted_per_second"] == pytest.approx(steps / gen.decode_seconds if steps else 0.0)
    if t["prompt_n"]:
        assert t["prompt_per_token_ms"] == pytest.approx(t["prompt_ms"] / t["prompt_n"])
        assert t["prompt_per_second"] == pytest.approx(t["prompt_n"] / gen.prefill_seconds)


def sse_payloads(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name three colours."}]}),
        ("/v1/completions", {"prompt": "Three colours are red,"}),
    ],
)
def test_timings_non_stream_equal_generated_and_count_the_cache(base_url, hub, path, body):
    key = uuid.uuid4().hex  # one session slot: the second turn reuses the first's prefix
    cached = []
    for _ in range(2):
        r = httpx.post(
            base_url + path,
            timeout=120,
            json={"model": MODEL, **body, "max_tokens": 6, "temperature": 0, "timings": True, "prompt_cache_key": key},
        )
        assert r.status_code == 200, r.text
        gen = hub.wait_kind(r.headers["x-request-id"], "generated")
        t = r.json()["timings"]
        check_timings(t, gen)
        assert t["predicted_n"] == r.json()["usage"]["completion_tokens"] == 6
        cached.append(t["cache_n"])
    assert cached[1] > 0  # the repeated prompt came from the slot's KV


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}),
        ("/v1/completions", {"prompt": "Hello, my name is"}),
    ],
)
def test_timings_on_the_final_stream_chunk(base_url, hub, path, body):
    with httpx.stream(
        "POST",
        base_url + path,
        timeout=120,
        json={
            "model": MODEL,
            **body,
            "max_tokens": 5,
            "stream": True,
            "timings": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        payloads = sse_payloads("".join(r.iter_text()))
    gen = hub.wait_kind(rid, "generated")
    with_timings = [p for p in payloads if "timings" in p]
    assert len(with_timings) == 1
    last = with_timings[0]
    # the finish chunk (sampled, the answer may end before its 5 tokens)
    assert last["choices"][0]["finish_reason"] in ("length", "stop")
    check_timings(last["timings"], gen)
    assert payloads[-1]["usage"]["completion_tokens"] == gen.new_tokens


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_timings_are_opt_in(base_url, path):
    body = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    r = httpx.post(base_url + path, timeout=120, json={"model": MODEL, **body, "max_tokens": 2})
    assert r.status_code == 200 and "timings" not in r.json()
    with httpx.stream(
        "POST", base_url + path, timeout=120, json={"model": MODEL, **body, "max_tokens": 2, "stream": True}
    ) as s:
        assert not any("timings" in p for p in sse_payloads("".join(s.iter_text())))


def check_ollama(done: dict, gen) -> None:
    assert done["prompt_eval_count"] == gen.prompt_tokens
    assert done["eval_count"] == gen.new_tokens
    assert done["prompt_eval_duration"] == round(gen.prefill_seconds * 1e9)
    assert done["eval_duration"] == round(gen.decode_seconds * 1e9)
    assert done["total_duration"] >= done["prompt_eval_duration"] + done["eval_duration"]
    assert done["load_duration"] == 0


@pytest.mark.parametrize(
    "path,body",
    [
        ("/api/chat", {"messages": [{"role": "user", "content": "Hi there"}]}),
        ("/api/generate", {"prompt": "Why is the sky blue?"}),
    ],
)
def test_ollama_nanosecond_fields_equal_generated(base_url, hub, path, body):
    r = httpx.post(
        base_url + path, timeout=120, json={"model": MODEL, **body, "stream": False, "options": {"num_predict": 4}}
    )
    assert r.status_code == 200, r.text
    check_ollama(r.json(), hub.wait_kind(r.headers["x-request-id"], "generated"))
    with httpx.stream(
        "POST", base_url + path, timeout=120, json={"model": MODEL, **body, "options": {"num_predict": 4}}
    ) as s:  # streams by default
        rid = s.headers["x-request-id"]
        lines = [json.loads(line) for line in s.iter_lines() if line.strip()]
    assert lines[-1]["done"] is True
    check_ollama(lines[-1], hub.wait_kind(rid, "generated"))
