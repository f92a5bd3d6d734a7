"""A config file's models applied to a running registry, again: what a
reload does once the file has been read. The models are compared, by id,
with those the file gave before (:class:`Presets`), and the difference is
applied without failing a request in flight:

- a model whose section is gone is detached: it takes no new request, ends
  the ones it has, then unloads (``Registry.remove``);
- a new section is added: a local model is loaded off the event loop while
  there is room under ``--max-resident``, else configured to load on first
  use; a remote one is a client; a replica group's local replicas load on
  first use;
- a changed section replaces its model in one step (``Registry.replace``):
  the new one is loaded first (when the old one was resident) and then
  swapped in, while the old one finishes its requests and unloads.

Models given otherwise (``--model``, an admin attach) are never touched. A
name clash refuses the whole change before anything is applied. No HTTP
types in here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core.backend import Backend
from ..engine.model import ModelOptions
from ..upstream.model import RemoteModel, RemoteOptions
from .entry import Entry
from .loading import GroupOptions, attach_group, load_spec, spec_for
from .names import ModelNames
from .registry import Registry

log = logging.getLogger("turbospark.registry")

#: one model of a config file: a local model, a remote one or a replica group
Preset = ModelOptions | RemoteOptions | GroupOptions


def preset_id(p: Preset) -> str:
    """The id a file's model is served under."""
    return spec_for(p).id if isinstance(p, ModelOptions) else p.id


#: ``modelDetached``'s reason for a model a reload took out
REMOVED = "removed from the config file"
CHANGED = "its config section changed"


@dataclass
class ReloadResult:
    """What one reload did (``error`` set: nothing, the running set is kept)."""

    #: what asked for it: ``admin``, ``SIGHUP`` or ``watch``
    trigger: str
    #: when it ran (Unix seconds)
    at: float = field(default_factory=time.time)
    error: str | None = None
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    reloaded: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: models the file gives that could not be loaded (id -> why); a changed
    #: one keeps its old self, a new one is not added (the next reload tries again)
    failed: dict[str, str] = field(default_factory=dict)
    #: ``[server]`` keys the file changes that apply only at a restart
    restart_needed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "trigger": self.trigger,
            "at": round(self.at, 3),
            "error": self.error,
            "added": self.added,
            "removed": self.removed,
            "reloaded": self.reloaded,
            "unchanged": self.unchanged,
            "failed": self.failed,
            "restart_needed": self.restart_needed,
        }


