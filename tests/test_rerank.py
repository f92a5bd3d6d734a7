"""Rerank (issue 45) on a real reranker: the generated BERT cross-encoder
(``tests/reranker.py``: random weights, so its rankings are arbitrary and
the tests check the contract) through a real server on loopback, in the
Jina / llama-server shape (``/v1/rerank``, ``/rerank``, ``/v1/reranking``)
and Cohere's v2 (``/v2/rerank``, with the ``cohere`` SDK and LangChain's
``CohereRerank``); the bad inputs each shape answers; the listings; the
``ranked`` event, the fold and Prometheus; loading a reranker (detected
from the file, ``--rerank``, ``kind = "rerank"``); a rerank template."""

from __future__ import annotations

import concurrent.futures
import math
import time

import httpx
import pytest

from turbospark import ListObserver, Server
from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.engine.types import AdmissionError, CancelFlag, EngineError

from .reranker import CLS, SEP, write_reranker

QUERY = "where do cats sleep"
DOCS = [
    "cats sleep on the mat",
    "stock markets fell as rates rose",
    "paris is the capital of france",
    "a kitten sat in the sun",
    "python code for a web server",
    "the dog and the cat",
]
#: scores from batched and lone decodes differ this much at most (the issue's bound)
BATCH_TOL = 5e-3
MAX_DOCS = 40
MAX_BODY = 64 << 10


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_reranker(tmp_path_factory.mktemp("rr") / "tiny-reranker.gguf")


@pytest.fixture(scope="module")
def rr(gguf):
    """A server whose one model is the tiny reranker (detected from its
    header: its kind is left as chat): ``(server, events)``."""
    events = ListObserver()
    opts = ModelOptions(path=str(gguf), id="rr", threads=1)
    with Server(models=[opts], observer=events, max_rerank_documents=MAX_DOCS, max_body=MAX_BODY) as srv:
        yield srv, events


def post(srv, path: str, body) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def rid(r: httpx.Response) -> int:
    return int(r.headers["x-request-id"])


def wait_events(events: ListObserver, request: int, kind: str) -> list:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [e for e in list(events.events) if getattr(e, "id", None) == request]
        if any(e.kind == kind for e in found):
            return found
        time.sleep(0.01)
    raise AssertionError(f"no {kind} for request {request}")


def scores_of(srv, docs: list, query: str = QUERY) -> list[float]:
    """Each document's score, in the documents' order."""
    body = post(srv, "/v1/rerank", {"query": query, "documents": docs}).json()
    out = [math.nan] * len(docs)
    for item in body["results"]:
        out[item["index"]] = item["relevance_score"]
    return out


# ------------------------------------------------------------ shapes
def test_jina_shape_orders_by_score_with_the_input_indexes(rr):
    srv, _ = rr
    docs = [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]
    answers = [
        post(srv, path, {"model": "asked", "query": QUERY, "documents": docs})
        for path in ("/v1/rerank", "/rerank", "/v1/reranking")
    ]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    body = answers[0].json()
    assert body["model"] == "asked" and body["object"] == "list"
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(DOCS)
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert len(set(round(s, 2) for s in scores)) > 2  # (random weights, yet not all one score)
    assert all(set(r) == {"index", "relevance_score"} for r in results)  # no documents unless asked
    assert [a.json()["results"] for a in answers[1:]] == [results, results]  # the same engine, the same numbers


def test_top_n_and_return_documents(rr):
    srv, _ = rr
    whole = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCS}).json()["results"]
    top = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True}).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in whole[:2]]
    assert all(r["document"] == {"text": DOCS[r["index"]]} for r in top["results"])
    more = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 100}).json()
    assert len(more["results"]) == len(DOCS)


def test_scores_are_deterministic_and_batching_does_not_change_them(rr):
    srv, _ = rr
    docs = [f"{d} {w}" for d in DOCS for w in ("today", "in paris", "and the bank")][:MAX_DOCS]
    batched = scores_of(srv, docs)
    assert scores_of(srv, docs) == batched
    alone = [scores_of(srv, [d])[0] for d in docs[:8]]
    assert max(abs(a - b) for a, b in zip(alone, batched)) <= BATCH_TOL
    # several requests at once share the engine's steps, and get their own numbers
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda d: scores_of(srv, [d, *DOCS]), docs[:8]))
    assert max(abs(t[0] - a) for t, a in zip(together, alone)) <= BATCH_TOL


