"""Never ignore a constraint a client asked for (issue 38): llama-server's
``grammar`` (GBNF) and ``json_schema``, and ``response_format`` with a
``schema``, on /v1/chat/completions, /v1/completions, /completion and its
``/completions`` alias, streamed and not, on the real bundled model; an
invalid grammar or schema, a grammar with tools and two constraints at once
are 400s."""

from __future__ import annotations

import json

import httpx
import pytest

from .support import assert_openai_error

FIVE_A = 'root ::= "a"{5,5}'
FORTY_TWO = {"const": "42"}
HELLO = [{"role": "user", "content": "Say something."}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def chat(base_url: str, stream: bool = False, **fields) -> str:
    body = {"model": "m", "messages": HELLO, "max_tokens": 12, "stream": stream, **fields}
    if not stream:
        r = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]
    text = ""
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:])["choices"]
                text += (choices[0]["delta"].get("content") or "") if choices else ""
    return text


@pytest.mark.parametrize("stream", [False, True])
def test_chat_takes_a_grammar_and_a_schema(base_url, stream):
    assert chat(base_url, stream, grammar=FIVE_A) == "aaaaa"
    assert chat(base_url, stream, json_schema=FORTY_TWO) == '"42"'
    assert chat(base_url, stream, response_format={"type": "json_object", "schema": FORTY_TWO}) == '"42"'
    assert chat(base_url, stream, response_format={"type": "json_schema", "schema": FORTY_TWO}) == '"42"'


@pytest.mark.parametrize("path", ["/v1/completions", "/completion", "/completions"])
def test_completions_take_a_grammar_and_a_schema(base_url, path):
    for fields, want in (({"grammar": FIVE_A}, "aaaaa"), ({"json_schema": FORTY_TWO}, '"42"')):
        r = httpx.post(base_url + path, json={"prompt": "Say:", "max_tokens": 12, **fields}, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["text"] if path == "/v1/completions" else r.json()["content"]
        assert got == want, (path, fields, r.text)


def test_completions_alias_answers_in_llama_servers_shape(base_url):
    r = httpx.post(base_url + "/completions", json={"prompt": "Hi", "n_predict": 2}, timeout=120)
    assert r.status_code == 200 and "content" in r.json() and "generation_settings" in r.json(), r.text
    r = httpx.post(base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=120)
    assert r.json()["object"] == "text_completion"


def test_bad_constraints_are_400s(base_url):
    url = base_url + "/v1/chat/completions"
    base = {"model": "m", "messages": HELLO, "max_tokens": 4}
    r = httpx.post(url, json={**base, "grammar": "root ::= undefined-rule"}, timeout=60)
    assert_openai_error(r, 400, "grammar", "undefined-rule")
    r = httpx.post(url, json={**base, "grammar": "root ::= ("}, timeout=60)
    assert_openai_error(r, 400, "grammar", "not a GBNF grammar")
    r = httpx.post(url, json={**base, "json_schema": {"type": "nonsense"}}, timeout=60)
    assert r.status_code == 400, r.text
    r = httpx.post(url, json={**base, "grammar": FIVE_A, "tools": [TOOL]}, timeout=60)
    assert_openai_error(r, 400, "grammar", "tools")
    r = httpx.post(url, json={**base, "grammar": FIVE_A, "json_schema": FORTY_TWO}, timeout=60)
    assert_openai_error(r, 400, "json_schema", "not both")
    r = httpx.post(base_url + "/completion", json={"prompt": "x", "grammar": "root ::= nope"}, timeout=60)
    assert r.status_code == 400 and "nope" in r.text
