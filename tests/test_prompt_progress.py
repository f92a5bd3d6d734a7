"""llama-server's ``return_progress`` and ``timings_per_token`` (issue 38):
while a long prompt is prefilled, ``prompt_progress`` chunks (``total``,
``cache``, ``processed``, ``time_ms``) arrive before the first token, and
with ``timings_per_token`` every text chunk carries the engine's timings so
far, on /completion and on /v1/chat/completions; ``post_sampling_probs``
gives the selection's probabilities."""

from __future__ import annotations

import json

import httpx

#: about 1.6k tokens of prompt (SmolLM2: 1601 as a completion): several
#: prefill chunks, and past the 1500 the checks ask for (every token more is
#: prefill time)
LONG = "The quick brown fox jumps over the lazy dog. " * 160


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


def test_post_sampling_probs_are_the_selections_probabilities(base_url):
    """With ``post_sampling_probs``, ``n_probs`` entries are probabilities of
    what the selection left (top-k 2 here: at most two, summing to 1), not
    the model's log-probabilities; a greedy pick is certain."""
    body = {"prompt": "Count: 1, 2, 3,", "n_predict": 6, "n_probs": 5, "temperature": 0.8, "top_k": 2, "seed": 7}
    post = httpx.post(base_url + "/completion", json={**body, "post_sampling_probs": True}, timeout=60).json()
    for entry in post["completion_probabilities"]:
        assert "logprob" not in entry and 0.0 < entry["prob"] <= 1.0
        assert 1 <= len(entry["top_probs"]) <= 2 and abs(sum(t["prob"] for t in entry["top_probs"]) - 1.0) < 1e-3
        assert entry["prob"] == next(t["prob"] for t in entry["top_probs"] if t["id"] == entry["id"])
    assert post["generation_settings"]["post_sampling_probs"] is True
    raw = httpx.post(base_url + "/completion", json=body, timeout=60).json()
    assert all(len(e["top_logprobs"]) == 5 and e["logprob"] <= 0 for e in raw["completion_probabilities"])
    greedy = {**body, "temperature": 0, "post_sampling_probs": True}
    certain = httpx.post(base_url + "/completion", json=greedy, timeout=60).json()["completion_probabilities"]
    assert all(e["prob"] == 1.0 for e in certain)
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "logprobs": True,
        "top_logprobs": 3,
        "top_k": 2,
        "post_sampling_probs": True,
    }
    content = httpx.post(base_url + "/v1/chat/completions", json=chat, timeout=60).json()["choices"][0]["logprobs"]
    assert content["content"] and all("prob" in e and len(e["top_probs"]) <= 2 for e in content["content"])


def test_chat_with_timings_carries_its_generation_settings(base_url):
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0.3}
    plain = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60).json()
    assert "generation_settings" not in plain and "timings" not in plain  # (OpenAI's shape unless asked)
    answer = httpx.post(base_url + "/v1/chat/completions", json={**body, "timings": True}, timeout=60).json()
    settings = answer["generation_settings"]
    assert settings["n_ctx"] > 0 and settings["temperature"] == 0.3 and settings["n_predict"] == 3
    last = [
        c for c in frames(base_url + "/v1/chat/completions", {**body, "timings": True, "stream": True}) if c["choices"]
    ]
    assert last[-1]["generation_settings"]["stream"] is True and last[-1]["timings"]["predicted_n"] >= 1
