"""The route table: every route the app serves, in one list (the app mounts
it; the metrics and tracing sinks read its templates for their labels)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from . import admin, anthropic, completions, dashboard, embeddings, events, ollama, responses
from . import metrics as metrics_routes
from . import openai as openai_routes
from .common import JSONResponse, state_of


async def health(request: Request) -> Response:
    """Answers at once, even while a generation runs (it never touches the
    engine)."""
    return JSONResponse({"status": "ok", "state": state_of(request).registry.state})


def route_table() -> list[BaseRoute]:
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
