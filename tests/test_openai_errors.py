"""Bad input gets a clear 4xx in OpenAI's error shape, and is observed."""

from __future__ import annotations

import httpx
import openai
import pytest

from .support import MALFORMED_BODIES, assert_openai_error, post_body

URL = "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]


def post(base_url: str, body, **kw) -> httpx.Response:
    return post_body(base_url + URL, body, **kw)


@pytest.mark.parametrize(
    "body, param, contains",
    [
        *MALFORMED_BODIES,
        ({"model": "m"}, "messages", "missing"),
        ({"model": "m", "messages": []}, "messages", ""),
        ({"model": "m", "messages": "hello"}, "messages", ""),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", ""),
        ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content", "required"),
        ({"model": "m", "messages": [{"role": "user", "content": 42}]}, "messages[0].content", ""),
        ({"model": "m", "messages": OK_MSG, "max_tokens": 0}, "max_tokens", ""),
        ({"model": "m", "messages": OK_MSG, "max_tokens": -5}, "max_tokens", ""),
        ({"model": "m", "messages": OK_MSG, "max_tokens": "ten"}, "max_tokens", ""),
        ({"model": "m", "messages": OK_MSG, "max_completion_tokens": 0}, "max_completion_tokens", ""),
        ({"model": "m", "messages": OK_MSG, "temperature": "hot"}, "temperature", ""),
        ({"model": "m", "messages": OK_MSG, "temperature": 7}, "temperature", ""),
        ({"model": "m", "messages": OK_MSG, "top_p": 1.5}, "top_p", ""),
        ({"model": "m", "messages": OK_MSG, "stream": "yes"}, "stream", ""),
        ({"model": "m", "messages": OK_MSG, "stop": 5}, "stop", ""),
        ({"model": "m", "messages": OK_MSG, "n": 17}, "n", "between 1 and 16"),
        ({"model": "m", "messages": OK_MSG, "reasoning_effort": "extreme"}, "reasoning_effort", "extreme"),
        ({"model": "m", "messages": OK_MSG, "seed": "abc"}, "seed", ""),
        ({"model": 7, "messages": OK_MSG}, "model", ""),
        ({"model": "m", "messages": OK_MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "20"),
        ({"model": "m", "messages": OK_MSG, "top_logprobs": 2}, "top_logprobs", "needs 'logprobs'"),
    ],
)
def test_bad_bodies_are_400_in_openai_shape(base_url, body, param, contains):
    r = post(base_url, body)
    assert_openai_error(r, 400, param, contains)


def test_context_overflow_names_the_numbers(base_url):
    r = post(base_url, {"model": "m", "messages": OK_MSG, "max_tokens": 100_000})
    err = assert_openai_error(r, 400, "max_tokens")
    msg = err["message"]
    assert "100000" in msg and "4096" in msg, msg


def test_long_prompt_overflow_is_400_not_truncated(base_url):
    text = "word " * 5000
    r = post(base_url, {"model": "m", "messages": [{"role": "user", "content": text}]})
    err = assert_openai_error(r, 400)
    assert "4096" in err["message"]


def test_sdk_raises_bad_request(oai):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model="m", messages=[], max_tokens=5)
    assert exc.value.status_code == 400


def test_unknown_route_404_observed(base_url, hub):
    r = httpx.get(base_url + "/v1/nope", timeout=10)
    err = assert_openai_error(r, 404, contains="no route")
    rid = r.headers["x-request-id"]
    events = hub.wait_for(lambda es: any(e.kind == "requestFinished" for e in es), rid)
    assert [e.kind for e in events] == ["requestStarted", "requestFinished"]
    assert events[0].path == "/v1/nope" and events[0].method == "GET"
    assert events[1].status == 404 and events[1].error == err["message"]


def test_wrong_method_405(base_url, hub):
    r = httpx.get(base_url + URL, timeout=10)
    assert_openai_error(r, 405)
    assert hub.wait_kind(r.headers["x-request-id"], "requestFinished").status == 405


def test_malformed_body_observed_with_error(base_url, hub):
    r = post(base_url, b"{oops")
    err = assert_openai_error(r, 400)
    rid = r.headers["x-request-id"]
    events = hub.wait_for(lambda es: any(e.kind == "requestFinished" for e in es), rid)
    assert [e.kind for e in events] == ["requestStarted", "requestFinished"]
    assert events[1].status == 400 and events[1].error == err["message"]
    assert "malformed JSON" in events[1].error


def test_failed_generation_emits_no_generated(base_url, hub):
    r = post(base_url, {"model": "m", "messages": OK_MSG, "max_tokens": 100_000})
    rid = r.headers["x-request-id"]
    events = hub.wait_for(lambda es: any(e.kind == "requestFinished" for e in es), rid)
    # routed (the body parsed and a model was chosen) but nothing generated
    assert [e.kind for e in events] == ["requestStarted", "requestRouted", "requestFinished"]
    assert events[-1].status == 400


def test_server_survives_bad_input(base_url, oai):
    for body in (b"\xff\xfe", b"null", b'{"messages": [{"role": "user", "content": [{"type": "nope"}]}]}'):
        assert post(base_url, body).status_code == 400
    assert oai.chat.completions.create(model="m", messages=OK_MSG, max_tokens=3).choices[0].message.content is not None


def test_image_parts_are_refused_by_a_model_without_vision(base_url):
    r = post(
        base_url,
        {
            "model": "m",
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                }
            ],
        },
    )
    assert r.status_code == 400, r.text  # never answered as if the image was seen
    error = r.json()["error"]
    assert (
        error["code"] == "images_not_supported" and error["param"] == "messages" and "smollm2-135m" in error["message"]
    )
