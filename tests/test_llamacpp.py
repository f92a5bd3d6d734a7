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
        ("/completion", {"prompt": [1, {"a": 1}]}, "prompt"),
        ("/completion", {"prompt": [10**9]}, "prompt"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/tokenize", {}, "content"),
        # each stop string is looked for after every token, on the thread all share
        ("/completion", {"prompt": "x", "stop": [f"s{i}" for i in range(65)]}, "stop"),
    ],
)
def test_bad_requests_are_400_in_llama_servers_shape(base_url, path, body, param):
    r = httpx.post(base_url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error" and err["message"]
    if param == "stop":
        assert "at most 64 stop strings" in err["message"]
        body["stop"] = body["stop"][:64]  # the limit itself is taken
        assert httpx.post(base_url + path, json={**body, "n_predict": 2}, timeout=60).status_code == 200


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
    # the prompt really is llama-server's repo-level FIM layout: the
    # repository marker and name, the current file's separator, then prefix
    # marker, prefix, suffix marker, suffix, middle marker
    toks = httpx.post(srv.url + "/tokenize", json={"content": "<|fim_prefix|><|fim_suffix|><|fim_middle|>"}).json()
    pre, suf, mid = toks["tokens"]

    def count(text: str) -> int:
        return len(httpx.post(srv.url + "/tokenize", json={"content": text, "parse_special": False}).json()["tokens"])

    header = 1 + count("myproject\n") + 1 + count("filename\n")
    assert out["tokens_evaluated"] == header + 3 + count(FIM_PREFIX) + count(FIM_SUFFIX)
    assert pre != suf != mid
    # the same insert through OpenAI Completions' suffix and Ollama's (the plain layout)
    comp = httpx.post(
        srv.url + "/v1/completions",
        json={"model": "qwen", "prompt": FIM_PREFIX, "suffix": FIM_SUFFIX, "max_tokens": 12, "temperature": 0},
        timeout=120,
    ).json()
    assert "a + b" in comp["choices"][0]["text"]
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
    assert gen["response"] == comp["choices"][0]["text"]


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


def test_what_editors_send_is_answered_as_llama_server_does(qwen_server):
    """llama.vim and llama.vscode: a warm-up with ``n_predict`` 0 (was a
    400), ``n_indent`` (a completion stays in its block), ``t_max_predict_ms``
    (a latency cap once a line has ended), ``response_fields`` (llama.vim
    reads ``timings/prompt_n``), ``generation_settings`` (llama.vscode reads
    its ``n_ctx`` after every answer: a TypeError without it), context past
    the window cut as llama-server cuts it (was a 400 once llama.vim's
    ring of chunks filled), a GBNF ``grammar`` and a ``json_schema`` (were
    ignored), a bare ``stop`` string and a negative temperature."""
    srv, _ = qwen_server

    def post(path: str, body: dict) -> dict:
        r = httpx.post(srv.url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    warm = {"n_predict": 0, "samplers": [], "t_max_predict_ms": 1, "response_fields": [""]}
    assert post("/infill", {"input_prefix": "def f(x):\n", "input_suffix": "", **warm}) == {}
    block = post("/completion", {"prompt": "def f():\n    x = 1\n", "n_predict": 48, "n_indent": 4, "temperature": 0})
    lines = block["content"].split("\n")
    assert block["stop_type"] == "limit" and len(lines) >= 2 and lines[-1].strip() == ""
    assert all(line.startswith("    ") for line in lines[:-1]), block["content"]
    assert block["generation_settings"]["n_ctx"] == 4096 and block["generation_settings"]["n_indent"] == 4
    capped = post(
        "/completion",
        {"prompt": "def f():\n    x = 1\n", "n_predict": 64, "t_max_predict_ms": 1, "ignore_eos": True,
         "temperature": 0},
    )  # fmt: skip
    # ended as a line ended (never mid-line), long before its budget
    assert capped["stop_type"] == "limit" and capped["tokens_predicted"] < 64 and capped["content"].endswith("\n")
    assert len(capped["content"].strip()) > 3 and capped["tokens_predicted"] > 1, (
        capped
    )  # (a whole line, not one token)
    some = post("/completion", {"prompt": "Hi", "n_predict": 2, "response_fields": ["content", "timings/prompt_n"]})
    assert set(some) == {"content", "timings/prompt_n"} and some["timings/prompt_n"] >= 1
    assert {"content", "timings"} <= set(post("/completion", {"prompt": "Hi", "n_predict": 1, "response_fields": []}))
    extra = [
        {"filename": f"f{i}.py", "text": "\n".join(f"def g{i}_{j}(): return {j}" for j in range(100))}
        for i in range(16)
    ]
    # (a large n_predict leaves little room for the context: a short prefill
    # here; the prefix's and suffix's cuts are the test below's)
    fim = post(
        "/infill",
        {"input_prefix": "def main():\n    total = ", "input_suffix": "\n", "input_extra": extra, "n_predict": 900,
         "stop": ["\n"], "temperature": 0},
    )  # fmt: skip
    assert fim["tokens_evaluated"] <= 4096 - 2048 - 2 * 900 + 64 and fim["tokens_predicted"] >= 1
    yes_no = post(
        "/completion", {"prompt": "Is the sky blue? Answer:", "n_predict": 5, "grammar": 'root ::= " yes" | " no"'}
    )
    assert yes_no["content"] in (" yes", " no")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    shaped = post("/completion", {"prompt": "JSON:", "n_predict": 24, "json_schema": schema})
    assert shaped["content"].startswith('{"a":')
    assert post("/completion", {"prompt": "x", "n_predict": 1, "grammar": ""})["tokens_predicted"] == 1  # (none)
    bad = httpx.post(srv.url + "/completion", json={"prompt": "x", "grammar": "root ::= ("}, timeout=30)
    assert bad.status_code == 400 and "grammar" in bad.json()["error"]["message"]
    words = post("/completion", {"prompt": "1 2 3", "n_predict": 12, "stop": " 6", "temperature": -1})
    assert words["stop_type"] == "word" and words["content"] == " 4 5"
    assert post("/detokenize", {}) == {"content": ""}
    # a prompt over the context: llama-server's own error, with its numbers
    over = httpx.post(srv.url + "/completion", json={"prompt": "word " * 5000, "n_predict": 4}, timeout=60)
    err = over.json()["error"]
    assert over.status_code == 400 and err["type"] == "exceed_context_size_error", err
    assert err["n_ctx"] == 4096 and err["n_prompt_tokens"] > 4096
    listed = httpx.get(srv.url + "/models", timeout=30).json()
    assert "qwen" in [m["id"] for m in listed["data"]]


def test_infill_layout_and_cut_as_llama_servers_and_always_within_the_context():
    """The arithmetic of ``/infill``'s cut (llama-server's), on a vocabulary
    of one token per character: the repository header, the files, the
    current file's separator, then prefix, the cursor line, suffix; the
    prefix's last 3/4 of a batch, the suffix's first 1/4 less the line, the
    newest context within the context less a batch and twice the answer.
    What that still leaves over the context goes (a warm-up reserves
    nothing; a long cursor line is never cut by it), oldest first."""
    from turbospark.core.request import FillIn
    from turbospark.models.prompt import fim_ids

    marks = {"pre": 1 << 20, "suf": (1 << 20) + 1, "mid": (1 << 20) + 2, "rep": (1 << 20) + 3, "sep": (1 << 20) + 4}

    class Vocab:
        model_id, max_context = "m", 4096
        fim_tokens = marks
        leading_bos = ()

        longest = 0

        def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
            Vocab.longest = max(Vocab.longest, len(text))
            return [ord(c) for c in text]

    files = [("a.py", "A" * 3000), ("b.py", "B" * 3000)]
    ids = fim_ids(Vocab(), FillIn("P" * 5000, "S" * 5000, files, "L" * 10, budget=128))  # type: ignore[arg-type]
    text = "".join(chr(t) if t < 1 << 20 else {v: k for k, v in marks.items()}[t].upper() for t in ids)
    # the newest context (b.py's end, the current file's separator) within 4096 - 2048 - 2 * 128
    assert text.endswith("SEPfilename\nPRE" + "P" * 1536 + "L" * 10 + "SUF" + "S" * (512 - 12) + "MID")
    assert ids.index(marks["pre"]) == 4096 - 2048 - 256 and marks["rep"] not in ids  # (the oldest went)
    small = fim_ids(Vocab(), FillIn("def f(", ")", [], "", budget=16))  # type: ignore[arg-type]
    assert small[:2] == [marks["rep"], ord("m")] and small[-1] == marks["mid"]
    for fill in (
        FillIn("P" * 5000, "S" * 5000, files, "", budget=0),  # a warm-up
        FillIn("P" * 5000, "S" * 5000, files, "L" * 3000, budget=1500),  # a long cursor line
        FillIn("P" * 5000, "S" * 5000, files, "", budget=-1),  # no n_predict: room for a default answer
    ):
        room = max(1, fill.budget if fill.budget >= 0 else 256)  # type: ignore[operator]
        assert len(fim_ids(Vocab(), fill)) + room <= 4096  # type: ignore[arg-type]
    # only what can be kept is tokenised (a 20 MB prefix tokenised whole took 18 s to keep 1536 tokens)
    Vocab.longest = 0
    huge = fim_ids(Vocab(), FillIn("P" * 10_000_000, "S" * 10_000_000, [("a.py", "A" * 10_000_000)], "", budget=64))  # type: ignore[arg-type]
    assert len(huge) + 64 <= 4096 and Vocab.longest <= 4096 * 32
