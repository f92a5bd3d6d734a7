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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from .access.auth import Auth, check_bind, read_key_file
from .access.guard import policy_from
from .compose import ConfigReloader, Reading, assemble, follow_config
from .config import ConfigError, load_config, model_fields
from .models.catalog import DEFAULT_MODEL
from .models.loading import ModelArg
from .models.registry import STALL_TIMEOUT, Registry
from .observe import Observer
from .serving.drain import CUT_GRACE_SECONDS, DEFAULT_DRAIN_SECONDS, Drain
from .serving.media import MediaPolicy
from .sinks.live import LiveEvents
from .state.responses import ResponseStore
from .web.middleware import BODY_TIMEOUT, SEND_TIMEOUT, ClientTimeouts

log = logging.getLogger("turbospark.server")


class Server:
    """A server on a background thread, with the models loaded in-process.
    ``store_dir``: the model store ``/api/pull`` fills and pulled models load
    from (None, the default: no store; ``turbospark serve`` always has one).
    ``state_dir``: where stored responses are kept (None, the default: none,
    as ``--store off``). ``slot_save_path``: the folder of llama-server's
    slot files (``POST /slots/{id}?action=save|restore``; None: refused).
    ``default_model``: the id of the model serving a name no model answers
    to (None: the first of ``models``); ``strict_model_names``: such a name
    is a 404 instead (docs/MODELS.md). ``allow_media_urls``: the hosts
    (``host``, ``host:port``, ``*.example.com``) image URLs in requests are
    fetched from (none, the default: such a URL is a 400); ``max_images``:
    the most images and sounds one request may carry (default 16);
    ``max_rerank_documents``: the most documents one rerank request may
    carry (default 1000)."""

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
        normalize_client_stamps: bool = True,
        sse_keepalive: float = 15.0,
        log_level: str = "warning",
        api_key_file: str | None = None,
        allowed_hosts: Iterable[str] = (),
        cors_origins: Iterable[str] = (),
        max_body: int | None = None,
        models_dirs: Iterable[str] | None = None,
        remote_key_envs: Iterable[str] = (),
        drain_timeout: float = DEFAULT_DRAIN_SECONDS,
        stall_timeout: float = STALL_TIMEOUT,
        send_timeout: float = SEND_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
        store_dir: str | None = None,
        state_dir: str | None = None,
        store_ttl: float = 30 * 86400.0,
        slot_save_path: str | None = None,
        default_model: str | None = None,
        strict_model_names: bool = False,
        allow_media_urls: Iterable[str] = (),
        max_images: int | None = None,
        max_rerank_documents: int | None = None,
    ) -> None:
        self.send_timeout, self.body_timeout = send_timeout, body_timeout
        self.host = host
        self.drain_timeout = drain_timeout
        self.port = port
        keys = [*api_keys, *(read_key_file(api_key_file) if api_key_file else [])]
        self.auth = Auth(tuple(keys), tuple(admin_keys), metrics_open=not metrics_auth)
        check_bind(host, self.auth)  # the same rule as `turbospark serve`
        media = MediaPolicy.of(allow_media_urls, max_images)  # (a bad host: ValueError)
        self.assembly = assemble(
            list(models) if models is not None else [DEFAULT_MODEL],
            auth=self.auth,
            policy=policy_from(host, allowed_hosts, cors_origins, max_body),
            observers=[observer, *observers],
            max_resident=max_resident,
            stall_timeout=stall_timeout,
            guardrails=guardrails,
            normalize_client_stamps=normalize_client_stamps,
            sse_keepalive=sse_keepalive,
            model_folders=tuple(models_dirs) if models_dirs is not None else None,
            remote_key_envs=tuple(remote_key_envs),
            model_defaults=model_defaults,
            store_dir=store_dir,
            responses=ResponseStore(state_dir, ttl=store_ttl) if state_dir is not None else None,
            slot_save_path=slot_save_path,
            default_model=default_model,
            strict_model_names=strict_model_names,
            media=media,
            max_rerank_documents=max_rerank_documents,
        )
        self.registry = self.assembly.registry
        self.observer = self.assembly.observer
        self.metrics = self.assembly.metrics
        self.live = self.assembly.live  # /v1/events, /v1/stats, /dashboard
        self.app = self.assembly.app
        self._log_level = log_level
        self._server: LiveUvicorn | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.config_file: ConfigReloader | None = None  # (from_config's)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def from_config(cls, path: str, models: Iterable[ModelArg] = (), *, watch: bool = False, **kw: Any) -> Server:
        """A server of the config file at ``path`` (docs/MODELS.md): its
        models (and ``models`` after them), its ``[defaults]`` over
        ``model_defaults`` for a model attached later, its ``default = true``
        section as ``default_model``; reloadable as ``turbospark serve
        --config``'s (``POST /v1/admin/config/reload``; ``watch``: also when
        it changes). Other arguments as :class:`Server`'s; ``[server]``
        settings are refused (give them as those arguments), and so is a
        ``pull`` section (no store resolves it here). :class:`ConfigError`
        names a bad file's problem."""
        given = dict(kw.pop("model_defaults", None) or {})

        def read() -> Reading:
            cfg = load_config(path)
            if cfg.server:
                raise ConfigError(f"{path}: [server] is turbospark serve's; give Server(...) its settings instead")
            return cfg, {**given, **model_fields(cfg.defaults)}

        first = read()
        kw.setdefault("default_model", first[0].default)
        server = cls([*first[0].models, *models], model_defaults=first[1], **kw)
        keys = {"api_keys": len(server.auth.api_keys), "admin_keys": len(server.auth.admin_keys)}
        server.config_file = follow_config(server.assembly, path, read, first, keys, watch)
        return server

    def start(self, timeout: float = 30.0) -> Server:
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn_config(self.app, self._log_level, self.send_timeout, self.body_timeout, self.assembly.drain)
        self._server = server = LiveUvicorn(
            config, self.live, self.registry, self.assembly.drain, self.drain_timeout, self.config_file
        )

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
        """Shut down as ``turbospark serve`` does on SIGTERM: new requests are
        refused, those in flight get up to ``drain_timeout`` seconds, the rest
        end with an error; then the models close and the event log is flushed."""
        server, loop = self._server, self._loop
        if server is not None and loop is not None and self._thread is not None and self._thread.is_alive():
            try:
                done = asyncio.run_coroutine_threadsafe(server.drain_and_exit(), loop)
                done.result(self.drain_timeout + CUT_GRACE_SECONDS + 5)
            except Exception:  # noqa: BLE001 - stopping goes on regardless
                log.exception("draining failed")
        if server is not None:
            server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.assembly.close()  # what this server loaded (a model object passed in stays the caller's)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class LiveUvicorn(uvicorn.Server):
    """uvicorn with turbospark's lifecycle: the registry's idle reaper starts
    with the loop; a first SIGTERM/SIGINT drains (``drain.Drain``: new
    requests refused, those in flight finish for up to ``drain_timeout``
    seconds, then the rest are ended with an error) before uvicorn stops; a
    second signal cuts everything and exits at once; the open
    ``/v1/events`` streams are ended at shutdown (they never end by
    themselves, so a graceful shutdown would otherwise wait them out)."""

    def __init__(
        self,
        config: uvicorn.Config,
        live: LiveEvents,
        registry: Registry | None = None,
        drain: Drain | None = None,
        drain_timeout: float = DEFAULT_DRAIN_SECONDS,
        config_file: ConfigReloader | None = None,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        #: told once the server accepts connections, its signal handlers in
        #: place (``turbospark serve``'s banner: a signal after it drains)
        self.on_started = on_started
        self.live = live
        self.registry = registry
        self.drain = drain
        self.drain_timeout = drain_timeout
        #: the config file a SIGHUP re-reads (None: SIGHUP drains, as SIGTERM)
        self.config_file = config_file
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.registry is not None:
            self.registry.start()
        if self.config_file is not None:
            self.config_file.start()
        if self.on_started is not None and self.started:
            self.on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.live.close()
        if self.config_file is not None:
            self.config_file.stop()
        await super().shutdown(sockets)

    async def drain_and_exit(self) -> None:
        """Drain, then let uvicorn stop (on the server's loop)."""
        try:
            if self.drain is not None:
                await self.drain.run(self.drain_timeout)
        finally:
            self.should_exit = True

    def begin_drain(self) -> None:
        """Start :meth:`drain_and_exit` once (on the server's loop)."""
        if self._draining is None:
            self._draining = asyncio.ensure_future(self.drain_and_exit())

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig == getattr(signal, "SIGHUP", None) and self.config_file is not None:
            self.config_file.hangup()  # with a config file, SIGHUP re-reads it (as daemons do)
            return
        if self.drain is None or self._loop is None or not self.started:
            super().handle_exit(sig, frame)  # not serving yet: stop at once
            return
        if self._draining is None and not self.should_exit:
            log.warning("turbospark: %s received, draining (a second signal exits now)", signal.Signals(sig).name)
            self._loop.call_soon_threadsafe(self.begin_drain)
            return
        if sig == getattr(signal, "SIGHUP", None):
            return  # a closing terminal may send it twice (the shell, then the kernel): not a second signal
        log.warning("turbospark: second signal, exiting now")
        self.drain.cut()
        self.should_exit = True
        self.force_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's (and SIGHUP), without re-raising the signal afterwards: uvicorn
        re-raises SIGTERM/SIGINT once it has stopped, which killed the process
        before ``turbospark serve`` could flush its event log and close its
        models. The caller's shutdown path runs instead, and it exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = list(HANDLED_SIGNALS)
        # a closed terminal (SIGHUP) drains as SIGTERM does (its default
        # killed the process: streams cut without an error frame, no KV kept,
        # the event log's tail lost), unless it is ignored (``nohup``)
        # (with a config file, SIGHUP re-reads it, even under ``nohup``)
        hup = getattr(signal, "SIGHUP", None)
        if hup is not None and (self.config_file is not None or signal.getsignal(hup) is not signal.SIG_IGN):
            signals.append(hup)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                # (the server is ending: a terminal's hangup, which may come
                # twice, must not kill the models' and the event log's closing)
                signal.signal(sig, signal.SIG_IGN if sig == hup else handler)


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

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            transport.set_write_buffer_limits(high=WRITE_BUFFER)

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


def uvicorn_config(
    app: Any,
    log_level: str = "warning",
    send_timeout: float = SEND_TIMEOUT,
    body_timeout: float = BODY_TIMEOUT,
    drain: Drain | None = None,
) -> uvicorn.Config:
    """The HTTP server's settings, for ``Server`` and ``turbospark serve``
    alike; the app runs inside the client timeouts (``ClientTimeouts``),
    which the drain's deadline ends."""
    protocol = _bounded_protocol()
    return uvicorn.Config(
        ClientTimeouts(app, send_timeout, body_timeout, drain),
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        http=protocol if protocol is not None else "h11",
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )


#: each connection's kernel send buffer (Linux doubles it) and the server's
#: own write buffer before a response's sender waits: far more than a token
#: stream has in flight, small enough that a client which stops reading
#: stalls its stream after some hundreds of frames (so --send-timeout can
#: drop it); autotuned, the kernel would absorb megabytes first
SEND_BUFFER = 32 * 1024
WRITE_BUFFER = 16 * 1024


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
