"""Each dialect's error body. Clients parse these, so the shapes are exact."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

#: a dialect's error body from (status, message, type=, param=, code=)
ErrorShape = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class Failure:
    """What went wrong, in every dialect's terms: the one classification
    (``routes.common.classify``) behind JSON error bodies, stream error
    frames, Ollama error lines and the ``error`` of ``requestFinished``."""

    status: int
    message: str
    type: str | None = None
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: a prompt over the context: (its tokens, the context), which
    #: llama-server's errors carry (``n_prompt_tokens``, ``n_ctx``) and
    #: clients written for it read to trim their history
    context: tuple[int, int] | None = None

    def body(self, shape: ErrorShape) -> dict[str, Any]:
        extra = {"context": self.context} if self.context is not None else {}
        return shape(self.status, self.message, type=self.type, param=self.param, code=self.code, **extra)

    def sse_frame(self, shape: ErrorShape) -> bytes:
        """One SSE ``event: error`` frame carrying the body the non-streamed
        error would have (OpenAI and Anthropic streams)."""
        return b"event: error\ndata: " + orjson.dumps(self.body(shape)) + b"\n\n"


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


#: llama-server's error type of a prompt over the context
EXCEED_CONTEXT = "exceed_context_size_error"


def openai_error(
    status: int,
    message: str,
    type: str | None = None,
    param: str | None = None,
    code: str | None = None,
    context: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``; a prompt over
    the context is llama-server's ``exceed_context_size_error`` (its type,
    ``n_prompt_tokens`` and ``n_ctx``, which clients written for it read),
    its ``code`` OpenAI's ``context_length_exceeded`` (what the OpenAI SDKs
    and Codex read)."""
    if type is None or (type == "invalid_request_error" and status != 400):
        type = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    if context is not None:
        type = EXCEED_CONTEXT
    error: dict[str, Any] = {"message": message, "type": type, "param": param, "code": code}
    if context is not None:
        error["n_prompt_tokens"], error["n_ctx"] = context
    return {"error": error}


def anthropic_error(status: int, message: str, type: str | None = None, **_: Any) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``"""
    if type is None or type not in _ANTHROPIC_TYPES.values() or (type == "invalid_request_error" and status != 400):
        type = _ANTHROPIC_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": type, "message": message}}


def ollama_error(status: int, message: str, **_: Any) -> dict[str, Any]:
    """Ollama answers ``{"error": "..."}``."""
    return {"error": message}


def cohere_error(status: int, message: str, **_: Any) -> dict[str, Any]:
    """Cohere answers ``{"message": "..."}``."""
    return {"message": message}


def llamacpp_error(
    status: int, message: str, type: str | None = None, context: tuple[int, int] | None = None, **_: Any
) -> dict[str, Any]:
    """llama-server's ``{"error": {"code", "message", "type"}}``; a prompt
    over the context is its ``exceed_context_size_error`` with
    ``n_prompt_tokens`` and ``n_ctx``."""
    if context is not None:
        return {
            "error": {
                "code": status,
                "message": message,
                "type": EXCEED_CONTEXT,
                "n_prompt_tokens": context[0],
                "n_ctx": context[1],
            }
        }
    if type is None or (type == "invalid_request_error" and status != 400):
        type = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"code": status, "message": message, "type": type}}
