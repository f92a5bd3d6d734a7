"""Ollama routes: ``/api/tags``, ``/api/show``, ``/api/ps``,
``/api/version`` and ``GET /`` (clients probe it to detect an Ollama
server). ``/api/chat`` and ``/api/generate`` are served by the generic
handler (``dialects/ollama.py``); embeddings (``/api/embed``) live in
routes/embeddings.py."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ..dialects import ollama as ol
from ..dialects.common import BadRequest
from ..engine.gguf import projector_info
from ..engine.model import ModelOptions
from ..pull.specs import facts
from ..tools.prompting import template_thinks
from .common import (
    JSONResponse,
    read_body,
    state_of,
)


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
    models (clients pick embedding models by it); ``rerank`` a reranker."""
    caps = []
    if entry.capable("chat"):
        caps += ["completion", "tools"]  # tools: any chat model (see tools/prompting.py)
    elif entry.capable("embeddings"):
        caps.append("embedding")
    elif entry.capable("rerank"):
        caps.append("rerank")  # (no Ollama name: it has no rerank API)
    takes = entry.modalities()  # (its projector's: known from its header before a load)
    caps += [name for name in ("vision", "audio") if takes[name]]
    if entry.capable("chat") and template_thinks(_info(entry).get("chat_template") or ""):
        caps.append("thinking")  # known from its last load, as the template is
    return caps


def _tag(info: dict[str, Any], fallback: float) -> dict[str, Any]:
    row = ol.tag_entry(info, _mtime_ns(info, fallback))
    if str(info.get("digest") or "").startswith("sha256:"):
        row["digest"] = info["digest"][7:]  # a pulled model's, as its source gave it
    return row


async def tags(request: Request) -> Response:
    """The models served, then those pulled into the store and not loaded
    (each loads on first use, by name)."""
    st = state_of(request)
    entries = st.registry.entries()
    rows = [_tag(_info(entry), st.started_at) for entry in entries]
    if st.puller is not None:
        store = st.puller.store
        names = {n for e in entries for n in e.names}
        for model in await asyncio.to_thread(store.models):
            if model.name not in names:
                info = {**facts(model), "id": model.name, "path": store.path(model.files[0])}
                rows.append(_tag(info, model.pulled_at))
    return JSONResponse({"models": rows})


async def show(request: Request) -> Response:
    st = state_of(request)
    name = (await read_body(request, ol.ShowBody)).requested()
    wanted = ol.model_name(name) or name
    # lookups never fall back; a pulled model becomes known by its name
    entry = st.registry.lookup(wanted) or await asyncio.to_thread(st.registry.configure_on_demand, wanted)
    if entry is None:
        raise BadRequest(f"model '{name}' not found", "model", status=404, code="model_not_found")
    info = _info(entry)
    shown = ol.show(info, _mtime_ns(info, st.started_at), _capabilities(entry))
    projector = _projector_path(entry)
    if projector:  # its header's clip.* keys, as Ollama shows them
        shown["projector_info"] = await asyncio.to_thread(projector_info, projector)
    return JSONResponse(shown)


def _projector_path(entry: Any) -> str | None:
    """The projector a model loads with (its options'; else what its last
    load said)."""
    options = entry.spec.options if entry.spec is not None else None
    if isinstance(options, ModelOptions):
        return options.mmproj or None
    found = entry.info.get("mmproj")
    return found if isinstance(found, str) and os.path.isabs(found) else None


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


async def version(request: Request) -> Response:
    return JSONResponse({"version": ol.OLLAMA_VERSION})


async def root(request: Request) -> Response:
    """What Ollama answers at ``/``; clients use it to detect a server (a
    browser gets the web page instead: ``routes/page.py``, which routes ``/``
    in no dialect's error shape: it is every dialect's)."""
    return PlainTextResponse("Ollama is running")


routes = [
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/version", version, methods=["GET"]),
]