def test_cohere_v2_sdk(rr):
    import cohere

    srv, _ = rr
    client = cohere.ClientV2(api_key="unused", base_url=srv.url, timeout=60)
    got = client.rerank(model="rr", query=QUERY, documents=DOCS, top_n=3)
    jina = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCS}).json()["results"]
    assert [r.index for r in got.results] == [r["index"] for r in jina[:3]]
    for mine, raw in zip(got.results, jina):
        assert 0.0 < mine.relevance_score < 1.0  # Cohere's range: the logit through the logistic function
        assert mine.relevance_score == pytest.approx(1 / (1 + math.exp(-raw["relevance_score"])), abs=1e-6)
    assert got.meta.billed_units.search_units == 1
    assert got.meta.tokens.input_tokens > len(DOCS)


def test_langchain_cohere_reranker(rr):
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    srv, _ = rr
    reranker = CohereRerank(model="rr", cohere_api_key="unused", base_url=srv.url, top_n=2)
    kept = reranker.compress_documents([Document(page_content=d) for d in DOCS], QUERY)
    jina = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCS}).json()["results"]
    assert [d.page_content for d in kept] == [DOCS[r["index"]] for r in jina[:2]]
    assert kept[0].metadata["relevance_score"] >= kept[1].metadata["relevance_score"]


