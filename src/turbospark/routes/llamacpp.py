"""llama.cpp server's native routes besides its generating ones
(``/completion`` and ``/infill``: the generic handler, ``dialects/llamacpp.py``):
``/tokenize``, ``/detokenize``, ``/apply-template``, ``/props``, ``/embedding``,
and the session slots: ``GET /slots``, ``POST /slots/{id}?action=save|restore|erase``.

Who may see and act on slots (llama-server has no tenants): without keys,
everyone, on every slot. With ``--api-key``, an inference key sees its own
tenant's slots and the empty ones (another tenant's only as a bare
id and whether it is processing), saves, restores into and erases only its
tenant's slots or empty ones, and names files in its tenant's own folder
(``.tenants/<tenant>`` inside the save folder: another tenant's names are
neither taken nor seen; a record also keeps its owner); an admin key sees
and acts on every slot, its files in the save folder itself. No route needs
an admin key: a tenant can only ever touch its own KV.
``--slot-save-path DIR`` is where save and restore keep their files (without
it they are refused, 501, as llama-server refuses them); the file a caller
names is a plain name inside that folder (no path, not hidden), anything
else a 400."""

from __future__ import annotations

import os
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..core.backend import Backend, Vocabulary, needs_local
from ..dialects import llamacpp as ll
from ..dialects.common import BadRequest
from ..engine.slotcontrol import SlotControl
from ..engine.types import SlotActionError
from ..models.registry import Capability, Registry
from .common import (
    JSONResponse,
    dispatch,
    off_loop,
    read_body,
    read_json,
    state_of,
)
from .embeddings import embed
from .events import viewer


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


def _props_capability(registry: Registry, name: str | None) -> Capability:
    """What ``/props`` routes by: a reranker's when it names one, or names
    none on a server whose only models are rerankers; else chat."""
    entry = registry.lookup(name) if name else None
    if entry is None and not name and not any(e.capable("chat") for e in registry.entries()):
        entry = next((e for e in registry.entries() if e.capable("rerank")), None)
    return "rerank" if entry is not None and entry.capable("rerank") else "chat"


async def props(request: Request) -> Response:
    """``GET /props``, from what the model's load said: it is no activity
    (a model unloaded after its keep-alive, ``--sleep-idle-seconds``, stays
    asleep, ``is_sleeping`` true, and a loaded one's idle time runs on, as
    llama-server's do); only a model never loaded yet (or a replica group)
    is routed, loaded on demand, as a request would be."""
    requested = request.query_params.get("model")
    registry = state_of(request).registry
    capability = _props_capability(registry, requested)
    entry = registry.resolve(requested, capability).entry
    # (a load's info has its engine settings, ``parallel``: what is known before a load has none)
    if entry.group is not None or "parallel" not in entry.info:
        entry = (await dispatch(request).route(requested, capability, False))[1].entry
    asleep = entry.state == "unloaded"
    info = entry.info or {}
    props = ll.props(info, int(info.get("parallel") or 1), str(info.get("chat_template") or ""))
    # what its projector takes (media are refused without it): llama.cpp's web UI reads it
    props["modalities"] = entry.modalities()
    props["is_sleeping"] = asleep
    props["reranking"] = entry.capable("rerank")  # (/v1/rerank: llama-server's --reranking)
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


def _slot_control(model: Backend) -> SlotControl:
    control = model.slot_control()
    if control is None:
        where = f" (its slots are {model.upstream.base_url}'s)" if model.upstream is not None else ""
        raise BadRequest(
            f"model {model.model_id!r} has no session slots here{where}", "model", 501, type="not_supported_error"
        )
    return control


async def slots(request: Request) -> Response:
    """``GET /slots``: the routed model's session slots (``?model=``, else
    the default chat model); ``?fail_on_no_slot=1``: 503 when no job could
    start now (every slot that may run one, ``parallel`` of them, does)."""
    model, _ = await dispatch(request).route(request.query_params.get("model"), "chat", False)
    control = _slot_control(model)
    states = control.states()
    if _flag(request.query_params.get("fail_on_no_slot")) and not control.idle():
        raise BadRequest("no slot available", None, 503, type="unavailable_error")
    tenant = viewer(request)
    out = []
    for state in states:
        own = tenant is None or state.owner == tenant
        if own or not state.tokens_cached:
            out.append(ll.slot(state, control.n_ctx, control.speculative, own))
    return JSONResponse(out)


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes", "on")


ACTIONS = ("save", "restore", "erase")


async def slot_action(request: Request) -> Response:
    """``POST /slots/{id}?action=save|restore|erase`` (see the module
    docstring for who may act on which slot and file)."""
    try:
        slot_id = int(request.path_params["id_slot"])
    except ValueError:
        raise BadRequest("Invalid slot ID", "id_slot") from None
    action = request.query_params.get("action", "")
    if action not in ACTIONS:
        raise BadRequest(f"Invalid action {action!r} (one of: {', '.join(ACTIONS)})", "action")
    body = await read_json(request) if action != "erase" or await request.body() else {}
    requested = body.get("model") if isinstance(body.get("model"), str) else request.query_params.get("model")
    folder = state_of(request).slot_save_path
    if action != "erase" and folder is None:
        raise BadRequest(
            "This server does not support slots action. Start it with `--slot-save-path`",
            None,
            501,
            type="not_supported_error",
        )
    model, _ = await dispatch(request).route(requested, "chat", False)
    control = _slot_control(model)
    owner = viewer(request)
    try:
        if action == "erase":
            return JSONResponse(ll.slot_erased(await off_loop(control.erase, slot_id, owner)))
        assert folder is not None
        folder = tenant_folder(folder, owner)
        name = body.get("filename")
        path = slot_file(folder, name)
        if action == "save":
            try:
                os.makedirs(folder, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise SlotActionError(f"cannot write {name}: {exc.strerror or type(exc).__name__}") from None
            return JSONResponse(ll.slot_saved(await off_loop(control.save, slot_id, path, owner), str(name)))
        return JSONResponse(ll.slot_restored(await off_loop(control.restore, slot_id, path, owner), str(name)))
    except SlotActionError as exc:
        raise BadRequest(str(exc), None, _STATUS.get(exc.reason, 400)) from None


_STATUS = {"invalid": 400, "not_found": 404, "busy": 409, "forbidden": 403}


def tenant_folder(folder: str, owner: str | None) -> str:
    """Where a caller's slot files live: a tenant's in a folder of its own
    (``.tenants/<tenant>``, never a name a request can give), so one
    tenant's names neither collide with nor reveal another's; an admin's,
    or everyone's on a server without keys, in the folder itself."""
    return folder if not owner else os.path.join(folder, ".tenants", owner)


def slot_file(folder: str, name: Any) -> str:
    """The file ``name`` in ``folder``: a plain, visible file name whose
    resolved path (links followed) stays inside the folder; else a 400."""
    if not isinstance(name, str) or not name:
        raise BadRequest("'filename' (a file name) is required", "filename")
    bad = (
        len(name) > 255
        or name.startswith(".")
        or any(c in name for c in ("/", "\\", "\0"))
        or any(ord(c) < 32 for c in name)
    )
    root = os.path.realpath(folder)
    path = os.path.join(root, name)
    if bad or os.path.dirname(os.path.realpath(path)) != root:
        raise BadRequest("Invalid filename: a plain file name inside the slot save folder is required", "filename")
    return path


routes = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/props", props, methods=["GET"]),
    Route("/embedding", embedding, methods=["POST"]),
    Route("/slots", slots, methods=["GET"]),
    Route("/slots/{id_slot}", slot_action, methods=["POST"]),
]
