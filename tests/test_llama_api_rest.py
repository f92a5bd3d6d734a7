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


# --------------------------------------------------------------- 3. prompts
@pytest.mark.parametrize("path", ["/completion", "/completions"])
def test_completion_with_tokens_input(url, path):
    """test_completion_with_tokens_input: token ids, a list of prompts
    ([ids, ids], [ids, text], [ids, object]) answered as a list of results
    that agree (greedy), and one sequence mixing ids and text."""
    text = "I believe the meaning of life is"
    tokens = post(url, "/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    single = post(url, path, {"prompt": tokens, "n_predict": 6, "temperature": 0.0})
    assert single.status_code == 200 and isinstance(single.json()["content"], str)
    for prompts in ([tokens, tokens], [tokens, text], [tokens, {"prompt_string": text}]):
        res = post(url, path, {"prompt": prompts, "n_predict": 6, "temperature": 0.0})
        assert res.status_code == 200, res.text
        body = res.json()
        assert isinstance(body, list) and len(body) == 2 and [r["index"] for r in body] == [0, 1]
        assert body[0]["content"] == body[1]["content"] == single.json()["content"]
        assert body[0]["tokens_evaluated"] == body[1]["tokens_evaluated"] == len(tokens)
    assert [r["prompt"] for r in res.json()] == ["", text]
    mixed = post(url, path, {"prompt": [1, 2, 3, 4, 5, 6, text, 7, 8, 9, 10, text], "n_predict": 2})
    assert mixed.status_code == 200 and isinstance(mixed.json()["content"], str)
    assert mixed.json()["tokens_evaluated"] == 10 + 2 * len(post(url, "/tokenize", {"content": text}).json()["tokens"])
    assert post(url, path, {"prompt": {"prompt_string": text}, "n_predict": 1}).status_code == 200


def test_several_prompts_stream_by_index(url):
    """A streamed list of prompts: each chunk names its prompt's index, and
    each prompt ends with a chunk of its own saying ``stop``."""
    chunks = stream(url, "/completion", {"prompt": ["Hello", "One, two,"], "n_predict": 4, "stream": True})
    ends = sorted(c["index"] for c in chunks if c["stop"])
    assert ends == [0, 1]
    for index in (0, 1):
        assert any(c["tokens"] for c in chunks if c["index"] == index and not c["stop"])


def test_openai_batch_prompt_is_choices_by_index(url):
    """OpenAI's batch ``prompt`` (strings or token lists) on
    /v1/completions: one choice per prompt, by its index, usage counting
    every prompt; streamed, each choice finishes."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    text = "I believe the meaning of life is"
    one = client.completions.create(model="smol", prompt=text, max_tokens=4, temperature=0)
    res = client.completions.create(model="smol", prompt=[text, "1, 2, 3,"], max_tokens=4, temperature=0)
    assert [c.index for c in res.choices] == [0, 1] and res.choices[0].text == one.choices[0].text
    assert res.usage.prompt_tokens == one.usage.prompt_tokens + len(
        post(url, "/tokenize", {"content": "1, 2, 3,"}).json()["tokens"]
    )
    ids = post(url, "/tokenize", {"content": text}).json()["tokens"]
    by_ids = client.completions.create(model="smol", prompt=[ids, ids], max_tokens=4, temperature=0)
    assert [c.text for c in by_ids.choices] == [one.choices[0].text] * 2
    streamed = client.completions.create(model="smol", prompt=[text, text], max_tokens=4, stream=True)
    assert sorted(c.choices[0].index for c in streamed if c.choices and c.choices[0].finish_reason) == [0, 1]
    bad = post(url, "/v1/completions", {"model": "smol", "prompt": ["a", "b"], "n": 2})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"


@pytest.mark.parametrize("tokenize,openai_style", [(False, False), (False, True), (True, False), (True, True)])
def test_logit_bias(url, tokenize, openai_style):
    """test_logit_bias: biases by token id or by text (each of its tokens),
    as pairs or as an object, keep those words out of a greedy answer."""
    exclude = ["i", "I", "the", "The", "to", "a", "an", "be", "is", "was", "but", "But", "and", "And", "so",
               "So", "you", "You", "he", "He", "she", "She", "we", "We", "they", "They", "it", "It", "his",
               "His", "her", "Her", "book", "Book"]  # fmt: skip
    if tokenize:
        tokens = post(url, "/tokenize", {"content": " " + " ".join(exclude) + " "}).json()["tokens"]
        bias: Any = [[tok, -100] for tok in tokens]
    else:
        bias = [[" " + tok + " ", -100] for tok in exclude]
    if openai_style:
        bias = {str(k): v for k, v in bias}
    body = {"n_predict": 64, "prompt": "What is the best book", "logit_bias": bias, "temperature": 0.0}
    res = post(url, "/completion", body)
    assert res.status_code == 200, res.text
    assert all(res.json()["content"].find(" " + tok + " ") == -1 for tok in exclude)
    banned = {b["token"] for b in res.json()["generation_settings"]["logit_bias"]}
    the = post(url, "/tokenize", {"content": " the "}).json()["tokens"]
    assert set(the) <= banned


# ------------------------------------------------------------ 4. chat rules
BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def chat(url: str, body: dict[str, Any], path: str = "/chat/completions") -> httpx.Response:
    return post(url, path, {"max_tokens": 8, **body})


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "test"}, *[{"role": "assistant", "content": "test"}] * 2],
        [{"role": "system", "content": 123}],
        [{"role": "system", "content": "test"}, {}],
    ],
)  # fmt: skip
def test_invalid_chat_completion_req(url, messages):
    """test_invalid_chat_completion_req: two assistant messages at the end
    (and malformed ones) are a 400."""
    res = chat(url, {"messages": messages})
    assert res.status_code == 400 and "error" in res.json()


def test_chat_template_assistant_prefill_and_continue_final_message(url):
    """test_chat_template_assistant_prefill, _continue_final_message_vllm_compat
    and _mutual_exclusion: a last assistant message is continued (the
    prompt ends with its text), as with ``continue_final_message`` and
    ``add_generation_prompt`` false; both switches true is a 400."""
    prefill = [*BOOK, {"role": "assistant", "content": "Whill"}]
    opened = "<|im_start|>user\nWhat is the best book<|im_end|>\n<|im_start|>assistant\n"
    auto = chat(url, {"messages": prefill, "verbose": True})
    assert auto.status_code == 200 and auto.json()["__verbose"]["prompt"].endswith(opened + "Whill")
    explicit = chat(
        url, {"messages": prefill, "add_generation_prompt": False, "continue_final_message": True, "verbose": True}
    )
    assert explicit.status_code == 200 and explicit.json()["__verbose"]["prompt"] == auto.json()["__verbose"]["prompt"]
    both = chat(
        url,
        {
            "add_generation_prompt": True,
            "continue_final_message": True,
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        },
    )
    assert both.status_code == 400 and "error" in both.json()
    plain = chat(url, {"messages": BOOK, "verbose": True})
    assert plain.json()["__verbose"]["prompt"].endswith(opened)
    counted = post(url, "/chat/completions/input_tokens", {"messages": prefill}).json()["input_tokens"]
    assert counted == auto.json()["usage"]["prompt_tokens"]


def test_verbose_debug(url):
    """test_verbose_debug: ``verbose`` adds llama-server's native result
    (``__verbose``, with the prompt); without it, nothing."""
    for verbose in (True, False):
        res = chat(url, {"max_tokens": 2, "messages": BOOK, "verbose": verbose})
        assert res.status_code == 200
        if verbose:
            native = res.json()["__verbose"]
            assert "Book" in native["prompt"] and native["tokens_predicted"] == res.json()["usage"]["completion_tokens"]
            assert native["content"] == res.json()["choices"][0]["message"]["content"] and native["stop"] is True
        else:
            assert "__verbose" not in res.json()
    streamed = stream(url, "/chat/completions", {"max_tokens": 2, "messages": BOOK, "verbose": True, "stream": True})
    assert [c for c in streamed if "__verbose" in c][0]["choices"][0]["finish_reason"] is not None


@pytest.mark.parametrize("path", ["/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"])
def test_chat_completions_token_count(url, path):
    """test_chat_completions_token_count: the prompt's tokens, as the
    request itself counts them, twice alike."""
    counts = [post(url, path, {"messages": BOOK}).json()["input_tokens"] for _ in range(2)]
    assert counts[0] == counts[1] > 5
    assert counts[0] == chat(url, {"messages": BOOK, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    bad = post(url, path, {"messages": []})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


# ------------------------------------------------------------------ 5. errors
@pytest.mark.parametrize("streamed", [False, True])
def test_context_size_exceeded(url, streamed):
    """test_context_size_exceeded(_stream): a prompt over the context is a
    400 before any stream, llama-server's ``exceed_context_size_error`` with
    its numbers, and (the OpenAI SDKs read it there) OpenAI's code."""
    import openai

    res = chat(url, {"messages": BOOK * 100, "stream": streamed})
    assert res.status_code == 400
    err = res.json()["error"]
    assert err["type"] == "exceed_context_size_error" and err["code"] == "context_length_exceeded"
    assert err["n_prompt_tokens"] > CTX and err["n_ctx"] == CTX
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="smol", messages=BOOK * 100, stream=streamed)
    assert exc.value.code == "context_length_exceeded" and exc.value.type == "exceed_context_size_error"


