"""The ASGI application: routes, the observing middleware, and error shapes
for requests no handler takes (unknown routes, wrong methods)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..access.auth import Auth
from ..access.guard import BrowserPolicy
from ..dialects.base import ErrorShapes
from ..routes.common import JSONResponse
from ..routes.table import cors, error_shapes, route_table
from ..serving.context import context_of
from ..serving.state import ServerState
from .middleware import (
    AuthMiddleware,
    DrainMiddleware,
    GuardMiddleware,
    LeaseMiddleware,
    ObserveMiddleware,
)


def http_error(shapes: ErrorShapes) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Unknown routes and wrong methods, in the error shape of the path's
    dialect."""

    async def answer(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _http_error(shapes, request, exc)

    return answer


def _http_error(shapes: ErrorShapes, request: Request, exc: HTTPException) -> Response:
    path = request.url.path
    if exc.status_code == 404:
        message = f"no route for {request.method} {path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {path}"
    else:
        message = exc.detail or f"HTTP {exc.status_code}"
    context_of(request.scope).error = message
    shape = shapes.for_path(path, request.headers.keys())
    code = "not_found" if exc.status_code == 404 else None
    body: dict[str, Any] = shape(exc.status_code, message, type=None, param=None, code=code)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def build_app(state: ServerState, auth: Auth, policy: BrowserPolicy) -> Starlette:
    """The ASGI app over a server's assembled parts (``compose.assemble``
    makes them); it creates and changes nothing else."""
    routes = route_table()
    shapes = error_shapes(routes)
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error(shapes)})
    app.state.turbospark = state
    # Outermost first: observe (sees every request, 401s included), then
    # the drain (counts requests in flight; refuses new ones while the server
    # shuts down), the browser guard (Host, Origin, CORS, body size) and auth, which both
    # refuse before any body is read, then leases (released once the
    # response, streams included, is complete). All sit outside Starlette's
    # own error handling, so they see every request's final status.
    app.add_middleware(LeaseMiddleware)
    app.add_middleware(AuthMiddleware, auth=auth, shapes=shapes, observer_ref=lambda: state.observer)
    app.add_middleware(GuardMiddleware, policy=policy, shapes=shapes, cors=cors(routes))
    app.add_middleware(DrainMiddleware, drain=state.drain, shapes=shapes)
    app.add_middleware(ObserveMiddleware, ids=state.ids, observer_ref=lambda: state.observer)
    return app
