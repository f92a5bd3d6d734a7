"""Anthropic's ``/v1/messages/count_tokens`` (``/v1/messages`` is served by
the generic handler, ``dialects/anthropic.py``).

The ``anthropic-version`` / ``anthropic-beta`` headers and the beta client's
``?beta=true`` need no handling: nothing here depends on them, and routing
ignores the query string.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..core.backend import Backend
from ..dialects import anthropic as msgs
from ..serving import media
from .common import (
    JSONResponse,
    dispatch,
    normalize,
    off_loop,
    read_body,
    state_of,
)
from .generic import response_headers


async def count_tokens(request: Request) -> Response:
    """Renders the prompt exactly as a real request would prefill it."""
    body = await read_body(request, msgs.CountTokensRequest)
    req, warnings = msgs.to_prompt_request(body)
    normalize(req, request)  # counted as the real request will be prefilled

    async def count(model: Backend) -> int:
        ready = await media.counted(state_of(request).media, model, req)  # (URLs fetched; none it cannot take)
        return await off_loop(model.count_prompt, ready)

    n, _ = await dispatch(request).run(body.model, "chat", count, req.normalized)
    return JSONResponse({"input_tokens": n}, headers=response_headers(msgs.Dialect, request, warnings))


routes = [
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
