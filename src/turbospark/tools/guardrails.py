"""Guardrails for tool calls (CONTRACT §8): a call must name an offered
tool and its arguments must validate against that tool's JSON schema; when a
turn fails that (or names no call although one was required) the model gets
ONE corrective user turn and a second attempt. Each attempt is real work and
is reported as its own ``generated`` event.
"""

from __future__ import annotations

import json
from typing import Any, cast

import jsonschema

from .calls import function_part
from .prompting import functions_of


def validate_calls(calls: list[Any], tools: list[dict[str, Any]] | None) -> list[str]:
    """Problems with parsed calls (empty when all are valid)."""
    schemas = {fn["name"]: fn.get("parameters") or {"type": "object"} for fn in functions_of(tools)}
    problems: list[str] = []
    for call in calls:
        schema = schemas.get(call.name)
        if schema is None:
            problems.append(f"{call.name!r} is not one of the offered functions ({', '.join(schemas)})")
            continue
        try:
            args = json.loads(call.arguments)
        except ValueError as exc:
            problems.append(f"the arguments of {call.name!r} are not valid JSON ({exc})")
            continue
        try:
            jsonschema.validate(args, schema)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
            problems.append(f"the arguments of {call.name!r} do not match its schema at {where}: {exc.message}")
        except Exception:  # noqa: BLE001 - SchemaError, an unresolvable $ref, a schema nested too deeply ...
            pass  # the client's schema is broken; nothing the model can fix
    return problems


def corrective_turn(raw_output: str, problems: list[str], names: list[str], example: str) -> list[dict[str, Any]]:
    """The assistant's attempt and a user turn saying what to fix."""
    listing = "; ".join(problems) if problems else "no function call was found, but one is required"
    return [
        {"role": "assistant", "content": raw_output},
        {
            "role": "user",
            "content": (
                f"That reply did not contain a valid function call: {listing}. "
                f"Reply again with only a corrected call to one of: {', '.join(names)}, "
                f"with arguments that match the function's JSON schema, written like:\n{example}"
            ),
        },
    ]


def _canonical(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return cast(str, arguments)  # still the caller's string: json.loads raised
    try:
        return json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return repr(arguments)


def _answered(messages: list[dict[str, Any]]) -> list[tuple[str, Any, str]]:
    """(name, arguments as the conversation has them, result text) of each
    call in the conversation that already has a result."""
    by_id: dict[str, tuple[str, Any]] = {}
    out: list[tuple[str, Any, str]] = []
    for m in messages:
        if m.get("role") == "assistant":
            for c in m.get("tool_calls") or []:
                if not isinstance(c, dict):
                    continue
                fn = function_part(c)
                by_id[str(c.get("id"))] = (str(fn.get("name")), fn.get("arguments") or {})
        elif m.get("role") == "tool":
            call = by_id.get(str(m.get("tool_call_id")))
            if call is not None:
                out.append((*call, str(m.get("content") or "")))
    return out


def answered_calls(messages: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Calls in the conversation that already have a result: (name, canonical
    arguments) -> the result text."""
    return {(name, _canonical(args)): result for name, args, result in _answered(messages)}


def answered_arguments(messages: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The arguments of the calls that already have a result, by name: their
    canonical form (:func:`canonical_arguments`, what a whole call just written
    is compared with) -> the same as compact JSON in the order they were
    written (what a call is compared with as it comes,
    :class:`~turbospark.tools.streaming.Compact`; empty when not JSON)."""
    out: dict[str, dict[str, str]] = {}
    for name, args, _ in _answered(messages):
        out.setdefault(name, {})[_canonical(args)] = _compact(args)
    return out


def _compact(arguments: Any) -> str:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return ""


def canonical_arguments(arguments: str) -> str:
    """A call's arguments (JSON text) as :func:`answered_arguments` has them:
    key order and blanks do not matter."""
    return _canonical(arguments)


def repeated(calls: list[Any], messages: list[dict[str, Any]]) -> list[str]:
    """Results of the calls that merely repeat an answered call (all of them
    must repeat, else the turn is doing new work and this returns [])."""
    done = answered_calls(messages)
    results = [done.get((c.name, _canonical(c.arguments))) for c in calls]
    return [r for r in results if r is not None] if calls and all(r is not None for r in results) else []


def answer_turn(raw_output: str, results: list[str]) -> list[dict[str, Any]]:
    """Small models often call a tool again instead of reading its result:
    hand the result back and ask for the answer."""
    shown = "\n".join(results)
    return [
        {"role": "assistant", "content": raw_output},
        {
            "role": "user",
            "content": (
                f"The function result is: {shown}. Now answer my original question in plain words, "
                "without calling any function."
            ),
        },
    ]
