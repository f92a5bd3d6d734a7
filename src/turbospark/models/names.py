"""The models a server knows by id and alias (CONTRACT §4): which names are
taken, and which entry serves a requested name. No HTTP types in here.

Resolution, among the models capable of the request (chat, embeddings or rerank):

1. an exact id or alias match wins (the registry first makes a model in
   the pull store known under the name asked for);
2. else, a rerank request naming a model that is no reranker, or another
   request naming a reranker, or no capable model while only rerankers
   (or, for a rerank, none) are there: 400 ``model_not_supported``;
   otherwise no capable model at all: 503;
3. else, with ``--strict-model-names``, a name that was asked for is a 404
   ``model_not_found`` naming the models that are available (an embedding
   model's name too, for chat);
4. else the server's default model serves whatever name was asked, or none
   (clients send ``gpt-4o`` or ``claude-sonnet-...``): the first
   ``--model``, a config section's ``default = true``, else its first one;
5. else (no default, or it cannot serve this kind of request) the one
   capable model there is; with several, 404 (400 when no name was given).

Lookups (``GET /v1/models/{id}``, Ollama ``/api/show``) never fall back.
"""

from __future__ import annotations

import difflib
import threading

from .entry import Capability, Entry, RegistryError, Route, RoutingError


def _base_name(name: str) -> str:
    """Ollama clients append ``:latest``; treat it as the bare name."""
    return name[: -len(":latest")] if name.endswith(":latest") else name


def _not_for(entry: Entry | None, capability: Capability) -> RoutingError:
    """The 400 for a rerank request to a model that is no reranker, or
    another request to a reranker (``entry``: the model it named)."""
    if capability == "rerank":
        which = f"model {entry.id!r} is not a reranker" if entry is not None else "no reranker is loaded"
        how = 'serve one with --rerank FILE, kind = "rerank", or a GGUF whose pooling is rank'
        return RoutingError(400, f"{which}: a rerank request needs one ({how})", "model_not_supported")
    which = f"model {entry.id!r} is a reranker" if entry is not None else "the only models loaded are rerankers"
    return RoutingError(
        400, f"{which}, which serve rerank requests only (/v1/rerank), not {capability}", "model_not_supported"
    )


class ModelNames:
    """The entries by id, in order (a group's members after it), and their
    names. ``lock`` guards every change; hold it across a check and an add."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self.lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._entries

    def get(self, model_id: str) -> Entry | None:
        return self._entries.get(model_id)

    def add(self, entry: Entry) -> None:
        """Add (or move to the end, when it is there already)."""
        with self.lock:
            self._entries.pop(entry.id, None)
            self._entries[entry.id] = entry

    def pop(self, model_id: str) -> Entry | None:
        with self.lock:
            return self._entries.pop(model_id, None)

    def swap(self, old: Entry, new: Entry) -> None:
        """Put ``new`` in ``old``'s place (its position in the order kept)."""
        with self.lock:
            self._entries = {(new.id if e is old else k): (new if e is old else e) for k, e in self._entries.items()}

    def entries(self) -> list[Entry]:
        with self.lock:
            return list(self._entries.values())

    def _owner_of(self, name: str, ignoring: Entry | None = None) -> Entry | None:
        for e in self._entries.values():
            if name in e.names and e is not ignoring:
                return e
        return None

    def check_names(
        self, model_id: str, aliases: tuple[str, ...] | list[str] = (), ignoring: Entry | None = None
    ) -> None:
        """Refuse an id or alias that another model (not ``ignoring``, the
        one it replaces) already answers to."""
        with self.lock:
            seen: set[str] = set()
            for name in [model_id, *aliases]:
                if not name:
                    raise RegistryError(f"model {model_id!r} has an empty name")
                if name in seen:
                    raise RegistryError(f"model {model_id!r} lists the name {name!r} twice")
                seen.add(name)
                owner = self._owner_of(name, ignoring)
                if owner is not None:
                    raise RegistryError(
                        f"the name {name!r} of model {model_id!r} is already used by model {owner.id!r}"
                    )

    def lookup(self, name: str) -> Entry | None:
        """Exact id or alias (``:latest`` ignored); never falls back."""
        with self.lock:
            return self._owner_of(name) or self._owner_of(_base_name(name))

    def resolve(
        self,
        requested: str | None,
        capability: Capability = "chat",
        default: str | None = None,
        strict: bool = False,
    ) -> Route:
        """The entry serving ``requested`` (module docstring): ``default``
        is the server's default model's id, ``strict`` refuses a name no
        model answers to."""
        with self.lock:
            capable = [e for e in self._entries.values() if e.capable(capability)]
            if requested:
                for name in (requested, _base_name(requested)):
                    for e in capable:
                        if name in e.names:
                            return Route(e, requested, e.id)
            named = self.lookup(requested) if requested else None
            if named is not None and "rerank" in (capability, named.kind):
                raise _not_for(named, capability)
            # a group's members answer to their own names, but the group is
            # the one model a fallback may pick
            capable = [e for e in capable if e.member_of is None]
            if not capable:
                if capability == "rerank" or any(e.kind == "rerank" for e in self._entries.values()):
                    raise _not_for(None, capability)
                raise RoutingError(
                    503, f"no model capable of this request ({capability}) is loaded", "model_not_available"
                )
            if not (requested and strict):
                chosen = next((e for e in capable if e.id == default), None)
                if chosen is None and len(capable) == 1:
                    chosen = capable[0]
                if chosen is not None:
                    return Route(chosen, requested, chosen.id)
            ids = sorted(e.id for e in capable)
            if not requested:
                raise RoutingError(
                    400,
                    f"several models are loaded; name one in 'model': {', '.join(ids)}",
                    "model_required",
                )
            names = [n for e in capable for n in e.names]
            close = difflib.get_close_matches(requested, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise RoutingError(
                404,
                f"model {requested!r} not found; available models: {', '.join(ids)}.{hint}",
                "model_not_found",
            )
