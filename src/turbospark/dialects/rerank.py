"""Rerank in the Jina / llama-server shape (``POST /v1/rerank``,
``/rerank``, ``/v1/reranking``): wire model and pure translations. The
pieces every rerank dialect shares (the documents read, the results
ordered) are here; Cohere's v2 shape is ``cohere_rerank``.

In: ``query`` (a non-empty string), ``documents`` (strings or ``{"text":
...}`` objects, at least one, at most ``--max-rerank-documents``),
``top_n`` (at least 1; more than the documents: all of them),
``return_documents`` (default false, as llama-server: true adds each
document as Jina returns it, ``{"text": ...}``), ``truncate`` (default
false: a pair over the reranker's context is a 400; true: its document is
cut at the end to fit). Out: ``{"model", "object": "list", "usage":
{"prompt_tokens", "total_tokens"}, "results": [{"index",
"relevance_score"}]}``, results ordered by score, highest first (ties in
the documents' order), each index the document's place in the request.
Scores are the reranker's raw output, as llama-server gives them (a
cross-encoder's logit: any real number). Errors are llama-server's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..engine.types import Ranking
from . import base
from .common import BadRequest
from .errors import llamacpp_error


class RerankRequest(BaseModel):
    """The fields acted on; unknown fields are accepted and ignored (Jina's
    clients send their own), TEI's ``texts`` is refused by name."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    query: str
    documents: list[Any] | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool | None = None
    truncate: bool | None = None


@dataclass(frozen=True)
class RerankAsk:
    """A rerank request as every dialect reads it: the query, the
    documents' texts, and how the answer and the pairs are shaped."""

    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = False
    #: a pair over the context: its document cut (else a 400)
    truncate: bool = False
    #: every document cut to this many tokens first (Cohere's ``max_tokens_per_doc``)
    max_doc_tokens: int | None = None


# ------------------------------------------------------------------ in
def check_query(query: str) -> str:
    if not query.strip():
        raise BadRequest("'query' is empty; send the text to rank the documents against", "query")
    return query


def document_texts(raw: list[Any] | None, limit: int) -> list[str]:
    """``documents`` as texts: strings, or objects with a ``text`` string;
    at least one, at most ``limit``."""
    if not raw:
        raise BadRequest("'documents' is empty; send at least one document to rank", "documents")
    if len(raw) > limit:
        raise BadRequest(
            f"'documents' has {len(raw)} items; at most {limit} are allowed per request (--max-rerank-documents)",
            "documents",
        )
    out: list[str] = []
    for i, doc in enumerate(raw):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str):
            raise BadRequest(f"'documents[{i}]' must be a string or an object with a 'text' string", f"documents[{i}]")
        out.append(text)
    return out


def translate(body: RerankRequest, limit: int) -> RerankAsk:
    """The body as a :class:`RerankAsk` (``limit``: the most documents)."""
    if body.documents is None and "texts" in (body.model_extra or {}):
        raise BadRequest("send the documents as 'documents' (TEI's 'texts' shape is not served)", "texts")
    return RerankAsk(
        query=check_query(body.query),
        documents=document_texts(body.documents, limit),
        top_n=body.top_n,
        return_documents=bool(body.return_documents),
        truncate=bool(body.truncate),
    )


# ------------------------------------------------------------------ out
def ordered(scores: list[float], top_n: int | None) -> list[int]:
    """The documents' indexes, highest score first (ties keep the
    documents' order), the first ``top_n`` of them (None: all)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order if top_n is None else order[:top_n]


def render(body: RerankRequest, ask: RerankAsk, served: str, ranking: Ranking) -> dict[str, Any]:
    results = []
    for i in ordered(ranking.scores, ask.top_n):
        item: dict[str, Any] = {"index": i, "relevance_score": ranking.scores[i]}
        if ask.return_documents:
            item["document"] = {"text": ask.documents[i]}
        results.append(item)
    tokens = ranking.total_tokens
    return {
        "model": body.model or served,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }


#: answered whole, never generated: no generating kinds (its routes are
#: ``routes/rerank.py``'s)
Dialect = base.Dialect("rerank", llamacpp_error)
