"""Safe by default (CONTRACT §5): what a web page, a stranger or an
oversized request can do to a server on loopback without a key. Real server,
real model, raw sockets and httpx, and a real page in headless Chromium."""

from __future__ import annotations

import http.server
import math
import os
import re
import shutil
import socket
import threading
import time
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from turbospark import Server
from turbospark.access.auth import OpenBind
from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.models.catalog import resolve_model
from turbospark.models.loading import NotAttachable
from turbospark.routes.table import route_table

from .chromium import run_once

EVIL = "http://evil.example"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _kinds(hub: Any, rid: str) -> list[str]:
    return [e.kind for e in hub.wait_for(lambda es: any(e.kind == "requestFinished" for e in es), rid)]


# ------------------------------------------------------------ Origin and Host
@pytest.mark.parametrize(
    "path,body",
    [
        ("/api/generate", b'{"model":"m","prompt":"hi","stream":false,"options":{"num_predict":2}}'),
        ("/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'),
        ("/api/chat", b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false}'),
        ("/v1/messages", b'{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}'),
        ("/v1/admin/models", b'{"model":"smollm2-135m","id":"evil"}'),
    ],
)
def test_a_cross_origin_simple_post_never_reaches_a_model(base_url, hub, path, body):
    r = httpx.post(base_url + path, content=body, headers={"Origin": EVIL, "Content-Type": "text/plain"})
    assert r.status_code == 403
    assert "evil.example" in r.text and "not allowed" in r.text
    assert "access-control-allow-origin" not in r.headers
    kinds = _kinds(hub, r.headers["x-request-id"])
    assert kinds == ["requestStarted", "requestFinished"]  # observed, never routed


def test_refusals_come_in_each_dialects_error_shape(base_url):
    h = {"Origin": EVIL}
    o = httpx.post(base_url + "/api/chat", json={}, headers=h).json()
    assert set(o) == {"error"} and isinstance(o["error"], str)
    a = httpx.post(base_url + "/v1/messages", json={}, headers=h).json()
    assert a["type"] == "error" and a["error"]["type"] == "permission_error"
    oa = httpx.post(base_url + "/v1/chat/completions", json={}, headers=h).json()
    assert oa["error"]["type"] == "permission_error"


def test_a_foreign_host_is_refused_on_every_route(base_url, hub):
    """DNS rebinding: a page on evil.example re-pointed at 127.0.0.1 sends
    its own name as Host."""
    seen = 0
    for route in route_table():
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            path = re.sub(r"\{[^}]*\}", "m", route.path)
            r = httpx.request(method, base_url + path, headers={"Host": "evil.example:8080"}, content=b"{}")
            assert r.status_code == 403, (method, path, r.status_code)
            if method != "HEAD":
                assert "evil.example" in r.text
            seen += 1
    assert seen >= 30
    rid = r.headers["x-request-id"]
    assert [e.status for e in hub.of(rid) if e.kind == "requestFinished"] == [403]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "app.localhost"])
def test_loopback_hosts_are_served(base_url, host):
    port = base_url.rsplit(":", 1)[1]
    r = httpx.get(base_url + "/v1/models", headers={"Host": f"{host}:{port}"})
    assert r.status_code == 200


