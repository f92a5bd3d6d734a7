"""OpenAI routes: ``/v1/chat/completions`` and ``/v1/models``."""

from __future__ import annotations

from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects import openai_chat as chat
from ..dialects.common import BadRequest, validate
from ..dialects.errors import openai_error
from ..engine.types import CancelFlag
from ..generation import Delta, Final, ReasoningDelta, ToolCallDelta, complete, prepare, stream
from .common import (
    bind_request,
    DisconnectWatch,
    JSONResponse,
    endpoint,
    error_response,
    read_json,
    route_model,
    sse_response,
    state_of,
    warning_headers,
)


def openai_error_frame(exc: BaseException) -> bytes:
    """Mid-stream failure: one ``event: error`` frame, and no ``[DONE]``."""
    body = error_response(openai_error, exc).body
    return b"event: error\ndata: " + bytes(body) + b"\n\n"


@endpoint(openai_error)
async def chat_completions(request: Request) -> Response:
    body = validate(chat.ChatCompletionRequest, await read_json(request))
    req, warnings = chat.to_chat_request(body)
    bind_request(req, request)
    model, route = await route_model(request, body.model, "chat", bool(body.stream))
    prepared = prepare(model, req)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    renderer = chat.ChatRenderer(body.model or route.served, include_usage, bool(body.timings))
    cancel = CancelFlag()
    headers = warning_headers(warnings)
    if not body.stream:
        async with DisconnectWatch(request, cancel):
            final = await complete(model, prepared, cancel)
        return JSONResponse(renderer.response(final), headers=headers)

    async def frames() -> AsyncIterator[bytes]:
        async with DisconnectWatch(request, cancel):
            yield renderer.role_frame()
            try:
                async for item in stream(model, prepared, cancel):
                    if isinstance(item, Delta):
                        yield renderer.text_frame(item.text)
                    elif isinstance(item, ReasoningDelta):
                        yield renderer.reasoning_frame(item.text)
                    elif isinstance(item, ToolCallDelta):
                        yield renderer.tool_call_frame(item.index, item.call)
                    elif isinstance(item, Final):
                        yield renderer.final_frames(item)
            except Exception as exc:  # noqa: BLE001 - framed for the client
                yield openai_error_frame(exc)

    return sse_response(frames(), headers)


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
