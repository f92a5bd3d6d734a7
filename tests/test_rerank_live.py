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
    assert job.future.exception() is not None
    # the server serves on: the next rerank gets every score
    r = httpx.post(srv.url + "/v1/rerank", json={"model": "rr", "query": QUERY, "documents": [DOC] * 3}, timeout=60)
    assert r.status_code == 200 and len(r.json()["results"]) == 3
    assert held.pairs == job.done + 3
