"""The ASGI application: routes, the observing middleware, and error shapes
for requests no handler takes (unknown routes, wrong methods)."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import __version__
from .dialects.errors import ollama_error, openai_error
from .middleware import ObserveMiddleware
from .observe import Observer
from .registry import Registry
from .routes import anthropic, completions, embeddings, ollama, responses
from .routes import openai as openai_routes
from .routes.common import JSONResponse, ServerState, state_of


async def health(request: Request) -> Response:
    """Answers at once, even while a generation runs (it never touches the
    engine)."""
    return JSONResponse({"status": "ok", "state": state_of(request).registry.state})


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 404:
        message = f"no route for {request.method} {path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {path}"
    else:
        message = exc.detail or f"HTTP {exc.status_code}"
    if path.startswith("/api/"):
        body: dict[str, Any] = ollama_error(exc.status_code, message)
    else:
        code = "not_found" if exc.status_code == 404 else None
        body = openai_error(exc.status_code, message, code=code)
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def build_app(registry: Registry, observer: Observer | None = None) -> Starlette:
    state = ServerState(registry=registry, observer=observer, version=__version__)
    routes = [
        Route("/health", health, methods=["GET"]),
        *openai_routes.routes,
        *completions.routes,
        *responses.routes,
        *embeddings.routes,
        *anthropic.routes,
        *ollama.routes,
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.turbospark = state
    # The middleware wraps the whole app (outside Starlette's own error
    # handling) so it sees the final status of every request.
    app.add_middleware(ObserveMiddleware, ids=state.ids, observer_ref=lambda: state.observer)
    return app
