"""llama.cpp server's native routes besides its generating ones
(``/completion`` and ``/infill``: the generic handler, ``dialects/llamacpp.py``):
``/tokenize``, ``/detokenize``, ``/apply-template``, ``/props``, ``/embedding``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..core.backend import Backend, Vocabulary, needs_local
from ..dialects import llamacpp as ll
from ..dialects.common import BadRequest
from .common import (
    JSONResponse,
    dispatch,
    off_loop,
    read_body,
)
from .embeddings import embed


def _vocabulary(model: Backend, what: str) -> Vocabulary:
    """The routed model's tokens, or the 400 of a model whose tokens are
    not known here (a remote engine's are its own)."""
    vocab = model.vocabulary
    if vocab is None:
        raise needs_local(model.model_id, model.upstream, what)
    return vocab


async def tokenize(request: Request) -> Response:
    body = await read_body(request, ll.TokenizeBody)
    model, _ = await dispatch(request).route(body.model, "chat", False)
    vocab = _vocabulary(model, "tokenizing")
    ids = await off_loop(vocab.tokenize, body.content, body.add_special, body.parse_special)
    if not body.with_pieces:
        return JSONResponse({"tokens": ids})
    return JSONResponse({"tokens": [{"id": t, "piece": vocab.detokenize([t])} for t in ids]})


async def detokenize(request: Request) -> Response:
    body = await read_body(request, ll.DetokenizeBody)
    model, _ = await dispatch(request).route(body.model, "chat", False)
    vocab = _vocabulary(model, "detokenizing")
    bad = next((t for t in body.tokens if not 0 <= t < vocab.vocab_size), None)
    if bad is not None:
        raise BadRequest(f"token {bad} is not in the vocabulary ({vocab.vocab_size} tokens)", "tokens")
    return JSONResponse({"content": await off_loop(vocab.detokenize, body.tokens)})


async def apply_template(request: Request) -> Response:
    body = await read_body(request, ll.TemplateBody)
    model, _ = await dispatch(request).route(body.model, "chat", False)
    vocab = _vocabulary(model, "rendering the chat template")
    return JSONResponse({"prompt": await off_loop(vocab.chat_text, body.messages)})


async def props(request: Request) -> Response:
    model, route = await dispatch(request).route(request.query_params.get("model"), "chat", False)
    info = route.entry.info or {}
    template = str(info.get("chat_template") or "")
    props = ll.props(info, int(info.get("parallel") or 1), template)
    props["modalities"]["vision"] = model.capabilities.vision  # (images are refused without it)
    return JSONResponse(props)


async def embedding(request: Request) -> Response:
    body = await read_body(request, ll.EmbeddingBody)
    texts = [body.content] if isinstance(body.content, str) else body.content
    if not texts:
        raise BadRequest("'content' must not be empty", "content")
    result, _ = await embed(request, body.model, texts)
    assert result is not None
    out: list[dict[str, Any]] = [{"index": i, "embedding": [v]} for i, v in enumerate(result.vectors)]
    return JSONResponse(out)


routes = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/props", props, methods=["GET"]),
    Route("/embedding", embedding, methods=["POST"]),
]
