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


# ------------------------------------------- 2. tokens and generation_settings
#: every key of llama-server's ``generation_settings`` (its task_params::to_json)
LLAMA_SETTINGS = {
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "top_n_sigma",
    "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay",
    "stop", "max_tokens", "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "logit_bias", "n_probs",
    "min_keep", "grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens", "chat_format",
    "reasoning_format", "reasoning_in_content", "generation_prompt", "samplers", "speculative.types",
    "timings_per_token", "post_sampling_probs", "backend_sampling", "lora",
}  # fmt: skip


def test_completion_stream_chunks_carry_their_tokens(url):
    """test_completion_stream: every text chunk's ``tokens`` are the ids
    of its text; the last chunk has every count and llama-server's
    settings (``adaptive_target``, ``adaptive_decay`` …)."""
    prompt = "I believe the meaning of life is"
    chunks = stream(url, "/completion", {"n_predict": 8, "prompt": prompt, "stream": True, "seed": 42})
    content, ids = "", []
    for data in chunks:
        assert isinstance(data["stop"], bool)
        if data["stop"]:
            assert data["timings"]["predicted_n"] == 8 and data["stop_type"] == "limit"
            assert data["truncated"] is False and isinstance(data["has_new_line"], bool)
            settings = data["generation_settings"]
            assert LLAMA_SETTINGS <= set(settings), LLAMA_SETTINGS - set(settings)
            assert settings["n_predict"] == settings["max_tokens"] == 8 and settings["seed"] == 42
        else:
            assert data["tokens"] and all(type(t) is int for t in data["tokens"])
            content += data["content"]
            ids += data["tokens"]
    assert len(ids) == 8
    assert post(url, "/detokenize", {"tokens": ids}).json()["content"] == content
    whole = post(url, "/completion", {"n_predict": 8, "prompt": prompt, "seed": 42, "return_tokens": True}).json()
    assert whole["content"] == content and whole["tokens"] == ids
    assert post(url, "/completion", {"n_predict": 2, "prompt": prompt}).json()["tokens"] == []


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_ignore_eos_shows_its_logit_bias(url, ignore_eos):
    """test_ignore_eos: with ``ignore_eos`` the end-of-generation tokens
    are in ``generation_settings.logit_bias`` with bias null (minus
    infinity); without it the list is empty."""
    body = {"n_predict": 8, "prompt": "Once upon a time", "ignore_eos": ignore_eos, "temperature": 0.0}
    bias = post(url, "/completion", body).json()["generation_settings"]["logit_bias"]
    if ignore_eos:
        assert bias and all(entry["bias"] is None for entry in bias)
        eos = post(url, "/tokenize", {"content": "<|im_end|>", "parse_special": True}).json()["tokens"]
        assert set(eos) <= {entry["token"] for entry in bias}
    else:
        assert bias == []
