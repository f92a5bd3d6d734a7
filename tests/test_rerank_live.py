"""A rerank end to end beside a chat model (issue 45): a client that leaves
mid-rerank over HTTP has its remaining pairs dropped on the engine thread,
is recorded as a client that left, and the server serves on; the Activity
view in a real Chromium shows the rerank's row (kind rerank, its pairs and
tokens) and the model filter picks it. One module server: the shared chat
model beside the generated tiny reranker (``tests/reranker.py``)."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from turbospark import ListObserver, Server
from turbospark.engine.model import ModelOptions

from .chromium import LivePage
from .reranker import write_reranker
from .support import wait_event, wait_until

QUERY = "where do cats sleep"
#: 42 tokens a document, a pair about 49: ten pairs fill a 512-token step
DOC = "the cat sat on the mat and the dog sat in the sun " * 3
N_DOCS = 40


@pytest.fixture(scope="module")
def live(server, tmp_path_factory):
    """``(server, events)``: the shared chat model and the tiny reranker ``rr``."""
    gguf = write_reranker(tmp_path_factory.mktemp("rr") / "tiny-reranker.gguf")
    events = ListObserver()
    chat_model = server.registry.models()[0]
    with Server(models=[chat_model, ModelOptions(path=str(gguf), id="rr", threads=1)], observer=events) as srv:
        yield srv, events


class HeldStep:
    """The reranker's next engine step held until released: how many pairs
    its steps scored, and an event set once the first step is inside its
    decode (the engine thread's, not the test's)."""

    def __init__(self, ranker, monkeypatch) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.pairs = 0
        decode = ranker._decode

        def held(seqs):
            self.inside.set()
            assert self.release.wait(60), "the test never released the step"
            self.pairs += len(seqs)
            return decode(seqs)

        monkeypatch.setattr(ranker, "_decode", held)


def send_raw(url: str, path: str, body: dict) -> socket.socket:
    """A request sent on a raw socket, its answer left unread (close it to leave)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_a_client_that_leaves_mid_rerank_stops_its_pairs(live, monkeypatch):
    srv, events = live
    ranker = srv.registry.lookup("rr").model.engine.ranker
    held = HeldStep(ranker, monkeypatch)
    sock = send_raw(srv.url, "/v1/rerank", {"model": "rr", "query": QUERY, "documents": [DOC] * N_DOCS})
    try:
        assert held.inside.wait(60), "the rerank never reached the engine"
        job = ranker._jobs[0]
        left = threading.Event()
        job.cancel.on_cancel(left.set)
    finally:
        sock.close()  # the client leaves while its first step is inside llama_decode
    assert left.wait(30), "the server never saw the client leave"
    held.release.set()
    rid = next(e.id for e in reversed(list(events.events)) if e.kind == "requestStarted" and e.path == "/v1/rerank")
    done = wait_event(events, rid, "requestFinished")
    assert (done.status, done.error) == (499, "client disconnected")
    # its first step ran to its end; nothing after it: the rest were dropped, not scored
    wait_until(lambda: ranker.waiting == 0, 30, "the reranker's queue empties")
    assert 0 < held.pairs < N_DOCS and held.pairs == job.done, (held.pairs, job.done)
    # reported as a cut generation is: a rerank, cancelled, with the pairs it had scored
    ranked = wait_event(events, rid, "ranked")
    assert (ranked.model, ranked.stop_reason, ranked.pairs, ranked.steps) == ("rr", "cancelled", held.pairs, 1)
    assert ranked.prompt_tokens == sum(map(len, job.pairs[: held.pairs])) and ranked.compute_seconds > 0
    assert [e.kind for e in events.of(rid)] == ["requestStarted", "requestRouted", "ranked", "requestFinished"]
    rec = next(x for x in httpx.get(srv.url + "/v1/stats", timeout=30).json()["records"] if x["id"] == rid)
    assert (rec["kind"], rec["pairs"], rec["stopReason"], rec["status"]) == ("rerank", held.pairs, "cancelled", 499)
    # the server serves on: the next rerank gets every score
    r = httpx.post(srv.url + "/v1/rerank", json={"model": "rr", "query": QUERY, "documents": [DOC] * 3}, timeout=60)
    assert r.status_code == 200 and len(r.json()["results"]) == 3
    assert held.pairs == job.done + 3


