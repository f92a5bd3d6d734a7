"""Getting tools into a prompt and constraints into the sampler.

A model's own chat template renders ``tools`` and assistant ``tool_calls``
when it knows how (Qwen, Llama 3, Mistral ...). Templates that ignore them
(SmolLM2's, plain ChatML) would hide the tools from the model, so for those
the tools are described in the system turn in the Hermes format, and earlier
calls and results are written into the conversation as text.
"""

from __future__ import annotations

import json
from typing import Any

from ..engine.types import AdmissionError
from .calls import function_part, render_call

TOOL_SYSTEM = (
    "You can call functions to help answer. The available functions are listed as JSON "
    "inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, reply with a JSON object holding its name and arguments inside "
    "<tool_call></tool_call> tags, like this:\n<tool_call>\n"
    '{{"name": "<function-name>", "arguments": {{"<arg>": "<value>"}}}}\n</tool_call>'
)


def template_knows_tools(template_source: str) -> bool:
    """Whether the template renders a ``tools`` list at all."""
    return "tools" in template_source


def template_thinks(template_source: str) -> bool:
    """Whether a chat template handles thinking apart from the answer
    (Qwen3's ``enable_thinking``, DeepSeek-R1's ``<think>``, gpt-oss's
    reasoning channel, EXAONE-Deep's ``<thought>``)."""
    source = template_source.lower()
    return any(word in source for word in ("think", "reasoning", "thought"))


def functions_of(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The ``function`` objects of OpenAI-style tools."""
    out = []
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append(fn)
    return out


def tool_names(tools: list[dict[str, Any]] | None) -> list[str]:
    return [fn["name"] for fn in functions_of(tools)]


def _dumps(value: Any, where: str) -> str:
    """JSON text of client data going into a prompt; data JSON cannot write
    (nested too deeply) is the client's error, naming ``where``."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise AdmissionError(f"'{where}' cannot be written into the prompt: {exc}", where) from None


def inline_tools(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, syntax: str
) -> list[dict[str, Any]]:
    """Messages for a template that does not render tools: the tool list in
    the system turn, calls and results as plain text."""
    out: list[dict[str, Any]] = []
    if tools:
        listing = "\n".join(_dumps(fn, "tools") for fn in functions_of(tools))
        section = TOOL_SYSTEM.format(tools=listing)
        if messages and messages[0].get("role") == "system":
            first = dict(messages[0])
            first["content"] = f"{first.get('content') or ''}\n\n{section}".strip()
            messages = [first, *messages[1:]]
        else:
            messages = [{"role": "system", "content": section}, *messages]
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                if not isinstance(c, dict):
                    continue  # the dialects refuse these; never fail on one here
                fn = function_part(c)
                args = fn.get("arguments") or {}
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except (ValueError, RecursionError):
                        args = {"_raw": args}
                name = fn.get("name")
                _dumps(args, "messages")  # too deep to write: a 400, not a failure in render_call
                calls.append(render_call(syntax, name if isinstance(name, str) else "", args))
            content = m.get("content")
            text = "\n".join(filter(None, [content if isinstance(content, str) else "", *calls]))
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            name = m.get("name") or m.get("tool_name") or "tool"
            out.append(
                {
                    "role": "user",
                    "content": f'<tool_response name="{name}">\n{m.get("content") or ""}\n</tool_response>',
                }
            )
        else:
            out.append(m)
    return out
