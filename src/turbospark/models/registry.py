"""Which model serves a request (CONTRACT §4), and which models are in
memory: the :class:`Registry` other modules use, composed of the names
(:mod:`.names`), the room under ``--max-resident``
(:mod:`.residency`), the loads, leases and unloads (:mod:`.lifecycle`) and
the watchdog (:mod:`.watchdog`). No HTTP types in here.

A model is an :class:`Entry` (:mod:`.entry`): its names, how to
(re)load it (a spec, when the registry may load it on demand) and, while
resident, the loaded model. Each request holds a lease on the entry it was
routed to; a detached or idle model is unloaded only once its leases are
gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..core.backend import Backend
from ..observe import ModelAttached, ModelDetached, Observer, now_ms, record
from .entry import (
    Capability,
    Entry,
    Kind,
    ModelSpec,
    RegistryError,
    Route,
    RoutingError,
    file_size,
    info_of,
)
from .failures import MAX_FAILURES
from .lifecycle import Lifecycle
from .names import ModelNames
from .replica_groups import acquire_replica, check_members, group_entry
from .replicas import Replica, ReplicaSet
from .residency import Residency
from .watchdog import STALL_TIMEOUT, Watchdog

__all__ = [
    "MAX_FAILURES",
    "ROOM_WAIT_SECONDS",
    "STALL_TIMEOUT",
    "Capability",
    "Entry",
    "Kind",
    "ModelSpec",
    "Registry",
    "RegistryError",
    "Route",
    "RoutingError",
]

#: how long a request waits for a resident model to go idle when it needs
#: another loaded and ``max_resident`` are all busy (``acquire``'s default)
ROOM_WAIT_SECONDS = 60.0


class Registry:
    """The models a server knows, addressable by id and aliases."""

    def __init__(
        self,
        observer: Observer | None = None,
        loader: Callable[[ModelSpec], Any] | None = None,
        max_resident: int = 0,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self.observer = observer
        self._names = ModelNames()
        self.residency = Residency(self._names.entries, observer, max_resident)
        self.lifecycle = Lifecycle(self.residency, loader, observer)
        self.watchdog = Watchdog(self._names.entries, self.lifecycle, observer, stall_timeout)
        #: detached entries whose model still runs the requests it had
        self._leaving: list[Entry] = []
        #: a model asked for by a name no entry has: the spec of one that can
        #: be loaded under it (a model in the pull store), or None
        self.on_demand: Callable[[str], ModelSpec | None] | None = None
        #: the id of the model that serves a name no model answers to (and a
        #: request that names none): the first ``--model``, a config
        #: section's ``default = true``, else its first section; None: the
        #: one model there is serves it
        self.default: str | None = None
        #: ``--strict-model-names``: a name no model answers to is a 404
        self.strict_names = False

    @property
    def max_resident(self) -> int:
        return self.residency.max_resident

    # -- membership ------------------------------------------------------------
    def check_names(self, model_id: str, aliases: tuple[str, ...] | list[str] = ()) -> None:
        """Refuse an id or alias that another model already answers to."""
        self._names.check_names(model_id, aliases)

    def attach(self, model: Backend, spec: ModelSpec | None = None) -> Entry:
        """Add a loaded model (and, with a spec, the means to reload it)."""
        with self._names.lock:
            entry = _loaded(model, spec)
            self.check_names(entry.id, entry.aliases)
            self._names.add(entry)
        record(self.observer, lambda: ModelAttached(at_ms=now_ms(), model=entry.id))
        return entry

    def configure(self, spec: ModelSpec) -> Entry:
        """Add a model that is loaded on first use."""
        with self._names.lock:
            entry = _configured(spec)
            self.check_names(spec.id, spec.aliases)
            self._names.add(entry)
        return entry

    def replace(self, model_id: str, model: Backend | None, spec: ModelSpec | None, reason: str = "replaced") -> Entry:
        """Put a new model in the place of ``model_id`` in one step: loaded
        (``model``, reloadable with ``spec``) or loaded on first use (only
        ``spec``). A request routed from now on gets the new one; the old
        one finishes the requests it has, then unloads (needs a loop). Its
        names may change (:class:`RegistryError` if another model has one);
        a replica group is not replaced this way (remove it, add the new)."""
        with self._names.lock:
            old = self._names.get(model_id)
            if old is None:
                raise KeyError(model_id)
            if old.group is not None or old.member_of is not None:
                raise RegistryError(f"{model_id!r} is a replica group or one of its replicas: remove it and add anew")
            if model is not None:
                entry = _loaded(model, spec)
            elif spec is not None:
                entry = _configured(spec)
            else:
                raise ValueError("replace needs a model or a spec")
            self._names.check_names(entry.id, entry.aliases, ignoring=old)
            self._names.swap(old, entry)
            old.detached = True
            if old.model is not None and old.leases > 0:
                self._leaving.append(old)
        record(self.observer, lambda: ModelDetached(at_ms=now_ms(), model=model_id, reason=reason))
        if entry.model is not None:
            record(self.observer, lambda: ModelAttached(at_ms=now_ms(), model=entry.id))
        self.lifecycle.unload_later(old)
        return entry

    def detach(self, model_id: str, reason: str | None = None) -> Entry:
        """Take a model out of routing now; it is unloaded once its in-flight
        requests are done (see :meth:`remove`)."""
        with self._names.lock:
            entry = self._names.pop(model_id)
            if entry is None:
                raise KeyError(model_id)
            entry.detached = True
            if entry.model is not None and entry.leases > 0:
                self._leaving.append(entry)
        record(self.observer, lambda: ModelDetached(at_ms=now_ms(), model=model_id, reason=reason))
        return entry

    def remove(self, model_id: str, reason: str | None = None) -> Entry:
        """Detach, and unload in the background when idle (needs a loop). A
        group goes with its replicas; a replica alone is refused
        (:class:`RegistryError`): it is removed with its group. ``reason``:
        why, for the ``modelDetached`` event."""
        member = self._names.get(model_id)
        if member is not None and member.member_of is not None:
            raise RegistryError(
                f"{model_id!r} is a replica of {member.member_of!r}; detach the group (replicas go with it)"
            )
        entry = self.detach(model_id, reason)
        gone = [entry]
        if entry.group is not None:
            entry.group.close()
            gone += [self.detach(r.entry.id, reason) for r in entry.group.replicas if r.entry.id in self._names]
        for e in gone:
            self.lifecycle.unload_later(e)
        return entry

    def add_group(
        self,
        group_id: str,
        aliases: tuple[str, ...],
        members: list[tuple[str, Any, ModelSpec | None]],
        health_interval: float = 5.0,
        cooldown: float = 10.0,
        probe: Callable[[Replica], Awaitable[str | None]] | None = None,
        routing: str = "affinity",
    ) -> Entry:
        """A replica group: ``members`` are (replica name, loaded model or
        None, spec to load it or None), each attached as ``group_id@name``."""
        with self._names.lock:
            check_members(self._names, group_id, aliases, members, routing)
            entries = [
                self.attach(model, spec) if model is not None else self.configure(spec)  # type: ignore[arg-type]
                for name, model, spec in members
            ]
            replicas = [Replica(name, e) for (name, _, _), e in zip(members, entries)]
            group = ReplicaSet(
                group_id,
                replicas,
                health_interval,
                cooldown,
                routing=routing,
                probe=probe,
                on_change=self.watchdog.replica_changed,
            )
            for e, r in zip(entries, replicas):
                e.replica, e.member_of = r, group_id
            entry = group_entry(group_id, aliases, group, entries)
            self._names.add(entry)
            for e in entries:  # listed after their group
                self._names.add(e)
        record(self.observer, lambda: ModelAttached(at_ms=now_ms(), model=group_id))
        return entry

    # -- views -----------------------------------------------------------------
    def entries(self) -> list[Entry]:
        return self._names.entries()

    def models(self) -> list[Backend]:
        """The models resident in memory now: a detached one too while it
        finishes its requests (the views and metrics show their work)."""
        with self._names.lock:
            self._leaving = [e for e in self._leaving if e.leases > 0 and e.model is not None]
            leaving = list(self._leaving)
        return [e.model for e in [*self.entries(), *leaving] if e.model is not None]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.models())

    def __len__(self) -> int:
        return len(self._names)

    @property
    def state(self) -> str:
        return "ready" if len(self._names) else "empty"

    def unhealthy(self) -> list[Entry]:
        """The models that are failed or stalled now."""
        # a replica's trouble is its group's only when no replica is left up
        return [
            e
            for e in self.entries()
            if (e.member_of is None and e.state in ("failed", "stalled")) or (e.group is not None and e.state == "down")
        ]

    def lookup(self, name: str) -> Entry | None:
        """Exact id or alias (``:latest`` ignored); never falls back."""
        return self._names.lookup(name)

    # -- routing ---------------------------------------------------------------
    def resolve(self, requested: str | None, capability: Capability = "chat") -> Route:
        if requested and self.on_demand is not None and self._names.lookup(requested) is None:
            self.configure_on_demand(requested)
        return self._names.resolve(requested, capability, self.default, self.strict_names)

    def configure_on_demand(self, name: str) -> Entry | None:
        """The entry of a model known only to :attr:`on_demand` (configured
        now, loaded on first use), or None."""
        spec = self.on_demand(name) if self.on_demand is not None else None
        if spec is None:
            return None
        with self._names.lock:
            found = self._names.lookup(name)
            if found is not None:
                return found
            same = self._names.get(spec.id)
            if same is not None and same.spec is not None and same.spec.path == spec.path:
                same.aliases = (*same.aliases, name)  # known already, by another of its names
                return same
            try:
                return self.configure(spec)
            except RegistryError:  # (its id is taken by another model)
                return None

    async def acquire(
        self,
        requested: str | None,
        capability: Capability = "chat",
        key: Callable[[], str | None] | None = None,
        exclude: frozenset[str] = frozenset(),
        room_wait: float | None = None,
    ) -> tuple[Route, Callable[[], None]]:
        """Resolve, load on demand (waiting up to ``room_wait`` seconds for
        room under ``max_resident``; None: :data:`ROOM_WAIT_SECONDS`), and
        lease the model for one request (for a replica group: the replica
        ``key`` routes to, never one named in ``exclude``). Call the
        returned release exactly once when the request is done."""
        self.watchdog.start()
        route = self.resolve(requested, capability)
        if route.entry.group is not None:
            return await acquire_replica(
                route, capability, key, exclude, lambda name, cap, wait: self.acquire(name, cap, room_wait=wait)
            )
        self.watchdog.check(route.entry)
        wait = ROOM_WAIT_SECONDS if room_wait is None else room_wait
        route.load_seconds, release = await self.lifecycle.lease(route.entry, wait)
        return route, release

    # -- room, keep-alive and the watchdog --------------------------------------
    async def reserve(self, exclude: Entry | None = None, wait: float = 0.0) -> bool:
        """A place for one more resident model (see :meth:`Residency.reserve`)."""
        return await self.residency.reserve(exclude, wait)

    def unreserve(self) -> None:
        self.residency.unreserve()

    def stop_waiting(self) -> None:
        """A shutdown's deadline: a load still waiting for room gives up (a
        503 ``shutting_down``) rather than holding the exit."""
        self.residency.stopping = True

    def set_keep_alive(self, entry: Entry, seconds: float | None) -> None:
        """A request's own keep-alive for its model (Ollama's ``keep_alive``):
        ``seconds`` idle before unloading (0: as soon as it is idle), None:
        resident until unloaded otherwise. It holds until the next request,
        which brings back the operator's unless it sets its own (as Ollama's
        default comes back). Only reloadable models."""
        if self.lifecycle.set_keep_alive(entry, seconds):
            self.watchdog.start()

    def start(self) -> None:
        """Start the watchdog with the event loop (call on it), so a model
        loaded at start and never used is unloaded after its keep-alive too,
        and a failed or stalled one is noticed without a request."""
        self.watchdog.start()

    async def close(self) -> None:
        self.watchdog.stop()
        await self.lifecycle.close(self.entries())


def _loaded(model: Backend, spec: ModelSpec | None) -> Entry:
    """The entry of a loaded model (not yet added)."""
    caps = model.capabilities
    kind: Kind = "chat" if caps.chat else "rerank" if caps.rerank else "embedding"
    entry = Entry(model.model_id, tuple(model.aliases), kind, spec=spec, model=model)
    entry.info = info_of(model)
    return entry


def _configured(spec: ModelSpec) -> Entry:
    """The entry of a model loaded on first use (not yet added)."""
    entry = Entry(spec.id, spec.aliases, spec.kind, spec=spec)
    entry.info = {
        **spec.facts,
        "id": spec.id,
        "aliases": list(spec.aliases),
        "path": spec.path,
        "size_bytes": spec.facts.get("size_bytes") or file_size(spec.path),
    }
    # the context it will be served with, when its options fix one (a chat
    # model's ``ctx``; 0: the model's own, known once it is loaded)
    ctx = getattr(spec.options, "ctx", 0)
    if spec.kind == "chat" and isinstance(ctx, int) and ctx > 0:
        entry.info["context"] = ctx
    return entry