def test_a_drains_deadline_cuts_a_rerank_and_reports_what_it_scored(live, monkeypatch):
    """A server around the same reranker stops with a rerank inside its
    first step and half a second to drain: at the deadline the rerank is
    cut (its client gets the drain's 503 in its shape), its remaining pairs
    are dropped, and its ``ranked`` says cancelled with the pairs scored."""
    srv, _ = live
    backend = srv.registry.lookup("rr").model
    ranker = backend.engine.ranker
    held = HeldStep(ranker, monkeypatch)
    events = ListObserver()
    other = Server(models=[backend], observer=events, drain_timeout=0.5).start()
    answer: dict[str, httpx.Response] = {}

    def ask() -> None:
        answer["r"] = httpx.post(
            other.url + "/v1/rerank", json={"query": QUERY, "documents": [DOC] * N_DOCS}, timeout=60
        )

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    try:
        assert held.inside.wait(60), "the rerank never reached the engine"
        cut = threading.Event()
        ranker._jobs[0].cancel.on_cancel(cut.set)
        stopping = threading.Thread(target=other.stop, daemon=True)
        stopping.start()
        assert cut.wait(60), "the drain's deadline never cut the rerank"
    finally:
        held.release.set()
    stopping.join(60)
    asking.join(60)
    r = answer["r"]
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text
    ranked = wait_event(events, int(r.headers["x-request-id"]), "ranked")
    assert (ranked.stop_reason, ranked.pairs) == ("cancelled", held.pairs) and 0 < held.pairs < N_DOCS
    assert ranker.waiting == 0


ROW = (
    "(() => {{ const tr = document.querySelector('#rows tr[data-id=\"{rid}\"]');"
    " return tr ? [...tr.children].map((td) => td.textContent) : null; }})()"
)


def choose_model(page: LivePage, name: str) -> None:
    page.js(
        f"(() => {{ const s = document.getElementById('model'); s.value = {json.dumps(name)};"
        " s.dispatchEvent(new Event('change')); })()"
    )


def test_the_activity_view_shows_a_rerank_row_and_filters_it(live):
    srv, events = live
    chat = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": "smollm2-135m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
    rr = httpx.post(srv.url + "/v1/rerank", json={"model": "rr", "query": QUERY, "documents": [DOC] * 5}, timeout=60)
    assert chat.status_code == rr.status_code == 200
    cid, rid = int(chat.headers["x-request-id"]), int(rr.headers["x-request-id"])
    ranked = wait_event(events, rid, "ranked")
    wait_event(events, rid, "requestFinished")
    with LivePage(srv.url + "/dashboard") as page:
        page.wait("document.getElementById('state').textContent === 'live'")
        cells = page.wait(ROW.format(rid=rid))
        # id, status, method, path, route, stream, prompt, new, media, encoded, prefill, decode, queued, overhead, tok/s
        assert cells[1:6] == ["200", "POST", "/v1/rerank", "rr → rr", "no"], cells
        assert (cells[6], cells[7]) == (str(ranked.prompt_tokens), "5 pairs"), cells
        assert ranked.prompt_tokens == rr.json()["usage"]["total_tokens"]
        assert cells[10] != "–" and cells[11] == "–" and cells[14] == "–", cells  # compute as prefill, no decode
        assert page.js("document.getElementById('rerankBox').hidden") is False
        stats = httpx.get(srv.url + "/v1/stats", timeout=30).json()
        band = page.js("document.getElementById('reranks').textContent")
        assert band.startswith(f"{stats['reranks']} ({stats['rerankPairs']} pairs, ") and stats["reranks"] >= 1, band
        page.js(f"document.querySelector('#rows tr[data-id=\"{rid}\"]').click()")
        details = json.loads(page.js("document.getElementById('details').textContent"))
        assert details["kind"] == "rerank" and details["pairs"] == 5 and details["model"] == "rr", details
        # the time chart has a bar for each (the rerank's compute as its prefill), the rate chart the chat only
        shown = lambda: page.js("[...document.querySelectorAll('#rows tr')].map((tr) => Number(tr.dataset.id))")
        points = lambda: (page.js("document.getElementById('timeChart').dataset.points"),
                          page.js("document.getElementById('rateChart').dataset.points"))  # fmt: skip
        records = stats["records"]

        def expected(model: str) -> tuple[str, str]:  # (bars: timed requests, points: decode rates)
            mine = [x for x in records if model in (x["served"], x["model"])]
            bars = sum(x["kind"] is not None for x in mine)
            return str(bars), str(sum(x["decodeTokPerSec"] is not None for x in mine))

        assert cid in shown() and rid in shown()
        choose_model(page, "rr")
        assert rid in shown() and cid not in shown()
        assert points() == expected("rr") and points()[1] == "0"
        choose_model(page, "smollm2-135m")
        assert cid in shown() and rid not in shown()
        assert points() == expected("smollm2-135m") and points()[1] != "0"
        assert not page.errors(), page.errors()
