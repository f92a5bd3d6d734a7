"""How models get from a ``--model`` argument, a config section or an
attach request into the registry: options, specs, and the loader."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Iterable
from typing import Any

from .catalog import CATALOG, GGUF_MAGIC, cache_dir, resolve_model
from .engine.model import LlamaChatModel, ModelOptions, derive_id
from .registry import ModelSpec, Registry

ModelArg = str | ModelOptions | Any


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
        if not any(_inside(real, root) for root in roots):
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
    model_id = opts.id or derive_id(opts.path)
    return ModelSpec(
        id=model_id,
        aliases=tuple(opts.aliases),
        kind=opts.kind,  # type: ignore[arg-type]
        options=dataclasses.replace(opts, id=model_id),
        keep_alive=opts.keep_alive,
        path=opts.path,
    )


def load_spec(spec: ModelSpec, progress: Callable[[float], None] | None = None) -> LlamaChatModel:
    """The registry's loader: build the llama.cpp model a spec describes."""
    return LlamaChatModel(spec.options, progress)


def populate(
    registry: Registry,
    models: Iterable[ModelArg],
    defaults: dict[str, Any] | None = None,
    progress_for: Callable[[ModelSpec], Callable[[float], None] | None] | None = None,
    on_loaded: Callable[[Any], None] | None = None,
) -> list[Any]:
    """Register every model; load them now, up to the registry's resident
    cap (the rest load on first use). Returns the models it loaded."""
    args = [options_for(a, **(defaults or {})) if isinstance(a, str) else a for a in models]
    # every name is checked before anything loads (a clash is a config error)
    scratch = Registry()
    for arg in args:
        if isinstance(arg, ModelOptions):
            spec = spec_for(arg)
            registry.check_names(spec.id, spec.aliases)
            scratch.configure(spec)
    loaded: list[Any] = []
    for arg in args:
        if isinstance(arg, ModelOptions):
            spec = spec_for(arg)
            if registry.max_resident and len(loaded) >= registry.max_resident:
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
            registry.attach(arg)  # a model object the caller owns
    return loaded
