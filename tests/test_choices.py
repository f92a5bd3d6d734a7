"""``n`` > 1 in OpenAI chat and completions, on the real model: the choices
decode side by side from ONE prefill (the others get a copy of the prompt's
KV and sample their first token from the same logits), each with its own
``index``, ``finish_reason`` and logprobs; usage counts the prompt once and
every choice's completion."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.support import wait_until
from turbospark.views.fold import Fold

QUESTION = [{"role": "user", "content": "Write one word about the sea."}]


def generated_of(hub, rid: int, n: int) -> list:
    evs = hub.wait_for(lambda es: sum(e.kind == "generated" for e in es) >= n, rid, timeout=60)
    return [e for e in evs if e.kind == "generated"]


def test_greedy_choices_equal_the_single_answer(oai, hub):
    """The copied KV is the prompt's exactly: greedy choices all say what a
    single greedy answer says."""
    one = oai.chat.completions.create(model="m", messages=QUESTION, max_tokens=10, temperature=0)
    raw = oai.chat.completions.with_raw_response.create(model="m", messages=QUESTION, max_tokens=10, temperature=0, n=3)
    r = raw.parse()
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert {c.message.content for c in r.choices} == {one.choices[0].message.content}
    assert all(c.finish_reason == one.choices[0].finish_reason for c in r.choices)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens
    gens = generated_of(hub, int(raw.headers["x-request-id"]), 3)
    assert len(gens) == 3
    # one prefill: the other two choices copied the whole prompt's KV
    forks = [g for g in gens if g.reused_prefix_tokens == g.prompt_tokens and g.reused_from == "copy"]
    assert len(forks) == 2, [g.to_dict() for g in gens]
    # each names its choice; their times overlap, so the request's engine
    # time is the longest choice's, not their sum (which can pass the wall
    # time, leaving the overhead a meaningless 0)
    rid = int(raw.headers["x-request-id"])
    assert sorted(g.choice for g in gens) == [0, 1, 2]
    finished = hub.wait_kind(rid, "requestFinished")
    record = Fold().feed_all(e.to_dict() for e in hub.of(rid)).record(rid)
    assert record is not None
    longest = max(g.queue_seconds + g.prefill_seconds + g.decode_seconds for g in gens)
    assert record.overhead_ms == pytest.approx(max(0.0, finished.duration_ms - 1000 * longest))
    # and the times every view shows for the request are that choice's: they fit in its wall time
    d = record.to_dict()
    assert d["queuedMs"] + d["prefillMs"] + d["decodeMs"] == pytest.approx(1000 * longest)


def test_sampled_choices_differ_and_each_has_logprobs(oai):
    r = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=12, temperature=1.2, seed=3, n=4, logprobs=True, top_logprobs=2
    )
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1, texts
    total = 0
    for c in r.choices:
        entries = c.logprobs.content
        assert b"".join(bytes(e.bytes) for e in entries).decode() == c.message.content
        total += len(entries)
    # a choice that ended on its own also counts the end-of-turn token,
    # which has no text and so no entry
    assert r.usage.completion_tokens == total + sum(c.finish_reason == "stop" for c in r.choices)


def test_streamed_choices_interleave_and_end_once(base_url):
    body = {
        "model": "m",
        "messages": QUESTION,
        "max_tokens": 8,
        "temperature": 1.0,
        "n": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    roles, texts, finishes, usage, done = [], {0: "", 1: "", 2: ""}, {}, None, 0
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done += 1
                continue
            if not line.startswith("data: "):
                continue
            assert not finishes.keys() >= {0, 1, 2} or usage is None, "content after every choice finished"
            chunk = orjson.loads(line[6:])
            if not chunk["choices"]:
                usage = chunk["usage"]
                continue
            c = chunk["choices"][0]
            if c["delta"].get("role"):
                roles.append(c["index"])
            texts[c["index"]] += c["delta"].get("content") or ""
            if c["finish_reason"]:
                assert c["index"] not in finishes
                finishes[c["index"]] = c["finish_reason"]
    assert sorted(roles) == [0, 1, 2] and set(finishes) == {0, 1, 2} and done == 1
    assert all(texts.values())
    assert usage is not None and usage["completion_tokens"] >= 3


def test_completions_n_with_logprobs(oai):
    r = oai.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=1.0, n=2, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert "".join(c.logprobs.tokens) == c.text and c.finish_reason == "length"
    assert r.usage.completion_tokens == 12


def test_more_choices_than_free_slots_still_all_finish(oai, hub):
    """The server has 4 sequences: 6 choices run 4 at a time, the rest wait
    for a slot and reuse the prompt when they start."""
    raw = oai.chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, max_tokens=6, temperature=0.9, n=6
    )
    r = raw.parse()
    assert [c.index for c in r.choices] == list(range(6))
    assert all(c.message.content for c in r.choices)
    assert len(generated_of(hub, int(raw.headers["x-request-id"]), 6)) == 6


def test_a_client_that_leaves_ends_every_choice(base_url, hub):
    body = {"model": "m", "messages": QUESTION, "max_tokens": 400, "n": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        rid = int(r.headers["x-request-id"])
        for line in r.iter_lines():
            if '"content":"' in line:
                break
    gens = generated_of(hub, rid, 3)
    assert {g.stop_reason for g in gens} == {"cancelled"}
    assert all(g.new_tokens < 400 for g in gens)
    wait_until(
        lambda: not any(s["state"] == "busy" for s in httpx.get(base_url + "/v1/slots").json()["data"]),
        30,
        "every slot free again",
    )
