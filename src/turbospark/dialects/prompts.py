"""The raw prompts llama-server takes on ``/completion``, ``/completions``
and ``/v1/completions`` (its ``tokenize_input_prompts``), and the requests
they make.

One prompt is a string, a list of token ids, a list mixing token ids and
strings (each string tokenized where it stands), or an object
``{"prompt_string", "multimodal_data"}`` (text with llama-server's media
marker, one base64 item per marker). A list holding no token id at its top
is a list of such prompts (``[ids, ids]``, ``[ids, "text"]``, ``["a", "b"]``,
objects): each is answered as a result of its own, by its index (OpenAI's
batch ``prompt``: ``choices`` with their indexes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..core.request import ChatRequest, Media, media_text
from ..engine.types import MEDIA_MARKER
from .common import BadRequest
from .media import base64_item

#: llama-server's media marker (libmtmd's ``mtmd_default_marker()``)
MTMD_MARKER = "<__media__>"
#: the most prompts one request may carry (each is a generation of its own)
MAX_PROMPTS = 64


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt of a request: its text, token ids or mixed parts (one
    of them), its media, and its text as the answer echoes it."""

    text: str | None = None
    ids: list[int] | None = None
    mixed: list[int | str] | None = None
    media: list[Media] = dataclasses.field(default_factory=list)
    shown: str = ""


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def prompts_of(prompt: str | list[Any] | dict[str, Any], field: str = "prompt") -> list[Prompt]:
    """The prompts a request's ``prompt`` holds (one unless it is a list of
    prompts); anything else is a 400 naming ``field``."""
    if isinstance(prompt, list) and not any(_is_id(p) for p in prompt):
        if not prompt:
            raise BadRequest(f"'{field}' must not be empty", field)
        if len(prompt) > MAX_PROMPTS:
            raise BadRequest(f"'{field}' holds {len(prompt)} prompts; at most {MAX_PROMPTS} per request", field)
        return [one_prompt(p, f"{field}[{i}]") for i, p in enumerate(prompt)]
    return [one_prompt(prompt, field)]


def one_prompt(prompt: Any, field: str) -> Prompt:
    """One prompt: text, token ids, mixed ids and text, or an object."""
    if isinstance(prompt, str):
        return Prompt(text=prompt, shown=prompt)
    if isinstance(prompt, dict):
        text, media = multimodal_prompt(prompt, field)
        return Prompt(text=text, media=media, shown=prompt["prompt_string"])
    if isinstance(prompt, list) and all(_is_id(t) for t in prompt):
        return Prompt(ids=[int(t) for t in prompt])
    if isinstance(prompt, list) and all(_is_id(t) or isinstance(t, str) for t in prompt):
        return Prompt(mixed=list(prompt))
    raise BadRequest(
        f"'{field}' must be a string, a list of token ids, a list of token ids and strings, "
        'or an object {"prompt_string", "multimodal_data"}',
        field,
    )


def multimodal_prompt(prompt: dict[str, Any], field: str = "prompt") -> tuple[str, list[Media]]:
    """llama-server's ``{"prompt_string": "... <__media__> ...",
    "multimodal_data": [base64, ...]}``: the items in order, one per
    marker (its marker becomes the engine's :data:`MEDIA_MARKER`)."""
    text, data = prompt.get("prompt_string"), prompt.get("multimodal_data") or []
    if not isinstance(text, str):
        raise BadRequest(f"'{field}.prompt_string' must be a string", f"{field}.prompt_string")
    if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
        raise BadRequest(f"'{field}.multimodal_data' must be a list of base64 strings", f"{field}.multimodal_data")
    if not data:
        return text, []
    markers = text.count(MTMD_MARKER)
    if markers != len(data):
        raise BadRequest(
            f"'{field}.prompt_string' has {markers} media marker(s) ({MTMD_MARKER}) for "
            f"{len(data)} item(s) of '{field}.multimodal_data': one marker stands for each, in order",
            f"{field}.multimodal_data",
        )
    media = [base64_item(d, f"{field}.multimodal_data[{i}]") for i, d in enumerate(data)]
    return media_text(text).replace(MTMD_MARKER, MEDIA_MARKER), media


def raw_request(prompt: Prompt, make: Callable[[], ChatRequest]) -> ChatRequest:
    """``make``'s request (its sampling and budget) for ``prompt``."""
    req = make()
    req.prompt, req.prompt_ids, req.prompt_mixed, req.media = prompt.text, prompt.ids, prompt.mixed, prompt.media
    return req


def batch(prompts: list[Prompt], make: Callable[[], ChatRequest]) -> ChatRequest:
    """The request of the first prompt, the others as its ``batch`` (each
    its own request: its own sampling state, no session slot of its own)."""
    first = raw_request(prompts[0], make)
    for p in prompts[1:]:
        other = raw_request(p, make)
        other.config.session_key = None  # (the conversation's slot stays the first prompt's)
        first.batch.append(other)
    return first
