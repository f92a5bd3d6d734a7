"""Slow and silent clients (issue 16 point 5), on the real model over raw
loopback sockets: a client that holds its stream open and reads nothing
loses its generation (engine and lease released, ``client too slow``); a body
that stops arriving gets a 408 in the dialect's shape; a client that leaves
mid-body is a 499, never a 500."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

from turbospark import ListObserver, Server

from .support import wait_until


@pytest.fixture(scope="module")
def slow_server():
    obs = ListObserver()
    srv = Server(observer=obs, model_defaults={"ctx": 8192, "parallel": 2}, send_timeout=3.0, body_timeout=1.0).start()
    yield srv, obs
    srv.stop()


def connect(srv: Server, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # a tiny window: the server's buffers fill soon
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", srv.port))
    return s


def head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def new_request(obs: ListObserver, before: set[int]) -> int:
    return wait_until(
        lambda: next((e.id for e in obs.events if e.kind == "requestStarted" and e.id not in before), None),
        30,
        "request started",
    )


def finished(obs: ListObserver, rid: int) -> dict[str, Any] | None:
    for e in obs.events:
        if e.kind == "requestFinished" and e.id == rid:
            return e.to_dict()
    return None


def read_response(s: socket.socket, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head_, _, body = data.partition(b"\r\n\r\n")
    lines = head_.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def test_a_client_that_never_reads_is_cut_and_releases_the_engine(slow_server):
    srv, obs = slow_server
    model = srv.registry.models()[0]
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 7000,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    before = {e.id for e in obs.events if e.kind == "requestStarted"}
    s = connect(srv, rcvbuf=4096)
    try:
        s.sendall(head("/v1/chat/completions", len(body)) + body)
        # it reads nothing from here on; the server must give up on it
        rid = new_request(obs, before)
        done = wait_until(lambda: finished(obs, rid), 240, "the silent client's request to end")
    finally:
        s.close()
    assert done["error"] == "client too slow", done
    generated = [e.to_dict() for e in obs.events if e.kind == "generated" and e.id == rid]
    assert len(generated) == 1 and generated[0]["stopReason"] == "cancelled"
    assert 0 < generated[0]["newTokens"] < 7000  # it stopped long before its budget
    # engine and lease released: nothing runs, and the next client is served
    assert model.load()["running"] == 0
    assert srv.registry.entries()[0].leases == 0
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
        timeout=60,
    )
    assert r.status_code == 200


@pytest.mark.parametrize(
    "path,shape",
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"), ("/api/chat", "ollama")],
)
def test_a_body_that_stops_arriving_gets_408_in_the_dialects_shape(slow_server, path, shape):
    srv, obs = slow_server
    s = connect(srv)
    try:
        s.sendall(head(path, 200) + b'{"model": "m", ')  # and then nothing
        status, headers, raw = read_response(s)
    finally:
        s.close()
    assert status == 408, raw
    body = json.loads(raw)
    if shape == "openai":
        assert body["error"]["code"] == "request_timeout" and "--body-timeout" in body["error"]["message"]
    elif shape == "anthropic":
        assert body["type"] == "error" and "stopped arriving" in body["error"]["message"]
    else:
        assert "stopped arriving" in body["error"]
    rid = int(headers["x-request-id"])
    done = wait_until(lambda: finished(obs, rid), 30, "requestFinished")
    assert done["status"] == 408


def test_a_client_that_leaves_mid_body_is_a_499_not_a_server_error(slow_server):
    srv, obs = slow_server
    before = {e.id for e in obs.events if e.kind == "requestStarted"}
    s = connect(srv)
    s.sendall(head("/v1/chat/completions", 5000) + b'{"model": "m", "messages": [')
    time.sleep(0.2)
    s.close()
    rid = new_request(obs, before)
    done = wait_until(lambda: finished(obs, rid), 30, "requestFinished")
    assert done["status"] == 499 and done["error"] == "client disconnected", done
    metrics = httpx.get(srv.url + "/metrics", timeout=30).text
    assert 'status="499"' in metrics and 'status="500"' not in metrics
