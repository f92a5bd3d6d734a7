"""Remote media URLs (issue 43, item 3): off by default (a 400 saying how to
turn them on: tests/test_media_dialects.py), fetched only from the hosts
``--allow-media-urls`` names, never from a loopback or private address
unless the operator named that address itself, no redirect to another host,
a size cap and a time limit; every refusal a 400 in the dialect's shape.

The images are served by a small HTTP server on loopback (named literally,
``127.0.0.1:PORT``, which is how an operator allows an address that is
otherwise refused); ``localhost:PORT`` is allowed too, to show that a name
resolving to loopback is refused all the same."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import openai
import pytest

from turbospark.engine import media

if not media.available():
    pytest.skip("this llama-cpp-python is built without libmtmd (scripts/llama-wheel.sh)", allow_module_level=True)

from turbospark import Server  # noqa: E402
from turbospark.core.request import Media  # noqa: E402
from turbospark.engine.model import ModelOptions  # noqa: E402
from turbospark.engine.types import AdmissionError  # noqa: E402
from turbospark.models.catalog import resolve_model  # noqa: E402
from turbospark.serving.media import MAX_FETCH_BYTES, MediaPolicy, _address, _public, allowed_hosts, fetch  # noqa: E402

from .media_samples import RED  # noqa: E402
from .mmproj import N_IMAGE_TOKENS, write_mmproj  # noqa: E402
from .support import assert_anthropic_error, assert_openai_error  # noqa: E402

RELEASE = threading.Event()  # lets /slow answer


class Images(BaseHTTPRequestHandler):
    """The loopback image host."""

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        port = self.server.server_address[1]
        if self.path == "/red.png":
            self._send(200, RED, {"Content-Type": "image/png"})
        elif self.path == "/same":
            self._send(302, headers={"Location": "/red.png"})
        elif self.path == "/elsewhere":
            self._send(302, headers={"Location": f"http://localhost:{port}/red.png"})
        elif self.path == "/loop":
            self._send(302, headers={"Location": "/loop"})
        elif self.path == "/page.html":
            self._send(200, b"<html><body>not an image</body></html>", {"Content-Type": "text/html"})
        elif self.path == "/declared-huge":
            self._send(200, RED, {"Content-Length": str(MAX_FETCH_BYTES + 1)})
        elif self.path == "/streamed-huge":  # (no length: read until the connection closes)
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            chunk = b"\x00" * (1 << 20)
            try:
                for _ in range(MAX_FETCH_BYTES // len(chunk) + 2):
                    self.wfile.write(chunk)
            except OSError:
                pass  # (the server stopped reading: the cap)
        elif self.path == "/slow":
            RELEASE.wait(30)
            self._send(200, RED)
        else:
            self._send(404, b"no such image")


@pytest.fixture(scope="module")
def host() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Images)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    RELEASE.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def srv(host: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    mmproj = write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-576.gguf")
    path, _ = resolve_model("smollm2-135m")
    model = ModelOptions(id="eye", path=path, mmproj=str(mmproj), ctx=1024, threads=2, gpu_layers=0, parallel=1)
    port = host.split(":")[1]
    server = Server(models=[model], allow_media_urls=[f"{host},localhost:{port}"]).start()
    yield server
    server.stop()


def chat(srv: Server, url: str | None) -> httpx.Response:
    content: list[Any] = [{"type": "text", "text": "What is this?"}]
    if url is not None:
        content.append({"type": "image_url", "image_url": {"url": url}})
    body = {"model": "eye", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)


def test_an_image_is_fetched_from_an_address_the_operator_named(srv: Server, host: str) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    text = chat(srv, None).json()["usage"]["prompt_tokens"]
    for path in ("/red.png", "/same"):  # (a redirect to the same host is followed)
        r = client.chat.completions.create(
            model="eye",
            max_tokens=1,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": f"http://{host}{path}"}},
                    ],
                }
            ],
        )
        assert r.usage is not None and r.usage.prompt_tokens == text + N_IMAGE_TOKENS
    # the same bytes inline or fetched are the same image
    inline = chat(srv, "data:image/png;base64," + base64.b64encode(RED).decode())
    assert inline.json()["usage"]["prompt_tokens"] == text + N_IMAGE_TOKENS


def test_an_anthropic_url_source_is_fetched(srv: Server, host: str) -> None:
    ant = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)
    image = {"type": "image", "source": {"type": "url", "url": f"http://{host}/red.png"}}
    counted = ant.messages.count_tokens(model="eye", messages=[{"role": "user", "content": [image]}])
    plain = ant.messages.count_tokens(model="eye", messages=[{"role": "user", "content": ""}])
    assert counted.input_tokens == plain.input_tokens + N_IMAGE_TOKENS
    r = httpx.post(
        srv.url + "/v1/messages",
        json={"model": "eye", "max_tokens": 1, "messages": [{"role": "user", "content": [image]}]},
        timeout=60,
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("url", "code", "contains"),
    [
        ("http://{host}/elsewhere", "media_url_refused", "redirects to another host (localhost)"),
        ("http://localhost:{port}/red.png", "media_url_refused", "loopback, private or link-local"),
        ("http://127.0.0.2:{port}/red.png", "media_url_refused", "only from the hosts --allow-media-urls names"),
        ("http://127.0.0.1:1/red.png", "media_url_refused", "only from the hosts"),
        ("http://{host}/loop", "media_url_refused", "redirects too many times"),
        ("http://{host}/missing.png", "media_fetch_failed", "HTTP 404"),
        ("http://{host}/declared-huge", "media_too_large", "larger than"),
        ("http://{host}/streamed-huge", "media_too_large", "larger than"),
    ],
)
def test_a_url_the_server_must_not_fetch_is_a_400(srv: Server, host: str, url: str, code: str, contains: str) -> None:
    r = chat(srv, url.format(host=host, port=host.split(":")[1]))
    err = assert_openai_error(r, 400, "messages[0].content[1].image_url", contains)
    assert err["code"] == code, err


def test_a_page_that_is_no_image_is_refused_in_anthropics_shape(srv: Server, host: str) -> None:
    image = {"type": "image", "source": {"type": "url", "url": f"http://{host}/page.html"}}
    body = {"model": "eye", "max_tokens": 1, "messages": [{"role": "user", "content": [image]}]}
    r = httpx.post(srv.url + "/v1/messages", json=body, timeout=60)
    assert_anthropic_error(r, 400, "'messages[0].content[0].source.url' is neither an image")


def test_the_address_checks() -> None:
    assert _public("93.184.216.34") and _public("2606:4700::1111")
    for private in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1", "fe80::1%2", "::ffff:127.0.0.1"):
        assert not _public(private), private
    anywhere = MediaPolicy(allowed_hosts(["*"]))
    with pytest.raises(AdmissionError, match="loopback"):  # (any host, but no address unless named)
        asyncio.run(_address(anywhere, httpx.URL("http://127.0.0.1:8080/x.png"), "f"))
    with pytest.raises(AdmissionError, match="loopback"):  # (a name: resolved, then checked)
        asyncio.run(_address(MediaPolicy(allowed_hosts(["localhost"])), httpx.URL("http://localhost/x.png"), "f"))
    named = MediaPolicy(allowed_hosts(["127.0.0.1:8080", "*.example.com"]))
    assert asyncio.run(_address(named, httpx.URL("http://127.0.0.1:8080/x.png"), "f")) == "127.0.0.1"
    with pytest.raises(AdmissionError, match="only from the hosts"):
        asyncio.run(_address(named, httpx.URL("http://example.com/x.png"), "f"))
    for bad in ("http://x/", "a/b", "user@host"):
        with pytest.raises(ValueError, match="not a host"):
            allowed_hosts([bad])


def test_a_fetch_that_takes_too_long_is_cut(host: str) -> None:
    policy = MediaPolicy(allowed_hosts([host]), timeout=0.3)
    with pytest.raises(AdmissionError, match="took longer than 0.3 s"):
        asyncio.run(fetch(policy, Media("image", url=f"http://{host}/slow", field="f")))


def test_serve_refuses_a_bad_allow_media_urls_entry() -> None:
    serve = [sys.executable, "-m", "turbospark.cli", "serve", "--allow-media-urls", "https://x/", "--port", "0"]
    out = subprocess.run(serve, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not a host" in out.stderr, out.stderr
