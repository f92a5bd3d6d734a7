"""Calls a small model writes in the wrong shape, taken for what they are
(CONTRACT §8). Only a whole answer that is one JSON object is considered, and
only when it fits an offered tool's parameters schema exactly:

- ``{"name": X, ...the arguments beside it}`` (no ``arguments`` key): a call
  to X when the rest is valid for X;
- the bare arguments ``{"command": ["echo", "hi"]}``: a call to the one
  offered tool whose schema they are valid for and declare every key of (a
  schema that would take anything, or two tools that both fit, rescue
  nothing);
- positional arguments ``{"name": X, "arguments": ["echo", "hi"]}`` (what
  Qwen2.5-Coder-0.5B writes for a shell tool): the list is the value of X's
  one required parameter, when that is valid.

Anything else stays the answer it was.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from .calls import ToolCall, new_call_id
from .prompting import functions_of

#: an answer longer than this is no rescued call (and is not held back for one)
MAX_RESCUE_CHARS = 4096


def _object(text: str) -> dict[str, Any] | None:
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0].strip()
    if not body.startswith("{") or len(body) > MAX_RESCUE_CHARS:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and value else None


def _problem(args: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why ``args`` do not fit ``schema`` (None: they do)."""
    try:
        jsonschema.validate(args, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
        return f"do not match its schema at {where}: {exc.message}"
    except Exception:  # noqa: BLE001 - a broken client schema fits nothing
        return "cannot be checked against its schema"
    return None


def _declares(args: dict[str, Any], schema: dict[str, Any]) -> bool:
    props = schema.get("properties")
    return isinstance(props, dict) and bool(props) and all(k in props for k in args)


def rescue_call(text: str, tools: list[dict[str, Any]] | None) -> tuple[ToolCall | None, str | None]:
    """(the call ``text`` is, in one of the shapes above, or None; why a
    call-shaped answer naming an offered tool is not one, for the guardrails'
    re-ask, or None)."""
    obj = _object(text)
    if obj is None or not tools:
        return None, None
    schemas = {fn["name"]: fn.get("parameters") or {"type": "object"} for fn in functions_of(tools)}
    name = obj.get("name")
    listed = obj.get("arguments", obj.get("parameters"))
    if isinstance(name, str) and name in schemas and isinstance(listed, list):
        return _positional(name, listed, schemas[name])
    if isinstance(name, str) and name in schemas and "arguments" not in obj and "parameters" not in obj:
        args = {k: v for k, v in obj.items() if k != "name"}
        why = _problem(args, schemas[name])
        if why is not None:
            return None, f"the arguments of {name!r} {why}"
        return ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False)), None
    fits = [n for n, s in schemas.items() if _declares(obj, s) and _problem(obj, s) is None]
    if len(fits) != 1:
        return None, None
    return ToolCall(new_call_id(), fits[0], json.dumps(obj, ensure_ascii=False)), None


def _positional(name: str, values: list[Any], schema: dict[str, Any]) -> tuple[ToolCall | None, str | None]:
    required = schema.get("required")
    if not isinstance(required, list) or len(required) != 1 or not isinstance(required[0], str):
        return None, f"the arguments of {name!r} are a list, not an object"
    args = {required[0]: values}
    why = _problem(args, schema)
    if why is not None:
        return None, f"the arguments of {name!r} are a list, not an object"
    return ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False)), None


def may_become_call(answer: str) -> bool:
    """Whether an answer that has begun like this might still be rescued
    (so a stream holds it back): it starts a JSON object and is short."""
    body = answer.lstrip()
    if body.startswith("```"):
        body = body[3:].removeprefix("json").lstrip()
    return (not body or body.startswith("{")) and len(answer) <= MAX_RESCUE_CHARS
