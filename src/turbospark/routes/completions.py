"""OpenAI legacy Completions route: ``/v1/completions`` (and ``/completions``)."""

from __future__ import annotations

from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects import openai_completions as comp
from ..dialects.common import validate
from ..dialects.errors import openai_error
from ..engine.types import CancelFlag
from ..generation import Delta, Final, complete, prepare, stream
from .common import (
    DisconnectWatch,
    JSONResponse,
    bind_request,
    endpoint,
    read_json,
    route_model,
    sse_response,
    warning_headers,
)
from .openai import openai_error_frame


@endpoint(openai_error)
async def completions(request: Request) -> Response:
    body = validate(comp.CompletionRequest, await read_json(request))
    req, warnings = comp.to_chat_request(body)
    bind_request(req, request)
    model, route = await route_model(request, body.model, "chat", bool(body.stream))
    prepared = prepare(model, req)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    renderer = comp.CompletionRenderer(body.model or route.served, include_usage, bool(body.timings))
    cancel = CancelFlag()
    headers = warning_headers(warnings)
    if not body.stream:
        async with DisconnectWatch(request, cancel):
            final = await complete(model, prepared, cancel)
        return JSONResponse(renderer.response(final), headers=headers)

    async def frames() -> AsyncIterator[bytes]:
        async with DisconnectWatch(request, cancel):
            try:
                async for item in stream(model, prepared, cancel):
                    if isinstance(item, Delta):
                        yield renderer.text_frame(item.text)
                    elif isinstance(item, Final):
                        yield renderer.final_frames(item)
            except Exception as exc:  # noqa: BLE001 - framed for the client
                yield openai_error_frame(exc)

    return sse_response(frames(), headers)


routes = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/completions", completions, methods=["POST"]),
]
