"""OpenAI legacy Completions on the real bundled model through the official
SDK, raw SSE framing, refusals, and a scripted mid-stream failure."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

COUNTING = "Here is a list of numbers: 1, 2, 3,"


def kinds(events):
    return [e.kind for e in events]


def served_model(server):
    return server.registry.lookup("smollm2-135m").model.engine


def test_sdk_non_stream_raw_prompt_usage_and_events(server, oai, hub):
    raw = oai.completions.with_raw_response.create(
        model="gpt-3.5-turbo-instruct", prompt=COUNTING, max_tokens=8, temperature=0
    )
    rid = raw.headers["x-request-id"]
    r = raw.parse()
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.model == "gpt-3.5-turbo-instruct"
    choice = r.choices[0]
    assert choice.index == 0 and choice.logprobs is None and choice.text.strip()
    assert choice.finish_reason == "length" and r.usage.completion_tokens == 8
    # no chat template: the prompt is exactly the raw text's tokens
    assert r.usage.prompt_tokens == len(served_model(server).prompt_ids(COUNTING))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    events = hub.wait_for(lambda es: "generated" in kinds(es) and "requestFinished" in kinds(es), rid)
    assert kinds(events) == ["requestStarted", "requestRouted", "generated", "requestFinished"]
    started, routed, gen, finished = events
    assert started.path == "/v1/completions" and started.method == "POST"
    assert routed.requested == "gpt-3.5-turbo-instruct" and routed.served == "smollm2-135m"
    assert routed.stream is False
    assert gen.new_tokens == r.usage.completion_tokens
    assert gen.prompt_tokens == r.usage.prompt_tokens
    assert gen.reused_prefix_tokens == r.usage.prompt_tokens_details.cached_tokens
    assert gen.stop_reason == "maxTokens"
    assert finished.status == 200


def test_default_max_tokens_is_16(oai):
    r = oai.completions.create(model="m", prompt=COUNTING, temperature=0)
    assert r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_repeated_prompt_reports_cached_tokens(oai, hub):
    kw = dict(model="m", prompt="The history of the Roman empire, in brief:", max_tokens=3, temperature=0)
    oai.completions.create(**kw)
    raw = oai.completions.with_raw_response.create(**kw)
    r = raw.parse()
    gen = hub.wait_kind(raw.headers["x-request-id"], "generated")
    assert r.usage.prompt_tokens_details.cached_tokens == gen.reused_prefix_tokens
    assert r.usage.prompt_tokens_details.cached_tokens > 0


def test_sdk_stream_matches_non_stream_and_usage(oai, hub):
    kw = dict(model="m", prompt=COUNTING, max_tokens=10, temperature=0)
    full = oai.completions.create(**kw).choices[0].text
    raw = oai.completions.with_raw_response.create(stream=True, stream_options={"include_usage": True}, **kw)
    rid = raw.headers["x-request-id"]
    chunks = list(raw.parse())
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    gen = hub.wait_kind(rid, "generated")
    assert gen.new_tokens == chunks[-1].usage.completion_tokens == 10
    assert gen.prompt_tokens == chunks[-1].usage.prompt_tokens
    routed = hub.wait_kind(rid, "requestRouted")
    assert routed.stream is True
    assert hub.wait_kind(rid, "requestFinished").status == 200


def test_raw_sse_framing(base_url):
    body = {
        "model": "x",
        "prompt": COUNTING,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames)
    assert frames[-1] == "data: [DONE]"
    payloads = [json.loads(f[6:]) for f in frames[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert len({p["id"] for p in payloads}) == 1
    for p in payloads[:-2]:
        assert p["choices"] == [{"text": p["choices"][0]["text"], "index": 0, "logprobs": None, "finish_reason": None}]
        assert p["usage"] is None
    assert payloads[-2]["choices"][0] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
    assert payloads[-1]["choices"] == []
    assert payloads[-1]["usage"]["completion_tokens"] == 4
    assert "cached_tokens" in payloads[-1]["usage"]["prompt_tokens_details"]


def test_stream_without_usage_has_no_usage_chunk(base_url):
    body = {"model": "x", "prompt": COUNTING, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=120) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert all("usage" not in p for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_sequence_is_honoured(oai):
    kw = dict(model="m", prompt="Count: 1, 2, 3,", max_tokens=16, temperature=0)
    full = oai.completions.create(**kw).choices[0].text
    assert "6" in full, full
    r = oai.completions.create(stop=["6"], **kw)
    assert r.choices[0].finish_reason == "stop"
    assert "6" not in r.choices[0].text and full.startswith(r.choices[0].text)


def test_seeded_sampling_is_reproducible(oai):
    kw = dict(
        model="m",
        prompt="My favourite colour is",
        max_tokens=8,
        temperature=1.0,
        top_p=0.9,
        seed=42,
        frequency_penalty=0.3,
        extra_body={"top_k": 40, "min_p": 0.05},
    )
    assert oai.completions.create(**kw).choices[0].text == oai.completions.create(**kw).choices[0].text


def test_one_element_prompt_list_is_accepted(oai):
    r = oai.completions.create(model="m", prompt=[COUNTING], max_tokens=2, temperature=0)
    assert r.usage.completion_tokens == 2


def test_suffix_on_a_model_without_fim_tokens_is_a_400_saying_so(oai):
    """SmolLM2 has no fill-in-the-middle tokens (Qwen's insert is tested in
    test_llamacpp.py)."""
    with pytest.raises(openai.BadRequestError) as exc:
        oai.completions.create(model="m", prompt="hi", suffix="the end", max_tokens=2)
    err = exc.value.body
    assert err["param"] == "suffix" and "no fill-in-the-middle tokens" in err["message"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"echo": True}, "echo"),
        ({"n": 17}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"best_of": 3}, "best_of"),
    ],
)
def test_unsupported_fields_are_a_400_naming_the_field(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.completions.create(model="m", prompt="hi", max_tokens=2, **extra)
    err = exc.value.body
    assert err["param"] == param and param in err["message"]
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m", "prompt": [1, None]}, "prompt"),  # token ids and something else
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m"}, "prompt"),  # missing
        ({"model": "m", "prompt": 7}, "prompt"),  # wrong type
        ({"model": "m", "prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
        ({"model": "m", "prompt": "hi", "max_tokens": 0}, "max_tokens"),  # out of range
        ({"model": "m", "prompt": "hi", "temperature": 7}, "temperature"),
        ({"model": "m", "prompt": "hi", "stream": "yes"}, "stream"),
    ],
)
def test_malformed_bodies_are_400_in_openai_shape(base_url, body, param):
    r = httpx.post(base_url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["message"]


def test_bad_json_and_empty_prompt(base_url):
    r = httpx.post(
        base_url + "/v1/completions", content=b"{nope", timeout=30, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(base_url + "/v1/completions", json={"model": "m", "prompt": ""}, timeout=30)
    assert r.status_code == 400 and "empty" in r.json()["error"]["message"]


def test_context_overflow_is_a_400_with_the_numbers(oai):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.completions.create(model="m", prompt="hello", max_tokens=100_000)
    assert "100000" in exc.value.body["message"]


# -- scripted engine failures --------------------------------------------------
def test_midstream_failure_is_one_error_frame_without_done(failing):
    srv, model, obs = failing
    body = {"model": "x", "prompt": "hi there", "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    frames = [f for f in raw.split("\n\n") if f.strip()]
    assert "[DONE]" not in raw
    assert frames[-1].startswith("event: error\ndata: ")
    err = json.loads(frames[-1].split("data: ", 1)[1])["error"]
    assert err["message"].startswith("engine error: scripted failure") and err["type"] == "server_error"
    texts = [json.loads(f[6:])["choices"][0]["text"] for f in frames[:-1]]
    assert texts == ["one", " two"]
    assert model.calls[-1] == {"prompt": "hi there", "config": model.calls[-1]["config"]}  # raw, no template
    assert not [e for e in obs.events if e.kind == "generated"]


def test_midstream_failure_raises_in_the_sdk(failing):
    srv, _, _ = failing
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    got = []
    with pytest.raises(openai.APIError) as exc:
        for chunk in client.completions.create(model="x", prompt="hi", stream=True):
            got.append(chunk.choices[0].text)
    assert got == ["one", " two"]
    assert "scripted failure" in exc.value.message


def test_non_stream_failure_is_500_in_shape(failing):
    srv, _, obs = failing
    r = httpx.post(srv.url + "/v1/completions", json={"model": "x", "prompt": "hi"}, timeout=30)
    assert r.status_code == 500
    assert r.json()["error"]["message"].startswith("engine error")
    fin = [e for e in obs.events if e.kind == "requestFinished"][-1]
    assert fin.status == 500 and fin.error.startswith("engine error")


def test_client_that_leaves_cancels_the_generation(base_url, hub):
    body = {"model": "m", "prompt": COUNTING, "max_tokens": 2000, "stream": True, "temperature": 0}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", base_url + "/v1/completions", json=body) as r:
            rid = r.headers["x-request-id"]
            assert next(r.iter_lines()).startswith("data: ")
    gen = hub.wait_kind(rid, "generated", timeout=15)
    assert gen.stop_reason == "cancelled" and gen.new_tokens < 2000
