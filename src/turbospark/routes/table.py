"""The route table: every route the app serves, in one list (the app mounts
it; the metrics and tracing sinks read its templates for their labels).

Each wire dialect is one line: ``serve(dialect, its other routes)`` mounts the
generic handler on each of its generating paths and tags every route with the
dialect, whose error shape its failures take. The error shape of any path
(:func:`error_shapes`) and the CORS request headers (:func:`cors`) are derived
from this table and its dialects."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..dialects import (
    anthropic,
    cohere_rerank,
    llamacpp,
    ollama,
    ollama_embed,
    openai_chat,
    openai_completions,
    openai_embeddings,
)
from ..dialects import openai_responses as responses
from ..dialects import rerank as jina_rerank
from ..dialects.base import CorsHeaders, Dialect, ErrorShapes, cors_headers
from . import admin, conversations, embeddings, events, page, pulls, rerank
from . import anthropic as anthropic_routes
from . import llamacpp as llamacpp_routes
from . import metrics as metrics_routes
from . import ollama as ollama_routes
from . import openai as openai_routes
from . import responses as responses_routes
from .common import JSONResponse, endpoint, state_of
from .generic import handler


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


class DialectRoute(Route):
    """A route of a wire dialect: its failures come in the dialect's shape."""

    def __init__(self, route: Route, dialect: Dialect) -> None:
        super().__init__(route.path, endpoint(dialect.error)(route.endpoint), methods=route.methods)
        self.dialect = dialect


def serve(dialect: Dialect, routes: Iterable[Route] = ()) -> list[BaseRoute]:
    """A dialect's generating paths (the generic handler) and its other
    routes, each answering its failures in the dialect's error shape."""
    generating = [Route(path, handler(dialect, kind), methods=["POST"]) for path, kind in dialect.generating.items()]
    return [DialectRoute(route, dialect) for route in (*generating, *routes)]


#: the dialect of a path no dialect's route or prefix claims
DEFAULT_DIALECT = openai_chat.Dialect


def route_table() -> list[BaseRoute]:
    return [
        Route("/health", health, methods=["GET"]),
        *serve(openai_chat.Dialect, openai_routes.routes),
        *serve(openai_completions.Dialect),
        *serve(responses.Dialect, [*responses_routes.routes, *conversations.routes]),
        *serve(openai_embeddings.Dialect, embeddings.openai_routes),
        *serve(anthropic.Dialect, anthropic_routes.routes),
        *serve(ollama.Dialect, [*ollama_routes.routes, *pulls.routes]),
        *serve(ollama_embed.Dialect, embeddings.ollama_routes),
        *serve(llamacpp.Dialect, llamacpp_routes.routes),
        *serve(jina_rerank.Dialect, rerank.jina_routes),
        *serve(cohere_rerank.Dialect, rerank.cohere_routes),
        *admin.routes,
        *metrics_routes.routes,
        *events.routes,
        *page.routes,  # (``/``: the page to a browser, Ollama's probe to the rest)
    ]


def dialect_paths(routes: Iterable[BaseRoute]) -> list[tuple[str, Dialect]]:
    return [(r.path, r.dialect) for r in routes if isinstance(r, DialectRoute)]


def error_shapes(routes: Iterable[BaseRoute]) -> ErrorShapes:
    """Which error shape each path's client parses, from the table."""
    return ErrorShapes(DEFAULT_DIALECT, dialect_paths(routes))


def cors(routes: Iterable[BaseRoute]) -> CorsHeaders:
    """The request headers a browser client of any dialect served may send."""
    return cors_headers(d for _, d in dialect_paths(routes))
