"""Token log-probabilities in every dialect that has them, on the real model:
OpenAI chat (``logprobs`` + ``top_logprobs``), Completions (``logprobs: N``),
Responses (``include: ["message.output_text.logprobs"]``), Ollama
(``logprobs`` + ``top_logprobs``) and llama.cpp (``n_probs``), streamed and
not. The numbers are the engine's distribution after the constraints
(logit bias, grammar): at temperature 0 the pick is always the most likely
token, the alternatives are sorted and their probabilities sum to at most 1.
"""

from __future__ import annotations

import math

import httpx
import ollama
import orjson
import pytest

QUESTION = [{"role": "user", "content": "Name three colours."}]


def check_entry(token: str, logprob: float, top: list[tuple[str, float]], n: int, greedy: bool = True) -> None:
    """One sampled token: a real log-probability, ``n`` alternatives most
    likely first whose probabilities sum to at most 1, and (greedy) the pick
    is the most likely of them."""
    assert logprob <= 0.0
    assert len(top) == n
    values = [lp for _, lp in top]
    assert values == sorted(values, reverse=True)
    assert sum(math.exp(v) for v in values) <= 1.0 + 1e-6
    if greedy:
        assert top[0] == (token, pytest.approx(logprob)), (token, logprob, top)
    else:
        assert logprob <= values[0] + 1e-9


def test_chat_logprobs_match_the_greedy_pick(oai):
    r = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=12, temperature=0, logprobs=True, top_logprobs=5
    )
    choice = r.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        check_entry(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs], 5)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    assert b"".join(bytes(e.bytes) for e in entries).decode() == choice.message.content


def test_chat_logprobs_without_alternatives_and_off_by_default(oai):
    r = oai.chat.completions.create(model="m", messages=QUESTION, max_tokens=4, temperature=0, logprobs=True)
    assert all(e.top_logprobs == [] and e.logprob <= 0 for e in r.choices[0].logprobs.content)
    r = oai.chat.completions.create(model="m", messages=QUESTION, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


def test_chat_stream_chunks_carry_their_tokens_logprobs(oai):
    stream = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    text, pieces = "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        if c.delta.content:
            text += c.delta.content
            assert c.logprobs is not None and c.logprobs.content
            for e in c.logprobs.content:
                check_entry(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs], 2)
                pieces.append(bytes(e.bytes))
    assert text and b"".join(pieces).decode() == text


def test_sampled_tokens_have_their_own_logprob(oai):
    r = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=16, temperature=1.5, seed=7, logprobs=True, top_logprobs=3
    )
    for e in r.choices[0].logprobs.content:
        check_entry(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs], 3, greedy=False)


def test_logprobs_are_after_the_logit_bias(oai, base_url):
    """A banned token is not among the alternatives: the numbers are the
    distribution the constraints leave."""
    first = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=1, temperature=0, logprobs=True, top_logprobs=5
    )
    top = first.choices[0].logprobs.content[0].top_logprobs
    body = {"content": top[0].token, "add_special": False, "parse_special": False}
    tok = httpx.post(base_url + "/tokenize", json=body, timeout=30).json()["tokens"]
    assert len(tok) == 1
    banned = oai.chat.completions.create(
        model="m",
        messages=QUESTION,
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        logit_bias={str(tok[0]): -100},
    )
    e = banned.choices[0].logprobs.content[0]
    assert e.token != top[0].token
    assert top[0].token not in [t.token for t in e.top_logprobs]
    assert e.top_logprobs[0].token == top[1].token and e.token == top[1].token
    # what was second is now more likely: the banned token's share moved
    assert e.logprob > top[1].logprob


def test_completions_logprobs_legacy_shape(oai):
    r = oai.completions.create(model="m", prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=3)
    choice = r.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == choice.text
    at = 0
    for token, value, top, offset in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
        assert offset == at
        at += len(token)
        ranked = sorted(top.items(), key=lambda kv: -kv[1])
        check_entry(token, value, ranked, 3)


def test_completions_stream_logprobs(base_url):
    body = {"model": "m", "prompt": "One, two,", "max_tokens": 5, "temperature": 0, "logprobs": 1, "stream": True}
    tokens, text = [], ""
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            c = orjson.loads(line[6:])["choices"][0]
            text += c["text"]
            if c["logprobs"]:
                tokens += c["logprobs"]["tokens"]
                assert c["logprobs"]["text_offset"][0] == len(text) - len(c["text"])
    assert len(tokens) == 5 and "".join(tokens) == text


