"""A pulled model as the registry loads it: its options (the server's
defaults, then the presets its source gave: Ollama's ``num_ctx``, system
prompt ..., and the projector pulled beside it) and the facts the listings
show before it is loaded."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..engine.model import ModelOptions
from ..models.entry import ModelSpec
from ..models.loading import projector_facts, spec_for
from .ollama import presets
from .refs import BadReference, parse
from .store import Installed, Store

#: option keys a model's defaults may not set for a pulled model
_OWN = ("path", "id", "aliases", "kind")


def facts(model: Installed) -> dict[str, Any]:
    """What ``/api/tags`` and ``/api/show`` show of a model not loaded yet."""
    return {
        "architecture": model.architecture,
        "parameters": model.parameters,
        "quantization": model.quant,
        "trained_context": model.context,
        "size_bytes": model.size,
        "source": model.source,
        "reference": model.reference,
        "digest": model.digest,
        "chat_template": model.template,
        "mmproj": model.mmproj,
    }


def projector(store: Store, model: Installed, defaults: dict[str, Any] | None = None) -> str | None:
    """The projector a pulled model loads with: the one pulled beside it
    (Hugging Face's ``mmproj-*.gguf``, Ollama's projector layer), unless
    the defaults leave projectors off (``--no-mmproj``, ``mmproj = false``
    in ``[defaults]``: the key present, None)."""
    if not model.mmproj or (defaults is not None and "mmproj" in defaults and not defaults["mmproj"]):
        return None
    return store.path(model.mmproj)


def options(store: Store, model: Installed, defaults: dict[str, Any] | None = None) -> ModelOptions:
    base = {k: v for k, v in (defaults or {}).items() if k not in _OWN}
    opts = ModelOptions(path=store.path(model.files[0]), id=model.name, **base)
    opts.mmproj = projector(store, model, defaults)
    preset = presets(model.params)
    if "ctx" in preset:
        opts.ctx = preset.pop("ctx")
    # the source's sampling presets (Ollama's params layer), under the server's own
    opts.sampling = {**preset, **opts.sampling}
    if model.system and opts.default_system is None:
        opts.default_system = model.system
    return opts


def spec(
    store: Store, model: Installed, defaults: dict[str, Any] | None = None, aliases: tuple[str, ...] = ()
) -> ModelSpec:
    opts = options(store, model, defaults)
    opts.aliases = aliases
    # (the projector it loads with, if any: its absolute path and what it takes)
    shown = {**facts(model), "mmproj": None, **projector_facts(opts.mmproj), "sampling": dict(opts.sampling)}
    shown["tags"] = list(opts.tags)
    return dataclasses.replace(spec_for(opts), facts=shown)


def on_demand(store: Store, defaults: dict[str, Any] | None = None) -> Callable[[str], ModelSpec | None]:
    """The registry's hook: a model asked for by a name only the store knows
    (as it was pulled: ``hf.co/org/repo:Q8_0`` finds ``org/repo:Q8_0``, and
    answers to the name asked for too)."""

    def find(name: str) -> ModelSpec | None:
        model = store.find(name)
        if model is None:
            try:
                model = store.find(parse(name, bare_is_ollama=True).name)
            except BadReference:
                return None
        if model is None:
            return None
        same = name in (model.name, f"{model.name}:latest")
        return spec(store, model, defaults, () if same else (name,))

    return find
