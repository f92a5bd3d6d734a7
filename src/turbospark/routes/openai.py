"""OpenAI routes: ``/v1/chat/completions`` and ``/v1/models``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects import openai_chat as chat
from ..dialects.common import BadRequest, validate
from ..dialects.errors import openai_error
from ..dialects.render import Renderer
from ..dialects.translate import Translation
from .common import (
    JSONResponse,
    endpoint,
    read_json,
    respond,
    route_and_prepare,
    state_of,
    warning_headers,
)


async def openai_generation(
    request: Request,
    schema: type[Any],
    translate: Callable[[Any], Translation],
    renderer_class: Callable[[str, Any, bool], Renderer],
) -> Response:
    """What the two OpenAI generation routes (chat, legacy completions) share:
    the body validated against ``schema``, translated, routed and prepared,
    then answered through ``renderer_class``."""
    body = validate(schema, await read_json(request))
    tr = translate(body)
    assert tr.request is not None
    model, route, prepared = await route_and_prepare(request, tr.request, body.model, tr.stream)
    renderer = renderer_class(body.model or route.served, body, tr.stream)
    return await respond(request, model, prepared, renderer, warning_headers(tr.warnings + prepared.warnings))


@endpoint(openai_error)
async def chat_completions(request: Request) -> Response:
    return await openai_generation(request, chat.ChatCompletionRequest, chat.to_chat_request, chat.ChatRenderer)


def model_card(entry: Any, created: int) -> dict[str, Any]:
    """OpenAI's model object, plus this server's ``state`` (loaded,
    unloaded, stalled, failed) and, for a failed model, its ``error``."""
    card = {"id": entry.id, "object": "model", "created": created, "owned_by": "turbospark", "state": entry.state}
    if entry.state == "failed":
        card["error"] = entry.failure
    return card


@endpoint(openai_error)
async def list_models(request: Request) -> Response:
    st = state_of(request)
    created = int(st.started_at)
    cards = [model_card(e, created) for e in st.registry.entries()]
    return JSONResponse({"object": "list", "data": cards})


@endpoint(openai_error)
async def get_model(request: Request) -> Response:
    st = state_of(request)
    name = request.path_params["model_id"]
    entry = st.registry.lookup(name)
    if entry is None or entry.id != name and name not in entry.aliases:
        raise BadRequest(f"model {name!r} not found", "model", status=404, code="model_not_found")
    return JSONResponse(model_card(entry, int(st.started_at)))


routes = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
]
