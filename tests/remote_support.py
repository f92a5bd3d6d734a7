"""Upstreams on loopback for the remote-engine tests: real turbospark
processes (and llama.cpp's llama-server when the bench's peer build is
present), and a scripted OpenAI-compatible upstream for what a real one
cannot be made to do (a 429, a call left as text, a failure mid-stream)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: an upstream
    the tests kill and start again on its port must find it free, and a
    port in that range may meanwhile be taken as the local end of any
    outgoing connection (the front's, a client's), which made the restart
    fail with "address in use"."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(200 if low - max(1024, low // 2) >= 64 else 0):
        port = rng.randrange(max(1024, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:  # every try was taken: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 180, key: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"upstream exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def keep_reading(response: httpx.Response) -> threading.Thread:
    """Read a held stream in the background until it ends or is closed, so
    its run is never failed as a reader that fell behind."""

    def read() -> None:
        try:
            for _ in response.iter_bytes():
                pass
        except Exception:  # closed by the test: the end it waited for
            pass

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


class Upstream:
    """A turbospark process serving SmolLM2 on a loopback port."""

    def __init__(self, *extra: str, key: str | None = None, event_log: str | None = None) -> None:
        self.port = free_port()
        self.key = key
        self.event_log = event_log
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Upstream:
        cmd = [sys.executable, "-m", "turbospark.cli", "serve", "--model", "smollm2-135m", "--port", str(self.port)]
        cmd += ["--threads", "1", "--parallel", "2", "--ctx", "2048", *self.extra]
        if self.key:
            cmd += ["--api-key", self.key]
        if self.event_log:
            cmd += ["--event-log", self.event_log]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        wait_up(self.url, self.proc, key=self.key)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def settled(self, quiet: float = 0.6) -> int:
        """How many ``generated`` events its log holds once nothing more is
        being written (the log is written in batches, behind the requests)."""
        n = len(self.generated())
        while True:
            time.sleep(quiet)
            m = len(self.generated())
            if m == n:
                return n
            n = m

    def generated(self) -> list[dict[str, Any]]:
        """The upstream's own ``generated`` events, from its event log."""
        assert self.event_log is not None
        out = []
        with open(self.event_log, "rb") as f:
            for line in f:
                e = json.loads(line)
                if e.get("kind") == "generated":
                    out.append(e)
        return out


def peer_binary() -> tuple[str, dict[str, str]] | None:
    """llama-server from the bench's peer build (``bench/peer.sh``) and its
    environment, when it was built on this machine; None otherwise (never
    built by the tests)."""
    spec = importlib.util.spec_from_file_location("bench_peer", os.path.join(ROOT, "bench", "peer.py"))
    assert spec is not None and spec.loader is not None
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    path = peer.built()
    return (path, peer.peer_env(path)) if path else None


# ------------------------------------------------------------ scripted upstream
#: seconds a stalling scripted upstream says nothing
STALL = 4.0


