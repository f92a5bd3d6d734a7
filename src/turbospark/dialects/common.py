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


#: the most values (counted by their separating commas, an upper bound) a
#: request body may hold: parsing and validating each costs the event loop
#: time (the parsers hold the GIL), and a 30 MB list of 15M token ids froze
#: every stream for seconds. Far beyond any request a context can take.
MAX_VALUES = 1_000_000


def parse_json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise BadRequest("the request body is empty; expected a JSON object", code="invalid_json")
    if body.count(b",") >= MAX_VALUES:  # (a few ms for the largest body --max-body lets in)
        raise BadRequest(
            f"the request body holds too many values (more than {MAX_VALUES:,} separated by commas are not read)",
            status=413,
            code="too_many_values",
        )
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
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "missing":
        text = f"missing required field '{param}'"
    elif param:
        text = f"invalid value for '{param}': {msg}"
    else:
        text = msg
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return BadRequest(text, param or None)


#: How deeply a request body may nest. Far beyond any real request, and
#: well inside what the JSON writers (orjson stops at 255 levels), the
#: templates and the schema tools can take: past it a value could not be
#: echoed, rendered or checked, so it is refused up front.
MAX_DEPTH = 128


def _path(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def check_depth(data: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse a body nested more than ``limit`` levels, naming where."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            if isinstance(child, (dict, list)):
                if len(path) >= limit:
                    where = _path((*path, key)[:6]) + "..."
                    raise BadRequest(f"'{where}' is nested too deeply (more than {limit} levels)", where)
                stack.append((child, (*path, key)))


def validate(model: type[BaseModel], data: dict[str, Any]) -> Any:
    check_depth(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def check_json_schema(schema: Any, where: str, param: str | None = None) -> dict[str, Any]:
    """A client's JSON schema that a grammar will enforce (structured output,
    a required tool call), checked here so a schema the grammar cannot take
    is a 400 naming the field it came in (``param``: the error's ``param``
    when it differs from ``where``), not a failure deeper down."""
    from ..tools.grammar import check_schema

    param = param or where
    if not isinstance(schema, dict):
        raise BadRequest(f"'{where}' must be a JSON schema object", param)
    try:
        check_schema(schema)
    except RecursionError:
        raise BadRequest(f"'{where}' is nested too deeply", param) from None
    except Exception as exc:  # noqa: BLE001 - any failure on client data is the client's
        raise BadRequest(f"'{where}': {exc}", param) from None
    return schema


def gbnf(grammar: str, param: str = "grammar") -> str:
    """A GBNF grammar (llama.cpp's ``grammar`` field) in llguidance's Lark
    syntax; one it cannot convert (a syntax error, an undefined rule) is a
    400 naming the problem."""
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return str(gbnf_to_lark(grammar))
    except Exception as exc:  # noqa: BLE001 - whatever the converter says of it
        raise BadRequest(f"'{param}' is not a GBNF grammar this server can use: {exc}", param) from None


def constrain(req: Any, grammar: str | None, json_schema: Any, schema_param: str = "json_schema") -> None:
    """llama-server's constraint fields on a request: ``grammar`` (GBNF), or a
    ``json_schema`` (``{}``: any object, as llama-server reads it). A grammar
    with tools is refused, as llama-server refuses it (the tool-call grammar
    is the server's own)."""
    if grammar:  # (an empty one is none, as llama-server reads it)
        if getattr(req, "tools", None):
            raise BadRequest("a custom 'grammar' cannot be used together with tools", "grammar")
        req.grammar = gbnf(grammar)
    elif json_schema is not None:
        req.json_schema = check_json_schema(json_schema or {"type": "object"}, schema_param)


def check_tool_schemas(schemas: list[tuple[str, Any, Any]], choice: str, name: str | None) -> None:
    """When a call is forced (``choice`` "required" or "named"), the offered
    tools' parameter schemas become a grammar: check each one the grammar
    will use. ``schemas``: ``(where, tool name, schema)`` per tool."""
    if choice not in ("required", "named"):
        return
    for where, tool, schema in schemas:
        if choice == "named" and tool != name:
            continue
        check_json_schema(schema, where)


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
