"""Embeddings: the engine (own llama context, mean pooling, batching), OpenAI
``/v1/embeddings`` through the official SDK, Ollama ``/api/embed`` and
``/api/embeddings``, limits, events, and the property that an embedding
never waits behind a chat generation."""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest

from turbospark import ListObserver, Server
from turbospark.dialects import openai_embeddings as oe
from turbospark.dialects.common import BadRequest
from turbospark.engine.embedding import POOLING_MEAN, Embedder, choose_pooling, pooling_of
from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.engine.types import AdmissionError, Embeddings, EngineError
from turbospark.models.catalog import DEFAULT_MODEL, resolve_model
from turbospark.models.local import LocalBackend

from .fakes import ScriptedModel
from .support import assert_ollama_error, assert_openai_error, post_body

CAT = "The cat sat on the mat."
KITTEN = "A kitten is sleeping on the rug."
STOCKS = "Stock markets fell sharply today."
TOL = 1e-4


def vec(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def cos(a: Any, b: Any) -> float:
    a, b = vec(a), vec(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def real_model(server):
    return server.registry.models()[0].engine


def real_tokens(model: Any, text: str) -> int:
    # the vocabulary decides BOS/EOS/SEP (SmolLM2: none of them)
    return len(model.tokenize(text, True, False))


# ------------------------------------------------------------------ engine
@pytest.fixture(scope="module")
def small():
    """A second, owned copy of the model with a tiny embedding context, to
    reach the packing and length limits cheaply (closed at the end)."""
    path, _ = resolve_model(DEFAULT_MODEL)
    m = LlamaChatModel(ModelOptions(path=path, id="small", ctx=512, parallel=1, extra={"embed_ctx": 64}))
    yield m
    m.close()


def test_engine_mean_pooling_own_context(real_model):
    assert real_model.supports_embeddings is True
    emb = real_model.embedder()
    # SmolLM2 declares no pooling: MEAN, applied by llama.cpp in a context
    # that is not the chat scheduler's
    assert choose_pooling(real_model.file) == POOLING_MEAN
    assert pooling_of(emb.ctx) == POOLING_MEAN
    assert emb.ctx is not real_model.ctx
    assert emb.ctx.opts.embeddings and emb.ctx.opts.n_ubatch == emb.ctx.opts.n_ctx
    out = real_model.encode([CAT])
    assert isinstance(out, Embeddings)
    assert len(out.vectors[0]) == real_model.file.n_embd
    assert abs(np.linalg.norm(vec(out.vectors[0])) - 1) < 1e-6
    assert out.token_counts == [real_tokens(real_model, CAT)]
    # BOS / EOS only where the vocabulary asks: SmolLM2 asks for neither
    f = real_model.file
    assert f.add_bos is False
    assert emb.tokens(CAT) == f.tokenize(CAT, f.add_bos, False)
    assert f.eos not in emb.tokens(CAT) and f.bos not in emb.tokens(CAT)
    # one sequence must fit one ubatch; the whole context is usable by one input
    assert emb.max_tokens == min(real_model.max_context, 2048)


def test_engine_packs_many_inputs_in_order(small):
    emb = small.embedder()
    assert emb.max_tokens == 64
    texts = [f"sentence number {i} is about {w}" for i, w in enumerate(["cats", "dogs", "stocks"] * 7)]
    lengths = [len(small.tokenize(t, True, False)) for t in texts]
    groups = emb.plan(lengths)
    # more inputs than one decode takes: several decodes, each within limits
    assert len(groups) > 1
    assert [i for g in groups for i in g] == list(range(len(texts)))
    assert all(len(g) <= emb.max_seqs and sum(lengths[i] for i in g) <= emb.max_tokens for g in groups)
    batched = small.encode(texts)
    assert batched.token_counts == lengths
    for i in (0, 5, len(texts) - 1):
        single = small.encode([texts[i]]).vectors[0]
        assert np.abs(vec(batched.vectors[i]) - vec(single)).max() < TOL


def test_engine_refuses_too_long_input_with_numbers(small):
    text = "word " * 100
    n = len(small.tokenize(text, True, False))
    with pytest.raises(AdmissionError) as exc:
        small.encode(["short", text])
    msg = str(exc.value)
    assert f"input[1] is {n} tokens" in msg and "64 tokens" in msg
    with pytest.raises(AdmissionError):
        small.encode([])


def test_engine_truncates_at_the_end_when_asked(small):
    text = "word " * 100
    cut = small.encode(["short", text], truncate=True)
    assert cut.token_counts[1] == 64 == small.embedder().max_tokens
    # the cut input embeds as its own first 64 tokens do
    toks = small.tokenize(text, True, False)[:64]
    assert small.embedder().admit([text], truncate=True) == [toks]
    assert abs(np.linalg.norm(vec(cut.vectors[1])) - 1) < 1e-6


def test_engine_close_frees_the_embedder():
    path, _ = resolve_model(DEFAULT_MODEL)
    m = LlamaChatModel(ModelOptions(path=path, id="closing", ctx=256, parallel=1, extra={"embed_ctx": 32}))
    assert m._embedder is None  # lazily created
    m.encode(["hello"])
    emb = m._embedder
    assert emb is not None and emb.ctx.ptr is not None
    m.close()
    assert emb.ctx.ptr is None
    with pytest.raises(EngineError):
        m.encode(["hello"])


def test_embedder_direct_on_model_file(real_model):
    e = Embedder(real_model.file, n_ctx=128, n_seq_max=2, threads=1)
    try:
        a = e.encode([CAT, KITTEN, STOCKS])  # 3 inputs, 2 per decode
        b = real_model.encode([CAT, KITTEN, STOCKS])
        for x, y in zip(a.vectors, b.vectors):
            assert np.abs(vec(x) - vec(y)).max() < TOL
    finally:
        e.close()


# ------------------------------------------------------------------ dialect (pure)
def test_fit_dimensions_and_base64_roundtrip():
    v = vec([3.0, 4.0, 12.0]) / 13.0
    cut = oe.fit_dimensions(v.tolist(), 2)
    assert np.allclose(cut, [0.6, 0.8])
    assert np.allclose(oe.fit_dimensions(v.tolist(), None), v)
    with pytest.raises(BadRequest):
        oe.fit_dimensions(v.tolist(), 4)
    raw = base64.b64decode(oe.to_base64(v))
    assert len(raw) == 12  # float32
    assert np.allclose(np.frombuffer(raw, dtype="<f4"), v, atol=1e-7)


# ------------------------------------------------------------------ OpenAI SDK
def test_sdk_float_and_base64_agree_unit_norm(oai, real_model):
    f = oai.embeddings.create(model="text-embedding-3-small", input=CAT, encoding_format="float")
    assert f.object == "list" and f.model == "text-embedding-3-small"
    assert len(f.data) == 1 and f.data[0].index == 0 and f.data[0].object == "embedding"
    fv = vec(f.data[0].embedding)
    assert fv.shape == (real_model.file.n_embd,)
    assert abs(np.linalg.norm(fv) - 1) < 1e-6
    b = oai.embeddings.create(model="text-embedding-3-small", input=CAT, encoding_format="base64")
    assert isinstance(b.data[0].embedding, str)
    bv = np.frombuffer(base64.b64decode(b.data[0].embedding), dtype="<f4")
    assert np.abs(bv - fv).max() < 1e-6
    # no encoding_format: the SDK asks for base64 and decodes it itself
    d = oai.embeddings.create(model="text-embedding-3-small", input=CAT)
    assert np.abs(vec(d.data[0].embedding) - fv).max() < 1e-6
    n = real_tokens(real_model, CAT)
    assert f.usage.prompt_tokens == n and f.usage.total_tokens == n


def test_sdk_dimensions_truncate_and_renormalise(oai):
    full = vec(oai.embeddings.create(model="m", input=KITTEN, encoding_format="float").data[0].embedding)
    for dims in (1, 64, 256):
        r = oai.embeddings.create(model="m", input=KITTEN, dimensions=dims, encoding_format="float")
        v = vec(r.data[0].embedding)
        assert v.shape == (dims,)
        assert abs(np.linalg.norm(v) - 1) < 1e-6
        assert np.abs(v - full[:dims] / np.linalg.norm(full[:dims])).max() < 1e-6
    b = oai.embeddings.create(model="m", input=KITTEN, dimensions=64, encoding_format="base64")
    assert len(base64.b64decode(b.data[0].embedding)) == 64 * 4


def test_sdk_batch_in_order_equals_singles_and_usage(oai, real_model):
    texts = [CAT, "hello", KITTEN, "a much longer sentence about the weather in spring", STOCKS]
    r = oai.embeddings.create(model="m", input=texts, encoding_format="float")
    assert [d.index for d in r.data] == list(range(len(texts)))
    for i, t in enumerate(texts):
        single = oai.embeddings.create(model="m", input=t, encoding_format="float").data[0].embedding
        assert np.abs(vec(r.data[i].embedding) - vec(single)).max() < TOL, t
    expected = sum(real_tokens(real_model, t) for t in texts)
    assert r.usage.prompt_tokens == expected and r.usage.total_tokens == expected


def test_semantically_closer_texts_are_more_similar(oai):
    r = oai.embeddings.create(model="m", input=[CAT, KITTEN, STOCKS], encoding_format="float")
    cat, kitten, stocks = (d.embedding for d in r.data)
    assert cos(cat, kitten) > cos(cat, stocks) + 0.05
    assert cos(cat, kitten) > cos(kitten, stocks)


def test_events_routed_not_streamed_no_generated(oai, hub, real_model):
    raw = oai.embeddings.with_raw_response.create(model="asked-name", input=["a", "b"], encoding_format="float")
    rid = raw.headers["x-request-id"]
    hub.wait_kind(rid, "requestFinished")
    kinds = [e.kind for e in hub.of(rid)]
    assert kinds == ["requestStarted", "requestRouted", "requestFinished"]
    started, routed, finished = hub.of(rid)
    assert started.method == "POST" and started.path == "/v1/embeddings"
    assert routed.stream is False
    assert routed.requested == "asked-name" and routed.served == real_model.model_id
    assert finished.status == 200 and finished.error is None
    assert raw.parse().model == "asked-name"


def test_bare_embeddings_path(base_url):
    r = httpx.post(base_url + "/embeddings", json={"input": "hi"}, timeout=60)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert body["model"]  # the served model when none was requested
    assert isinstance(body["data"][0]["embedding"], list)


# ------------------------------------------------------------------ OpenAI errors
def post(base_url: str, body: Any, path: str = "/v1/embeddings") -> httpx.Response:
    return post_body(base_url + path, body)


@pytest.mark.parametrize(
    "body, param, contains",
    [
        (b"{oops", None, "malformed JSON"),
        (b"[]", None, "JSON object"),
        ({"model": "m"}, "input", "missing"),
        ({"model": "m", "input": []}, "input", "empty list"),
        ({"model": "m", "input": ""}, "input", "empty string"),
        ({"model": "m", "input": ["ok", ""]}, "input[1]", "empty string"),
        ({"model": "m", "input": 5}, "input", ""),
        ({"model": "m", "input": ["ok", 5]}, "input[1]", "must be a string"),
        ({"model": "m", "input": [1, 2, 3]}, "input", "token-id arrays"),
        ({"model": "m", "input": [[1, 2], [3]]}, "input", "token-id arrays"),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions", ""),
        ({"model": "m", "input": "x", "dimensions": -3}, "dimensions", ""),
        ({"model": "m", "input": "x", "dimensions": "8"}, "dimensions", ""),
        ({"model": "m", "input": "x", "dimensions": 100000}, "dimensions", "576"),
        ({"model": "m", "input": "x", "encoding_format": "binary"}, "encoding_format", ""),
        ({"model": 3, "input": "x"}, "model", ""),
        ({"model": "m", "input": "x", "user": 7}, "user", ""),
    ],
)
def test_bad_bodies_are_400_in_openai_shape(base_url, body, param, contains):
    assert_openai_error(post(base_url, body), 400, param, contains)


def test_limits_inputs_count_and_bytes(base_url):
    err = assert_openai_error(post(base_url, {"input": ["a"] * 2049}), 400, "input", "2048")
    assert "2049" in err["message"]
    big = "x" * (600 * 1024)
    err = assert_openai_error(post(base_url, {"input": [big, big]}), 400, "input", "1 MiB")
    # exactly at the count limit passes the count: the request fails only at
    # its last input, checked after the count (embedding 2048 inputs costs 14 s)
    err = assert_openai_error(post(base_url, {"input": ["a"] * 2047 + [""]}), 400, "input[2047]", "empty")
    assert "2048" not in err["message"]
    r = post(base_url, {"input": ["a"] * 100, "dimensions": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 100 and r.json()["usage"]["prompt_tokens"] == 100


def test_too_long_input_is_400_with_numbers_never_truncated(base_url, real_model):
    text = "word " * 3000
    n = real_tokens(real_model, text)
    limit = real_model.embedder().max_tokens
    err = assert_openai_error(post(base_url, {"input": ["fine", text]}), 400, "input")
    assert str(n) in err["message"] and str(limit) in err["message"]


def test_sdk_raises_bad_request(oai):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.embeddings.create(model="m", input=[], encoding_format="float")
    assert exc.value.status_code == 400


# ------------------------------------------------------------------ Ollama
def test_ollama_client_embed(base_url, real_model):
    c = ollama.Client(host=base_url)
    r = c.embed(model="smollm2:latest", input=[CAT, KITTEN, STOCKS])
    assert r.model == "smollm2:latest"
    assert len(r.embeddings) == 3
    for v in r.embeddings:
        assert len(v) == real_model.file.n_embd
        assert abs(np.linalg.norm(vec(v)) - 1) < 1e-6
    assert r.prompt_eval_count == sum(real_tokens(real_model, t) for t in (CAT, KITTEN, STOCKS))
    assert r.total_duration > 0 and r.load_duration == 0
    assert cos(r.embeddings[0], r.embeddings[1]) > cos(r.embeddings[0], r.embeddings[2])
    one = c.embed(model="smollm2", input=CAT, dimensions=32)
    assert len(one.embeddings) == 1 and len(one.embeddings[0]) == 32
    assert abs(np.linalg.norm(vec(one.embeddings[0])) - 1) < 1e-6
    full = vec(r.embeddings[0])
    assert np.abs(vec(one.embeddings[0]) - full[:32] / np.linalg.norm(full[:32])).max() < 1e-5


def test_ollama_legacy_embeddings_raw_and_client(base_url, oai):
    r = httpx.post(base_url + "/api/embeddings", json={"model": "smollm2", "prompt": CAT}, timeout=60)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"embedding"}
    ref = oai.embeddings.create(model="m", input=CAT, encoding_format="float").data[0].embedding
    assert np.abs(vec(body["embedding"]) - vec(ref)).max() < TOL
    via_client = ollama.Client(host=base_url).embeddings(model="smollm2", prompt=CAT)
    assert np.abs(vec(via_client.embedding) - vec(ref)).max() < TOL


def test_ollama_empty_input_loads_and_returns_nothing(base_url, hub):
    r = httpx.post(base_url + "/api/embed", json={"model": "smollm2", "input": []}, timeout=60)
    assert r.status_code == 200
    assert r.json()["embeddings"] == [] and r.json()["prompt_eval_count"] == 0
    rid = r.headers["x-request-id"]
    routed = hub.wait_kind(rid, "requestRouted")
    assert routed.stream is False
    r = httpx.post(base_url + "/api/embeddings", json={"model": "smollm2", "prompt": ""}, timeout=60)
    assert r.status_code == 200 and r.json() == {"embedding": []}


def test_ollama_embed_truncates_long_input_by_default(server, small):
    # served by the model with a 64-token embedding context, attached for
    # this test: cutting at the default model's 2048 tokens costs 17 s here
    server.registry.attach(LocalBackend(small))
    try:
        base_url = server.url
        long = "word " * 300
        limit = small.embedder().max_tokens
        assert limit == 64
        c = ollama.Client(host=base_url)
        r = c.embed(model="small", input=[CAT, long])
        assert len(r.embeddings) == 2
        assert r.prompt_eval_count == real_tokens(small, CAT) + limit
        # the cut input is embedded as its first 64 tokens
        head = small.encode([long], truncate=True).vectors[0]
        assert cos(r.embeddings[1], head) > 0.9999
        with pytest.raises(ollama.ResponseError) as exc:
            c.embed(model="small", input=[long], truncate=False)
        assert exc.value.status_code == 400 and str(limit) in str(exc.value)
        # the legacy endpoint has no truncate option: over-long is refused
        r = httpx.post(base_url + "/api/embeddings", json={"model": "small", "prompt": long}, timeout=60)
        assert r.status_code == 400 and "tokens" in r.json()["error"]
    finally:
        server.registry.detach("small")


@pytest.mark.parametrize(
    "path, body, contains",
    [
        ("/api/embed", b"{nope", "malformed JSON"),
        ("/api/embed", {"model": "smollm2", "input": 5}, "input"),
        ("/api/embed", {"model": "smollm2", "input": ["a", 3]}, "input[1]"),
        ("/api/embed", {"model": "smollm2", "input": ["a", ""]}, "empty string"),
        ("/api/embed", {"model": "smollm2", "input": "x", "dimensions": 0}, "dimensions"),
        ("/api/embed", {"model": "smollm2", "input": "x", "dimensions": 5000}, "576"),
        ("/api/embed", {"model": "smollm2", "input": "x", "truncate": "yes"}, "truncate"),
        ("/api/embed", {"model": "smollm2", "input": "word " * 3000, "truncate": False}, "tokens"),
        ("/api/embeddings", {"model": "smollm2", "prompt": 12}, "prompt"),
        ("/api/embeddings", b"", "empty"),
    ],
)
def test_ollama_errors_in_ollama_shape(base_url, path, body, contains):
    assert_ollama_error(post(base_url, body, path), 400, contains)


def test_ollama_client_raises_response_error(base_url):
    with pytest.raises(ollama.ResponseError) as exc:
        ollama.Client(host=base_url).embed(model="smollm2", input="fine", dimensions=5000)
    assert exc.value.status_code == 400 and "576" in str(exc.value)


# ------------------------------------------------------------------ never behind chat
def test_embedding_completes_while_a_long_chat_stream_runs(oai):
    marks: dict[str, float] = {}
    chunk_times: list[float] = []
    first = threading.Event()
    errors: list[BaseException] = []

    def chat() -> None:
        try:
            s = oai.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "Tell me a long story."}],
                max_tokens=300,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for chunk in s:
                if chunk.choices and chunk.choices[0].delta.content:
                    chunk_times.append(time.monotonic())
                    first.set()
            marks["chat_done"] = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
            first.set()

    t = threading.Thread(target=chat)
    t.start()
    assert first.wait(120), "the chat stream never started"
    r = oai.embeddings.create(model="m", input=[CAT, KITTEN], encoding_format="float")
    marks["embed_done"] = time.monotonic()
    t.join(300)
    assert not errors, errors
    assert len(r.data) == 2
    assert marks["embed_done"] < marks["chat_done"]
    # the chat was still producing tokens after the embedding was answered
    assert any(ts > marks["embed_done"] for ts in chunk_times)


# ------------------------------------------------------------------ routing (fakes)
@dataclass
class FakeEmbedModel(ScriptedModel):
    """Embeds every text as a fixed unit vector; notes the calling thread."""

    supports_embeddings: bool = True
    delay: float = 0.0
    threads: list[str] | None = None

    def encode(self, texts: list[str], truncate: bool = False) -> Embeddings:  # type: ignore[override]
        if self.threads is not None:
            self.threads.append(threading.current_thread().name)
        time.sleep(self.delay)
        return Embeddings([[0.6, 0.8, 0.0] for _ in texts], [len(t.split()) for t in texts])


def test_no_embedding_model_is_503_in_each_shape():
    with Server(models=[ScriptedModel(model_id="chat-only")]) as srv:
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": "x"}, timeout=30)
        assert_openai_error(r, 503, "model", "embeddings")
        r = httpx.post(srv.url + "/api/embed", json={"model": "x", "input": "x"}, timeout=30)
        assert r.status_code == 503 and "embeddings" in r.json()["error"]


def test_routes_to_the_capable_model_off_the_event_loop():
    obs = ListObserver()
    emb = FakeEmbedModel(model_id="emb", delay=1.0, threads=[])
    with Server(models=[ScriptedModel(model_id="chat-only"), emb], observer=obs) as srv:
        result: dict[str, Any] = {}

        def call() -> None:
            result["r"] = httpx.post(
                srv.url + "/v1/embeddings", json={"model": "gpt-x", "input": "one two"}, timeout=30
            )

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.3)
        # the loop still answers while encode sleeps in its worker thread
        t0 = time.monotonic()
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 0.5
        t.join(30)
    r = result["r"]
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 2 and r.json()["model"] == "gpt-x"
    assert emb.threads and emb.threads[0] != "turbospark-http"
    routed = [e for e in obs.events if e.kind == "requestRouted"]
    assert routed[0].requested == "gpt-x" and routed[0].served == "emb" and routed[0].stream is False
    assert not [e for e in obs.events if e.kind == "generated"]
