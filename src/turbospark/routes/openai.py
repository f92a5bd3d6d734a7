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
from ..generation import ChatRequest
from .common import (
    Frames,
    JSONResponse,
    endpoint,
    error_frame,
    read_json,
    respond,
    route_and_prepare,
    state_of,
    warning_headers,
)


def openai_error_frame(exc: BaseException) -> bytes:
    """Mid-stream failure: one ``event: error`` frame, and no ``[DONE]``."""
    return error_frame(openai_error, exc)


async def openai_generation(
    request: Request,
    schema: type[Any],
    translate: Callable[[Any], tuple[ChatRequest, list[str]]],
    renderer_class: Callable[[str, bool, bool], Any],
    frames: Callable[[Any], Frames],
) -> Response:
    """What the two OpenAI generation routes (chat, legacy completions) share:
    the body validated against ``schema``, translated, routed and prepared,
    then rendered by ``renderer_class`` as JSON or, streamed, as ``frames``."""
    body = validate(schema, await read_json(request))
    req, warnings = translate(body)
    model, route, prepared = await route_and_prepare(request, req, body.model, bool(body.stream))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    renderer = renderer_class(body.model or route.served, include_usage, bool(body.timings))
    headers = warning_headers(warnings)
    return await respond(request, model, prepared, bool(body.stream), renderer.response, frames(renderer), headers)


def _chat_frames(renderer: chat.ChatRenderer) -> Frames:
    return Frames(
        opening=renderer.role_frame,
        text=renderer.text_frame,
        reasoning=renderer.reasoning_frame,
        tool_call=lambda delta: renderer.tool_call_frame(delta.index, delta.call),
        final=renderer.final_frames,
        error=openai_error_frame,
    )


@endpoint(openai_error)
async def chat_completions(request: Request) -> Response:
    return await openai_generation(
        request, chat.ChatCompletionRequest, chat.to_chat_request, chat.ChatRenderer, _chat_frames
    )


def model_card(entry: Any, created: int) -> dict[str, Any]:
    return {"id": entry.id, "object": "model", "created": created, "owned_by": "turbospark"}


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
