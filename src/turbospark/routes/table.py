"""The route table: every route the app serves, in one list (the app mounts
it; the metrics and tracing sinks read its templates for their labels)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from . import admin, anthropic, completions, dashboard, embeddings, events, llamacpp, ollama, responses
from . import metrics as metrics_routes
from . import openai as openai_routes
from .common import JSONResponse, state_of


async def health(request: Request) -> Response:
    """Answers at once, even while a generation runs (it never touches the
    engine): 503 ``draining`` once a graceful shutdown has begun, so a load
    balancer sends no more; 503 ``degraded`` naming the models that failed
    (until reloaded) or stalled, and why."""
    st = state_of(request)
    if st.drain.draining:
        return JSONResponse({"status": "draining", "state": st.registry.state}, status_code=503)
    bad = st.registry.unhealthy()
    if bad:
        models = [{"id": e.id, "state": e.state, "error": e.problem} for e in bad]
        return JSONResponse({"status": "degraded", "state": st.registry.state, "models": models}, status_code=503)
    return JSONResponse({"status": "ok", "state": st.registry.state})


def route_table() -> list[BaseRoute]:
    return [
        Route("/health", health, methods=["GET"]),
        *openai_routes.routes,
        *completions.routes,
        *responses.routes,
        *embeddings.routes,
        *anthropic.routes,
        *ollama.routes,
        *llamacpp.routes,
        *admin.routes,
        *metrics_routes.routes,
        *events.routes,
        *dashboard.routes,
    ]
