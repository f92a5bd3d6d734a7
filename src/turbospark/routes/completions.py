"""OpenAI legacy Completions route: ``/v1/completions`` (and ``/completions``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects import openai_completions as comp
from ..dialects.errors import openai_error
from .common import Frames, endpoint
from .openai import openai_error_frame, openai_generation


def _frames(renderer: comp.CompletionRenderer) -> Frames:
    return Frames(text=renderer.text_frame, final=renderer.final_frames, error=openai_error_frame)


@endpoint(openai_error)
async def completions(request: Request) -> Response:
    return await openai_generation(
        request, comp.CompletionRequest, comp.to_chat_request, comp.CompletionRenderer, _frames
    )


routes = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/completions", completions, methods=["POST"]),
]
