"""Graceful drain (issue 16 point 1): SIGTERM with streams in flight in four
dialects lets them finish, refuses new requests with a 503 in their shape,
loses no event and exits 0; past ``--drain-timeout`` the rest end with their
dialect's error frame; a second signal exits at once; ``Server.stop()`` drains
the same way. Real model, real ``turbospark serve`` processes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from turbospark.server import Server

from .support import wait_until
from .test_cli import listening_url, turbospark

COUNT = [{"role": "user", "content": "Count from 1 to 200, separated by commas."}]
SHUTTING_DOWN = "the server is shutting down"


def stream_bodies(max_tokens: int) -> list[tuple[str, str, dict[str, Any]]]:
    """One streamed request per dialect: (name, path, body)."""
    return [
        (
            "chat",
            "/v1/chat/completions",
            {"model": "m", "messages": COUNT, "max_tokens": max_tokens, "stream": True, "ignore_eos": True},
        ),
        ("anthropic", "/v1/messages", {"model": "m", "messages": COUNT, "max_tokens": max_tokens, "stream": True}),
        ("responses", "/v1/responses", {"model": "m", "input": COUNT, "max_output_tokens": max_tokens, "stream": True}),
        (
            "ollama",
            "/api/chat",
            {"model": "m", "messages": COUNT, "stream": True, "options": {"num_predict": max_tokens}},
        ),
    ]


@dataclass
class Reader:
    """A streamed request read to its end on a thread."""

    name: str
    url: str
    body: dict[str, Any]
    status: int = 0
    rid: int = -1
    text: str = ""
    first_byte: threading.Event = field(default_factory=threading.Event)
    #: the response's headers arrived (an NDJSON stream sends nothing more until its first token)
    answered: threading.Event = field(default_factory=threading.Event)
    ended_at: float = 0.0
    error: str = ""

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._run, daemon=True)
        t.start()
        return t

    def _run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=120) as r:
                self.status = r.status_code
                self.rid = int(r.headers.get("x-request-id", -1))
                self.answered.set()
                for chunk in r.iter_text():
                    self.text += chunk
                    self.first_byte.set()
        except httpx.HTTPError as exc:
            self.error = repr(exc)
        finally:
            self.ended_at = time.monotonic()
            self.first_byte.set()
            self.answered.set()

    def completed(self) -> bool:
        """The stream ended with its dialect's normal end."""
        t = self.text
        return {
            "chat": "data: [DONE]" in t and "event: error" not in t,
            "anthropic": "event: message_stop" in t and "event: error" not in t,
            "responses": ("response.completed" in t or "response.incomplete" in t) and "response.failed" not in t,
            "ollama": '"done":true' in t and '"error"' not in t,
        }[self.name]

    def cut(self) -> bool:
        """The stream ended with its dialect's error frame for the shutdown."""
        t = self.text
        marker = {
            "chat": "event: error",
            "anthropic": "event: error",
            "responses": "response.failed",
            "ollama": '"done_reason":"error"',
        }[self.name]
        return marker in t and SHUTTING_DOWN in t


def serve(tmp_path, *extra: str) -> tuple[subprocess.Popen, str, Any]:
    log = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        turbospark("serve", "--port", "0", "--ctx", "4096", "--event-log", str(log), *extra),
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, listening_url(proc), log


