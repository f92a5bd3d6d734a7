"""The ASGI application: routes, the observing middleware, and error shapes
for requests no handler takes (unknown routes, wrong methods)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from . import __version__
from .auth import Auth
from .dialects.errors import shape_for_path
from .guard import BrowserPolicy
from .loading import default_model_folders
from .middleware import ERROR_KEY, AuthMiddleware, GuardMiddleware, LeaseMiddleware, ObserveMiddleware
from .observe import Observer, combine
from .registry import Registry
from .routes import admin, anthropic, completions, dashboard, embeddings, events, ollama, responses
from .routes import metrics as metrics_routes
from .routes import openai as openai_routes
from .routes.common import JSONResponse, ServerState, state_of
from .sinks.live import LiveEvents
from .sinks.prometheus import PrometheusSink


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
    request.scope.setdefault("state", {})[ERROR_KEY] = message
    shape = shape_for_path(path)
    code = "not_found" if exc.status_code == 404 else None
    body: dict[str, Any] = shape(exc.status_code, message, type=None, param=None, code=code)
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def route_table() -> list[BaseRoute]:
    """Every route the app serves (sinks read it for route-template labels)."""
    return [
        Route("/health", health, methods=["GET"]),
        *openai_routes.routes,
        *completions.routes,
        *responses.routes,
        *embeddings.routes,
        *anthropic.routes,
        *ollama.routes,
        *admin.routes,
        *metrics_routes.routes,
        *events.routes,
        *dashboard.routes,
    ]


def build_app(
    registry: Registry,
    observer: Observer | None = None,
    auth: Auth | None = None,
    metrics: PrometheusSink | None = None,
    *,
    live: LiveEvents | None = None,
    guardrails: bool = True,
    policy: BrowserPolicy | None = None,
    model_folders: Sequence[str] | None = None,
) -> Starlette:
    """``metrics`` should already be in ``observer`` (so it saw the models
    attach); without one, a fresh sink is added to the fan-out here so
    ``/metrics`` always works."""
    if metrics is None:
        metrics = PrometheusSink()
        observer = registry.observer = combine([observer, metrics])
    metrics.watch(registry)
    if live is None:  # likewise the feed behind /v1/events, /v1/stats, /dashboard
        live = LiveEvents()
        observer = registry.observer = combine([observer, live])
    state = ServerState(
        registry=registry,
        observer=observer,
        version=__version__,
        metrics=metrics,
        live=live,
        guardrails=guardrails,
        model_folders=tuple(model_folders) if model_folders is not None else default_model_folders(registry),
    )
    routes = route_table()
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.turbospark = state
    # Outermost first: observe (sees every request, 401s included), then
    # the browser guard (Host, Origin, CORS, body size) and auth, which both
    # refuse before any body is read, then leases (released once the
    # response, streams included, is complete). All sit outside Starlette's
    # own error handling, so they see every request's final status.
    app.add_middleware(LeaseMiddleware)
    app.add_middleware(AuthMiddleware, auth=auth or Auth(), observer_ref=lambda: state.observer)
    app.add_middleware(GuardMiddleware, policy=policy or BrowserPolicy())
    app.add_middleware(ObserveMiddleware, ids=state.ids, observer_ref=lambda: state.observer)
    return app
