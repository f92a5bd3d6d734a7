"""Rerank routes: the Jina / llama-server shape (``/v1/rerank``,
``/rerank``, ``/v1/reranking``) and Cohere's v2 (``/v2/rerank``).

A rerank is answered whole, as embeddings are (``Dispatch.run``: routed to
a reranker, ``requestRouted`` with ``stream`` false, a replica replaced
once): the dialect reads the body into a :class:`RerankAsk`, the model's
blocking ``rerank`` runs in a worker thread while its pairs are scored on
the reranker's engine thread, and the request's ``ranked`` event carries
its pairs, tokens and times. A client that disconnects, or a drain's
deadline, cancels the pairs not yet scored; its ``ranked`` then says
``stopReason: "cancelled"`` and counts the pairs scored before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..core.backend import Backend
from ..dialects import cohere_rerank as cohere
from ..dialects import rerank as jina
from ..dialects.rerank import RerankAsk
from ..engine.types import CancelFlag, EngineError, RankCancelled, Ranking
from .common import JSONResponse, dispatch, read_body, state_of
from .respond import DisconnectWatch


async def rank(request: Request, requested: str | None, ask: RerankAsk) -> tuple[Ranking, str]:
    """Route the request to a reranker and score ``ask``'s documents;
    returns the ranking and the id of the model that served it."""
    way = dispatch(request)
    cancel = way.ctx.cancel = CancelFlag()
    served: list[str] = []  # the model it ran on (its last, in a replica group)

    async def run(model: Backend) -> Ranking:
        def blocking() -> Ranking:
            return model.rerank(ask.query, ask.documents, cancel, ask.truncate, ask.max_doc_tokens)

        served.append(model.model_id)
        return await anyio.to_thread.run_sync(blocking)

    with way.state.drain.watch(cancel):
        async with DisconnectWatch(request.receive, cancel) as watch:
            try:
                ranking, route = await way.run(requested, "rerank", run)
            except EngineError as exc:
                if isinstance(exc, RankCancelled):  # what it scored until then, as a cut generation's
                    way.ctx.reporting.ranked(served[-1], exc.ranking)
                if cancel.error is not None:  # the drain's deadline, a client too slow
                    raise cancel.error from None
                if watch.gone:
                    raise ClientDisconnect() from None
                raise
    way.ctx.reporting.ranked(route.served, ranking)
    return ranking, route.served


def _limit(request: Request) -> int:
    return state_of(request).max_rerank_documents


async def jina_rerank(request: Request) -> Response:
    body = await read_body(request, jina.RerankRequest)
    ask = jina.translate(body, _limit(request))
    ranking, served = await rank(request, body.model, ask)
    return JSONResponse(jina.render(body, ask, served, ranking))


async def cohere_v2_rerank(request: Request) -> Response:
    body = await read_body(request, cohere.CohereRerankRequest)
    ask = cohere.translate(body, _limit(request))
    ranking, served = await rank(request, body.model, ask)
    return JSONResponse(cohere.render(body, ask, served, ranking))


def _post(path: str, handler: Callable[[Request], Any]) -> Route:
    return Route(path, handler, methods=["POST"])


jina_routes = [_post(p, jina_rerank) for p in ("/v1/rerank", "/rerank", "/v1/reranking")]
cohere_routes = [_post("/v2/rerank", cohere_v2_rerank)]
