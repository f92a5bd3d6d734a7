"""OpenAI's model list: ``/v1/models`` (in Anthropic's shape for an
Anthropic client; with llama-server's ``models`` list beside ``data``, as
llama-server answers it and ``/models``) and ``/v1/models/{id}``; a Chat
Completions body's prompt tokens (``/v1/chat/completions/input_tokens``);
``/v1/chat/completions`` is served by the generic handler
(``dialects/openai_chat.py``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..core.backend import Backend
from ..dialects import anthropic, openai_chat
from ..dialects.common import BadRequest
from ..serving import media
from .common import (
    JSONResponse,
    dispatch,
    error_response,
    normalize,
    off_loop,
    read_body,
    state_of,
    warning_headers,
)


def facts(entry: Any) -> dict[str, Any]:
    """What a client needs to know to use the model well, in the names
    clients read: the context it is served with (``context_length``, and
    vLLM's ``max_model_len``; known once it has been loaded) and what it
    can do."""
    out: dict[str, Any] = {}
    ctx = int(entry.info.get("context") or 0)
    if ctx:
        out["context_length"] = out["max_model_len"] = ctx
    chat = entry.capable("chat")
    # (images and sound: what its projector takes; LM Studio's shape)
    out["capabilities"] = {
        "chat": chat,
        "tools": chat,
        "embeddings": entry.capable("embeddings"),
        "rerank": entry.capable("rerank"),
        **entry.modalities(),
    }
    if entry.info.get("sampling"):  # its preset's sampling defaults (config file)
        out["sampling"] = dict(entry.info["sampling"])
    if entry.group is not None:  # a replica group: its replicas and their state now
        out["replicas"] = entry.group.describe()
    elif entry.info.get("upstream"):
        out["upstream"] = entry.info["upstream"]
    return out


def model_card(entry: Any, created: int) -> dict[str, Any]:
    """OpenAI's model object, plus llama-server's ``aliases`` and ``tags``,
    this server's ``state`` (loaded, unloaded, stalled, failed), for a
    failed model its ``error``, and :func:`facts`."""
    card = {"id": entry.id, "object": "model", "created": created, "owned_by": "turbospark", "state": entry.state}
    # llama-server's: the other names it answers to, and its informational tags (--tags)
    card["aliases"] = list(entry.aliases)
    card["tags"] = list(entry.info.get("tags") or ())
    if entry.state == "failed":
        card["error"] = entry.failure
    return {**card, **facts(entry)}


def llamacpp_card(entry: Any) -> dict[str, Any]:
    """llama-server's entry in its ``models`` list (beside ``data``): Ollama's
    shape, ``capabilities`` ``["completion", "multimodal"]`` for a model
    with a projector (the probe llama.cpp's web UI reads)."""
    caps = ["completion"] if entry.capable("chat") else ["rerank"] if entry.capable("rerank") else ["embedding"]
    if any(entry.modalities().values()):
        caps.append("multimodal")
    return {
        "name": entry.id,
        "model": entry.id,
        "type": "model",
        "capabilities": caps,
        "details": {"format": "gguf"},
    }


def anthropic_card(entry: Any, created: int) -> dict[str, Any]:
    """Anthropic's model object (``GET /v1/models`` from an Anthropic
    client), with the same facts; ``max_input_tokens`` is the context."""
    card = {"type": "model", "id": entry.id, "display_name": entry.id, "created_at": _iso(created)}
    more = facts(entry)
    if "context_length" in more:
        card["max_input_tokens"] = more["context_length"]
    return {**card, **more}


def _iso(unix: int) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_anthropic_client(request: Request) -> bool:
    header = anthropic.Dialect.client_header
    return header is not None and header in request.headers


async def list_models(request: Request) -> Response:
    st = state_of(request)
    created = int(st.started_at)
    entries = st.registry.entries()
    if from_anthropic_client(request):
        data = [anthropic_card(e, created) for e in entries]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return JSONResponse({"data": data, "has_more": False, "first_id": first, "last_id": last})
    cards = [model_card(e, created) for e in entries]
    return JSONResponse({"object": "list", "data": cards, "models": [llamacpp_card(e) for e in entries]})


async def get_model(request: Request) -> Response:
    st = state_of(request)
    name = request.path_params["model_id"]
    entry = st.registry.lookup(name)
    if entry is None or entry.id != name and name not in entry.aliases:
        missing = BadRequest(f"model {name!r} not found", "model", status=404, code="model_not_found")
        # in the shape of the client asking (the path is OpenAI's and Anthropic's)
        shape = anthropic.Dialect.error if from_anthropic_client(request) else openai_chat.Dialect.error
        return error_response(shape, missing, request)
    if from_anthropic_client(request):
        return JSONResponse(anthropic_card(entry, int(st.started_at)))
    return JSONResponse(model_card(entry, int(st.started_at)))


async def input_tokens(request: Request) -> Response:
    """``POST /v1/chat/completions/input_tokens`` (and llama-server's
    ``/chat/completions/input_tokens``): the tokens a Chat Completions body's
    prompt takes, rendered exactly as the request would prefill it."""
    body = await read_body(request, openai_chat.ChatCompletionRequest)
    tr = openai_chat.translate(body)
    assert tr.request is not None
    req = normalize(tr.request, request)  # counted as the real request will be prefilled

    async def count(model: Backend) -> int:
        ready = await media.counted(state_of(request).media, model, req)  # (URLs fetched; none it cannot take)
        return await off_loop(model.count_prompt, ready)

    n, _ = await dispatch(request).run(body.model, "chat", count, req.normalized)
    return JSONResponse({"input_tokens": n}, headers=warning_headers(tr.warnings))


routes = [
    Route("/v1/chat/completions/input_tokens", input_tokens, methods=["POST"]),
    Route("/chat/completions/input_tokens", input_tokens, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/models", list_models, methods=["GET"]),  # (llama-server answers it too)
    Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
]
