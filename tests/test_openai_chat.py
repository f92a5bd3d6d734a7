"""OpenAI Chat Completions on the real bundled model, through the official SDK."""

from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
import openai
import pytest

HELLO = [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}]


def kinds(events):
    return [e.kind for e in events]


def test_non_stream_text_usage_and_events(oai, hub):
    raw = oai.chat.completions.with_raw_response.create(model="gpt-4o", messages=HELLO, max_tokens=120, temperature=0)
    rid = raw.headers["x-request-id"]
    r = raw.parse()
    assert r.id.startswith("chatcmpl-")
    assert r.model == "gpt-4o"  # the client's string is echoed
    assert r.object == "chat.completion"
    text = r.choices[0].message.content
    assert text and text.strip()
    assert r.choices[0].finish_reason == "stop"

    events = hub.wait_for(lambda es: "requestFinished" in kinds(es), rid)
    assert kinds(events) == ["requestStarted", "requestRouted", "generated", "requestFinished"]
    started, routed, gen, finished = events
    assert {e.id for e in events} == {int(rid)}
    assert started.method == "POST" and started.path == "/v1/chat/completions"
    assert routed.requested == "gpt-4o" and routed.served == "smollm2-135m"
    assert routed.requested != routed.served and routed.stream is False
    assert gen.model == "smollm2-135m"
    assert gen.new_tokens == r.usage.completion_tokens
    assert gen.prompt_tokens == r.usage.prompt_tokens
    assert gen.reused_prefix_tokens == r.usage.prompt_tokens_details.cached_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert gen.stop_reason == "endOfTurn"
    assert gen.prefill_seconds > 0 and gen.decode_seconds > 0
    assert finished.status == 200 and "error" not in finished.to_dict()
    # queue wait = duration - prefill - decode is never negative (ms rounding aside)
    assert finished.duration_ms + 1 >= (gen.prefill_seconds + gen.decode_seconds) * 1000


def test_finish_reason_length_when_capped(oai, hub):
    raw = oai.chat.completions.with_raw_response.create(
        model="whatever",
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=5,
        temperature=0,
    )
    r = raw.parse()
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    gen = hub.wait_kind(raw.headers["x-request-id"], "generated")
    assert gen.stop_reason == "maxTokens" and gen.new_tokens == 5


def test_max_completion_tokens_is_honoured(oai):
    r = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Tell me about the sea."}],
        max_completion_tokens=3,
        temperature=0,
    )
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_stream_chunks_usage_and_events(oai, hub):
    raw = oai.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=HELLO,
        max_tokens=120,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    rid = raw.headers["x-request-id"]
    chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0].choices == []
    assert chunks[-1] is usage_chunks[0]
    gen = hub.wait_kind(rid, "generated")
    assert gen.new_tokens == usage_chunks[0].usage.completion_tokens
    assert gen.prompt_tokens == usage_chunks[0].usage.prompt_tokens
    routed = hub.wait_kind(rid, "requestRouted")
    assert routed.stream is True
    # for a stream, requestFinished fires when the stream starts
    finished = hub.wait_kind(rid, "requestFinished")
    assert finished.status == 200


def test_stream_is_same_text_as_non_stream(oai):
    kw = dict(model="m", messages=HELLO, max_tokens=40, temperature=0)
    full = oai.chat.completions.create(**kw).choices[0].message.content
    parts = oai.chat.completions.create(stream=True, **kw)
    assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == full


def test_raw_sse_framing(base_url):
    body = {
        "model": "x",
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}  # as OpenAI sends it
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 8
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)
    assert len({p["id"] for p in payloads}) == 1


def test_stop_string_is_not_leaked(oai):
    kw = dict(
        model="m",
        messages=[{"role": "user", "content": "Count from 1 to 10 separated by commas."}],
        max_tokens=60,
        temperature=0,
    )
    full = oai.chat.completions.create(**kw).choices[0].message.content
    assert "4" in full, full
    r = oai.chat.completions.create(stop=["4"], **kw)
    assert r.choices[0].finish_reason == "stop"
    assert "4" not in r.choices[0].message.content
    assert full.startswith(r.choices[0].message.content)
    streamed = oai.chat.completions.create(stop=["4"], stream=True, **kw)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == r.choices[0].message.content


def test_seeded_sampling_is_reproducible(oai):
    kw = dict(
        model="m",
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=12,
        temperature=1.0,
        top_p=0.9,
        seed=1234,
        frequency_penalty=0.5,
        presence_penalty=0.2,
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    a = oai.chat.completions.create(**kw).choices[0].message.content
    b = oai.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_models_endpoints(oai):
    ids = [m.id for m in oai.models.list()]
    assert ids == ["smollm2-135m"]
    assert oai.models.retrieve("smollm2-135m").id == "smollm2-135m"
    with pytest.raises(openai.NotFoundError) as exc:
        oai.models.retrieve("gpt-4o")  # lookups never fall back
    assert exc.value.body["code"] == "model_not_found"


def test_health_answers_during_generation(base_url):
    with httpx.stream(
        "POST",
        base_url + "/v1/chat/completions",
        timeout=60,
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "Write a long essay on rivers."}],
            "max_tokens": 200,
            "stream": True,
            "temperature": 0,
        },
    ) as r:
        it = r.iter_lines()
        next(it)  # generation is under way
        h = httpx.get(base_url + "/health", timeout=5)
        assert h.status_code == 200
        assert h.json() == {"status": "ok", "state": "ready"}


def test_three_concurrent_requests_all_complete(oai, hub):
    def one(i: int):
        raw = oai.chat.completions.with_raw_response.create(
            model="m",
            messages=[{"role": "user", "content": f"Say the number {i}."}],
            max_tokens=16,
            temperature=0,
        )
        return raw.headers["x-request-id"], raw.parse()

    with cf.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, range(3)))
    assert len(results) == 3
    for rid, r in results:
        assert r.choices[0].message.content
        gen = hub.wait_kind(rid, "generated")
        assert gen.new_tokens == r.usage.completion_tokens
        assert hub.wait_kind(rid, "requestFinished").status == 200