def finish(proc: subprocess.Popen) -> str:
    """Make sure the server ends (it was signalled already, unless the test
    failed first) and return its stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=120)[1]


def events_of(log) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def assert_log_complete(events: list[dict[str, Any]]) -> None:
    """Every request started also finished, exactly once, last."""
    started = [e["id"] for e in events if e["kind"] == "requestStarted"]
    finished = [e["id"] for e in events if e["kind"] == "requestFinished"]
    assert sorted(started) == sorted(finished), (started, finished)
    for rid in started:
        kinds = [e["kind"] for e in events if e.get("id") == rid]
        assert kinds[0] == "requestStarted" and kinds[-1] == "requestFinished", kinds


def held_rerank(url: str, body: bytes) -> socket.socket:
    """A rerank whose body waits: its headers sent with ``Expect:
    100-continue``, returned once the server's 100 Continue says the app is
    reading it (in flight: the drain waits for it)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=120)
    sock.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))  # fmt: skip
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 100"), got
    return sock


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    """An HTTP/1.1 answer with a Content-Length: (status, headers, JSON body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(rest) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, rest
        rest += chunk
    return int(lines[0].split()[1]), headers, json.loads(rest)


def test_sigterm_lets_four_dialect_streams_finish_refuses_new_requests_and_exits_0(tmp_path):
    """Besides the four streams, a rerank (the tiny reranker beside the chat
    model) whose body is sent after the signal is scored whole while the
    server drains, as a new rerank is refused."""
    from .reranker import write_reranker

    reranker = write_reranker(tmp_path / "tiny-reranker.gguf")
    docs = [f"the cat sat on the mat {i} times" for i in range(24)]
    rerank_body = json.dumps({"query": "where do cats sleep", "documents": docs}).encode()
    # a drain window no loaded 2-core box outlasts: the streams must finish, not be cut
    proc, url, log = serve(tmp_path, "--parallel", "4", "--drain-timeout", "300", "--rerank", str(reranker))
    readers = [Reader(name, url + path, body) for name, path, body in stream_bodies(128)]
    held = None
    try:
        threads = [r.start() for r in readers]
        for r in readers:
            assert r.first_byte.wait(60), r.name
        held = held_rerank(url, rerank_body)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the drain begins on the server's loop
        refused = httpx.post(url + "/v1/messages", json={"model": "m", "max_tokens": 4, "messages": COUNT}, timeout=30)
        health = httpx.get(url + "/health", timeout=30)
        ollama_refused = httpx.post(url + "/api/chat", json={"model": "m", "messages": COUNT}, timeout=30)
        rerank_refused = httpx.post(url + "/v1/rerank", json={"query": "cats", "documents": ["a cat"]}, timeout=30)
        held.sendall(rerank_body)  # the rerank in flight goes on: scored on the draining server
        ranked_status, ranked_headers, ranked = read_answer(held)
        for t in threads:
            t.join(120)
    finally:
        if held is not None:
            held.close()
        err = finish(proc)
    assert proc.returncode == 0, err
    assert "draining 5 request(s)" in err, err
    # the rerank: 200 with every document's score; a new one refused in its shape
    assert ranked_status == 200 and sorted(x["index"] for x in ranked["results"]) == list(range(len(docs))), ranked
    assert rerank_refused.status_code == 503 and SHUTTING_DOWN in rerank_refused.json()["error"]["message"]
    # new work is refused in the caller's dialect, with a time to come back
    assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
    assert refused.json()["type"] == "error" and SHUTTING_DOWN in refused.json()["error"]["message"]
    assert ollama_refused.status_code == 503 and SHUTTING_DOWN in ollama_refused.json()["error"]
    assert health.status_code == 503 and health.json()["status"] == "draining"
    for r in readers:
        assert r.ended_at > signalled, f"{r.name} ended before the signal: the test proves nothing"
        assert r.status == 200 and r.completed(), (r.name, r.error, r.text[-300:])
    events = events_of(log)
    assert_log_complete(events)
    for r in readers:
        mine = [e for e in events if e.get("id") == r.rid]
        generated = [e for e in mine if e["kind"] == "generated"]
        assert len(generated) == 1 and generated[0]["stopReason"] != "cancelled", (r.name, mine)
        assert mine[-1].get("error") is None, (r.name, mine[-1])
    mine = [e for e in events if e.get("id") == int(ranked_headers["x-request-id"])]
    assert [e["kind"] for e in mine] == ["requestStarted", "requestRouted", "ranked", "requestFinished"], mine
    assert mine[2]["pairs"] == len(docs) and "stopReason" not in mine[2] and mine[-1]["status"] == 200, mine
    refused_ids = {int(refused.headers["x-request-id"]), int(ollama_refused.headers["x-request-id"])}
    refused_ids.add(int(rerank_refused.headers["x-request-id"]))
    for e in events:
        if e["kind"] == "requestFinished" and e["id"] in refused_ids:
            assert e["status"] == 503 and SHUTTING_DOWN in e["error"]


def test_past_the_drain_timeout_streams_end_with_their_dialects_error_frame(tmp_path):
    """One long generation runs and three wait behind it (``--parallel 1``);
    a 1-second drain cuts all four: each gets its dialect's error frame, the
    event log says why, the process still exits 0."""
    proc, url, log = serve(tmp_path, "--parallel", "1", "--drain-timeout", "1")
    readers = [Reader(name, url + path, body) for name, path, body in stream_bodies(4000)]
    try:
        threads = [readers[0].start()]
        # tokens flowing (the opening chunk can come before the first token on a loaded box)
        wait_until(lambda: readers[0].text.count("data: ") >= 4, 60, "the long stream's first tokens")
        threads += [r.start() for r in readers[1:]]
        for r in readers[1:]:
            assert r.answered.wait(60), r.name  # its headers: it waits in the queue
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
    finally:
        err = finish(proc)
    assert proc.returncode == 0, err
    for r in readers:
        assert r.status == 200 and r.cut(), (r.name, r.error, r.text[-300:])
        assert r.ended_at - signalled < 60  # the drain's 1 s, plus one engine step; generous on a busy box
    events = events_of(log)
    assert_log_complete(events)
    for r in readers:
        finished = [e for e in events if e.get("id") == r.rid and e["kind"] == "requestFinished"]
        assert finished and SHUTTING_DOWN in (finished[0].get("error") or ""), (r.name, finished)
    # the long one ran: its cut run is reported with its real counts
    first = [e for e in events if e.get("id") == readers[0].rid and e["kind"] == "generated"]
    assert first and first[0]["stopReason"] == "cancelled" and first[0]["newTokens"] > 0


def test_a_second_signal_exits_at_once(tmp_path):
    proc, url, log = serve(tmp_path, "--parallel", "1", "--drain-timeout", "600")
    reader = Reader("chat", url + "/v1/chat/completions", stream_bodies(4000)[0][2])
    try:
        thread = reader.start()
        assert reader.first_byte.wait(60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # draining: it waits for the stream
        second = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        took = time.monotonic() - second
        thread.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert took < 30, took  # far below the 600 s drain
    assert reader.cut() or reader.error, reader.text[-300:]
    assert_log_complete(events_of(log))


def test_server_stop_drains_the_same_way():
    # 5 s: long enough for the late request to meet the drain on a loaded box,
    # far shorter than the 4000-token stream on any machine
    srv = Server(drain_timeout=5.0).start()
    url = srv.url
    reader = Reader("chat", url + "/v1/chat/completions", stream_bodies(4000)[0][2])
    done = threading.Event()
    try:
        thread = reader.start()
        assert reader.first_byte.wait(60)
        outcome: dict[str, Any] = {}

        def late_request() -> None:
            time.sleep(0.3)
            try:
                outcome["r"] = httpx.post(
                    url + "/v1/chat/completions", json={"model": "m", "messages": COUNT, "max_tokens": 2}, timeout=30
                )
            except httpx.HTTPError as exc:
                outcome["r"] = exc
            done.set()

        threading.Thread(target=late_request, daemon=True).start()
    finally:
        srv.stop()
    thread.join(60)
    done.wait(30)
    # the drain ran out of time: the stream got its error event
    assert reader.cut(), reader.text[-300:]
    r = outcome["r"]
    assert isinstance(r, httpx.Response) and r.status_code == 503, r
    assert r.json()["error"]["code"] == "shutting_down"


def test_a_generation_that_starts_after_the_cut_is_cut_too():
    """A request still being prepared when the drain runs out of time is
    failed the moment its generation is watched, not left to run on."""
    from turbospark.engine.types import CancelFlag
    from turbospark.serving.drain import Drain, ShuttingDown

    drain = Drain()
    running = CancelFlag()
    with drain.watch(running):
        assert drain.cut() == 1
    assert isinstance(running.error, ShuttingDown)
    late = CancelFlag()
    with drain.watch(late):
        assert late.cancelled and isinstance(late.error, ShuttingDown)


def test_clients_stuck_at_the_deadline_do_not_hold_the_shutdown(tmp_path):
    """At the drain's deadline a stream whose client reads nothing (its error
    frame cannot go out either) is dropped, and a request whose body stopped
    coming gets its dialect's 503: before, both held the process until
    uvicorn's own timeout cancelled them (a plain-text 500, an internal
    CancelledError as the logged error)."""
    proc, url, log = serve(tmp_path, "--parallel", "2", "--drain-timeout", "1")
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "Once upon a time", "n_predict": 3000, "n_probs": 20, "ignore_eos": True,
                       "stream": True}).encode()  # fmt: skip
    unread = socket.socket()
    unread.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    stalled = socket.socket()
    try:
        unread.connect((host, int(port)))
        unread.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
        stalled.connect((host, int(port)))
        stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b'Content-Length: 500\r\n\r\n{"model":')  # fmt: skip
        time.sleep(3)  # the stream has filled the buffers by now
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        stalled.settimeout(10)
        answer = b""
        while chunk := stalled.recv(65536):
            answer += chunk
    finally:
        err = finish(proc)
        unread.close()
        stalled.close()
    assert proc.returncode == 0, err
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after" in head.lower(), answer[:300]
    assert json.loads(rest)["error"]["code"] == "shutting_down"
    events = events_of(log)
    assert_log_complete(events)
    finished = [e for e in events if e["kind"] == "requestFinished"]
    assert len(finished) == 2 and all(SHUTTING_DOWN in (e.get("error") or "") for e in finished), finished


def test_a_signal_as_soon_as_it_says_listening_drains(tmp_path):
    """The banner ("listening on") comes once the signal handlers are in
    place: a SIGTERM sent the moment it is read drains and exits 0, never the
    default action's death (-15, no event log flushed)."""
    proc, _, log = serve(tmp_path)
    proc.send_signal(signal.SIGTERM)
    err = finish(proc)
    assert proc.returncode == 0, (proc.returncode, err)
    assert "shutting down" in err and log.exists()
