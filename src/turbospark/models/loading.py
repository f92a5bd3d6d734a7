"""How models get from a ``--model`` argument, a config section or an
attach request into the registry: options, specs, and the loader."""

from __future__ import annotations

import dataclasses
import os
import ssl
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..core.backend import Backend
from ..engine.gguf import is_reranker, projector_info, projector_modalities
from ..engine.model import LlamaChatModel, ModelOptions, derive_id
from ..upstream.model import RemoteModel, RemoteOptions
from .catalog import CATALOG, GGUF_MAGIC, cache_dir, resolve_model
from .local import LocalBackend
from .registry import MAX_FAILURES, Entry, ModelSpec, Registry
from .replicas import Replica

#: a packaged name or GGUF path, options, or a model object the caller owns
ModelArg = str | ModelOptions | Any


#: keys of a remote model (config section, attach body, a replica) -> accepted types
REMOTE_KEYS: dict[str, tuple[type, ...]] = {
    "base_url": (str,),
    "model": (str,),
    "api_key_env": (str,),
    "ctx": (int,),
    "context": (int,),
    "headers": (dict,),
    "connect_timeout": (int, float),
    "read_timeout": (int, float),
    "embeddings": (bool,),
    "health_path": (str,),
    "max_connections": (int,),
    "ca_file": (str,),
}
#: keys of a replica group besides its replicas
GROUP_KEYS: dict[str, tuple[type, ...]] = {"health_interval": (int, float), "cooldown": (int, float), "routing": (str,)}


class RemoteConfigError(ValueError):
    """A remote model or replica group described wrongly (the message names the key)."""


