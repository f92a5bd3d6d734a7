"""OpenAI Responses route: ``POST /v1/responses`` (JSON or typed SSE)."""

from __future__ import annotations

from typing import Any, AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects import openai_responses as rs
from ..dialects.common import validate
from ..dialects.errors import openai_error
from ..engine.types import AdmissionError, CancelFlag, Overloaded
from ..generation import ChatRequest, Delta, Final, Prepared, ReasoningDelta, ToolCallDelta, complete, prepare, stream
from .common import (
    DisconnectWatch,
    bind_request,
    JSONResponse,
    endpoint,
    error_response,
    read_json,
    route_model,
    sse_response,
    warning_headers,
)

#: Engine parameter names in admission errors -> this dialect's names.
_PARAMS = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


def _prepare(model: Any, req: ChatRequest) -> Prepared:
    """``prepare``, with admission errors naming this dialect's fields."""
    try:
        return prepare(model, req)
    except AdmissionError as exc:
        if exc.param in _PARAMS:
            raise AdmissionError(str(exc), _PARAMS[exc.param]) from exc
        raise


def _error_message(exc: BaseException) -> str:
    """The message the non-streamed error body would carry."""
    body = orjson.loads(bytes(error_response(openai_error, exc).body))
    return body["error"]["message"]


@endpoint(openai_error)
async def create_response(request: Request) -> Response:
    body = validate(rs.ResponsesRequest, await read_json(request))
    req, warnings, tools = rs.to_chat_request(body)
    bind_request(req, request)
    model, route = await route_model(request, body.model, "chat", bool(body.stream))
    prepared = _prepare(model, req)
    renderer = rs.ResponsesRenderer(body, body.model or route.served, prepared.config, tools)
    cancel = CancelFlag()
    headers = warning_headers(warnings)
    if not body.stream:
        async with DisconnectWatch(request, cancel):
            final = await complete(model, prepared, cancel)
        return JSONResponse(renderer.response(final), headers=headers)

    async def frames() -> AsyncIterator[bytes]:
        async with DisconnectWatch(request, cancel):
            yield renderer.opening_frames()
            try:
                async for item in stream(model, prepared, cancel):
                    if isinstance(item, Delta):
                        yield renderer.delta_frame(item.text)
                    elif isinstance(item, ReasoningDelta):
                        yield renderer.reasoning_frame(item.text)
                    elif isinstance(item, ToolCallDelta):
                        yield renderer.tool_call_frames(item.call)
                    elif isinstance(item, Final):
                        yield renderer.closing_frames(item)
            except Exception as exc:  # noqa: BLE001 - framed for the client
                code = "rate_limit_exceeded" if isinstance(exc, Overloaded) else "server_error"
                yield renderer.failed_frame(_error_message(exc), code)

    return sse_response(frames(), headers)


routes: list[Route] = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/responses", create_response, methods=["POST"]),
]
