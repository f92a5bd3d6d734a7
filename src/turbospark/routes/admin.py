"""Operator routes: what the engine holds (``/v1/slots``), live model
attach/detach (``/v1/admin/models``), the config file in force
(``/v1/admin/config``, and its reload) and the model pulls
(``/v1/admin/pulls``)."""

from __future__ import annotations

import asyncio
import hashlib
import urllib.parse
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects.common import BadRequest, validate
from ..dialects.errors import openai_error
from ..engine.media import ProjectorError
from ..engine.model import ModelOptions
from ..models.catalog import ModelNotFound
from ..models.loading import (
    GROUP_KEYS,
    GroupOptions,
    NotAttachable,
    RemoteConfigError,
    attach_group,
    attachable,
    attachable_projector,
    load_spec,
    remote_options,
    replica_name,
    spec_for,
)
from ..models.registry import RegistryError
from ..models.replicas import ROUTINGS
from ..serving.state import ConfigControl
from ..upstream.model import RemoteModel, RemoteOptions
from .common import JSONResponse, endpoint, read_json, state_of
from .events import viewer
from .pulls import pull_failure, run_pull


def owner_hash(owner: str) -> str | None:
    """Never the key itself: a short digest that tells tenants apart."""
    if not owner:
        return None
    return hashlib.sha256(owner.encode()).hexdigest()[:12]


def session_hash(session_key: str | None) -> str | None:
    """Never the session key itself (a user id, a prompt cache key): a
    stable digest, so a client can still tell which slot holds its session
    (``sha256("turbospark-session:" + key)``, first 16 hex digits)."""
    if session_key is None:
        return None
    return hashlib.sha256(b"turbospark-session:" + session_key.encode("utf-8")).hexdigest()[:16]


@endpoint(openai_error)
async def slots(request: Request) -> Response:
    """Every model's slots; a non-admin caller sees only its tenant's."""
    tenant = viewer(request)
    out: list[dict[str, Any]] = []
    for model in state_of(request).registry.models():
        load = model.load()
        for slot in load.get("slots", []):
            if tenant is not None and slot["owner"] != tenant:
                continue
            out.append(
                {
                    "model": model.model_id,
                    "slot": slot["id"],
                    "state": slot["state"],
                    "owner": owner_hash(slot["owner"]),
                    "session_key": session_hash(slot["session_key"]),
                    "tokens_cached": slot["tokens_cached"],
                    "last_used": slot["last_used"] or None,
                }
            )
    return JSONResponse({"object": "list", "data": out})


routes = [Route("/v1/slots", slots, methods=["GET"])]


