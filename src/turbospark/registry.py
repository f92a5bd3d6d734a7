"""Which model serves a request (REFERENCE.md §4). No HTTP types in here.

Resolution, among the models capable of the request (chat vs embeddings):

1. an exact id or alias match wins;
2. else, if exactly one capable model is loaded, it serves whatever name was
   asked (clients send ``gpt-4o`` or ``claude-sonnet-...``);
3. else, no capable model at all: 503;
4. else 404 ``model_not_found`` naming the models that are available.

Lookups (``GET /v1/models/{id}``, Ollama ``/api/show``) never fall back.
"""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Literal

from .observe import ModelAttached, ModelDetached, Observer, now_ms, record

Capability = Literal["chat", "embeddings"]


class RoutingError(Exception):
    """A request no loaded model can take; carries its HTTP meaning."""

    def __init__(self, status: int, message: str, code: str, param: str | None = "model") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


class RegistryError(ValueError):
    """A configuration the registry refuses (duplicate id or alias)."""


@dataclass(frozen=True)
class Route:
    model: Any
    requested: str | None
    served: str

    @property
    def fell_back(self) -> bool:
        return self.requested is not None and self.requested != self.served


def _capable(model: Any, capability: Capability) -> bool:
    if capability == "chat":
        return bool(getattr(model, "supports_chat", True))
    return bool(getattr(model, "supports_embeddings", False))


class Registry:
    """The models a server holds, addressable by id and aliases."""

    def __init__(self, observer: Observer | None = None) -> None:
        self._models: dict[str, Any] = {}
        self._lock = threading.RLock()
        self.observer = observer

    # -- membership ------------------------------------------------------------
    def _names(self, model: Any) -> list[str]:
        return [model.model_id, *getattr(model, "aliases", ())]

    def _owner_of(self, name: str) -> str | None:
        for mid, m in self._models.items():
            if name in self._names(m):
                return mid
        return None

    def check_names(self, model_id: str, aliases: tuple[str, ...] | list[str] = ()) -> None:
        """Refuse an id or alias that another model already answers to."""
        with self._lock:
            seen: set[str] = set()
            for name in [model_id, *aliases]:
                if name in seen:
                    raise RegistryError(f"model {model_id!r} lists the name {name!r} twice")
                seen.add(name)
                owner = self._owner_of(name)
                if owner is not None:
                    raise RegistryError(
                        f"the name {name!r} of model {model_id!r} is already used by model {owner!r}"
                    )

    def attach(self, model: Any) -> None:
        with self._lock:
            self.check_names(model.model_id, getattr(model, "aliases", ()))
            self._models[model.model_id] = model
        record(self.observer, lambda: ModelAttached(at_ms=now_ms(), model=model.model_id))

    def detach(self, model_id: str) -> Any:
        with self._lock:
            model = self._models.pop(model_id, None)
        if model is None:
            raise KeyError(model_id)
        record(self.observer, lambda: ModelDetached(at_ms=now_ms(), model=model_id))
        return model

    def models(self) -> list[Any]:
        with self._lock:
            return list(self._models.values())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.models())

    def __len__(self) -> int:
        return len(self._models)

    @property
    def state(self) -> str:
        return "ready" if self._models else "empty"

    # -- routing ---------------------------------------------------------------
    def lookup(self, name: str) -> Any | None:
        """Exact id or alias; never falls back."""
        with self._lock:
            owner = self._owner_of(name)
            return self._models.get(owner) if owner is not None else None

    def resolve(self, requested: str | None, capability: Capability = "chat") -> Route:
        with self._lock:
            capable = [m for m in self._models.values() if _capable(m, capability)]
            if requested:
                for m in capable:
                    if requested in self._names(m):
                        return Route(m, requested, m.model_id)
            if len(capable) == 1:
                return Route(capable[0], requested, capable[0].model_id)
            if not capable:
                what = "chat" if capability == "chat" else "embeddings"
                raise RoutingError(
                    503,
                    f"no model capable of this request ({what}) is loaded",
                    "model_not_available",
                )
            ids = sorted(m.model_id for m in capable)
            if not requested:
                raise RoutingError(
                    400,
                    f"several models are loaded; name one in 'model': {', '.join(ids)}",
                    "model_required",
                )
            names = [n for m in capable for n in self._names(m)]
            close = difflib.get_close_matches(requested, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise RoutingError(
                404,
                f"model {requested!r} not found; available models: {', '.join(ids)}.{hint}",
                "model_not_found",
            )
