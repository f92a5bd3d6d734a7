"""Rerank in Cohere's v2 shape (``POST /v2/rerank``): wire model and pure
translations; the reading of documents and the ordering are ``rerank``'s.

In: ``model``, ``query``, ``documents`` (strings; ``{"text": ...}`` objects
are taken too, as Cohere's v1 took them), ``top_n``, ``max_tokens_per_doc``
(default 4096, as Cohere: every document cut to that many tokens, and, as
Cohere does, a pair still over the reranker's context has its document cut
to fit), ``priority`` (only 0, the default: requests are served in order).
Out: ``{"id", "results": [{"index", "relevance_score"}], "meta":
{"api_version", "billed_units": {"search_units"}, "tokens":
{"input_tokens", "output_tokens"}}}``. ``relevance_score`` is in [0, 1] as
Cohere's is: a cross-encoder's logit through the logistic function (what
bge-reranker's ``normalize`` does), a score the model already gives as a
probability (Qwen3-Reranker's) as it is; the order is the same. A search
unit is a query with up to 100 documents, as Cohere bills them. Errors are
Cohere's ``{"message": ...}``.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..engine.types import Ranking
from . import base
from .common import BadRequest
from .errors import cohere_error
from .rerank import RerankAsk, check_query, document_texts, ordered

#: Cohere's default ``max_tokens_per_doc``
MAX_TOKENS_PER_DOC = 4096
#: documents a search unit covers
DOCUMENTS_PER_UNIT = 100


class CohereRerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    query: str
    documents: list[Any] | None = None
    top_n: int | None = Field(default=None, ge=1)
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    priority: int | None = None


def translate(body: CohereRerankRequest, limit: int) -> RerankAsk:
    if body.priority:
        raise BadRequest("'priority' other than 0 is not served: requests are taken in the order they come", "priority")
    return RerankAsk(
        query=check_query(body.query),
        documents=document_texts(body.documents, limit),
        top_n=body.top_n,
        truncate=True,
        max_doc_tokens=body.max_tokens_per_doc or MAX_TOKENS_PER_DOC,
    )


def logistic(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def render(body: CohereRerankRequest, ask: RerankAsk, served: str, ranking: Ranking) -> dict[str, Any]:
    scores = ranking.scores if ranking.probabilities else [logistic(s) for s in ranking.scores]
    results = [{"index": i, "relevance_score": scores[i]} for i in ordered(ranking.scores, ask.top_n)]
    return {
        "id": str(uuid.uuid4()),
        "results": results,
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"search_units": -(-len(ask.documents) // DOCUMENTS_PER_UNIT)},
            "tokens": {"input_tokens": ranking.total_tokens, "output_tokens": 0},
        },
    }


#: answered whole, never generated: no generating kinds (its route is
#: ``routes/rerank.py``'s)
Dialect = base.Dialect("cohere", cohere_error, shared_paths=())
