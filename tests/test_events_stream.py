"""GET /v1/events (SSE, ring replay, gaps, keep-alives, auth) and
GET /v1/stats against a live server."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from turbospark.observe import ListObserver
from turbospark.views.fold import Fold

from .views_support import FrameReader, HeldPull, chat, fresh_server, pulling_server, read_frames

TIMEOUT = httpx.Timeout(30.0)


@pytest.fixture(scope="module")
def watched(server):
    """A fresh server (empty ring) whose every event is also kept in order."""
    seen = ListObserver()
    with fresh_server(server, observers=[seen]) as srv:
        yield srv, seen


def wait_quiet(seen: ListObserver, rid: int, kinds: set[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if kinds <= {e.kind for e in seen.of(rid)}:
            return
        time.sleep(0.02)
    raise AssertionError(f"request {rid}: {[e.to_dict() for e in seen.of(rid)]}")


def test_stream_replays_the_ring_then_goes_live_and_resumes(watched):
    srv, seen = watched
    r = chat(srv.url)
    assert r.status_code == 200
    first = int(r.headers["x-request-id"])
    wait_quiet(seen, first, {"generated", "requestFinished"})
    with httpx.Client(timeout=TIMEOUT) as client:
        with client.stream("GET", srv.url + "/v1/events", params={"since": 0}) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            reader = FrameReader(resp)
            frames = reader.until(
                lambda fs: any(f.get("event") == "requestFinished" and f["data"]["id"] == first for f in fs)
            )
            # every event so far, in order, numbered 1, 2, 3, ... by the server
            evs = [f for f in frames if "event" in f]
            assert [f["id"] for f in evs] == list(range(1, len(evs) + 1))
            assert [f["data"] for f in evs] == [e.to_dict() for e in seen.events[: len(evs)]]
            assert all(f["event"] == f["data"]["kind"] for f in evs)
            assert evs[0]["data"] == {"kind": "modelAttached", "atMs": evs[0]["data"]["atMs"], "model": "smollm2-135m"}
            # live: a request sent now arrives on the open stream
            r2 = chat(srv.url, stream=True, max_tokens=4)
            second = int(r2.headers["x-request-id"])
            more = reader.until(lambda fs: any(f.get("event") == "generated" and f["data"]["id"] == second for f in fs))
            live = [f for f in more if "event" in f]
            assert [f["id"] for f in live] == list(range(len(evs) + 1, len(evs) + 1 + len(live)))
            watcher = int(resp.headers["x-request-id"])
    # a watcher closing the stream is its normal end (it never ends by
    # itself), not a client that left in error: not in the error counts
    wait_quiet(seen, watcher, {"requestFinished"})
    done = [e for e in seen.of(watcher) if e.kind == "requestFinished"][0]
    assert (done.status, done.error) == (200, None)
    metrics = text_string_to_metric_families(httpx.get(srv.url + "/metrics", timeout=TIMEOUT).text)
    errors = [s for f in metrics if f.name == "turbospark_request_errors" for s in f.samples]
    assert not [s for s in errors if s.labels.get("path") == "/v1/events"], errors
    mid = evs[len(evs) // 2]["id"]
    # Last-Event-ID (what a reconnecting EventSource sends) wins over ?since=
    with httpx.Client(timeout=TIMEOUT) as client:
        with client.stream("GET", srv.url + "/v1/events?since=0", headers={"Last-Event-ID": str(mid)}) as resp:
            again = read_frames(resp, lambda fs: len([f for f in fs if "event" in f]) >= 3)
    again = [f for f in again if "event" in f]
    assert [f["id"] for f in again[:3]] == [mid + 1, mid + 2, mid + 3]
    assert again[0]["data"] == seen.events[mid].to_dict()


def test_gap_marker_when_the_ring_moved_on(watched):
    srv, seen = watched
    srv.live.max_events = 3  # read per record: shrink the ring of this server
    try:
        r = chat(srv.url, max_tokens=2)
        rid = int(r.headers["x-request-id"])
        wait_quiet(seen, rid, {"generated", "requestFinished"})
        last = srv.live.last_seq
        with httpx.Client(timeout=TIMEOUT) as client:
            with client.stream("GET", srv.url + "/v1/events?since=1") as resp:
                frames = read_frames(resp, lambda fs: len([f for f in fs if "event" in f]) >= 4)
    finally:
        srv.live.max_events = 4096
    evs = [f for f in frames if "event" in f]
    assert evs[0]["event"] == "gap"
    oldest = evs[1]["id"]
    assert evs[0]["data"] == {"missed": oldest - 2, "from": 2, "to": oldest - 1}
    assert evs[0]["id"] == oldest - 1  # a reconnect after it does not ask again
    # the ring held only the newest three (this stream's own start and
    # finish are among them: its generator runs once the headers went out)
    assert last - 2 <= oldest <= last and [f["id"] for f in evs[1:4]] == [oldest, oldest + 1, oldest + 2]


def test_keep_alive_comments_and_bad_since(watched):
    srv, _ = watched
    srv.live.keepalive_s = 0.2
    try:
        with httpx.Client(timeout=TIMEOUT) as client:
            with client.stream("GET", srv.url + "/v1/events") as resp:
                frames = read_frames(resp, lambda fs: {"comment": "keep-alive"} in fs)
    finally:
        srv.live.keepalive_s = 15.0
    assert frames[-1] == {"comment": "keep-alive"}
    bad = httpx.get(srv.url + "/v1/events?since=x", timeout=10)
    assert bad.status_code == 400 and "since" in bad.json()["error"]["message"]


def test_head_answers_the_headers_and_frees_the_connection(watched):
    """A HEAD of the endless stream ends at its headers: before, the stream
    ran on unsent, and the connection (and a request after it on the same
    connection) hung until the client gave up."""
    srv, _ = watched
    with httpx.Client(timeout=10) as client:
        r = client.head(srv.url + "/v1/events")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.content == b""
        assert client.get(srv.url + "/health").status_code == 200  # the same kept-alive connection
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"HEAD /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := s.recv(4096):  # the server closes it: no timeout
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 200") and raw.endswith(b"\r\n\r\n"), raw


def test_stats_is_the_fold_of_the_same_events(watched):
    srv, seen = watched
    r = chat(srv.url, max_tokens=3, content="Count to three.")
    rid = int(r.headers["x-request-id"])
    wait_quiet(seen, rid, {"generated", "requestFinished"})
    miss = httpx.get(srv.url + "/v1/nothing-here", timeout=10)
    wait_quiet(seen, int(miss.headers["x-request-id"]), {"requestFinished"})
    stats = httpx.get(srv.url + "/v1/stats?requests=1000", timeout=10).json()
    events = [e.to_dict() for e in seen.events]
    seq = stats.pop("seq")  # the last event folded into it: /v1/stats's own start
    assert events[seq - 1]["kind"] == "requestStarted" and events[seq - 1]["path"] == "/v1/stats"
    expected = Fold().feed_all(events[:seq]).summary(max_requests=1000)
    assert stats == expected
    assert stats["inFlight"] == 0 and stats["errors"] >= 1 and stats["models"] == ["smollm2-135m"]
    gen = next(e for e in seen.of(rid) if e.kind == "generated")
    rec = next(x for x in stats["records"] if x["id"] == rid)
    assert (rec["promptTokens"], rec["newTokens"]) == (gen.prompt_tokens, gen.new_tokens)
    assert rec["requested"] == "gpt-4o" and rec["served"] == "smollm2-135m"
    assert not any(x["path"] in ("/v1/stats", "/v1/events") for x in stats["records"])
    assert len(httpx.get(srv.url + "/v1/stats", timeout=10).json()["records"]) <= 100


def test_views_need_the_key_but_the_dashboard_page_does_not(server):
    with fresh_server(server, api_keys=["sekrit"]) as srv:
        assert httpx.get(srv.url + "/v1/stats", timeout=10).status_code == 401
        assert httpx.get(srv.url + "/v1/events", timeout=10).status_code == 401
        ok = httpx.get(srv.url + "/v1/stats", headers={"Authorization": "Bearer sekrit"}, timeout=10)
        assert ok.status_code == 200 and ok.json()["models"] == ["smollm2-135m"]
        page = httpx.get(srv.url + "/dashboard", timeout=10)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert "http://" not in page.text and "https://" not in page.text  # no CDN, nothing remote
        assert httpx.post(srv.url + "/dashboard", timeout=10).status_code in (401, 405)


def test_a_pull_reaches_every_stream_and_the_stats_while_it_runs(tmp_path):
    """``modelPull`` events are the server's, like a model attaching: a
    tenant's stream carries them, and its ``/v1/stats`` (what a view paints
    first) lists the pull in progress as the puller has it, then its end."""
    user, admin = {"Authorization": "Bearer user-key"}, {"Authorization": "Bearer admin-key"}
    with pulling_server(str(tmp_path), api_keys=["user-key"], admin_keys=["admin-key"]) as (srv, reg):
        with HeldPull(srv, reg, headers=admin) as pull:
            stats = httpx.get(srv.url + "/v1/stats", headers=user, timeout=10).json()
            (active,) = srv.assembly.puller.active()
            assert (active["model"], active["completed"], active["total"]) == ("smollm2:135m", 0, pull.size)
            (shown,) = stats["pulls"]
            assert (shown["model"], shown["state"], shown["completed"], shown["total"]) == (
                "smollm2:135m", "pulling", 0, pull.size,
            )  # fmt: skip
            with httpx.Client(timeout=TIMEOUT) as client:
                with client.stream("GET", srv.url + "/v1/events?since=0", headers=user) as resp:
                    reader = FrameReader(resp)
                    reader.until(lambda fs: any(f.get("event") == "modelPull" for f in fs))
                    pull.finish()
                    frames = reader.until(
                        lambda fs: any(f.get("event") == "modelPull" and f["data"]["phase"] == "finished" for f in fs)
                    )
        pulls = [f["data"] for f in frames if f.get("event") == "modelPull"]
        assert {p["model"] for p in pulls} == {"smollm2:135m"}
        last = pulls[-1]
        assert last["completed"] == last["total"] == last["fetched"] == pull.size and last["seconds"] > 0
        failed = httpx.post(srv.url + "/api/pull", json={"model": "nothing:here", "stream": False}, headers=admin)
        assert failed.status_code >= 400
        stats = httpx.get(srv.url + "/v1/stats", headers=user, timeout=10).json()
        done, bad = stats["pulls"]
        assert (done["model"], done["state"], done["completed"], done["total"]) == (
            "smollm2:135m", "finished", pull.size, pull.size,
        )  # fmt: skip
        assert done["bytesPerSec"] == pytest.approx(pull.size / last["seconds"])
        assert (bad["model"], bad["state"]) == ("nothing:here", "failed") and bad["reason"], bad
        assert httpx.get(srv.url + "/v1/stats", headers=admin, timeout=10).json()["pulls"] == stats["pulls"]