class AttachBody(BaseModel):
    """``POST /v1/admin/models``: what to load and under which names."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str = Field(min_length=1, description="GGUF path, packaged model name, or (with pull) a reference")
    #: pull ``model`` into the store first (``org/repo:Q4_K_M``, ``ollama:name``, a URL)
    pull: bool = False
    id: str | None = Field(default=None, min_length=1)
    aliases: list[str] = Field(default_factory=list)
    kind: Literal["chat", "embedding", "rerank", "remote"] = "chat"
    ctx: int | None = Field(default=None, ge=16)
    parallel: int | None = Field(default=None, ge=1)
    session_slots: int | None = Field(default=None, ge=0)
    threads: int | None = Field(default=None, ge=0)
    keep_alive: float | None = Field(default=None, ge=0)
    system: str | None = None
    reasoning: str | None = None
    chat_template: str | None = None
    #: a multimodal projector GGUF under the allowed folders (as ``model``);
    #: false: none, not even the one a pulled model brings
    mmproj: str | bool | None = None


def entry_card(entry: Any) -> dict[str, Any]:
    card = {
        "id": entry.id,
        "aliases": list(entry.aliases),
        "kind": entry.info.get("kind", entry.kind),
        "loaded": entry.model is not None or entry.group is not None,
        "state": entry.state,
        "in_flight": entry.leases,
        "keep_alive": entry.spec.keep_alive if entry.spec is not None else None,
        "path": entry.info.get("path"),
    }
    if entry.info.get("upstream"):
        card["upstream"], card["upstream_model"] = entry.info["upstream"], entry.info.get("upstream_model")
    if entry.group is not None:
        card["replicas"] = entry.group.describe()
    return card


@endpoint(openai_error)
async def list_admin_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [entry_card(e) for e in state_of(request).registry.entries()]})


def _remote_body(raw: dict[str, Any]) -> RemoteOptions | GroupOptions:
    """``{"id", "kind": "remote", "base_url", "model", "api_key_env", "ctx", ...}``,
    or with ``replicas``: a list of such (remote) replicas, each with an
    optional ``name``, inheriting the body's remote keys."""
    values = dict(raw)
    model_id = values.pop("id", None)
    if not isinstance(model_id, str) or not model_id:
        raise BadRequest("'id' is required for a remote model (the name clients use)", "id")
    aliases = values.pop("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise BadRequest("'aliases' must be a list of names", "aliases")
    values.pop("kind", None)
    replicas = values.pop("replicas", None)
    for where in [values, *(r for r in (replicas if isinstance(replicas, list) else []) if isinstance(r, dict))]:
        if "ca_file" in where:
            # a path on this machine: the config file's to name, never a
            # caller's (who would learn from the answer whether it exists)
            raise BadRequest("'ca_file' is read from the config file only, not from an attach body", "ca_file")
    try:
        if replicas is None:
            return remote_options(model_id, values, "body", tuple(aliases))
        if not isinstance(replicas, list) or not replicas or not all(isinstance(r, dict) for r in replicas):
            raise BadRequest("'replicas' must be a non-empty list of objects", "replicas")
        group = {k: values.pop(k) for k in list(values) if k in GROUP_KEYS}
        for key, value in group.items():
            if key == "routing":
                if value not in ROUTINGS:
                    raise BadRequest(f"'routing' must be one of {', '.join(ROUTINGS)}", "routing")
            elif not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise BadRequest(f"'{key}' must be a positive number of seconds", key)
        members: list[tuple[str, RemoteOptions | ModelOptions]] = []
        for i, rep in enumerate(replicas):
            name = replica_name(rep, i)
            rep = {k: v for k, v in rep.items() if k != "name"}
            if "base_url" not in {**values, **rep}:
                raise BadRequest("attached replicas are remote: each needs a 'base_url'", f"replicas[{i}].base_url")
            if any(n == name for n, _ in members):
                raise BadRequest(f"two replicas are named {name!r}; give each a 'name'", f"replicas[{i}].name")
            members.append((name, remote_options(f"{model_id}@{name}", {**values, **rep}, f"replicas[{i}]")))
        return GroupOptions(model_id, members, tuple(aliases), **group)
    except RemoteConfigError as exc:
        raise BadRequest(str(exc), None) from None


def _origin(url: Any) -> str | None:
    """``scheme://host:port`` of a URL (None if it is none)."""
    if not isinstance(url, str):
        return None
    try:
        p = urllib.parse.urlsplit(url)
        port = p.port or {"http": 80, "https": 443}.get(p.scheme.lower(), 0)
    except ValueError:
        return None
    return f"{p.scheme.lower()}://{(p.hostname or '').lower()}:{port}"


def _check_key_envs(raw: dict[str, Any], free: set[str], bound: dict[str, set[str | None]]) -> None:
    """The key in ``api_key_env`` is sent to the body's ``base_url``: a body
    may name a variable the operator allowed (``free``: ``--remote-key-env``),
    or one an attached remote model names, for that model's own host only
    (``bound``); else a caller could send a server secret to a host of its
    choosing. Replicas inherit the body's keys. The answer never says
    whether the variable is set."""
    replicas = raw.get("replicas")
    rows: list[tuple[str, dict[str, Any]]] = [("", raw)]
    if isinstance(replicas, list):
        rows = [(f"replicas[{i}].", {**raw, **r}) for i, r in enumerate(replicas) if isinstance(r, dict)]
    for where, values in rows:
        name = values.get("api_key_env")
        if name is None:
            continue
        if not isinstance(name, str) or not name:
            raise BadRequest("'api_key_env' must name an environment variable", where + "api_key_env")
        if name in free or _origin(values.get("base_url")) in bound.get(name, set()):
            continue
        raise BadRequest(
            f"'api_key_env' {name!r} is not a variable attach bodies may name for this base_url; allow it with "
            "--remote-key-env (or [server] remote_key_envs), or use it only with the host of the model that names it",
            where + "api_key_env",
            status=403,
            code="key_env_not_allowed",
            type="permission_error",
        )


def _key_envs(request: Request) -> tuple[set[str], dict[str, set[str | None]]]:
    """The variables attach bodies may name anywhere (the operator's list),
    and those the attached remote models name, with their hosts."""
    st = state_of(request)
    bound: dict[str, set[str | None]] = {}
    for e in st.registry.entries():
        upstream = e.model.upstream if e.model is not None else None
        if upstream is not None and upstream.api_key_env is not None:
            bound.setdefault(upstream.api_key_env, set()).add(_origin(upstream.base_url))
    return set(st.remote_key_envs), bound


async def _attach_remote(request: Request, raw: dict[str, Any]) -> Response:
    _check_key_envs(raw, *_key_envs(request))
    opts = _remote_body(raw)
    registry = state_of(request).registry
    try:
        registry.check_names(opts.id, opts.aliases)
        if isinstance(opts, GroupOptions):
            attach_group(registry, opts)
            entry = registry.lookup(opts.id)
        else:
            entry = registry.attach(RemoteModel(opts))
    except RegistryError as exc:
        raise BadRequest(str(exc), "id", status=409, code="model_exists") from None
    return JSONResponse(entry_card(entry), status_code=201)


@endpoint(openai_error)
async def attach_model(request: Request) -> Response:
    raw = await read_json(request)
    if raw.get("kind") == "remote" or "replicas" in raw:
        return await _attach_remote(request, raw)
    body = validate(AttachBody, raw)
    registry = state_of(request).registry
    default_id: str | None
    pulled_mmproj: str | None = None  # (the projector pulled beside it: store-relative)
    try:
        if body.pull:
            pulled = await run_pull(state_of(request), body.model, register=False)
            path, default_id = pulled.path, pulled.name
            pulled_mmproj = pulled.model.mmproj if pulled.model is not None else None
        else:
            path, default_id = await asyncio.to_thread(attachable, body.model, state_of(request).model_folders)
    except BadRequest:
        raise
    except NotAttachable as exc:
        raise BadRequest(str(exc), "model", status=403, code="model_not_allowed", type="permission_error") from None
    except ModelNotFound as exc:
        raise BadRequest(str(exc), "model", status=404, code="model_not_found") from None
    except Exception as exc:  # a pull that failed
        raise pull_failure(exc) from None
    mmproj = await _projector(request, body, pulled_mmproj)
    # the server's own defaults (threads, queue bound, reuse, speculation,
    # keep-alive ...), then what the request sets
    base = {k: v for k, v in state_of(request).model_defaults.items() if k not in ("path", "id", "aliases", "kind")}
    opts = ModelOptions(path=path, id=body.id or default_id, aliases=tuple(body.aliases), kind=body.kind, **base)
    opts.mmproj = mmproj
    for field_name, attr in (
        ("ctx", "ctx"),
        ("parallel", "parallel"),
        ("session_slots", "session_slots"),
        ("threads", "threads"),
        ("keep_alive", "keep_alive"),
        ("system", "default_system"),
        ("reasoning", "default_reasoning"),
        ("chat_template", "chat_template"),
    ):
        value = getattr(body, field_name)
        if value is not None:
            setattr(opts, attr, value)
    spec = spec_for(opts)
    try:
        registry.check_names(spec.id, spec.aliases)
    except RegistryError as exc:
        raise BadRequest(str(exc), "id", status=409, code="model_exists") from None
    if not await registry.reserve():
        raise BadRequest(
            f"{registry.max_resident} model(s) are resident (--max-resident) and every one is busy; "
            "try again when one is idle",
            "model",
            status=409,
            code="max_resident",
        )
    try:
        try:
            model = await asyncio.to_thread(load_spec, spec)  # off the event loop
        except ProjectorError as exc:  # (named by its file's name: no folder of the server's)
            why = f"could not load {body.model!r} with its projector: {exc.public}"
            raise BadRequest(why, "mmproj", status=422, code="load_failed") from None
        except (RuntimeError, ValueError, OSError) as exc:
            raise BadRequest(f"could not load {body.model!r}: {exc}", "model", status=422, code="load_failed") from None
        try:
            entry = registry.attach(model, spec)
        except RegistryError as exc:  # a concurrent attach took the name meanwhile
            await asyncio.to_thread(model.close)
            raise BadRequest(str(exc), "id", status=409, code="model_exists") from None
    finally:
        registry.unreserve()  # resident now (or not at all)
    return JSONResponse(entry_card(entry), status_code=201)


async def _projector(request: Request, body: AttachBody, pulled: str | None) -> str | None:
    """The projector an attached model loads with: the body's ``mmproj`` (a
    GGUF file under the allowed folders, checked as ``model`` is), none
    (``false``), else the one pulled beside it (``pulled``: store-relative)
    unless the server's defaults leave projectors off (``--no-mmproj``)."""
    st = state_of(request)
    if body.mmproj is True or body.mmproj == "":
        raise BadRequest("'mmproj' must be a projector GGUF's path, or false to load none", "mmproj")
    if body.mmproj is False or (body.kind in ("embedding", "rerank") and body.mmproj is None):
        return None
    if body.kind in ("embedding", "rerank"):
        what = "an embedding model" if body.kind == "embedding" else "a reranker"
        raise BadRequest(f"{what} takes no projector: 'mmproj' is for chat models", "mmproj")
    if isinstance(body.mmproj, str):
        try:
            return await asyncio.to_thread(attachable_projector, body.mmproj, st.model_folders)
        except NotAttachable:
            raise BadRequest(
                f"{body.mmproj!r} is not a GGUF file under the allowed model folders (--models-dir)",
                "mmproj",
                status=403,
                code="model_not_allowed",
                type="permission_error",
            ) from None
    off = "mmproj" in st.model_defaults and not st.model_defaults["mmproj"]
    return None if off or pulled is None or st.puller is None else st.puller.store.path(pulled)


@endpoint(openai_error)
async def detach_model(request: Request) -> Response:
    registry = state_of(request).registry
    model_id = request.path_params["model_id"]
    try:
        entry = registry.remove(model_id)
    except RegistryError as exc:
        raise BadRequest(str(exc), "model", status=409, code="model_is_replica") from None
    except KeyError:
        raise BadRequest(f"model {model_id!r} is not attached", "model", status=404, code="model_not_found") from None
    # the model stops taking requests now; it unloads once its in-flight ones end
    return JSONResponse({**entry_card(entry), "detached": True})


def _config_file(request: Request) -> ConfigControl:
    control = state_of(request).config
    if control is None:
        raise BadRequest(
            "this server was started without --config: there is no config file to show or reload",
            None,
            status=404,
            code="no_config_file",
        )
    return control


@endpoint(openai_error)
async def show_config(request: Request) -> Response:
    """The config file in force: when it was loaded, the last reload, the
    server settings and each model's preset (never a key)."""
    return JSONResponse(_config_file(request).describe())


@endpoint(openai_error)
async def reload_config(request: Request) -> Response:
    """Read the config file again and apply it: what was added, removed and
    reloaded; an invalid file is a 400 naming its error, and nothing changes."""
    result = await _config_file(request).reload("admin")
    if result.error is not None:
        raise BadRequest(result.error, None, status=400, code="invalid_config")
    return JSONResponse(result.to_json())


@endpoint(openai_error)
async def list_pulls(request: Request) -> Response:
    """The pulls in flight and the last few ended: name, state, bytes
    done/total, rate and error (none: a server without a model store)."""
    puller = state_of(request).puller
    return JSONResponse({"object": "list", "data": puller.pulls() if puller is not None else []})


@endpoint(openai_error)
async def cancel_pull(request: Request) -> Response:
    """Stop a pull in flight at its next chunk (its client gets an error
    line, its ``modelPull`` ends ``failed``, ``/v1/admin/pulls`` shows it
    ``cancelled``); 404 when no pull of that name is in flight."""
    puller, name = state_of(request).puller, request.path_params["model"]
    if puller is None or not puller.cancel(name):
        raise BadRequest(f"no pull of {name!r} is in flight", "model", status=404, code="not_found")
    return JSONResponse({"model": name, "cancelled": True})


routes += [
    Route("/v1/admin/pulls", list_pulls, methods=["GET"]),
    Route("/v1/admin/pulls/{model:path}", cancel_pull, methods=["DELETE"]),
    Route("/v1/admin/config", show_config, methods=["GET"]),
    Route("/v1/admin/config/reload", reload_config, methods=["POST"]),
    Route("/v1/admin/models", list_admin_models, methods=["GET"]),
    Route("/v1/admin/models", attach_model, methods=["POST"]),
    Route("/v1/admin/models/{model_id:path}", detach_model, methods=["DELETE"]),
]
