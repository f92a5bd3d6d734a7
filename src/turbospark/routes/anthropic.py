"""Anthropic routes: ``/v1/messages`` and ``/v1/messages/count_tokens``.

The ``anthropic-version`` / ``anthropic-beta`` headers and the beta client's
``?beta=true`` need no handling: nothing here depends on them, and routing
ignores the query string.
"""

from __future__ import annotations

from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects import anthropic as msgs
from ..dialects.common import validate
from ..dialects.errors import anthropic_error
from ..engine.types import CancelFlag
from ..generation import Delta, Final, ReasoningDelta, ToolCallDelta, complete, prepare, render, stream
from .common import (
    DisconnectWatch,
    bind_request,
    JSONResponse,
    endpoint,
    error_response,
    read_json,
    request_id,
    route_model,
    sse_response,
    warning_headers,
)


def anthropic_error_frame(exc: BaseException) -> bytes:
    """Mid-stream failure: one ``event: error`` in Anthropic's shape (an
    engine failure is an ``api_error``), and no ``message_stop`` after it."""
    body = error_response(anthropic_error, exc).body
    return b"event: error\ndata: " + bytes(body) + b"\n\n"


def _headers(request: Request, warnings: list[str]) -> dict[str, str]:
    """Warnings, and ``request-id`` (what the SDK exposes as ``_request_id``)
    set to the id the request's events carry."""
    headers = warning_headers(warnings)
    rid = request_id(request)
    if rid is not None:
        headers["request-id"] = str(rid)
    return headers


@endpoint(anthropic_error)
async def messages(request: Request) -> Response:
    body = validate(msgs.MessagesRequest, await read_json(request))
    req, warnings = msgs.to_chat_request(body)
    bind_request(req, request)
    model, route = await route_model(request, body.model, "chat", bool(body.stream))
    prepared = prepare(model, req)
    # the budget (asked for, or the default) was cut to the room in the context
    clipped = prepared.config.max_new_tokens < req.default_max_tokens
    renderer = msgs.MessageRenderer(body.model or route.served, req.config.stop, clipped)
    cancel = CancelFlag()
    headers = _headers(request, warnings)
    if not body.stream:
        async with DisconnectWatch(request, cancel):
            final = await complete(model, prepared, cancel)
        return JSONResponse(renderer.response(final), headers=headers)

    async def frames() -> AsyncIterator[bytes]:
        async with DisconnectWatch(request, cancel):
            yield renderer.start_frames(len(prepared.prompt_ids))
            try:
                async for item in stream(model, prepared, cancel):
                    if isinstance(item, Delta):
                        yield renderer.text_frame(item.text)
                    elif isinstance(item, ReasoningDelta):
                        yield renderer.thinking_frame(item.text)
                    elif isinstance(item, ToolCallDelta):
                        yield renderer.tool_call_frames(item.call)
                    elif isinstance(item, Final):
                        yield renderer.final_frames(item)
            except Exception as exc:  # noqa: BLE001 - framed for the client
                yield anthropic_error_frame(exc)

    return sse_response(frames(), headers)


@endpoint(anthropic_error)
async def count_tokens(request: Request) -> Response:
    """Renders the prompt exactly as a real request would prefill it."""
    body = validate(msgs.CountTokensRequest, await read_json(request))
    req, warnings = msgs.to_prompt_request(body)
    model, _ = await route_model(request, body.model, "chat", False)
    ids = render(model, req)
    return JSONResponse({"input_tokens": len(ids)}, headers=_headers(request, warnings))


routes = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