#: a Responses request that asks for the answer's logprobs
INCLUDED = {"model": "m", "input": "Name three colours.", "temperature": 0, "include": ["message.output_text.logprobs"]}


def test_responses_logprobs_when_included(oai):
    r = oai.responses.create(**INCLUDED, max_output_tokens=10, top_logprobs=4)
    part = r.output[0].content[0]
    assert part.logprobs and "".join(e.token for e in part.logprobs) == part.text
    for e in part.logprobs:
        check_entry(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs], 4)
    plain = oai.responses.create(model="m", input="Name three colours.", max_output_tokens=4, temperature=0)
    assert plain.output[0].content[0].logprobs == []


def test_responses_stream_deltas_carry_logprobs(oai):
    stream = oai.responses.create(**INCLUDED, max_output_tokens=8, stream=True)
    deltas, done = [], None
    for ev in stream:
        if ev.type == "response.output_text.delta":
            deltas += ev.logprobs
        elif ev.type == "response.output_text.done":
            done = ev
    assert done is not None and deltas
    assert [e.token for e in deltas] == [e.token for e in done.logprobs]
    assert "".join(e.token for e in done.logprobs) == done.text


def test_ollama_logprobs(base_url):
    client = ollama.Client(host=base_url)
    r = client.chat(
        model="m", messages=QUESTION, options={"temperature": 0, "num_predict": 8}, logprobs=True, top_logprobs=3
    )
    assert r.logprobs and "".join(e.token for e in r.logprobs) == r.message.content
    for e in r.logprobs:
        check_entry(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs], 3)
    streamed = []
    for part in client.generate(
        model="m", prompt="One, two,", options={"temperature": 0, "num_predict": 5}, logprobs=True, stream=True
    ):
        streamed += part.logprobs or []
    assert len(streamed) == 5


def test_llamacpp_n_probs(base_url):
    body = {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0, "n_probs": 3}
    r = httpx.post(base_url + "/completion", json=body, timeout=60).json()
    probs = r["completion_probabilities"]
    assert len(probs) == 4 and "".join(p["token"] for p in probs) == r["content"]
    for p in probs:
        check_entry(p["token"], p["logprob"], [(t["token"], t["logprob"]) for t in p["top_logprobs"]], 3)
        assert p["top_logprobs"][0]["id"] == p["id"]
    streamed = []
    with httpx.stream("POST", base_url + "/completion", json={**body, "stream": True}, timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                streamed += orjson.loads(line[6:]).get("completion_probabilities", [])
    assert [p["id"] for p in streamed] == [p["id"] for p in probs]


def test_a_stop_string_takes_its_tokens_logprobs_with_it(oai):
    """The entries are the answer's tokens: those wholly inside the stop
    string that ended it are dropped with its text."""
    free = oai.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, temperature=0, logprobs=True)
    tokens = [e.token for e in free.choices[0].logprobs.content]
    stop = tokens[3].strip() or tokens[4].strip()
    r = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=12, temperature=0, logprobs=True, stop=[stop]
    )
    c = r.choices[0]
    assert c.finish_reason == "stop" and stop not in c.message.content
    kept = [e.token for e in c.logprobs.content]
    # every token with a byte in the answer, and no more
    assert "".join(kept).startswith(c.message.content) and kept == tokens[: len(kept)]
    assert len("".join(kept[:-1])) < len(c.message.content)


def test_logprobs_under_a_grammar_list_only_what_it_allows(oai):
    """With structured output the distribution is the grammar's: every
    listed alternative is a token the grammar allows there (never one it
    forbids, never a -inf), so fewer than asked may come back where the
    grammar leaves few choices, and the answer is the enum value."""
    r = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": {"enum": ["yes", "no"]}},
        },
    )
    choice = r.choices[0]
    assert choice.message.content in ('"yes"', '"no"')
    entries = choice.logprobs.content
    assert entries
    text = ""
    for e in entries:
        alts = [(t.token, t.logprob) for t in e.top_logprobs]
        assert 1 <= len(alts) <= 5 and all(math.isfinite(lp) and lp <= 0 for _, lp in alts)
        assert alts[0] == (e.token, pytest.approx(e.logprob))
        for token, _ in alts:  # each alternative keeps the text on the way to an enum value
            if not token or token.startswith("<|"):  # the end, once the value is complete
                continue
            assert any(v.startswith(text + token) or (text + token).startswith(v) for v in ('"yes"', '"no"')), (
                text,
                token,
            )
        text += e.token