class Presets:
    """The models a config file gave a registry, each with the entry it
    became: what a reload compares the file with. One detached through the
    admin API (or whose name another model took since) is no longer the
    file's; if the file still names it, the next reload adds it again."""

    def __init__(self, registry: Registry, presets: Iterable[Preset]) -> None:
        self.registry = registry
        self._applied: dict[str, tuple[Preset, Entry]] = {}
        for p in presets:
            entry = registry.lookup(preset_id(p))
            if entry is not None and entry.id == preset_id(p):
                self._applied[preset_id(p)] = (p, entry)

    def in_force(self) -> dict[str, Preset]:
        """The file's models the registry still serves, by id, in the file's order."""
        self._applied = {i: (p, e) for i, (p, e) in self._applied.items() if self.registry.lookup(i) is e}
        return {i: p for i, (p, _) in self._applied.items()}

    def entry(self, model_id: str) -> Entry | None:
        """The entry a file's model became (None: it is not served)."""
        got = self._applied.get(model_id)
        return got[1] if got is not None and self.registry.lookup(model_id) is got[1] else None

    async def apply(self, new: list[Preset], result: ReloadResult) -> None:
        """Make the file's models ``new`` (in the file's order) the ones in
        force, recording what changed in ``result``. Raises
        :class:`RegistryError` before changing anything when a name is
        taken by a model the file does not give."""
        old = self.in_force()
        wanted = {preset_id(p) for p in new}
        removed = [i for i in old if i not in wanted]
        added = [p for p in new if preset_id(p) not in old]
        changed = [p for p in new if preset_id(p) in old and old[preset_id(p)] != p]
        self._check_names(set(removed) | {preset_id(p) for p in changed}, added + changed)
        result.unchanged = [preset_id(p) for p in new if preset_id(p) in old and old[preset_id(p)] == p]
        for model_id in removed:
            self.registry.remove(model_id, REMOVED)
            del self._applied[model_id]
            result.removed.append(model_id)
        # (the changed before the new: a new model may take a name a changed one gives up)
        for p in changed:
            if await self._change(old[preset_id(p)], p, result):
                result.reloaded.append(preset_id(p))
        for p in added:
            if await self._add(p, result):
                result.added.append(preset_id(p))

    def _check_names(self, leaving: set[str], incoming: list[Preset]) -> None:
        """Every name the incoming models take is free once ``leaving`` (ids
        of the file's models, a group with its replicas) has gone."""
        names = ModelNames()
        for e in self.registry.entries():
            if (e.member_of or e.id) not in leaving:
                names.add(Entry(e.id, e.aliases, e.kind))
        for p in incoming:
            members = [f"{preset_id(p)}@{n}" for n, _ in p.replicas] if isinstance(p, GroupOptions) else []
            for model_id, aliases in [(preset_id(p), tuple(p.aliases)), *((m, ()) for m in members)]:
                names.check_names(model_id, aliases)
                names.add(Entry(model_id, aliases, "chat"))

    async def _add(self, p: Preset, result: ReloadResult, lazy: bool = False) -> bool:
        """Add a new model of the file (False: it failed, noted in
        ``result``); ``lazy``: a local one loads on first use."""
        try:
            if isinstance(p, GroupOptions):
                attach_group(self.registry, p, room=0)  # its local replicas load on first use
                entry = self.registry.lookup(preset_id(p))
            elif isinstance(p, RemoteOptions):
                entry = self.registry.attach(RemoteModel(p))
            else:
                spec = spec_for(p)
                loaded = None if lazy else await self._load(p, None)
                if loaded is None:
                    entry = self.registry.configure(spec)
                else:
                    entry = await _closed_unless(loaded, lambda m: self.registry.attach(m, spec))
        except Exception as exc:  # noqa: BLE001 - one model's failure, reported; the others go on
            log.warning("config reload: model %s could not be added: %s", preset_id(p), exc)
            result.failed[preset_id(p)] = str(exc)
            return False
        if entry is not None:
            self._applied[preset_id(p)] = (p, entry)
        return True

    async def _change(self, old: Preset, new: Preset, result: ReloadResult) -> bool:
        """Replace a model whose section changed (False: the new one failed
        to load, noted in ``result``; the old one stays)."""
        model_id = preset_id(new)
        if isinstance(old, GroupOptions) or isinstance(new, GroupOptions):
            # a group is replaced whole, and what replaces it loads on first
            # use: nothing awaits between the two, so no request finds the
            # name missing
            self.registry.remove(model_id, CHANGED)
            del self._applied[model_id]
            return await self._add(new, result, lazy=True)
        was = self._applied[model_id][1]
        try:
            if isinstance(new, RemoteOptions):
                remote = RemoteModel(new)
                entry = await _closed_unless(remote, lambda m: self.registry.replace(model_id, m, None, CHANGED))
            else:
                spec = spec_for(new)
                loaded = await self._load(new, was)
                if loaded is None:
                    entry = self.registry.replace(model_id, None, spec, CHANGED)
                else:
                    entry = await _closed_unless(loaded, lambda m: self.registry.replace(model_id, m, spec, CHANGED))
        except Exception as exc:  # noqa: BLE001 - reported; the old model keeps serving
            log.warning("config reload: model %s could not be reloaded, the old one stays: %s", model_id, exc)
            result.failed[model_id] = str(exc)
            return False
        self._applied[model_id] = (new, entry)
        return True

    async def _load(self, opts: ModelOptions, instead_of: Entry | None) -> Backend | None:
        """The model loaded off the event loop, or None (it loads on first
        use): when it replaces a resident model it takes that one's place;
        else it loads only while there is room under ``--max-resident``
        (nothing is evicted for it)."""
        resident = instead_of is not None and instead_of.model is not None and instead_of.model.capabilities.resident
        if not resident:
            if not self.registry.residency.has_room() or not await self.registry.reserve():
                return None
        try:
            return await asyncio.to_thread(load_spec, spec_for(opts))
        finally:
            if not resident:
                self.registry.unreserve()


async def _closed_unless(model: Backend, put: Callable[[Backend], Entry]) -> Entry:
    """``put(model)`` into the registry; if that is refused (a name taken
    meanwhile), the model is closed and the refusal raised."""
    try:
        return put(model)
    except BaseException:
        await asyncio.to_thread(model.close)
        raise
