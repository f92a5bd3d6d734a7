"""OpenAI Responses route: ``POST /v1/responses`` (JSON or typed SSE)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..backend import Backend
from ..dialects import openai_responses as rs
from ..dialects.errors import openai_error
from ..engine.types import AdmissionError
from ..generation import prepare
from ..request import ChatRequest, Prepared
from .common import endpoint, read_body, respond, route_and_prepare, warning_headers

#: Engine parameter names in admission errors -> this dialect's names.
_PARAMS = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


def _prepare(model: Backend, req: ChatRequest) -> Prepared:
    """``prepare``, with admission errors naming this dialect's fields."""
    try:
        return prepare(model, req)
    except AdmissionError as exc:
        if exc.param in _PARAMS:
            exc.param = _PARAMS[exc.param]  # the same error (and code), in this dialect's field names
        raise


@endpoint(openai_error)
async def create_response(request: Request) -> Response:
    body = await read_body(request, rs.ResponsesRequest)
    tr = rs.to_chat_request(body)
    assert tr.request is not None
    model, route, prepared = await route_and_prepare(request, tr.request, body.model, tr.stream, _prepare)
    renderer = rs.ResponsesRenderer(body, body.model or route.served, prepared.config, tr.extras["tools"])
    return await respond(request, model, prepared, renderer, warning_headers(tr.warnings + prepared.warnings))


routes: list[Route] = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/responses", create_response, methods=["POST"]),
]
