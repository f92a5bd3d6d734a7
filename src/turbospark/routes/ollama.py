"""Ollama routes: ``/api/chat``, ``/api/generate``, ``/api/tags``,
``/api/show``, ``/api/ps``, ``/api/version`` and ``GET /`` (clients probe it
to detect an Ollama server). Embeddings (``/api/embed``) live in
routes/embeddings.py."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ..dialects import ollama as ol
from ..dialects.common import BadRequest
from ..dialects.errors import ollama_error
from ..dialects.translate import Translation
from ..tools.prompting import template_thinks
from .common import (
    JSONResponse,
    admit,
    bind_request,
    endpoint,
    read_body,
    respond,
    route_chat,
    route_model,
    state_of,
    warning_headers,
)


async def _answer(request: Request, requested: str, tr: Translation, renderer: ol.Renderer) -> Response:
    """Route, prepare, generate and render one chat/generate request. A
    request's ``keep_alive`` becomes its model's idle timeout (0: unloaded
    once idle, e.g. right after this request); the time this request spent
    loading the model is its ``load_duration``."""
    req = bind_request(tr.request, request) if tr.request is not None else None
    name = ol.model_name(requested)
    if req is not None:
        model, route = await route_chat(request, req, name, tr.stream)
    else:  # a load or unload request: no prompt to route by
        model, route = await route_model(request, name, "chat", tr.stream)
    if req is not None and req.asks_thinking() and model.capabilities.thinking is False:
        # as Ollama answers it: clients retry without ``think`` on this 400,
        # or ask /api/show for the "thinking" capability first
        raise BadRequest(f"{json.dumps(name, ensure_ascii=False)} does not support thinking", "think")
    keep_alive = tr.extras.get("keep_alive")
    if keep_alive is not None:
        state_of(request).registry.set_keep_alive(route.entry, None if math.isinf(keep_alive) else keep_alive)
    renderer.load_ns = int(route.load_seconds * 1e9)
    if req is None:
        return JSONResponse(renderer.loaded(tr.extras["done_reason"]), headers=warning_headers(tr.warnings))
    model, route, prepared = await admit(request, model, req, name, tr.stream, route)
    return await respond(request, model, prepared, renderer, warning_headers(tr.warnings + prepared.warnings))


@endpoint(ollama_error)
async def chat(request: Request) -> Response:
    started = time.perf_counter_ns()
    body = await read_body(request, ol.ChatBody)
    tr = ol.chat_request(body)
    return await _answer(request, body.model, tr, ol.Renderer("chat", body.model, tr.stream, started))


@endpoint(ollama_error)
async def generate(request: Request) -> Response:
    started = time.perf_counter_ns()
    body = await read_body(request, ol.GenerateBody)
    tr = ol.generate_request(body)
    return await _answer(request, body.model, tr, ol.Renderer("generate", body.model, tr.stream, started))


# ---------------------------------------------------------------- model facts
def _info(entry: Any) -> dict[str, Any]:
    """Facts of a registry entry (cached at its last load)."""
    info = dict(entry.info)
    info.setdefault("id", entry.id)
    return info


def _mtime_ns(info: dict[str, Any], fallback: float) -> int:
    path = info.get("path")
    try:
        return os.stat(path).st_mtime_ns if path else int(fallback * 1e9)
    except OSError:
        return int(fallback * 1e9)


def _capabilities(entry: Any) -> list[str]:
    """As Ollama reports them: a chat model is a ``completion`` model even
    though it also serves ``/api/embed``; ``embedding`` marks embedding-only
    models (clients pick embedding models by it)."""
    caps = []
    if entry.capable("chat"):
        caps += ["completion", "tools"]  # tools: any chat model (see tools/prompting.py)
    elif entry.capable("embeddings"):
        caps.append("embedding")
    if entry.model is not None and entry.model.capabilities.vision:
        caps.append("vision")
    if entry.capable("chat") and template_thinks(_info(entry).get("chat_template") or ""):
        caps.append("thinking")  # known from its last load, as the template is
    return caps


@endpoint(ollama_error)
async def tags(request: Request) -> Response:
    st = state_of(request)
    entries = []
    for entry in st.registry.entries():
        info = _info(entry)
        entries.append(ol.tag_entry(info, _mtime_ns(info, st.started_at)))
    return JSONResponse({"models": entries})


@endpoint(ollama_error)
async def show(request: Request) -> Response:
    st = state_of(request)
    name = (await read_body(request, ol.ShowBody)).requested()
    entry = st.registry.lookup(ol.model_name(name) or name)  # lookups never fall back
    if entry is None:
        raise BadRequest(f"model '{name}' not found", "model", status=404, code="model_not_found")
    info = _info(entry)
    return JSONResponse(ol.show(info, _mtime_ns(info, st.started_at), _capabilities(entry)))


@endpoint(ollama_error)
async def ps(request: Request) -> Response:
    st = state_of(request)
    now = time.time_ns()
    entries = []
    for entry in st.registry.entries():
        if entry.model is None and entry.state != "failed" and entry.group is None:
            continue  # configured but not resident
        info = _info(entry)
        row = ol.ps_entry(info, _mtime_ns(info, st.started_at), now, entry.expires_in(time.monotonic()))
        row["state"] = entry.state  # this server's: loaded, stalled, failed (then not in memory), down
        if entry.group is not None:
            row["replicas"] = entry.group.describe()
        if entry.state == "failed":
            row["size"], row["error"] = 0, entry.failure
        entries.append(row)
    return JSONResponse({"models": entries})


@endpoint(ollama_error)
async def version(request: Request) -> Response:
    return JSONResponse({"version": ol.OLLAMA_VERSION})


async def root(request: Request) -> Response:
    """What Ollama answers at ``/``; clients use it to detect a server."""
    return PlainTextResponse("Ollama is running")


routes = [
    Route("/", root, methods=["GET", "HEAD"]),
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/version", version, methods=["GET"]),
]
