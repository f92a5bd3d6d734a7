"""Anthropic routes: ``/v1/messages`` and ``/v1/messages/count_tokens``.

The ``anthropic-version`` / ``anthropic-beta`` headers and the beta client's
``?beta=true`` need no handling: nothing here depends on them, and routing
ignores the query string.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..backend import Backend
from ..dialects import anthropic as msgs
from ..dialects.errors import anthropic_error
from .common import (
    JSONResponse,
    endpoint,
    normalize,
    off_loop,
    read_body,
    request_id,
    respond,
    route_and_prepare,
    run_routed,
    warning_headers,
)


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
    body = await read_body(request, msgs.MessagesRequest)
    tr = msgs.to_chat_request(body)
    assert tr.request is not None
    model, route, prepared = await route_and_prepare(request, tr.request, body.model, tr.stream)
    renderer = msgs.MessageRenderer(body.model or route.served, prepared, tr.stream)
    return await respond(request, model, prepared, renderer, _headers(request, tr.warnings + prepared.warnings))


@endpoint(anthropic_error)
async def count_tokens(request: Request) -> Response:
    """Renders the prompt exactly as a real request would prefill it."""
    body = await read_body(request, msgs.CountTokensRequest)
    req, warnings = msgs.to_prompt_request(body)
    normalize(req, request)  # counted as the real request will be prefilled

    async def count(model: Backend) -> int:
        return await off_loop(model.count_prompt, req)

    n, _ = await run_routed(request, body.model, "chat", count, req.normalized)
    return JSONResponse({"input_tokens": n}, headers=_headers(request, warnings))


routes = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
