"""llama-server's API, the rest of it (issue 46, items 1 to 5): each test
sends the request llama.cpp's own server tests send (tools/server/tests/unit)
and checks what they check, on the real bundled model, in one server of
this module (a small context, so prompts over it are cheap to send, and a
small prefill chunk, so a short prompt prefills in several batches)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from turbospark import Server
from turbospark.engine.model import ModelOptions
from turbospark.models.catalog import resolve_model

CTX = 1024
CHUNK = 32


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    path, _ = resolve_model("smollm2-135m")
    options = ModelOptions(path=path, id="smol", ctx=CTX, parallel=2, prefill_chunk=CHUNK, batch=CHUNK)
    with Server(models=[options]) as srv:
        yield srv.url


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def stream(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's ``data:`` payloads (``[DONE]`` left out)."""
    out = []
    with httpx.stream("POST", url + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


# ------------------------------------------------------ 1. streamed telemetry
def test_chat_timings_per_token_with_usage_ends_on_timings(url):
    """test_chat_completion_with_timings_per_token: the role chunk has no
    timings; the last chunk (no choices, the usage) carries them."""
    chunks = stream(
        url,
        "/chat/completions",
        {
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "test"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "timings_per_token": True,
        },
    )
    first, last = chunks[0], chunks[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None} and "timings" not in first
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] <= 10
    timings = last["timings"]
    assert {"prompt_per_second", "predicted_per_second", "predicted_n"} <= set(timings)
    assert 1 <= timings["predicted_n"] <= 10 and timings["predicted_n"] == last["usage"]["completion_tokens"]


def progress_of(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``prompt_progress`` reports, checked as llama-server's
    test_return_progress checks them: the first before any prefill work
    (processed == cache), the same total and cache throughout, more
    processed each time, the last all of it."""
    reports = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert reports and reports[0]["total"] > 0 and reports[0]["cache"] == reports[0]["processed"]
    for before, now in zip(reports, reports[1:], strict=False):
        assert (now["total"], now["cache"]) == (before["total"], before["cache"])
        assert now["processed"] > before["processed"]
    assert reports[-1]["processed"] == reports[-1]["total"]
    return reports


def test_return_progress_reports_before_prefill_then_each_batch(url):
    """test_return_progress: one report before any prefill (processed ==
    cache), then one per prefill batch; asked again, the cached prefix is
    the first report's cache."""
    body = {
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "This is a test" * 10}],
        "stream": True,
        "return_progress": True,
    }
    cold = progress_of(stream(url, "/chat/completions", body))
    total = cold[0]["total"]
    assert cold[0]["processed"] == cold[0]["cache"] == 0
    assert len(cold) == 1 + -(-total // CHUNK)  # the first, then one per batch
    warm = progress_of(stream(url, "/chat/completions", body))
    assert warm[0]["cache"] > 0 and len(warm) < len(cold)


def test_completion_progress_carries_timings(url):
    """test_metrics_timings_on_prompt_progress: with ``timings_per_token``
    the progress chunks carry timings, the first with nothing timed yet,
    none going backwards."""
    chunks = stream(
        url,
        "/completion",
        {
            "prompt": "the quick brown fox jumps over the lazy dog " * 8,
            "n_predict": 4,
            "stream": True,
            "timings_per_token": True,
            "return_progress": True,
        },
    )
    progress = [c for c in chunks if "prompt_progress" in c]
    assert len(progress) > 1
    first = progress[0]["timings"]
    assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"], first["predicted_ms"]) == (0, 0.0, 0, 0.0)
    prompt_ms = 0.0
    for chunk in progress:
        assert all(v is not None and v >= 0 for v in chunk["timings"].values())
        assert chunk["timings"]["prompt_ms"] >= prompt_ms
        prompt_ms = chunk["timings"]["prompt_ms"]
    assert prompt_ms > 0


@pytest.mark.parametrize("path", ["/v1/responses", "/responses"])
def test_responses_stream_with_llama_telemetry(url, path):
    """test_responses_stream_with_llama_telemetry: progress as
    ``response.in_progress`` events, timings on the text deltas and on
    the terminal event."""
    events = stream(
        url,
        path,
        {
            "input": "This is a test" * 10,
            "max_output_tokens": 8,
            "temperature": 0.8,
            "stream": True,
            "timings_per_token": True,
            "return_progress": True,
        },
    )
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert all(e["prompt_progress"]["processed"] >= e["prompt_progress"]["cache"] for e in progress)
    progress_of(progress)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all({"prompt_per_second", "predicted_per_second"} <= set(e["timings"]) for e in deltas)
    completed = events[-1]  # (response.incomplete here: capped by max_output_tokens, as OpenAI says it)
    assert completed["type"] in ("response.completed", "response.incomplete") and completed["response"]["usage"]
    timings = completed["timings"]
    assert all(v is not None and v >= 0 for v in timings.values())
    assert timings["prompt_ms"] > 0 and timings["prompt_per_token_ms"] > 0
    plain = stream(url, path, {"input": "Hi", "max_output_tokens": 3, "stream": True})
    assert not any("timings" in e or "prompt_progress" in e for e in plain)
