"""Pieces every dialect shares: body parsing, validation messages, framing."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError


class BadRequest(Exception):
    """A client error; each dialect renders it in its own error shape."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.type = type
        self.headers = headers or {}


def parse_json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise BadRequest("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON in the request body: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    return data


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # pydantic reports union members (e.g. 'str', 'list[...]') in loc
            if any(ch in str(part) for ch in "[]()") or str(part) in {"str", "int", "float", "bool", "list", "dict"}:
                continue
            out += ("." if out else "") + str(part)
    return out


def validation_error(exc: ValidationError) -> BadRequest:
    """One readable 400 from pydantic's errors, naming the first bad field."""
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    param = _loc(tuple(first.get("loc", ())))
    msg = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        text = f"missing required field '{param}'"
    elif param:
        text = f"invalid value for '{param}': {msg}"
    else:
        text = msg
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return BadRequest(text, param or None)


def validate(model: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def argument_pieces(text: str, n: int = 3) -> list[str]:
    """Tool-call arguments cut into a few delta pieces, the way the APIs
    stream them (clients must only rely on the concatenation)."""
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def unix_time() -> int:
    return int(time.time())


def sse_data(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_event(event: str, obj: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def ndjson(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


def text_of(content: Any, *, images: list[Any] | None = None, where: str = "content") -> str:
    """Flatten OpenAI/Anthropic-style content (a string or a list of typed
    parts) into text; image parts go to ``images`` when a list is given."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
                continue
            if not isinstance(part, dict):
                raise BadRequest(f"'{where}[{i}]' must be an object", f"{where}[{i}]")
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text"):
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"'{where}[{i}].text' must be a string", f"{where}[{i}].text")
                out.append(text)
            elif kind in ("image_url", "image", "input_image"):
                if images is not None:
                    images.append(part)
            else:
                raise BadRequest(
                    f"unsupported content part type {kind!r} in '{where}[{i}]'", f"{where}[{i}].type"
                )
        return "".join(out)
    raise BadRequest(f"'{where}' must be a string or a list of content parts", where)