# ------------------------------------------------------------ pairs over the context
def test_a_pair_over_the_context_is_a_400_or_cut_when_asked(rr):
    srv, events = rr
    long = "word " * 300  # 1200 tokens: the reranker's context is 256
    r = post(srv, "/v1/rerank", {"query": QUERY, "documents": ["a cat", long]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == 400 and "documents[1]" in err["message"] and "256" in err["message"]
    r = post(srv, "/v1/rerank", {"query": QUERY, "documents": ["a cat", long], "truncate": True})
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    ranked = next(e for e in wait_events(events, rid(r), "ranked") if e.kind == "ranked")
    assert ranked.truncated == 1
    # Cohere cuts as Cohere does: every document to max_tokens_per_doc, a pair still too long to fit
    v2 = post(srv, "/v2/rerank", {"model": "rr", "query": QUERY, "documents": ["a cat", long]})
    assert v2.status_code == 200
    short = post(srv, "/v2/rerank", {"query": QUERY, "documents": [long], "max_tokens_per_doc": 3}).json()
    head = post(srv, "/v2/rerank", {"query": QUERY, "documents": ["word"]}).json()  # "word": 4 pieces
    assert short["meta"]["tokens"]["input_tokens"] == head["meta"]["tokens"]["input_tokens"] - 1


def test_a_query_with_no_room_left_is_a_400(rr):
    srv, _ = rr
    r = post(srv, "/v1/rerank", {"query": "word " * 100, "documents": ["a cat"], "truncate": True})
    assert r.status_code == 400 and "query" in r.json()["error"]["message"]


# ------------------------------------------------------------ bad input
BAD = [
    ({"query": "", "documents": ["a"]}, "'query' is empty"),
    ({"query": "  ", "documents": ["a"]}, "'query' is empty"),
    ({"query": QUERY, "documents": []}, "'documents' is empty"),
    ({"query": QUERY}, "'documents' is empty"),
    ({"query": QUERY, "documents": ["a", 3]}, "'documents[1]' must be a string"),
    ({"query": QUERY, "documents": [{"image": "http://x/y.png"}]}, "'documents[0]' must be a string"),
    ({"query": QUERY, "documents": ["a"] * (MAX_DOCS + 1)}, f"at most {MAX_DOCS}"),
    ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": 7, "documents": ["a"]}, "query"),
    ({"query": QUERY, "texts": ["a"]}, "'texts'"),
]


@pytest.mark.parametrize(("body", "says"), BAD)
def test_bad_input_is_a_400_in_each_shape(rr, body, says):
    srv, _ = rr
    jina = post(srv, "/v1/rerank", body)
    assert jina.status_code == 400 and says in jina.json()["error"]["message"], jina.text
    if "texts" in body:
        return
    v2 = post(srv, "/v2/rerank", body)
    assert v2.status_code == 400 and set(v2.json()) == {"message"} and says in v2.json()["message"], v2.text


def test_cohere_refuses_what_it_cannot_honour_and_bodies_over_the_limit(rr):
    srv, _ = rr
    r = post(srv, "/v2/rerank", {"query": QUERY, "documents": ["a"], "priority": 2})
    assert r.status_code == 400 and "priority" in r.json()["message"]
    r = post(srv, "/v2/rerank", {"query": QUERY, "documents": ["a"], "return_documents": True})
    assert r.status_code == 400 and "return_documents" in r.json()["message"]
    big = {"query": QUERY, "documents": ["x" * 1000] * 80}  # 80 kB: over the server's 64 KiB
    for path, shape in (("/v1/rerank", "error"), ("/v2/rerank", "message")):
        r = post(srv, path, big)
        assert r.status_code == 413 and shape in r.json(), r.text


def test_chat_to_a_reranker_and_rerank_to_a_chat_model_are_400s(rr, server):
    srv, _ = rr
    r = post(srv, "/v1/chat/completions", {"model": "rr", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported"
    assert "reranker" in r.json()["error"]["message"]
    r = post(srv, "/v1/embeddings", {"model": "rr", "input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported"
    r = post(server, "/v1/rerank", {"query": QUERY, "documents": DOCS})  # (the bundled chat model only)
    assert r.status_code == 400 and "no reranker is loaded" in r.json()["error"]["message"]
    r = post(server, "/v2/rerank", {"model": "smollm2-135m", "query": QUERY, "documents": DOCS})
    assert r.status_code == 400 and "is not a reranker" in r.json()["message"]


# ------------------------------------------------------------ listings, events, metrics
def test_listings_show_a_reranker(rr):
    srv, _ = rr
    models = httpx.get(srv.url + "/v1/models").json()
    card = models["data"][0]
    assert card["capabilities"]["rerank"] is True and card["capabilities"]["chat"] is False
    assert card["context_length"] == 256 and models["models"][0]["capabilities"] == ["rerank"]
    assert httpx.post(srv.url + "/api/show", json={"model": "rr"}).json()["capabilities"] == ["rerank"]
    assert httpx.get(srv.url + "/props").json()["reranking"] is True


def test_a_rerank_is_a_request_like_any_other(rr):
    srv, events = rr
    r = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCS})
    found = wait_events(events, rid(r), "requestFinished")
    assert [e.kind for e in found] == ["requestStarted", "requestRouted", "ranked", "requestFinished"]
    ranked = found[2]
    assert ranked.model == "rr" and ranked.pairs == len(DOCS) and ranked.steps >= 1
    assert ranked.prompt_tokens == r.json()["usage"]["total_tokens"]
    assert ranked.queue_seconds >= 0 and ranked.compute_seconds > 0
    assert "truncated" not in ranked.to_dict()
    stats = httpx.get(srv.url + "/v1/stats").json()
    rec = next(x for x in stats["records"] if x["id"] == rid(r))
    assert rec["kind"] == "rerank" and rec["pairs"] == len(DOCS) and rec["promptTokens"] == ranked.prompt_tokens
    assert stats["reranks"] >= 1 and stats["rerankPairs"] >= len(DOCS)
    assert stats["perModel"]["rr"]["rerankPairs"] >= len(DOCS)
    metrics = httpx.get(srv.url + "/metrics").text
    pairs = next(line for line in metrics.splitlines() if line.startswith('turbospark_rerank_pairs_total{model="rr"}'))
    assert float(pairs.split()[-1]) >= len(DOCS)
    assert 'turbospark_rerank_compute_time_seconds_count{model="rr"}' in metrics


# ------------------------------------------------------------ loading, the engine
def test_how_a_reranker_is_named_at_start(gguf, tmp_path):
    from turbospark.cli import _model_options, parser
    from turbospark.config import load_config
    from turbospark.models.loading import options_for, spec_for

    assert spec_for(options_for(str(gguf))).kind == "rerank"  # from the header, before any load
    args = parser().parse_args(["serve", "--model", str(gguf), "--rerank"])
    assert [o.kind for o in _model_options(args)] == ["rerank"]
    args = parser().parse_args(["serve", "--model", "smollm2-135m", "--rerank", str(gguf)])
    assert [o.kind for o in _model_options(args)] == ["chat", "rerank"]
    toml = tmp_path / "t.toml"
    toml.write_text(f'[models.r]\nmodel = "{gguf}"\nkind = "rerank"\n')
    assert load_config(str(toml)).models[0].kind == "rerank"


def test_a_rerank_template_is_filled_in_and_a_cancelled_request_never_runs(tmp_path):
    path = write_reranker(tmp_path / "templated.gguf", template="[CLS] query: {query} [SEP] doc: {document} [SEP]")
    model = LlamaChatModel(ModelOptions(path=str(path), threads=1))
    try:
        ranker = model.ranker
        assert ranker is not None and model.supports_rerank and not model.supports_chat
        pairs = ranker.format.pairs("a cat", ["the mat"]).ids
        tok = model.file.tokenize
        assert pairs == [[CLS, *tok("query: a cat", False, False), SEP, *tok("doc: the mat", False, False), SEP]]
        assert len(model.rerank("a cat", ["the mat", "a dog"], CancelFlag()).scores) == 2
        with pytest.raises(AdmissionError):
            model.rerank("a cat", ["word " * 300], CancelFlag())
        assert model.rerank("a cat", ["word " * 300], CancelFlag(), truncate=True).token_counts == [256]
        cancel = CancelFlag()
        cancel.cancel("the client disconnected")
        with pytest.raises(EngineError, match="disconnected"):
            ranker.submit(pairs, cancel).result(timeout=10)
        with pytest.raises(AdmissionError, match="reranker"):
            model.encode(["a cat"])
    finally:
        model.close()
