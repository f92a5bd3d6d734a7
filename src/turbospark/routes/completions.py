"""OpenAI legacy Completions route: ``/v1/completions`` (and ``/completions``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects import openai_completions as comp
from ..dialects.errors import openai_error
from .common import endpoint
from .openai import openai_generation


@endpoint(openai_error)
async def completions(request: Request) -> Response:
    return await openai_generation(request, comp.CompletionRequest, comp.to_chat_request, comp.CompletionRenderer)


routes = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/completions", completions, methods=["POST"]),
]
