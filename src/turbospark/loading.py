"""How models get from a ``--model`` argument, a config section or an
attach request into the registry: options, specs, and the loader."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from .catalog import resolve_model
from .engine.model import LlamaChatModel, ModelOptions, derive_id
from .registry import ModelSpec, Registry

ModelArg = str | ModelOptions | Any


def options_for(arg: str, **overrides: Any) -> ModelOptions:
    """A ``--model`` argument (GGUF path or packaged name) as load options."""
    path, default_id = resolve_model(arg)
    return ModelOptions(path=path, id=default_id or derive_id(path), **overrides)


def spec_for(opts: ModelOptions) -> ModelSpec:
    model_id = opts.id or derive_id(opts.path)
    return ModelSpec(
        id=model_id, aliases=tuple(opts.aliases), kind=opts.kind,  # type: ignore[arg-type]
        options=dataclasses.replace(opts, id=model_id), keep_alive=opts.keep_alive, path=opts.path,
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