def remote_options(model_id: str, values: dict[str, Any], where: str, aliases: tuple[str, ...] = ()) -> RemoteOptions:
    """A remote model from a config section / attach body / replica entry
    (only :data:`REMOTE_KEYS`). The API key itself is never a key: only the
    name of the environment variable holding it."""
    for key, value in values.items():
        types = REMOTE_KEYS.get(key)
        if types is None:
            known = ", ".join(sorted(REMOTE_KEYS))
            raise RemoteConfigError(f"unknown key {where}.{key} for a remote model (known keys: {known})")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise RemoteConfigError(f"{where}.{key} must be {names}, not {type(value).__name__}")
    for key in ("base_url", "model"):
        if not values.get(key):
            raise RemoteConfigError(f"{where}.{key} is required for a remote model")
    url = values["base_url"]
    if not url.startswith(("http://", "https://")):
        raise RemoteConfigError(f"{where}.base_url must be an http:// or https:// URL, not {url!r}")
    host = url.split("://", 1)[1].split("/", 1)[0]
    if "@" in host or "?" in url or "#" in url:
        # the URL is shown (model listings, error messages): no credentials in it
        raise RemoteConfigError(
            f"{where}.base_url must not carry credentials or a query; name the key's variable in api_key_env"
        )
    headers = values.get("headers", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise RemoteConfigError(f"{where}.headers must map header names to strings")
    if any(k.lower() == "authorization" for k in headers):
        raise RemoteConfigError(f"{where}.headers must not carry the key: name its variable in api_key_env")
    ctx = values.get("ctx", values.get("context", 8192))
    timing = ("connect_timeout", "read_timeout", "max_connections")
    for key, value in (("ctx", ctx), *((k, values[k]) for k in timing if k in values)):
        if value <= 0:
            raise RemoteConfigError(f"{where}.{key} must be positive")
    ca_file = values.get("ca_file")
    if ca_file is not None:
        try:  # read now: a bad bundle is a config error, not a 500 at every request
            ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as e:
            raise RemoteConfigError(f"{where}.ca_file {ca_file!r} is no readable PEM bundle of CAs ({e})") from None
    return RemoteOptions(
        id=model_id,
        base_url=url,
        model=values["model"],
        api_key_env=values.get("api_key_env"),
        ctx=ctx,
        aliases=aliases,
        headers=dict(headers),
        connect_timeout=float(values.get("connect_timeout", 5.0)),
        read_timeout=float(values.get("read_timeout", 600.0)),
        embeddings=values.get("embeddings", False),
        health_path=values.get("health_path", "models"),
        max_connections=values.get("max_connections", 256),
        ca_file=ca_file,
    )


@dataclass
class GroupOptions:
    """A replica group: one id over several engines, each a remote model or
    a local one, attached as ``id@name``."""

    id: str
    replicas: list[tuple[str, RemoteOptions | ModelOptions]]
    aliases: tuple[str, ...] = ()
    health_interval: float = 5.0
    cooldown: float = 10.0
    #: "affinity" (cache-aware, the default), "round-robin" or "least-loaded"
    routing: str = "affinity"


def replica_name(values: dict[str, Any], index: int) -> str:
    """A replica's name: its ``name``, else its upstream's host:port, else its position."""
    name = values.get("name")
    if isinstance(name, str) and name:
        return name
    url = values.get("base_url")
    if isinstance(url, str) and "://" in url:
        return url.split("://", 1)[1].split("/", 1)[0]
    return f"r{index}"


async def probe_replica(replica: Replica) -> str | None:
    """A replica's health: a remote answers its health path, a local model's
    engine neither failed nor stalled (the registry's watchdog decides those)."""
    entry: Entry = replica.entry
    model: Backend | None = entry.model
    if model is not None and (down := await model.probe()) is not None:
        return down  # (a remote that does not answer its health path)
    if entry.failure is not None and model is None:
        # a failed engine is reloaded by the next request routed to it, once
        # its backoff is over: until then (or after too many failures) down
        if entry.failures >= MAX_FAILURES or time.monotonic() < entry.retry_at:
            return entry.failure
        return None
    return entry.stall_reason if entry.stalled else None


def options_for(arg: str, **overrides: Any) -> ModelOptions:
    """A ``--model`` argument (GGUF path or packaged name) as load options."""
    path, default_id = resolve_model(arg)
    return ModelOptions(path=path, id=default_id or derive_id(path), **overrides)


class NotAttachable(Exception):
    """An attach request names something that is not a packaged model or a
    GGUF file under the allowed folders. One message for every case, so a
    caller never learns whether a path exists."""

    def __init__(self, arg: str) -> None:
        super().__init__(
            f"{arg!r} is not a packaged model name or a GGUF file under the allowed model folders (--models-dir)"
        )


def default_model_folders(registry: Registry) -> tuple[str, ...]:
    """Where attach may load files from when ``--models-dir`` is not given:
    the model cache and the folders of the models configured at start."""
    folders = [cache_dir()]
    for entry in registry.entries():
        path = entry.spec.path if entry.spec is not None else entry.info.get("path")
        if path:
            folders.append(os.path.dirname(os.path.abspath(path)))
    return tuple(dict.fromkeys(folders))


def _inside(path: str, folder: str) -> bool:
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # different drives, or a relative/absolute mix
        return False


def attachable(arg: str, folders: Iterable[str]) -> tuple[str, str | None]:
    """``(path, default id)`` for an attach request's ``model``: a packaged
    model name, or a regular file that lies (links resolved) under one of
    ``folders`` and starts with the GGUF magic. Anything else raises
    :class:`NotAttachable`; llama.cpp never sees the file."""
    if arg in CATALOG:
        return resolve_model(arg)  # not installed: ModelNotFound names the package
    try:
        real = os.path.realpath(arg)
        roots = [os.path.realpath(f) for f in folders]
        inside = [root for root in roots if _inside(real, root)]
        hidden = [p for root in inside for p in os.path.relpath(real, root).split(os.sep) if p.startswith(".")]
        if not inside or hidden:  # (a hidden folder holds partial downloads)
            raise NotAttachable(arg)
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode) or os.read(fd, len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise NotAttachable(arg)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        raise NotAttachable(arg) from None
    return real, None


def spec_for(opts: ModelOptions) -> ModelSpec:
    """How the registry loads ``opts``; a GGUF whose header declares rank
    pooling is a reranker whatever its kind says (as the engine takes it)."""
    model_id = opts.id or derive_id(opts.path)
    kind = "rerank" if opts.kind == "chat" and is_reranker(opts.path) else opts.kind
    return ModelSpec(
        id=model_id,
        aliases=tuple(opts.aliases),
        kind=kind,  # type: ignore[arg-type]
        options=dataclasses.replace(opts, id=model_id),
        keep_alive=opts.keep_alive,
        path=opts.path,
        facts={**projector_facts(opts.mmproj), "tags": list(opts.tags)},
    )


def projector_facts(mmproj: str | None) -> dict[str, Any]:
    """What the listings show of a model's projector before it is loaded:
    its file, and what it takes as its header says (``modalities``)."""
    if not mmproj:
        return {}
    return {"mmproj": mmproj, "modalities": projector_modalities(projector_info(mmproj))}


def attachable_projector(arg: str, folders: Iterable[str]) -> str:
    """An attach request's ``mmproj``: a GGUF file under one of ``folders``
    (as :func:`attachable` checks a model's; a packaged model's name is
    none). Raises :class:`NotAttachable`."""
    if arg in CATALOG:
        raise NotAttachable(arg)
    return attachable(arg, folders)[0]


def attach_group(
    registry: Registry,
    group: GroupOptions,
    progress_for: Callable[[ModelSpec], Callable[[float], None] | None] | None = None,
    room: int | None = None,
) -> list[Any]:
    """Load a group's local replicas (at most ``room`` of them, the places
    left under ``--max-resident``; the rest load on first use), make its
    remote ones, and add it to the registry. Returns the models it made (the
    caller closes them)."""
    made: list[Any] = []
    members: list[tuple[str, Any, ModelSpec | None]] = []
    try:
        for name, opts in group.replicas:
            member_id = f"{group.id}@{name}"
            if isinstance(opts, RemoteOptions):
                model: Any = RemoteModel(dataclasses.replace(opts, id=member_id, aliases=(), replica=name))
                members.append((name, model, None))
            else:
                spec = spec_for(dataclasses.replace(opts, id=member_id, aliases=()))
                if room is not None and room <= 0:
                    members.append((name, None, spec))
                    continue
                model = load_spec(spec, progress_for(spec) if progress_for else None)
                members.append((name, model, spec))
                if room is not None:
                    room -= 1
            made.append(model)
        registry.add_group(
            group.id,
            tuple(group.aliases),
            members,
            group.health_interval,
            group.cooldown,
            probe=probe_replica,
            routing=group.routing,
        )
    except BaseException:
        for model in made:
            model.close()
        raise
    return made


def load_spec(spec: ModelSpec, progress: Callable[[float], None] | None = None) -> Backend:
    """The registry's loader: the llama.cpp model a spec describes, as a backend."""
    return LocalBackend(LlamaChatModel(spec.options, progress))


def populate(
    registry: Registry,
    models: Iterable[ModelArg],
    defaults: dict[str, Any] | None = None,
    progress_for: Callable[[ModelSpec], Callable[[float], None] | None] | None = None,
    on_loaded: Callable[[Any], None] | None = None,
) -> list[Any]:
    """Register every model; load them now, up to the registry's resident
    cap (the rest load on first use); the first is the registry's default
    model unless it has one. Returns the models it loaded."""
    args = [options_for(a, **(defaults or {})) if isinstance(a, str) else a for a in models]
    # every name is checked before anything loads (a clash is a config error)
    scratch = Registry()
    ids: list[str] = []
    for arg in args:
        if isinstance(arg, ModelOptions):
            spec = spec_for(arg)
            registry.check_names(spec.id, spec.aliases)
            scratch.configure(spec)
            ids.append(spec.id)
        elif isinstance(arg, RemoteOptions | GroupOptions):
            registry.check_names(arg.id, arg.aliases)
            scratch.configure(ModelSpec(arg.id, tuple(arg.aliases)))
            ids.append(arg.id)
        else:
            ids.append(arg.model_id)
    if registry.default is None and ids:  # (else the caller chose it)
        registry.default = ids[0]
    loaded: list[Any] = []

    def room() -> int | None:  # places left under the cap for local models
        if not registry.max_resident:
            return None
        return registry.max_resident - sum(1 for m in loaded if m.capabilities.resident)

    for arg in args:
        if isinstance(arg, GroupOptions):
            loaded += attach_group(registry, arg, progress_for, room())
        elif isinstance(arg, RemoteOptions):  # nothing to load: a client
            remote = RemoteModel(arg)
            registry.attach(remote)
            loaded.append(remote)
        elif isinstance(arg, ModelOptions):
            spec = spec_for(arg)
            left = room()
            if left is not None and left <= 0:
                registry.configure(spec)
                continue
            model = load_spec(spec, progress_for(spec) if progress_for else None)
            try:
                registry.attach(model, spec)
            except Exception:
                model.close()
                raise
            loaded.append(model)
            if on_loaded:
                on_loaded(model)
        else:
            # a model object the caller owns: a backend, or an engine put behind one
            registry.attach(arg if isinstance(arg, LocalBackend | RemoteModel) else LocalBackend(arg))
    return loaded
