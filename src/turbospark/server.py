"""Embedding API: run a turbospark server inside your own process.

ring = RingObserver()
server = Server(models=["smollm2-135m"], observer=ring).start()
...  # talk to server.url with any client
events = ring.drain().events
server.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from .auth import Auth, check_bind, read_key_file
from .catalog import DEFAULT_MODEL
from .compose import assemble
from .guard import policy_from
from .loading import ModelArg
from .observe import Observer
from .registry import Registry
from .sinks.live import LiveEvents

log = logging.getLogger("turbospark.server")


class Server:
    """A server on a background thread, with the models loaded in-process."""

    def __init__(
        self,
        models: Iterable[ModelArg] | None = None,
        *,
        observer: Observer | None = None,
        observers: Iterable[Observer] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        model_defaults: dict[str, Any] | None = None,
        api_keys: Iterable[str] = (),
        admin_keys: Iterable[str] = (),
        max_resident: int = 0,
        metrics_auth: bool = True,
        guardrails: bool = True,
        log_level: str = "warning",
        api_key_file: str | None = None,
        allowed_hosts: Iterable[str] = (),
        cors_origins: Iterable[str] = (),
        max_body: int | None = None,
        models_dirs: Iterable[str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        keys = [*api_keys, *(read_key_file(api_key_file) if api_key_file else [])]
        self.auth = Auth(tuple(keys), tuple(admin_keys), metrics_open=not metrics_auth)
        check_bind(host, self.auth)  # the same rule as `turbospark serve`
        self.assembly = assemble(
            list(models) if models is not None else [DEFAULT_MODEL],
            auth=self.auth,
            policy=policy_from(host, allowed_hosts, cors_origins, max_body),
            observers=[observer, *observers],
            max_resident=max_resident,
            guardrails=guardrails,
            model_folders=tuple(models_dirs) if models_dirs is not None else None,
            model_defaults=model_defaults,
        )
        self.registry = self.assembly.registry
        self.observer = self.assembly.observer
        self.metrics = self.assembly.metrics
        self.live = self.assembly.live  # /v1/events, /v1/stats, /dashboard
        self.app = self.assembly.app
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> Server:
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn_config(self.app, self._log_level)
        self._server = server = LiveUvicorn(config, self.live, self.registry)

        def run() -> None:
            async def main() -> None:
                self._loop = asyncio.get_running_loop()
                try:
                    await server.serve(sockets=[sock])
                finally:
                    await self.registry.close()

            asyncio.run(main())

        self._thread = threading.Thread(target=run, name="turbospark-http", daemon=True)
        self._thread.start()
        waited = 0.0
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the HTTP server failed to start")
            threading.Event().wait(0.02)
            waited += 0.02
            if waited > timeout:
                raise TimeoutError("the HTTP server did not start in time")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.assembly.close()  # what this server loaded (a model object passed in stays the caller's)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class LiveUvicorn(uvicorn.Server):
    """uvicorn that starts the registry's idle reaper with the loop, and ends
    the open ``/v1/events`` streams when it shuts down: they never end by
    themselves, so a graceful shutdown would otherwise wait out its whole
    timeout for them."""

    def __init__(self, config: uvicorn.Config, live: LiveEvents, registry: Registry | None = None) -> None:
        super().__init__(config)
        self.live = live
        self.registry = registry

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.registry is not None:
            self.registry.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.live.close()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, without re-raising the signal afterwards: uvicorn
        re-raises SIGTERM/SIGINT once it has stopped, which killed the process
        before ``turbospark serve`` could flush its event log and close its
        models. The caller's shutdown path runs instead, and it exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


#: the most bytes a request line and its headers may take (431 past it)
MAX_HEADER_BYTES = 64 * 1024
_TOO_LARGE_BODY = b"the request's headers are too large\n"
HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TOO_LARGE_BODY), _TOO_LARGE_BODY)
)


def _bounded_protocol() -> Any:
    """uvicorn's fast HTTP protocol (httptools), with a bound on the request
    head: llhttp itself has none, so a client could send headers without
    end. Past :data:`MAX_HEADER_BYTES` of a head that is not complete yet the
    connection gets a 431 and is closed. Without httptools: h11, whose
    incomplete-event bound does the same."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is a dependency
        return None

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _head_bytes = 0
        _in_head = True

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            self._in_head = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_head and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEADER_BYTES:
                    self.transport.write(HEADERS_TOO_LARGE)
                    self.transport.close()

    return BoundedHttpToolsProtocol


def uvicorn_config(app: Any, log_level: str = "warning") -> uvicorn.Config:
    """The HTTP server's settings, for ``Server`` and ``turbospark serve`` alike."""
    protocol = _bounded_protocol()
    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        http=protocol if protocol is not None else "h11",
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # listening now, so the address printed next takes connections at once
    # (they wait in the backlog until the event loop accepts them)
    sock.listen(2048)
    if hasattr(os, "set_inheritable"):
        sock.set_inheritable(True)
    return sock
