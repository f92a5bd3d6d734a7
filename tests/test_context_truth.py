"""Context truth for agent clients, on the real Qwen model: every model listing a
client reads says the context the model is served with, and a request over
it gets each dialect's standard error, worded and coded the way Claude Code
(compaction, a lower ``max_tokens``) and Codex (``context_length_exceeded``)
recognise."""

from __future__ import annotations

import re

import anthropic
import httpx
import ollama
import openai
import pytest

CTX = 4096  # the Qwen test server's context (conftest's ``qwen_server``)
TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
BUDGET = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")
LONG_TEXT = "word " * 5000


@pytest.fixture(scope="module")
def base_url(qwen_server):
    return qwen_server[0].url


@pytest.fixture(scope="module")
def ant(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_openai_model_listing_says_the_context(oai):
    oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    card = oai.models.list().data[0].model_dump()
    assert card["context_length"] == CTX and card["max_model_len"] == CTX
    assert card["capabilities"]["tools"] is True
    assert oai.models.retrieve(card["id"]).model_dump()["context_length"] == CTX


def test_anthropic_model_listing_says_the_context(ant):
    models = ant.models.list().data
    assert models and models[0].type == "model"
    extra = models[0].model_dump()
    assert extra["max_input_tokens"] == CTX and extra["context_length"] == CTX
    one = ant.models.retrieve(models[0].id)
    assert one.id == models[0].id and one.model_dump()["max_input_tokens"] == CTX
    # an unknown id is Anthropic's 404 (it was OpenAI's shape)
    with pytest.raises(anthropic.NotFoundError) as exc:
        ant.models.retrieve("no-such-model")
    assert exc.value.body["type"] == "error" and exc.value.body["error"]["type"] == "not_found_error"
    assert "no-such-model" in exc.value.body["error"]["message"]


def test_ollama_show_says_the_context_and_tools(base_url):
    show = ollama.Client(host=base_url).show("qwen")
    assert "tools" in show.capabilities
    assert any(k.endswith(".context_length") and v == CTX for k, v in show.modelinfo.items())


def test_openai_overflow_is_context_length_exceeded(oai):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": LONG_TEXT}])
    assert exc.value.code == "context_length_exceeded"
    n, limit = map(int, TOO_LONG.search(exc.value.body["message"]).groups())
    assert n > limit == CTX
    # (and llama-server's numbers, which clients written for it read to trim)
    assert (exc.value.body["n_prompt_tokens"], exc.value.body["n_ctx"]) == (n, limit)
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=10_000)
    assert exc.value.code == "context_length_exceeded" and exc.value.body["param"] == "max_tokens"
    prompt, budget, limit = map(int, BUDGET.search(exc.value.body["message"]).groups())
    assert budget == 10_000 and limit == CTX and prompt + budget > limit


@pytest.mark.parametrize("stream", [False, True])
def test_responses_overflow_is_context_length_exceeded(oai, stream: bool):
    """Codex streams: its request over the context is refused before the
    stream, with the code it acts on and the numbers."""
    with pytest.raises(openai.BadRequestError) as exc:
        oai.responses.create(model="m", input=LONG_TEXT, stream=stream)
    assert exc.value.code == "context_length_exceeded"
    n, limit = map(int, TOO_LONG.search(exc.value.body["message"]).groups())
    assert n > limit == CTX


def test_anthropic_overflow_is_worded_as_the_api_words_it(ant):
    with pytest.raises(anthropic.BadRequestError) as exc:
        ant.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": LONG_TEXT}])
    err = exc.value.body["error"]
    assert err["type"] == "invalid_request_error"
    n, limit = map(int, TOO_LONG.search(err["message"]).groups())
    assert n > limit == CTX
    # a budget past the room left is clipped to it, as the API does (Claude
    # Code asks for 32k whatever the model): no error
    r = ant.messages.create(model="m", max_tokens=5000, messages=[{"role": "user", "content": "hi"}])
    assert r.stop_reason in ("end_turn", "max_tokens", "model_context_window_exceeded")


def test_a_streamed_request_over_the_context_is_refused_before_the_stream(base_url):
    body = {"model": "m", "messages": [{"role": "user", "content": LONG_TEXT}], "stream": True}
    r = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


#: Qwen2.5's longest token is 128 bytes: a text of more than 4096 x 128 bytes
#: is too long by its length alone, and refused before it is tokenised
BY_LENGTH = "x" * 600_000


@pytest.mark.parametrize("text", [LONG_TEXT, BY_LENGTH], ids=["tokenised", "refused-by-length"])
def test_a_raw_prompt_over_the_context_names_the_prompt(oai, base_url, text: str):
    """Completions have no ``messages``: the error names ``prompt``, whether
    the prompt was counted or its length alone proved it too long."""
    with pytest.raises(openai.BadRequestError) as exc:
        oai.completions.create(model="m", prompt=text, max_tokens=4)
    assert exc.value.code == "context_length_exceeded" and exc.value.body["param"] == "prompt"
    n, _ = map(int, TOO_LONG.search(exc.value.body["message"]).groups())
    if text is BY_LENGTH:
        assert n == len(BY_LENGTH) // 128  # counted from its length: the early refusal ran
    with pytest.raises(openai.BadRequestError) as exc:
        oai.completions.create(model="m", prompt=text, max_tokens=4, stream=True)
    assert exc.value.body["param"] == "prompt"
    r = httpx.post(base_url + "/completion", json={"prompt": text, "n_predict": 4}, timeout=60)
    assert r.status_code == 400 and "too long" in r.text
    # chat still names its messages
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], max_tokens=4)
    assert exc.value.body["param"] == "messages"
