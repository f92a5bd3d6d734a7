"""Embedding API: run a turbospark server inside your own process.

    ring = RingObserver()
    server = Server(models=["smollm2-135m"], observer=ring).start()
    ...  # talk to server.url with any client
    events = ring.drain().events
    server.stop()
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any, Callable, Iterable

import uvicorn

from .app import build_app
from .catalog import DEFAULT_MODEL, resolve_model
from .engine.model import LlamaChatModel, ModelOptions
from .observe import Observer, combine
from .registry import Registry

log = logging.getLogger("turbospark.server")

ModelSpec = str | ModelOptions | Any


def load_model(
    spec: ModelSpec, defaults: dict[str, Any] | None = None, progress: Callable[[float], None] | None = None
) -> Any:
    """A path or catalog name, a :class:`ModelOptions`, or an already-built
    model object (anything with ``model_id`` and ``run_completion``)."""
    if isinstance(spec, str):
        path, default_id = resolve_model(spec)
        opts = ModelOptions(path=path, id=default_id, **(defaults or {}))
        return LlamaChatModel(opts, progress)
    if isinstance(spec, ModelOptions):
        return LlamaChatModel(spec, progress)
    return spec


class Server:
    """A server on a background thread, with the models loaded in-process."""

    def __init__(
        self,
        models: Iterable[ModelSpec] | None = None,
        *,
        observer: Observer | None = None,
        observers: Iterable[Observer] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        model_defaults: dict[str, Any] | None = None,
        log_level: str = "warning",
    ) -> None:
        self.host = host
        self.port = port
        self.observer = combine([observer, *observers])
        self.registry = Registry(self.observer)
        self._owned: list[Any] = []
        for spec in list(models) if models is not None else [DEFAULT_MODEL]:
            model = load_model(spec, model_defaults)
            if model is not spec:
                self._owned.append(model)
            self.registry.attach(model)
        self.app = build_app(self.registry, self.observer)
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "Server":
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._sock = sock
        config = uvicorn.Config(
            self.app, log_level=self._log_level, access_log=False, lifespan="off",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
            name="turbospark-http",
            daemon=True,
        )
        self._thread.start()
        waited = 0.0
        while not self._server.started:
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
        for model in self._owned:
            try:
                model.close()
            except Exception:  # pragma: no cover
                log.exception("closing %s failed", getattr(model, "model_id", model))
        self._owned.clear()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
