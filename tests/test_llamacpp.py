"""llama.cpp server's native API as a sixth dialect (issue 14 point 9), on
the real models: ``/completion`` streamed and not, ``/infill`` with Qwen's
FIM tokens, the tokenizer round trip, ``/apply-template``, ``/props``,
``/embedding``, and errors in llama-server's shape. Also FIM through the
other dialects' ``suffix`` (point 11)."""

from __future__ import annotations

import json

import httpx
import pytest

COUNTING = "1, 2, 3, 4, 5, 6,"
FIM_PREFIX = "def add(a, b):\n    "
FIM_SUFFIX = "\n\nprint(add(2, 3))\n"


def sse_datas(text: str) -> list[dict]:
    out = []
    for frame in text.split("\n\n"):
        for line in frame.split("\n"):
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def test_completion_answers_llama_servers_shape_with_engine_counts(base_url, hub):
    r = httpx.post(
        base_url + "/completion",
        json={"prompt": COUNTING, "n_predict": 6, "temperature": 0, "cache_prompt": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stop"] is True and body["stop_type"] == "limit" and body["tokens_predicted"] == 6
    assert body["content"] and "7" in body["content"]
    assert (
        body["timings"]["predicted_n"] == 6
        and body["timings"]["prompt_n"] + body["tokens_cached"] == (body["tokens_evaluated"])
    )
    gen = hub.wait_kind(r.headers["x-request-id"], "generated")
    assert gen.new_tokens == 6 and gen.prompt_tokens == body["tokens_evaluated"]


def test_completion_streams_pieces_then_a_stop_frame(base_url):
    with httpx.stream(
        "POST", base_url + "/completion", json={"prompt": COUNTING, "n_predict": 8, "temperature": 0, "stream": True}
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = sse_datas(r.read().decode())
    assert all(f["stop"] is False for f in frames[:-1]) and frames[-1]["stop"] is True
    assert frames[-1]["tokens_predicted"] == 8 and "timings" in frames[-1]
    streamed = "".join(f["content"] for f in frames)
    plain = httpx.post(
        base_url + "/completion", json={"prompt": COUNTING, "n_predict": 8, "temperature": 0}, timeout=60
    ).json()
    assert streamed == plain["content"]  # greedy: the same text either way


def test_completion_takes_token_ids_and_stop_words(base_url):
    ids = httpx.post(base_url + "/tokenize", json={"content": COUNTING}, timeout=30).json()["tokens"]
    by_text = httpx.post(
        base_url + "/completion", json={"prompt": COUNTING, "n_predict": 6, "temperature": 0}, timeout=60
    ).json()
    by_ids = httpx.post(
        base_url + "/completion", json={"prompt": ids, "n_predict": 6, "temperature": 0}, timeout=60
    ).json()
    assert by_ids["content"] == by_text["content"]
    stopped = httpx.post(
        base_url + "/completion",
        json={"prompt": COUNTING, "n_predict": 20, "temperature": 0, "stop": ["9"]},
        timeout=60,
    ).json()
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == "9" and "9" not in stopped["content"]


def test_tokenize_detokenize_round_trip_with_pieces(base_url):
    text = "Hello, llama.cpp world! ünïcödé"
    toks = httpx.post(base_url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
    assert toks and all(isinstance(t, int) for t in toks)
    back = httpx.post(base_url + "/detokenize", json={"tokens": toks}, timeout=30).json()["content"]
    assert back == text
    pieces = httpx.post(base_url + "/tokenize", json={"content": "Hello", "with_pieces": True}, timeout=30).json()
    assert "".join(p["piece"] for p in pieces["tokens"]) == "Hello"


def test_apply_template_props_and_embedding(base_url):
    prompt = httpx.post(
        base_url + "/apply-template", json={"messages": [{"role": "user", "content": "Hi there"}]}, timeout=30
    ).json()["prompt"]
    assert "Hi there" in prompt and "<|im_start|>" in prompt  # SmolLM2's ChatML
    props = httpx.get(base_url + "/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] > 0 and props["total_slots"] >= 1
    assert "im_start" in props["chat_template"]
    emb = httpx.post(base_url + "/embedding", json={"content": ["a cat", "a dog"]}, timeout=60).json()
    assert [e["index"] for e in emb] == [0, 1] and len(emb[0]["embedding"][0]) > 0


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/completion", {"prompt": "x", "n_predict": "ten"}, "n_predict"),
        ("/completion", {"prompt": "x", "n_probs": 21}, "n_probs"),
        ("/completion", {"prompt": [1, "a"]}, "prompt"),
        ("/completion", {"prompt": [10**9]}, "prompt"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/tokenize", {}, "content"),
    ],
)
def test_bad_requests_are_400_in_llama_servers_shape(base_url, path, body, param):
    r = httpx.post(base_url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error" and err["message"]


def test_infill_on_a_model_without_fim_tokens_is_a_400_saying_so(base_url):
    r = httpx.post(base_url + "/infill", json={"input_prefix": "a", "input_suffix": "b"}, timeout=30)
    assert r.status_code == 400 and "no fill-in-the-middle tokens" in r.json()["error"]["message"]


def test_unknown_llamacpp_body_is_shaped_even_when_malformed(base_url):
    r = httpx.post(base_url + "/infill", content=b'{"input_prefix": ', timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == 400


def test_infill_fills_the_middle_with_qwens_fim_tokens(qwen_server):
    srv, events = qwen_server
    body = {"input_prefix": FIM_PREFIX, "input_suffix": FIM_SUFFIX, "n_predict": 12, "temperature": 0}
    r = httpx.post(srv.url + "/infill", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert "return" in out["content"] and "a + b" in out["content"], out["content"]
    # the prompt really is the FIM layout: prefix marker, prefix, suffix marker, suffix, middle marker
    toks = httpx.post(srv.url + "/tokenize", json={"content": "<|fim_prefix|><|fim_suffix|><|fim_middle|>"}).json()
    pre, suf, mid = toks["tokens"]
    n_prefix = len(
        httpx.post(srv.url + "/tokenize", json={"content": FIM_PREFIX, "parse_special": False}).json()["tokens"]
    )
    n_suffix = len(
        httpx.post(srv.url + "/tokenize", json={"content": FIM_SUFFIX, "parse_special": False}).json()["tokens"]
    )
    assert out["tokens_evaluated"] == 3 + n_prefix + n_suffix
    assert pre != suf != mid
    # the same insert through OpenAI Completions' suffix and Ollama's
    comp = httpx.post(
        srv.url + "/v1/completions",
        json={"model": "qwen", "prompt": FIM_PREFIX, "suffix": FIM_SUFFIX, "max_tokens": 12, "temperature": 0},
        timeout=120,
    ).json()
    assert comp["choices"][0]["text"] == out["content"]
    gen = httpx.post(
        srv.url + "/api/generate",
        json={
            "model": "qwen",
            "prompt": FIM_PREFIX,
            "suffix": FIM_SUFFIX,
            "stream": False,
            "options": {"num_predict": 12, "temperature": 0},
        },
        timeout=120,
    ).json()
    assert gen["response"] == out["content"]


def test_infill_with_extra_files_and_a_streamed_answer(qwen_server):
    srv, _ = qwen_server
    body = {
        "input_extra": [{"filename": "util.py", "text": "def twice(x):\n    return 2 * x\n"}],
        "input_prefix": "from util import twice\n\nprint(",
        "input_suffix": ")\n",
        "n_predict": 8,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", srv.url + "/infill", json=body, timeout=120) as r:
        frames = sse_datas(r.read().decode())
    assert frames[-1]["stop"] is True and frames[-1]["tokens_predicted"] >= 1
    assert "".join(f["content"] for f in frames)