def test_clients_without_origin_are_unaffected(base_url, oai):
    """SDKs, CLIs and curl (curl's default form content type on Ollama)."""
    assert oai.chat.completions.create(**CHAT).choices[0].message.content is not None
    a = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)
    assert a.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}]).content
    r = httpx.post(
        base_url + "/api/generate",
        content=b'{"model":"m","prompt":"hi","stream":false,"options":{"num_predict":2}}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and r.json()["done"] is True


def test_the_servers_own_pages_may_call_it(base_url):
    """The dashboard's fetches carry the server's own origin."""
    r = httpx.post(base_url + "/v1/chat/completions", json=CHAT, headers={"Origin": base_url})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == base_url


class _Page(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.html)))
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def page_origin():
    """A web page on its own origin (another loopback port)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


PAGE = """<!doctype html><html><body><pre id="out">pending</pre><script>
(async () => {
  const out = document.getElementById("out");
  try {
    const r = await fetch("%(api)s/v1/chat/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer %(key)s", "x-session-id": "page"},
      body: JSON.stringify({model: "m", max_tokens: 3, temperature: 0,
                            messages: [{role: "user", content: "Say hi"}]}),
    });
    const j = await r.json();
    out.textContent = "status=" + r.status + " rid=" + r.headers.get("x-request-id")
      + " finish=" + j.choices[0].finish_reason;
  } catch (e) { out.textContent = "failed: " + e; }
})();
</script></body></html>"""


def test_a_page_on_an_allowed_origin_calls_the_api_from_chromium(page_origin):
    httpd, origin = page_origin
    with Server(api_keys=["page-key"], cors_origins=[origin]) as srv:
        pre = httpx.options(
            srv.url + "/v1/chat/completions",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, x-session-id, x-evil",
            },
        )
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == origin
        assert "POST" in pre.headers["access-control-allow-methods"]
        allowed = pre.headers["access-control-allow-headers"]
        assert "authorization" in allowed and "x-session-id" in allowed and "x-evil" not in allowed
        assert int(pre.headers["access-control-max-age"]) > 0
        # a preflight from any other origin is refused
        other = httpx.options(
            srv.url + "/v1/chat/completions", headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"}
        )
        assert other.status_code == 403
        _Page.html = (PAGE % {"api": srv.url, "key": "page-key"}).encode()
        dom = run_once(origin + "/", "--virtual-time-budget=30000", "--dump-dom")
        assert "status=200" in dom and "finish=" in dom, dom[-2000:]
        # the page read the exposed request id: the request really ran here
        assert "rid=null" not in dom
    # the same page on an origin that is not allowed gets nothing
    with Server(api_keys=["page-key"]) as srv:
        _Page.html = (PAGE % {"api": srv.url, "key": "page-key"}).encode()
        dom = run_once(origin + "/", "--virtual-time-budget=15000", "--dump-dom")
        assert "failed:" in dom and "status=200" not in dom


# ------------------------------------------------------------- size limits
def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _whole(data: bytes) -> bool:
    """Whether ``data`` holds a response's head and its whole body (by its
    Content-Length; the head and its body may come in separate reads)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return len(body) >= int(m.group(1)) if m else len(body) > 0


def _raw(url: str, head: bytes, chunks: Any = (), timeout: float = 30) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(head)
        try:
            for chunk in chunks:
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before we were done
        data = b""
        try:
            while True:
                got = s.recv(65536)
                if not got:
                    break
                data += got
                if _whole(data):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
        return data


def test_a_100_mb_body_is_refused_without_reading_it(base_url, hub):
    before = _rss_bytes()
    head = (
        b"POST /v1/messages/count_tokens HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (100 << 20)
    )
    reply = _raw(base_url, head, (b"x" * (1 << 20) for _ in range(100)))
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"request_too_large" in reply  # Anthropic's shape for the path
    assert _rss_bytes() - before < 50 << 20


def test_a_chunked_body_is_counted_as_it_arrives(base_url):
    before = _rss_bytes()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"
    reply = _raw(base_url, head, (chunk for _ in range(100)))
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"--max-body" in reply
    assert _rss_bytes() - before < 50 << 20


def test_the_body_limit_is_configurable_and_shaped():
    model = ModelOptions(path=resolve_model("smollm2-135m")[0], id="m", parallel=1)
    with Server(models=[model], max_body=1000) as srv:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}
        r = httpx.post(srv.url + "/api/chat", json=big)
        assert r.status_code == 413 and "1000 bytes" in r.json()["error"]
        r = httpx.post(srv.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200


def test_oversized_headers_get_431(base_url):
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (200 << 10) + b"\r\n\r\n"
    reply = _raw(base_url, head)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:100]
    assert httpx.get(base_url + "/health").status_code == 200


