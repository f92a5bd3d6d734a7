"""The one shape of a wire dialect: every dialect module exports ONE
:class:`Dialect` (named ``Dialect``), and the server derives the rest from
these objects and the route table: the generating routes (one generic
handler, ``routes.generic``), the error shape of any path (:class:`ErrorShapes`,
for errors raised before a handler runs) and the CORS request headers
(:func:`cors_headers`). Pure: no HTTP types."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from ..core.backend import Backend
from ..core.request import ChatRequest, Prepared
from .errors import ErrorShape
from .render import Renderer
from .translate import Translation


@dataclass(frozen=True)
class Served:
    """What routing and the envelope know that a renderer may write: the
    served model's id, its context, the nanoseconds this request spent
    loading it, and the request's arrival (``time.perf_counter_ns``)."""

    model: str
    max_context: int = 0
    load_ns: int = 0
    started_ns: int = 0


#: a dialect's renderer from (the validated body, its translation, the
#: prepared generation, what routing served): one signature for all
RendererFactory = Callable[[Any, Translation, Prepared, Served], Renderer]


def named_model(body: Any) -> str | None:
    """The model a body names (its ``model`` field), as the registry takes it."""
    return body.model  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Kind:
    """One generating request kind of a dialect (most have one; Ollama has
    chat and generate, llama.cpp completion and infill)."""

    #: the pydantic model the body is validated against
    schema: type[BaseModel]
    #: the body → the one ``ChatRequest`` (pure)
    translate: Callable[[Any], Translation]
    renderer: RendererFactory
    #: the model the body asks for, as the registry knows it
    requested: Callable[[Any], str | None] = named_model
    #: engine parameter names in admission errors → this dialect's field names
    params: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: a refusal once the model is routed (Ollama's ``think`` on a model
    #: that cannot): (the request, the routed model, the requested name)
    check: Callable[[ChatRequest, Backend, str | None], None] | None = None
    #: the answer to a request with nothing to generate (Ollama's load and
    #: unload): (the body, its translation, what routing served)
    idle: Callable[[Any, Translation, Served], dict[str, Any]] | None = None
    #: its responses are kept by the server's response store (Responses'
    #: ``store``, ``previous_response_id``, ``conversation``, ``background``)
    stored: bool = False


@dataclass(frozen=True)
class Dialect:
    """A wire dialect: its error shape, its generating paths and their
    request kinds, and what the envelope must know of it."""

    name: str
    #: its error body from (status, message, type=, param=, code=)
    error: ErrorShape
    #: generating path → its request kind (the generic handler serves each)
    generating: Mapping[str, Kind] = field(default_factory=lambda: MappingProxyType({}))
    #: path prefixes it owns besides its routes: an unknown path under one
    #: gets its error shape (``/api/``: Ollama's)
    prefixes: tuple[str, ...] = ()
    #: a request header its clients send, and the paths shared with another
    #: dialect (``/v1/models``) whose errors such a client gets in this shape
    client_header: str | None = None
    shared_paths: tuple[str, ...] = ()
    #: request headers (and header prefixes) its browser clients send (CORS)
    cors_headers: tuple[str, ...] = ()
    cors_header_prefixes: tuple[str, ...] = ()
    #: a response header carrying the request's id (Anthropic's ``request-id``)
    request_id_header: str | None = None

    def owns(self, path: str) -> bool:
        return any(path.startswith(p) or path == p.rstrip("/") for p in self.prefixes)

    def shares(self, path: str, headers: Iterable[str]) -> bool:
        """A client of this dialect (by its header) on a path it shares."""
        if self.client_header is None or self.client_header not in headers:
            return False
        return any(path == p or path.startswith(p + "/") for p in self.shared_paths)


class ErrorShapes:
    """The error shape a client of a path parses (for errors raised before
    any handler runs: 401s, 403s, 413s, unknown routes, wrong methods),
    derived from the dialects and the paths of their routes: a path under a
    dialect's prefix, a shared path asked by a dialect's client, a route's
    own path, else the default dialect's."""

    def __init__(self, default: Dialect, routes: Iterable[tuple[str, Dialect]]) -> None:
        self.default = default
        self.exact: dict[str, Dialect] = {}
        dialects = {default.name: default}
        for path, dialect in routes:
            dialects.setdefault(dialect.name, dialect)
            if "{" not in path:
                self.exact.setdefault(path, dialect)
        self.dialects = tuple(dialects.values())

    def dialect_for(self, path: str, headers: Iterable[str] = ()) -> Dialect:
        names = [h.lower() for h in headers]
        for dialect in self.dialects:
            if dialect.owns(path):
                return dialect
        for dialect in self.dialects:
            if dialect.shares(path, names):
                return dialect
        return self.exact.get(path, self.default)

    def for_path(self, path: str, headers: Iterable[str] = ()) -> ErrorShape:
        return self.dialect_for(path, headers).error


#: request headers any browser client may send, whatever its dialect: the
#: server's own (keys, the body's type, the session, the request id)
SERVER_CORS_HEADERS = ("authorization", "x-api-key", "content-type", "x-session-id", "x-request-id")


@dataclass(frozen=True)
class CorsHeaders:
    """The request headers a page on an allowed origin may send."""

    names: tuple[str, ...]
    prefixes: tuple[str, ...]

    def allowed(self, requested: str) -> str:
        """The ``Access-Control-Allow-Headers`` answer for a preflight's
        ``Access-Control-Request-Headers``: the asked ones that are allowed."""
        asked = [h.strip().lower() for h in requested.split(",") if h.strip()]
        ok = [h for h in asked if h in self.names or h.startswith(self.prefixes)]
        return ", ".join(ok or self.names)


def cors_headers(dialects: Iterable[Dialect]) -> CorsHeaders:
    """The server's own headers and every dialect's, each once, in order."""
    names = list(SERVER_CORS_HEADERS)
    prefixes: list[str] = []
    for d in dialects:
        names += [h for h in d.cors_headers if h not in names]
        prefixes += [p for p in d.cors_header_prefixes if p not in prefixes]
    return CorsHeaders(tuple(names), tuple(prefixes))
