"""Embedding routes: OpenAI ``/v1/embeddings`` (and ``/embeddings``), Ollama
``/api/embed`` and the legacy ``/api/embeddings``.

``encode`` blocks (a llama_decode over the batch), so it runs in a worker
thread: the event loop keeps serving, and since the embedder has a llama
context of its own it never waits behind a chat generation either. Routing
reports ``requestRouted`` with ``stream`` false; there is no ``generated``
event (that one is for generations).
"""

from __future__ import annotations

import time

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..core.backend import Backend
from ..dialects import ollama as ollama_names
from ..dialects import ollama_embed as oe
from ..dialects import openai_embeddings as emb
from ..engine.types import Embeddings
from ..models.registry import Route as ModelRoute
from .common import JSONResponse, dispatch, read_body


async def encode(model: Backend, texts: list[str], truncate: bool = False) -> Embeddings:
    """The model's blocking ``encode`` in a worker thread."""
    return await anyio.to_thread.run_sync(model.encode, texts, truncate)


async def embed(
    request: Request, requested: str | None, texts: list[str], truncate: bool = False
) -> tuple[Embeddings | None, ModelRoute]:
    """Route the request and encode ``texts`` (none: routed only); in a
    replica group a failed replica is replaced once (``Dispatch.run``)."""

    async def run(model: Backend) -> Embeddings | None:
        return await encode(model, texts, truncate) if texts else None

    return await dispatch(request).run(requested, "embeddings", run)


async def openai_embeddings(request: Request) -> Response:
    body = await read_body(request, emb.EmbeddingRequest)
    texts = emb.texts_of(body)
    result, route = await embed(request, body.model, texts)
    assert result is not None  # texts_of refuses an empty input
    return JSONResponse(emb.render(body, route.served, result))


async def ollama_embed(request: Request) -> Response:
    started = time.perf_counter_ns()
    body = await read_body(request, oe.EmbedRequest)
    texts = oe.embed_texts(body)
    dimensions = oe.check_dimensions(body.dimensions)
    result, route = await embed(request, ollama_names.model_name(body.model), texts, body.truncate is not False)
    took = time.perf_counter_ns() - started
    return JSONResponse(oe.render_embed(body.model, route.served, result, dimensions, took))


async def ollama_embeddings(request: Request) -> Response:
    body = await read_body(request, oe.EmbeddingsRequest)
    texts = oe.legacy_texts(body)
    result, _ = await embed(request, ollama_names.model_name(body.model), texts)
    return JSONResponse(oe.render_legacy(result))


openai_routes = [
    Route("/v1/embeddings", openai_embeddings, methods=["POST"]),
    Route("/embeddings", openai_embeddings, methods=["POST"]),
]
ollama_routes = [
    Route("/api/embed", ollama_embed, methods=["POST"]),
    Route("/api/embeddings", ollama_embeddings, methods=["POST"]),
]