def test_health_answers_while_a_4_mb_prompt_is_refused(base_url):
    # encoded once here: the client's own encoding would hold this process's GIL
    body = orjson.dumps(
        {
            "model": "m",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "lorem ipsum dolor sit amet " * ((4 << 20) // 27)}],
        }
    )
    result: dict[str, Any] = {}

    def big() -> None:
        result["r"] = httpx.post(
            base_url + "/v1/chat/completions", timeout=120, content=body, headers={"content-type": "application/json"}
        )

    worst = 0.0
    t = threading.Thread(target=big)
    t.start()
    with httpx.Client() as c:
        while t.is_alive():
            began = time.perf_counter()
            assert c.get(base_url + "/health", timeout=30).status_code == 200
            worst = max(worst, time.perf_counter() - began)
            time.sleep(0.01)
    t.join()
    r = result["r"]
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    assert worst < 0.5, worst


def test_a_stream_keeps_running_while_a_huge_prompt_is_prepared(base_url):
    """Templating and tokenising happen off the event loop: a stream's
    pieces keep coming while a 4 MB raw completion prompt is refused."""
    gaps: list[float] = []
    prompt = orjson.dumps({"model": "m", "prompt": "word " * ((4 << 20) // 5), "max_tokens": 2})
    refused: list[int] = []

    def huge() -> None:
        refused.append(
            httpx.post(
                base_url + "/v1/completions", timeout=120, content=prompt, headers={"content-type": "application/json"}
            ).status_code
        )

    body = {
        **CHAT,
        "messages": [{"role": "user", "content": "Write a long story about a cat."}],
        "max_tokens": 80,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        next(lines)  # the role chunk
        next(line for line in lines if line.startswith("data:"))  # the first token: prefill is over
        t = threading.Thread(target=huge)
        t.start()
        last = time.perf_counter()
        for line in lines:
            if line.startswith("data:"):
                now = time.perf_counter()
                if t.is_alive() or not gaps:
                    gaps.append(now - last)
                last = now
        t.join()
    assert refused == [400] and gaps
    assert max(gaps) < 2.5, gaps  # 5-7 s stalls were the bug


# ------------------------------------------------------------------- admin
def _attach(url: str, model: str, **headers: str) -> httpx.Response:
    return httpx.post(url + "/v1/admin/models", json={"model": model, "id": "x"}, headers=headers, timeout=60)


def test_attach_refuses_anything_but_packages_and_ggufs_under_the_model_folders(base_url, tmp_path):
    outside = tmp_path / "copy.gguf"
    shutil.copyfile(resolve_model("smollm2-135m")[0], outside)
    cases = [
        "/etc/passwd",
        "/etc/shadow",
        "/nonexistent/model.gguf",
        "../../../../etc/passwd",
        str(outside),
        "/proc/self/environ",
        "/dev/zero",
    ]
    bodies = []
    for arg in cases:
        r = _attach(base_url, arg)
        assert r.status_code == 403, (arg, r.text)
        assert r.json()["error"]["message"] == str(NotAttachable(arg))
        bodies.append(r.json()["error"]["message"].replace(repr(arg), "ARG"))
    assert len(set(bodies)) == 1  # one message: whether a path exists never shows


def test_attach_loads_ggufs_under_models_dir_only(tmp_path):
    src = resolve_model("smollm2-135m")[0]
    allowed = tmp_path / "models"
    allowed.mkdir()
    shutil.copyfile(src, allowed / "tiny.gguf")
    (allowed / "fake.gguf").write_bytes(b"NOTGGUF" + b"\0" * 100)
    os.symlink("/etc/passwd", allowed / "link.gguf")
    with Server(models=[ModelOptions(path=src, id="m", parallel=1)], models_dirs=[str(allowed)]) as srv:
        for name in ("fake.gguf", "link.gguf", "../models/../../etc/passwd"):
            r = _attach(srv.url, str(allowed / name))
            assert r.status_code == 403, (name, r.text)
        r = _attach(srv.url, str(allowed / "tiny.gguf"))
        assert r.status_code == 201, r.text
        assert httpx.post(srv.url + "/v1/chat/completions", json={**CHAT, "model": "x"}).status_code == 200


def test_an_inference_key_never_administers():
    with Server(api_keys=["infer"]) as srv:
        h = {"Authorization": "Bearer infer"}
        r = httpx.get(srv.url + "/v1/admin/models", headers=h)
        assert r.status_code == 403 and "admin key" in r.json()["error"]["message"]
        assert httpx.delete(srv.url + "/v1/admin/models/smollm2-135m", headers=h).status_code == 403
        assert _attach(srv.url, "smollm2-135m", **h).status_code == 403
        assert httpx.get(srv.url + "/v1/admin/models").status_code == 401
        assert httpx.get(srv.url + "/v1/models", headers=h).status_code == 200


# --------------------------------------------------------- streamed overload
def _busy_server():
    model = LlamaChatModel(ModelOptions(path=resolve_model("smollm2-135m")[0], id="m", parallel=1, max_queue=1))
    return model, Server(models=[model])


LONG = {
    "model": "m",
    "messages": [{"role": "user", "content": "Write a long story."}],
    "max_tokens": 4000,
    "temperature": 0,
    "stream": True,
    "ignore_eos": True,
}


def _wait(pred: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_full_wait_list_answers_503_before_the_first_byte_in_every_dialect():
    model, server = _busy_server()
    asks = [
        ("/v1/chat/completions", {**CHAT, "stream": True}, lambda j: j["error"]["code"] == "overloaded"),
        (
            "/v1/completions",
            {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": True},
            lambda j: j["error"]["code"] == "overloaded",
        ),
        (
            "/v1/responses",
            {"model": "m", "input": "hi", "max_output_tokens": 16, "stream": True},
            lambda j: j["error"]["code"] == "overloaded",
        ),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            lambda j: j["type"] == "error" and j["error"]["type"] == "overloaded_error",
        ),
        (
            "/api/chat",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            lambda j: "wait list is full" in j["error"],
        ),
        ("/api/generate", {"model": "m", "prompt": "hi"}, lambda j: "wait list is full" in j["error"]),
    ]
    try:
        with server as srv, httpx.Client(timeout=120) as c:
            with c.stream("POST", srv.url + "/v1/chat/completions", json=LONG) as running:
                lines = running.iter_lines()
                next(lines)
                _wait(lambda: model.load()["running"] == 1)
                with c.stream("POST", srv.url + "/v1/chat/completions", json=LONG) as queued:
                    _wait(lambda: model.load()["waiting"] == 1)
                    for path, body, shaped in asks:
                        r = c.post(srv.url + path, json=body)
                        assert r.status_code == 503, (path, r.status_code, r.text[:300])
                        assert int(r.headers["retry-after"]) >= 1
                        assert shaped(r.json()), (path, r.text)
                    # the official SDKs see a 503 they can back off on
                    sdk = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
                    with pytest.raises(openai.InternalServerError) as exc:
                        sdk.chat.completions.create(**{**CHAT, "stream": True})
                    assert exc.value.status_code == 503
                    queued.close()
            # nothing is left reserved: the server takes requests again
            _wait(lambda: model.load()["running"] == 0 and model.load()["waiting"] == 0)
            r = c.post(srv.url + "/v1/chat/completions", json={**CHAT, "stream": True})
            assert r.status_code == 200 and "[DONE]" in r.text
    finally:
        model.close()


def test_retry_after_is_estimated_from_the_queue():
    """Jobs that take seconds each, one sequence, one waiting: the estimate
    is the waiting job times the mean job time, not a constant 1."""
    model, server = _busy_server()
    try:
        with server as srv, httpx.Client(timeout=120) as c:
            timed = {**LONG, "stream": False, "max_tokens": 400}
            began = time.perf_counter()
            assert c.post(srv.url + "/v1/chat/completions", json=timed).status_code == 200
            took = time.perf_counter() - began
            with c.stream("POST", srv.url + "/v1/chat/completions", json=LONG):
                _wait(lambda: model.load()["running"] == 1)
                with c.stream("POST", srv.url + "/v1/chat/completions", json=LONG):
                    _wait(lambda: model.load()["waiting"] == 1)
                    r = c.post(srv.url + "/v1/chat/completions", json=CHAT)
                    assert r.status_code == 503
                    # one job ahead × the mean job time (the one job measured,
                    # admitted → finished: a little under the client's time)
                    expected = max(1, math.ceil(took))
                    assert expected - 1 <= int(r.headers["retry-after"]) <= expected, (r.headers, took)
    finally:
        model.close()


# ------------------------------------------------------------------- binds
def test_server_refuses_an_open_bind_without_a_key_like_the_cli():
    with pytest.raises(OpenBind) as exc:
        Server(models=[], host="0.0.0.0")
    assert "--api-key" in str(exc.value)
    Server(models=[], host="0.0.0.0", api_keys=["k"])  # not started: the rule alone


def test_keys_from_a_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# the team's keys\nkey-one\n\n  key-two  \n")
    with Server(api_key_file=str(keys)) as srv:
        for key in ("key-one", "key-two"):
            assert httpx.get(srv.url + "/v1/models", headers={"x-api-key": key}).status_code == 200
        assert httpx.get(srv.url + "/v1/models", headers={"x-api-key": "# the team's keys"}).status_code == 401
