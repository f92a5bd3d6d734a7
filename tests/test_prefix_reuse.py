"""Prefix reuse on the real model: a new turn prefills only what is new, and
greedy output is token-identical to a cold prefill."""

from __future__ import annotations

import openai
import pytest

from turbospark import Server
from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.models.catalog import resolve_model


@pytest.fixture(scope="module")
def cold():
    path, _ = resolve_model("smollm2-135m")
    model = LlamaChatModel(ModelOptions(path=path, id="cold", prefix_reuse=False))
    srv = Server(models=[model]).start()
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    srv.stop()
    model.close()


def chat(client, messages, **kw):
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=messages, max_tokens=40, temperature=0, **kw
    )
    return raw.headers["x-request-id"], raw.parse()


def test_turn_two_reuses_turn_one_and_matches_cold(oai, hub, cold):
    turn1 = [
        {"role": "system", "content": "You are a terse assistant for geography questions."},
        {"role": "user", "content": "What is the largest ocean?"},
    ]
    rid1, r1 = chat(oai, turn1)
    answer = r1.choices[0].message.content
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And the smallest?"}]
    rid2, r2 = chat(oai, turn2)
    gen2 = hub.wait_kind(rid2, "generated")
    assert gen2.reused_prefix_tokens >= r1.usage.prompt_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens == gen2.reused_prefix_tokens
    assert gen2.prompt_tokens == r2.usage.prompt_tokens
    assert gen2.session_slot_evicted is False
    _, c2 = chat(cold, turn2)
    assert c2.usage.prompt_tokens_details.cached_tokens == 0
    assert r2.choices[0].message.content == c2.choices[0].message.content


def test_identical_prompt_reuses_all_but_one_token(oai, hub):
    msgs = [{"role": "user", "content": "Name three kinds of trees."}]
    _, a = chat(oai, msgs)
    rid, b = chat(oai, msgs)
    gen = hub.wait_kind(rid, "generated")
    assert gen.reused_prefix_tokens == gen.prompt_tokens - 1
    assert a.choices[0].message.content == b.choices[0].message.content
