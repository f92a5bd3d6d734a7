"""Ollama embeddings: ``POST /api/embed`` and the legacy ``POST
/api/embeddings``. Wire models and pure translations; errors are Ollama's
``{"error": "..."}``.

Like Ollama, an empty ``input`` / ``prompt`` is not an error (clients send it
to load a model) and yields no vectors. ``truncate`` (default true, as in
Ollama) cuts an input longer than the embedding context at its end;
``truncate: false`` makes such an input a 400 with the numbers. The legacy
endpoint has no such option and refuses over-long input.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ..engine.types import Embeddings
from . import base
from .common import BadRequest
from .errors import ollama_error
from .openai_embeddings import check_texts, fit_dimensions


class EmbedRequest(BaseModel):
    """``/api/embed``."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    input: str | list[Any] = ""
    truncate: bool | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | int | str | None = None
    dimensions: int | None = None


class EmbeddingsRequest(BaseModel):
    """Legacy ``/api/embeddings``."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    prompt: str | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | int | str | None = None


def embed_texts(body: EmbedRequest) -> list[str]:
    """``input`` as a list of strings; ``""`` and ``[]`` mean none."""
    raw = body.input
    if isinstance(raw, str):
        return check_texts([raw], single=True) if raw else []
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            raise BadRequest(f"invalid input type: 'input[{i}]' must be a string", f"input[{i}]")
    return check_texts(list(raw))


def check_dimensions(dimensions: int | None) -> int | None:
    if dimensions is not None and dimensions < 1:
        raise BadRequest("'dimensions' must be a positive integer", "dimensions")
    return dimensions


def legacy_texts(body: EmbeddingsRequest) -> list[str]:
    return check_texts([body.prompt], "prompt", single=True) if body.prompt else []


def render_embed(
    requested: str | None, served: str, emb: Embeddings | None, dimensions: int | None, total_ns: int
) -> dict[str, Any]:
    """``{"model", "embeddings", "total_duration", "load_duration",
    "prompt_eval_count"}``; the count is the engine's token count."""
    vectors = [] if emb is None else [fit_dimensions(v, dimensions).tolist() for v in emb.vectors]
    return {
        "model": requested or served,
        "embeddings": vectors,
        "total_duration": total_ns,
        "load_duration": 0,
        "prompt_eval_count": 0 if emb is None else emb.total_tokens,
    }


def render_legacy(emb: Embeddings | None) -> dict[str, Any]:
    """``{"embedding": [...]}`` (unit norm here; Ollama's legacy route
    returns the raw vector, which cosine similarity cannot tell apart)."""
    return {"embedding": [] if emb is None else list(emb.vectors[0])}


#: answered whole, never generated: no generating kinds (its routes are
#: ``routes/embeddings.py``'s)
Dialect = base.Dialect("ollama-embeddings", ollama_error)
