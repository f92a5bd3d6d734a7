"""OpenAI Embeddings (``POST /v1/embeddings``): wire model and pure
translations.

In: the body to a list of texts (with the limits a client gets a clear 400
for). Out: the engine's :class:`Embeddings` to ``{"object": "list", ...}``,
each vector as JSON floats or as base64 of little-endian float32 (what the
OpenAI SDK asks for by default and decodes with ``np.frombuffer(...,
"float32")``). The vector helpers here are shared with the Ollama dialect.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..engine.types import Embeddings
from . import base
from .common import BadRequest
from .errors import openai_error

MAX_INPUTS = 2048
MAX_TEXT_BYTES = 1 << 20  # 1 MiB of UTF-8 over all inputs


class EmbeddingRequest(BaseModel):
    """The fields we act on; unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


# ------------------------------------------------------------------ in
def check_texts(texts: list[str], where: str = "input", single: bool = False) -> list[str]:
    """The limits every embedding dialect applies. ``single``: the field was
    one string rather than a list (names it without an index)."""
    if len(texts) > MAX_INPUTS:
        raise BadRequest(f"'{where}' has {len(texts)} items; at most {MAX_INPUTS} are allowed", where)
    total = 0
    for i, text in enumerate(texts):
        if not text:
            name = where if single else f"{where}[{i}]"
            raise BadRequest(f"'{name}' is an empty string; every input must contain text", name)
        total += len(text.encode("utf-8"))
    if total > MAX_TEXT_BYTES:
        raise BadRequest(
            f"'{where}' holds {total} bytes of text; at most {MAX_TEXT_BYTES} bytes (1 MiB) are allowed per request",
            where,
        )
    return texts


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_token_ids(items: list[Any]) -> bool:
    """``[1, 2, 3]`` or ``[[1, 2], [3]]``: OpenAI's token-array inputs."""
    return all(_is_int(x) for x in items) or all(
        isinstance(x, list) and x and all(_is_int(t) for t in x) for x in items
    )


def texts_of(body: EmbeddingRequest) -> list[str]:
    """``input`` as a list of strings. Token-id arrays are refused: ids from
    another tokenizer (tiktoken, as LangChain sends) would silently mean
    other text to this model."""
    raw = body.input
    if isinstance(raw, str):
        return check_texts([raw], single=True)
    if not raw:
        raise BadRequest("'input' is an empty list; send at least one string", "input")
    if _is_token_ids(raw):
        raise BadRequest(
            "token-id arrays are not supported as 'input'; send the text itself "
            "(ids from another tokenizer would mean different text to this model)",
            "input",
        )
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            raise BadRequest(f"'input[{i}]' must be a string", f"input[{i}]")
    return check_texts(list(raw))


# ------------------------------------------------------------------ vectors
def fit_dimensions(vector: list[float], dimensions: int | None, param: str = "dimensions") -> np.ndarray:
    """Truncate to the first ``dimensions`` components and re-normalise to
    unit norm (the Matryoshka convention OpenAI and Ollama follow)."""
    v = np.asarray(vector, dtype=np.float64)
    if dimensions is None or dimensions == v.shape[0]:
        return v
    if dimensions < 1:
        raise BadRequest(f"'{param}' must be at least 1", param)
    if dimensions > v.shape[0]:
        raise BadRequest(f"'{param}' is {dimensions}, but this model's embeddings have {v.shape[0]} dimensions", param)
    v = v[:dimensions]
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def to_base64(vector: np.ndarray) -> str:
    """Little-endian float32 bytes, base64: what the OpenAI SDK decodes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def from_base64(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype="<f4")


# ------------------------------------------------------------------ out
def render(body: EmbeddingRequest, served: str, emb: Embeddings) -> dict[str, Any]:
    """``{"object": "list", "data": [...], "model", "usage"}``; usage is the
    engine's own token counts."""
    as_b64 = body.encoding_format == "base64"
    data = []
    for i, vec in enumerate(emb.vectors):
        v = fit_dimensions(vec, body.dimensions)
        data.append({"object": "embedding", "index": i, "embedding": to_base64(v) if as_b64 else v.tolist()})
    tokens = emb.total_tokens
    return {
        "object": "list",
        "data": data,
        "model": body.model or served,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


#: answered whole, never generated: no generating kinds (its routes are
#: ``routes/embeddings.py``'s)
Dialect = base.Dialect("openai-embeddings", openai_error)