@pytest.mark.parametrize(
    "path,body",
    [
        ("/completion", {"prompt": "word " * 1500, "n_predict": 4}),
        ("/completions", {"prompt": "word " * 1500, "n_predict": 4}),
        ("/v1/completions", {"prompt": "word " * 1500, "max_tokens": 4}),
        ("/v1/responses", {"input": "word " * 1500, "max_output_tokens": 4}),
    ],
)
def test_context_size_exceeded_on_every_route(url, path, body):
    """llama-server's error and numbers on its routes and the OpenAI ones
    (those with OpenAI's code beside them)."""
    res = post(url, path, {"model": "smol", **body})
    err = res.json()["error"]
    assert res.status_code == 400 and err["type"] == "exceed_context_size_error", err
    assert err["n_prompt_tokens"] > CTX and err["n_ctx"] == CTX
    assert err["code"] == (400 if path in ("/completion", "/completions") else "context_length_exceeded")


def test_anthropic_empty_messages(url):
    """test_anthropic_empty_messages: ``messages: []`` is answered (from
    the template's generation prompt), as llama-server answers it."""
    res = post(url, "/v1/messages", {"model": "test", "max_tokens": 50, "messages": []})
    assert res.status_code == 200, res.text
    assert res.json()["type"] == "message" and res.json()["usage"]["input_tokens"] > 0
    counted = post(url, "/v1/messages/count_tokens", {"model": "test", "messages": []})
    assert counted.status_code == 400 and counted.json()["type"] == "error"


def test_openai_completions_stream_telemetry(url):
    """/v1/completions takes llama-server's ``return_progress`` and
    ``timings_per_token`` too (they were ignored)."""
    body = {"model": "smol", "prompt": "This is a test" * 10, "max_tokens": 4, "stream": True}
    chunks = stream(url, "/v1/completions", {**body, "return_progress": True, "timings_per_token": True})
    assert all(c["choices"] == [] for c in chunks if "prompt_progress" in c)
    progress_of(chunks)
    texts = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert texts and all(c["timings"]["predicted_n"] >= 1 for c in texts)
    assert not any("prompt_progress" in c or "timings" in c for c in stream(url, "/v1/completions", body))
