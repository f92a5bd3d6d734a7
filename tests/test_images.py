"""Images sent to a model without vision (issue 38): refused with a 400 in
each chat dialect's own error shape, naming the model, streamed requests
before their first byte, and no engine run (no ``generated`` event); the
listings say which models take images."""

from __future__ import annotations

import httpx
import pytest

from .support import assert_anthropic_error, assert_ollama_error, assert_openai_error

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
DATA_URL = "data:image/png;base64," + PNG
OPENAI_CHAT = {
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": DATA_URL}},
            ],
        }
    ]
}
RESPONSES = {
    "input": [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": DATA_URL},
            ],
        }
    ]
}
ANTHROPIC = {
    "max_tokens": 8,
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            ],
        }
    ],
}
OLLAMA_CHAT = {"messages": [{"role": "user", "content": "What is this?", "images": [PNG]}]}
OLLAMA_GENERATE = {"prompt": "What is this?", "images": [PNG]}
CASES = [
    ("/v1/chat/completions", OPENAI_CHAT, assert_openai_error, "messages"),
    ("/v1/responses", RESPONSES, assert_openai_error, "input"),
    ("/v1/messages", ANTHROPIC, assert_anthropic_error, None),
    ("/api/chat", OLLAMA_CHAT, assert_ollama_error, None),
    ("/api/generate", OLLAMA_GENERATE, assert_ollama_error, None),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "body", "check", "param"), CASES, ids=[c[0] for c in CASES])
def test_images_are_refused_by_a_model_without_vision(server, hub, path, body, check, param, stream):
    generated = sum(1 for e in hub.events if e.kind == "generated")
    r = httpx.post(server.url + path, json={"model": "m", **body, "stream": stream}, timeout=60)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json"), r.text
    if param is not None:
        check(r, 400, param, "takes no images")
    elif check is assert_anthropic_error:
        check(r, 400, "takes no images")
    else:
        check(r, 400, "takes no images")
    assert "smollm2-135m" in r.text and "1 image(s)" in r.text
    assert sum(1 for e in hub.events if e.kind == "generated") == generated  # no engine run


def test_the_listings_say_whether_a_model_takes_images(server):
    card = httpx.get(server.url + "/v1/models/smollm2-135m").json()
    assert card["capabilities"]["vision"] is False
    shown = httpx.post(server.url + "/api/show", json={"model": "smollm2-135m"}).json()
    assert "vision" not in shown["capabilities"] and "completion" in shown["capabilities"]
    props = httpx.get(server.url + "/props").json()
    assert props["modalities"] == {"vision": False, "audio": False}
