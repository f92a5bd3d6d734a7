"""The ASGI application: routes, the observing middleware, and error shapes
for requests no handler takes (unknown routes, wrong methods)."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from .auth import Auth
from .dialects.errors import shape_for_path
from .guard import BrowserPolicy
from .middleware import (
    ERROR_KEY,
    AuthMiddleware,
    DrainMiddleware,
    GuardMiddleware,
    LeaseMiddleware,
    ObserveMiddleware,
)
from .routes.common import JSONResponse, ServerState
from .routes.table import route_table


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
    shape = shape_for_path(path, "anthropic-version" in request.headers)
    code = "not_found" if exc.status_code == 404 else None
    body: dict[str, Any] = shape(exc.status_code, message, type=None, param=None, code=code)
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def build_app(state: ServerState, auth: Auth, policy: BrowserPolicy) -> Starlette:
    """The ASGI app over a server's assembled parts (``compose.assemble``
    makes them); it creates and changes nothing else."""
    app = Starlette(routes=route_table(), exception_handlers={HTTPException: http_error})
    app.state.turbospark = state
    # Outermost first: observe (sees every request, 401s included), then
    # the drain (counts requests in flight; refuses new ones while the server
    # shuts down), the browser guard (Host, Origin, CORS, body size) and auth, which both
    # refuse before any body is read, then leases (released once the
    # response, streams included, is complete). All sit outside Starlette's
    # own error handling, so they see every request's final status.
    app.add_middleware(LeaseMiddleware)
    app.add_middleware(AuthMiddleware, auth=auth, observer_ref=lambda: state.observer)
    app.add_middleware(GuardMiddleware, policy=policy)
    app.add_middleware(DrainMiddleware, drain=state.drain)
    app.add_middleware(ObserveMiddleware, ids=state.ids, observer_ref=lambda: state.observer)
    return app
