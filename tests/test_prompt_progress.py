"""llama-server's ``return_progress`` and ``timings_per_token`` (issue 38):
while a long prompt is prefilled, ``prompt_progress`` chunks (``total``,
``cache``, ``processed``, ``time_ms``) arrive before the first token, and
with ``timings_per_token`` every text chunk carries the engine's timings so
far, on /completion and on /v1/chat/completions; ``post_sampling_probs``,
not done here, is refused."""

from __future__ import annotations

import json

import httpx

from .support import assert_openai_error

#: about 2k tokens of prompt: several prefill chunks
LONG = "The quick brown fox jumps over the lazy dog. " * 200


def frames(url: str, body: dict) -> list[dict]:
    out = []
    with httpx.stream("POST", url, json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                out.append(json.loads(line[6:]))
    return out


def progress_then_text(chunks: list[dict], text_of) -> list[dict]:
    at = [i for i, c in enumerate(chunks) if "prompt_progress" in c]
    progress = [chunks[i]["prompt_progress"] for i in at]
    first_text = next(i for i, c in enumerate(chunks) if text_of(c))
    assert len(progress) >= 3, progress  # one per prefill chunk
    assert at[-1] < first_text  # all of them before the first token
    total = progress[0]["total"]
    assert total > 1500 and all(p["total"] == total for p in progress)
    done = [p["processed"] for p in progress]
    assert done == sorted(done) and done[-1] == total
    assert all(p["time_ms"] >= 0 and 0 <= p["cache"] <= p["processed"] for p in progress)
    return progress


def test_completion_streams_prompt_progress(base_url):
    body = {"prompt": LONG, "n_predict": 4, "stream": True, "return_progress": True}
    chunks = frames(base_url + "/completion", body)
    progress_then_text(chunks, lambda c: c.get("content") or c.get("stop"))
    plain = frames(base_url + "/completion", {**body, "return_progress": False})
    assert not any("prompt_progress" in c for c in plain)


def test_chat_streams_prompt_progress(base_url):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": LONG + " Summarise."}],
        "max_tokens": 4,
        "stream": True,
        "return_progress": True,
    }
    chunks = frames(base_url + "/v1/chat/completions", body)
    progress_then_text(chunks, lambda c: c.get("choices") and c["choices"][0]["delta"].get("content"))
    assert all(c["choices"] == [] for c in chunks if "prompt_progress" in c)


def test_text_chunks_carry_the_timings_so_far(base_url):
    completion = frames(
        base_url + "/completion",
        {"prompt": "Count: 1, 2, 3,", "n_predict": 12, "stream": True, "timings_per_token": True, "ignore_eos": True},
    )
    chat = frames(
        base_url + "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 12,
         "stream": True, "timings_per_token": True},
    )  # fmt: skip
    for chunks, has_text in (
        (completion, lambda c: c.get("content")),
        (chat, lambda c: c.get("choices") and c["choices"][0]["delta"].get("content")),
    ):
        texts = [c for c in chunks if has_text(c)]
        assert texts and all("timings" in c for c in texts), chunks
        predicted = [c["timings"]["predicted_n"] for c in texts]
        assert predicted == sorted(predicted) and 1 <= predicted[0] and predicted[-1] <= 12
        assert len({c["timings"]["prompt_n"] for c in texts}) == 1 and texts[0]["timings"]["prompt_ms"] > 0
    plain = frames(base_url + "/completion", {"prompt": "Hi", "n_predict": 3, "stream": True})
    assert not any("timings" in c for c in plain if not c.get("stop"))


def test_post_sampling_probs_is_refused(base_url):
    field = "post_sampling_probs"
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, field: True}
    r = httpx.post(base_url + "/v1/chat/completions", json=chat, timeout=60)
    assert_openai_error(r, 400, field, "not supported")
    r = httpx.post(base_url + "/completion", json={"prompt": "Hi", "n_predict": 2, field: True}, timeout=60)
    assert r.status_code == 400 and field in r.text
