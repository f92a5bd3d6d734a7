"""Helpers for the view tests: a fresh server around the session's already
loaded model (nothing reloads; its ring and fold start empty), and a small
SSE reader."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import orjson

from turbospark import Server
from turbospark.views.console.client import SSEParser


@contextlib.contextmanager
def fresh_server(shared: Server, **kw: Any) -> Iterator[Server]:
    srv = Server(models=[shared.registry.models()[0]], **kw).start()
    try:
        yield srv
    finally:
        srv.stop()


@contextlib.contextmanager
def group_with_a_replica_down(shared: Server, **kw: Any) -> Iterator[Server]:
    """A server whose model ``pool`` has two replicas: ``a``, the shared
    server (a real upstream on loopback), and ``b``, a port nothing listens
    on. A request sent to ``b`` finds it unreachable: it is marked down (a
    ``modelHealth`` event) and the request is answered by ``a``."""
    from turbospark.models.loading import GroupOptions
    from turbospark.upstream.model import RemoteOptions

    from .remote_support import free_port
    from .support import wait_until

    def remote(url: str) -> RemoteOptions:
        return RemoteOptions(id="x", base_url=url + "/v1", model="smollm2-135m", ctx=2048)

    dead = f"http://127.0.0.1:{free_port()}"
    group = GroupOptions("pool", [("a", remote(shared.url)), ("b", remote(dead))], health_interval=3600, cooldown=3600)
    srv = Server([group], **kw).start()
    try:
        replicas = srv.assembly.registry.lookup("pool").group
        # (the first health check, due at once, may find b down before this request does)
        key = next((k for k in (f"s{i}" for i in range(500)) if replicas.pick("session:" + k).name == "b"), None)
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "pool", "max_tokens": 4, "messages": [
            {"role": "user", "content": "Say hi."}]}, headers={"x-session-id": key or "s0"}, timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text
        wait_until(lambda: not replicas.by_name("b").up, what="replica b marked down")
        yield srv
    finally:
        srv.stop()


def chat(
    url: str,
    *,
    model: str = "gpt-4o",
    stream: bool = False,
    max_tokens: int = 8,
    content: str = "Say hello.",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


class FrameReader:
    """Frames (``{"id", "event", "data"}``, data parsed) from an open SSE
    response; comments come as ``{"comment": text}``."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.iter_lines()
        self._parser = SSEParser()

    def until(self, done) -> list[dict[str, Any]]:
        """Read until ``done(frames read by this call)`` is true."""
        frames: list[dict[str, Any]] = []
        for line in self._lines:
            if line.startswith(":"):
                frames.append({"comment": line[1:].strip()})
            frame = self._parser.feed(line)
            if frame is not None and frame.data:
                frames.append({"id": frame.id, "event": frame.event, "data": orjson.loads(frame.data)})
            if done(frames):
                return frames
        raise AssertionError(f"the stream ended early: {frames}")


def read_frames(response: httpx.Response, done) -> list[dict[str, Any]]:
    return FrameReader(response).until(done)