class ScriptedUpstream:
    """An OpenAI-compatible server answering from ``self.mode``:
    ``rate_limited`` (429 + Retry-After), ``unavailable`` (503 without
    Retry-After), ``draining`` (503 ``shutting_down`` with Retry-After),
    ``vllm_overflow`` (vLLM's 400 for a
    prompt over its context), ``server_error`` (a 500 with an
    error body), ``text_call`` (a Hermes call left
    in the content), ``mid_stream`` (one piece, then an error event),
    ``cut`` (one piece, then the stream closes without an end), ``cut_empty``
    (an event stream that closes before its first chunk), ``stall`` and
    ``stall_mid`` (silent for :data:`STALL` seconds before the answer, or
    after its first piece), ``no_usage`` (an answer without its usage chunk),
    ``parsed_call`` (reasoning and a call the upstream parsed itself, in
    pieces), ``two_calls`` and ``interleaved_calls`` (two such calls, one
    after the other or interleaved by index), ``echo_key`` and ``echo_key_503``
    (an error quoting the request's Authorization header), ``json_error_200``
    (a gateway's error in a 200 JSON body), the stream quirks of
    :meth:`_quirk`, ``ok`` (a short answer). It records the bodies and headers it got."""

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        #: (certfile, keyfile): served over TLS by hypercorn, which offers
        #: HTTP/2 by ALPN (uvicorn speaks HTTP/1.1 only)
        self.tls = tls
        #: per request: its HTTP version and the client's (host, port), one
        #: port per connection
        self.versions: list[str] = []
        self.clients: list[tuple[str, int]] = []
        self.mode = "ok"
        #: modes for the next requests, one each, before ``mode`` applies again
        self.queue: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.port = free_port()
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run if tls is None else self._hypercorn, daemon=True)
        self._loop: Any = None
        self._stop: Any = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _hypercorn(self) -> None:
        import asyncio

        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        assert self.tls is not None
        config = Config()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.certfile, config.keyfile = self.tls
        config.loglevel = "ERROR"
        # no idle connection is closed by the upstream during a test (one
        # connection must carry every request), and its stop waits for the
        # client to close its own (the front's shutdown must do it)
        config.keep_alive_timeout = 60
        config.graceful_timeout = 60

        async def run() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await serve(self.app, config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        asyncio.run(run())

    def start(self) -> ScriptedUpstream:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self._up():
            if time.monotonic() > deadline:
                raise RuntimeError("scripted upstream did not start")
            time.sleep(0.02)
        return self

    def _up(self) -> bool:
        if self.tls is None:
            return bool(self.server.started)
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        if self.tls is None:
            self.server.should_exit = True
        elif self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(timeout=10)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.versions.append(request.scope.get("http_version", ""))
        client = request.scope.get("client") or ("", 0)
        self.clients.append((client[0], client[1]))
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        mode = self.queue.pop(0) if self.queue else self.mode
        if mode == "stall":  # says nothing for longer than a short read timeout, then answers
            await asyncio.sleep(STALL)
        if mode == "json":  # ignores ``stream``
            return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]})
        if mode in ("parsed_call", "two_calls", "interleaved_calls"):
            # the upstream's own tool parser: structured calls, in pieces (two
            # one after the other, as vLLM sends parallel calls, or interleaved)
            return StreamingResponse(self._parsed_call(mode), media_type="text/event-stream")
        if mode == "server_error":  # this request failed there (an engine's own 500, with its error body)
            err = {"error": {"message": "failed to apply the chat template", "type": "server_error"}}
            return JSONResponse(err, status_code=500)
        if mode == "vllm_overflow":  # vLLM's refusal of a prompt over its context
            message = ("This model's maximum context length is 4096 tokens. However, your request has 5000 input "
                       "tokens. Please reduce the length of the input messages.")  # fmt: skip
            err = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse(err, status_code=400)
        if mode in ("unavailable", "draining"):  # an engine not ready; a turbospark shutting down
            code, headers = ("unavailable", {}) if mode == "unavailable" else ("shutting_down", {"Retry-After": "3"})
            err = {"error": {"message": f"{mode}", "type": "server_error", "code": code}}
            return JSONResponse(err, status_code=503, headers=headers)
        if mode in ("echo_key", "echo_key_503"):  # a gateway that echoes the request's headers in its error
            seen = f"bad request; headers seen: authorization={request.headers.get('authorization')}"
            status = 400 if mode == "echo_key" else 503
            return JSONResponse({"error": {"message": seen, "type": "invalid_request_error"}}, status_code=status)
        if mode == "json_error_200":  # a gateway's error, in a 200 JSON body
            err = {"error": {"message": "model 'scripted' is not loaded on this worker", "code": "model_not_found"}}
            return JSONResponse(err)
        if mode in ("sglang_refusal", "llama_error_field", "llama_error_field_late", "held_open", "null_index",
                    "no_index"):  # fmt: skip
            return StreamingResponse(self._quirk(mode), media_type="text/event-stream")
        if mode == "rate_limited":
            err = {"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limited"}}
            return JSONResponse(err, status_code=429, headers={"Retry-After": "7"})
        if mode == "text_call":
            pieces = ["<tool_call>", '{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "</tool_call>"]
        elif mode == "cut_empty":  # a 200 event stream that closes before anything
            return StreamingResponse(iter([b": opened\n\n"]), media_type="text/event-stream")
        elif mode == "bad_text_call":  # an argument the schema does not have
            pieces = ['<tool_call>{"name": "get_weather", "arguments": {"town": "Paris"}}</tool_call>']
        else:
            pieces = ["Hello", " there"]

        async def frames() -> Any:
            for i, p in enumerate(pieces):
                chunk = {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": p}}],
                }
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                if mode == "stall_mid" and i == 0:
                    await asyncio.sleep(STALL)
                if mode == "cut" and i == 0:  # closes cleanly: no finish_reason, no [DONE]
                    return
                if mode == "mid_stream" and i == 0:
                    err = {"error": {"message": "the GPU fell over", "type": "server_error"}}
                    yield b"event: error\ndata: " + orjson.dumps(err) + b"\n\n"
                    return
            done = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield b"data: " + orjson.dumps(done) + b"\n\n"
            if mode != "no_usage":  # (an upstream that ignores stream_options.include_usage)
                usage = {"prompt_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 4}}
                yield b"data: " + orjson.dumps({"id": "c", "choices": [], "usage": usage}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(frames(), media_type="text/event-stream")

    async def _quirk(self, mode: str) -> Any:
        """Streams as real engines send them at their edges: SGLang's refusal
        inside the stream before any token, llama-server's (before 2025-09)
        error as an SSE field of its own, before or after tokens; a whole
        answer held open without ``[DONE]``; a call whose ``index`` is null;
        two calls with no ``index`` at all."""

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return b"data: " + orjson.dumps({"id": "c", "choices": [choice]}) + b"\n\n"

        if mode == "sglang_refusal":
            message = "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
            err = {"object": "error", "type": "BadRequestError", "code": 400, "message": message}
            yield b"data: " + orjson.dumps({"error": err}) + b"\n\n"
            yield b"data: [DONE]\n\n"
            return
        if mode.startswith("llama_error_field"):
            if mode.endswith("late"):
                yield chunk({"content": "Hello"})
            message = "the request exceeds the available context size. try increasing the context size"
            err = {"code": 400, "type": "invalid_request_error", "message": message}
            yield b"error: " + orjson.dumps(err) + b"\n\n"
            yield b"data: [DONE]\n\n"
            return
        if mode == "null_index":
            call = {"index": None, "id": "call_n", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
            yield chunk({"tool_calls": [call]})
            yield chunk({}, "tool_calls")
        elif mode == "no_index":  # two calls, each whole in one piece, told apart by their ids alone
            for n, city in enumerate(("Paris", "Oslo")):
                call = {"id": f"call_{n}", "type": "function",
                        "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}  # fmt: skip
                yield chunk({"tool_calls": [call]})
            yield chunk({}, "tool_calls")
        else:  # held_open
            yield chunk({"content": "Hello"})
            yield chunk({"content": " there"})
            yield chunk({}, "stop")
        usage = {"prompt_tokens": 11, "completion_tokens": 7}
        yield b"data: " + orjson.dumps({"id": "c", "choices": [], "usage": usage}) + b"\n\n"
        if mode == "held_open":
            await asyncio.sleep(LINGER * 6)  # no [DONE]: open and silent
        yield b"data: [DONE]\n\n"

    async def _parsed_call(self, mode: str) -> Any:
        def opened(i: int) -> dict[str, Any]:
            fn = {"name": "get_weather", "arguments": ""}
            return {"tool_calls": [{"index": i, "id": f"call_up{i + 1}", "type": "function", "function": fn}]}

        def piece(i: int, text: str) -> dict[str, Any]:
            return {"tool_calls": [{"index": i, "function": {"arguments": text}}]}

        deltas = [{"role": "assistant", "reasoning_content": "The user wants Paris."}, opened(0)]
        if mode == "two_calls":
            deltas += [
                piece(0, '{"city": '),
                piece(0, '"Paris"}'),
                opened(1),
                piece(1, '{"city": '),
                piece(1, '"Oslo"}'),
            ]
        elif mode == "interleaved_calls":
            deltas += [
                piece(0, '{"city": '),
                opened(1),
                piece(1, '{"city": '),
                piece(0, '"Paris"}'),
                piece(1, '"Oslo"}'),
            ]
        else:
            deltas += [piece(0, '{"city": '), piece(0, '"Paris"}')]
        for d in deltas:
            yield b"data: " + orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": d}]}) + b"\n\n"
        end = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        yield b"data: " + orjson.dumps(end) + b"\n\n"
        usage = {"prompt_tokens": 20, "completion_tokens": 12, "completion_tokens_details": {"reasoning_tokens": 5}}
        yield b"data: " + orjson.dumps({"id": "c", "choices": [], "usage": usage}) + b"\n\n"
        yield b"data: [DONE]\n\n"


#: how long a ``linger`` upstream holds a finished stream open
LINGER = 10.0


class ClosingUpstream:
    """A raw HTTP/1.1 upstream that closes connections at awkward moments.
    ``mode`` ``kept`` (the default): it answers the first request on each
    connection and keeps the connection open, then closes it without an
    answer when the next request arrives on it, which is what a client meets
    when it reuses a kept-alive connection just as the upstream's idle
    timeout closes it (uvicorn's and llama-server's are 5 s). ``never``:
    every request is closed on unanswered. ``short``: the answer, then the
    connection closes before the body's announced length (a cut past the
    stream's ``[DONE]``). ``linger``: the same, but the connection stays open
    and silent for :data:`LINGER` seconds first. ``connections`` counts the connections it accepted,
    ``dropped`` the requests it closed on unanswered."""

    def __init__(self, mode: str = "kept") -> None:
        self.mode = mode
        self.connections = 0
        self.dropped = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_request(f: Any) -> dict[str, Any] | None:
        length = 0
        line = f.readline()
        if not line:
            return None
        while (line := f.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return json.loads(f.read(length)) if length else {}

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            body = self._read_request(f)
            if body is None:
                return
            if self.mode == "never":
                self.dropped += 1
                return
            if body.get("stream"):
                chunks = [
                    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello"}}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                    {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}},
                ]
                payload = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
                kind = b"text/event-stream"
            else:
                message = {"role": "assistant", "content": "Hello"}
                answer = {
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
                }
                payload, kind = orjson.dumps(answer), b"application/json"
            length = len(payload) + (16 if self.mode in ("short", "linger") else 0)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (kind, length)
            conn.sendall(head + payload)
            if self.mode == "linger":
                time.sleep(LINGER)
            if self.mode in ("short", "linger"):
                return
            if self._read_request(f) is not None:
                self.dropped += 1  # the next request on this connection: closed unanswered

    def stop(self) -> None:
        self.sock.close()
