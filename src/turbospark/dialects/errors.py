"""Each dialect's error body. Clients parse these, so the shapes are exact."""

from __future__ import annotations

from typing import Any

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


def openai_error(
    status: int, message: str, type: str | None = None, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``"""
    if type is None or (type == "invalid_request_error" and status != 400):
        type = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def anthropic_error(status: int, message: str, type: str | None = None, **_: Any) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``"""
    if type is None or type not in _ANTHROPIC_TYPES.values() or (type == "invalid_request_error" and status != 400):
        type = _ANTHROPIC_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": type, "message": message}}


def ollama_error(status: int, message: str, **_: Any) -> dict[str, Any]:
    """Ollama answers ``{"error": "..."}``."""
    return {"error": message}


def error_message(body: Any) -> str | None:
    """The message inside any of the three shapes (for ``requestFinished``)."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, str):
        return err
    if isinstance(err, dict):
        msg = err.get("message")
        if isinstance(msg, str):
            return msg
    return None


def shape_for_path(path: str):
    """The error shape a client of this path parses (for errors raised before
    any handler runs: 401s, unknown routes, wrong methods)."""
    if path.startswith("/api/") or path == "/api":
        return ollama_error
    if path.startswith("/v1/messages") or path.startswith("/messages"):
        return anthropic_error
    return openai_error
