"""Which model serves a request (CONTRACT §4), and which models are in
memory. No HTTP types in here.

Resolution, among the models capable of the request (chat vs embeddings):

1. an exact id or alias match wins;
2. else, if exactly one capable model is known, it serves whatever name was
   asked (clients send ``gpt-4o`` or ``claude-sonnet-...``);
3. else, no capable model at all: 503;
4. else 404 ``model_not_found`` naming the models that are available.

Lookups (``GET /v1/models/{id}``, Ollama ``/api/show``) never fall back.

Health (the watchdog, :meth:`Registry.check`, twice a second and at every
acquire): a model whose engine thread died is taken out of memory at once
(``modelDetached`` with the reason; its requests in flight already got their
error) and reloaded by the next request that wants it, after a backoff that
doubles with each consecutive failure (1 s … 60 s; after
:data:`MAX_FAILURES` in a row it stays failed until attached again). A model
whose engine has made no step for ``stall_timeout`` seconds while work waits
is ``stalled`` (``modelHealth``, a log line) until it steps again. Either
makes ``/health`` answer 503 ``degraded``.

A model is an :class:`Entry`: its names, how to (re)load it (a spec, when the
registry may load it on demand) and, while resident, the loaded model. Each
request holds a lease on the entry it was routed to; a detached or idle model
is unloaded only once its leases are gone.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from .observe import ModelAttached, ModelDetached, ModelHealth, Observer, now_ms, record
from .replicas import ROUTINGS, Replica, ReplicaSet

log = logging.getLogger("turbospark.registry")

Capability = Literal["chat", "embeddings"]
Kind = Literal["chat", "embedding"]


#: consecutive engine failures (or failed reloads) after which a model is
#: no longer reloaded by requests
MAX_FAILURES = 5
#: the longest wait between reloads of a failing model (seconds)
MAX_BACKOFF = 60.0
#: a reloaded model that runs this long without failing is healthy again
HEALTHY_AFTER = 60.0
#: the watchdog's default: seconds without an engine step while work waits
STALL_TIMEOUT = 60.0
#: how long a request waits for a resident model to go idle when it needs
#: another loaded and ``max_resident`` are all busy, then the Retry-After of
#: its 503, and how often it looks
ROOM_WAIT_SECONDS = 60.0
ROOM_RETRY_AFTER = 5
ROOM_POLL_SECONDS = 0.1
#: the codes of a load refused for want of room (or at shutdown), not a failure of the model
ROOM_CODES = ("max_resident", "shutting_down")


class RoutingError(Exception):
    """A request no known model can take; carries its HTTP meaning."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = "model",
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after


class RegistryError(ValueError):
    """A configuration the registry refuses (duplicate id or alias)."""


@dataclass
class ModelSpec:
    """How the registry (re)loads a model on demand."""

    id: str
    aliases: tuple[str, ...] = ()
    kind: Kind = "chat"
    #: opaque to the registry; handed to the loader
    options: Any = None
    #: seconds idle before the model is unloaded (None: stays resident)
    keep_alive: float | None = None
    path: str = ""


@dataclass(eq=False)
class Entry:
    id: str
    aliases: tuple[str, ...]
    kind: Kind
    spec: ModelSpec | None = None
    model: Any = None
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    detached: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    _loading: asyncio.Future[Any] | None = None
    #: the last engine failure (or failed reload) while it is not healed
    failure: str | None = None
    #: consecutive failures, and when the next reload may be tried
    failures: int = 0
    retry_at: float = 0.0
    #: since when the resident model has run without failing
    healthy_since: float = field(default_factory=time.monotonic)
    #: the watchdog's finding: no engine step for the stall timeout
    stalled: bool = False
    stall_reason: str = ""
    #: a replica group's routing state (the group's own entry has no model)
    group: ReplicaSet | None = None
    #: a group member: its place in the group
    replica: Replica | None = None
    member_of: str | None = None
    #: a remote model outside any group (no health checks): why its last
    #: request got no answer, as last reported (``modelHealth``)
    unreachable: str | None = None
    #: the keep-alive in force (seconds idle before unloading; None: stays
    #: resident): the last request's own (Ollama's ``keep_alive``), else
    #: the operator's (``spec.keep_alive``); every request resets it
    keep_alive: float | None = None

    def __post_init__(self) -> None:
        if self.spec is not None:
            self.keep_alive = self.spec.keep_alive

    def expires_in(self, now: float) -> float | None:
        """Seconds until the idle unload (None: never): counted from the
        last use, or a whole keep-alive while a request holds it."""
        if self.keep_alive is None or self.spec is None:
            return None
        if self.leases:
            return self.keep_alive
        return max(0.0, self.keep_alive - (now - self.last_used))

    @property
    def problem(self) -> str | None:
        """What is wrong with it now, for ``/health`` (None: nothing)."""
        if self.state == "failed":
            return self.failure
        if self.state == "down":
            if self.unreachable:
                return self.unreachable
            return self.replica.reason if self.replica is not None else "every replica is down"
        return self.stall_reason if self.stalled else None

    @property
    def state(self) -> str:
        """``failed``, ``stalled``, ``loaded`` or ``unloaded``; a replica
        (or a group with no replica up) may be ``down``, and a remote model
        whose last request got no answer."""
        if self.group is not None:
            return "loaded" if any(r.up for r in self.group.replicas) else "down"
        if (self.replica is not None and not self.replica.up) or self.unreachable:
            return "down"
        if self.failure is not None and self.model is None:
            return "failed"
        if self.stalled:
            return "stalled"
        return "loaded" if self.model is not None else "unloaded"

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def capable(self, capability: Capability) -> bool:
        if self.group is not None:
            return any(r.entry.capable(capability) for r in self.group.replicas)
        if self.model is not None:
            flag = "supports_chat" if capability == "chat" else "supports_embeddings"
            return bool(getattr(self.model, flag, capability == "chat"))
        if capability == "chat":
            return self.kind == "chat"
        return True  # llama.cpp models embed; chat models too


@dataclass
class Route:
    entry: Entry
    requested: str | None
    served: str
    #: seconds this request spent loading the model (0: it was resident)
    load_seconds: float = 0.0
    #: the group and replica it was routed to, when ``requested`` names a group
    group: ReplicaSet | None = None
    replica: Replica | None = None

    @property
    def model(self) -> Any:
        return self.entry.model

    @property
    def fell_back(self) -> bool:
        return self.requested is not None and self.requested != self.served


def _base_name(name: str) -> str:
    """Ollama clients append ``:latest``; treat it as the bare name."""
    return name[: -len(":latest")] if name.endswith(":latest") else name


class Registry:
    """The models a server knows, addressable by id and aliases."""

    def __init__(
        self,
        observer: Observer | None = None,
        loader: Callable[[ModelSpec], Any] | None = None,
        max_resident: int = 0,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self._entries: dict[str, Entry] = {}
        self._lock = threading.RLock()
        self.observer = observer
        self.loader = loader
        self.max_resident = max_resident
        self.stall_timeout = stall_timeout
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[Any]] = set()
        #: requests holding each loaded model object (by id): a failed model
        #: is freed only once none does (one may still be templating with it)
        self._in_use: dict[int, int] = {}
        #: models being loaded past :meth:`make_room` (counted as resident:
        #: two loads at once must not both take the last place)
        self._reserved = 0
        self._room_lock = asyncio.Lock()
        #: detached entries whose model still runs the requests it had
        self._leaving: list[Entry] = []
        #: a shutdown's deadline passed: loads no longer wait for room
        self._stopping = False

    # -- membership ------------------------------------------------------------
    def _owner_of(self, name: str) -> Entry | None:
        for e in self._entries.values():
            if name in e.names:
                return e
        return None

    def check_names(self, model_id: str, aliases: tuple[str, ...] | list[str] = ()) -> None:
        """Refuse an id or alias that another model already answers to."""
        with self._lock:
            seen: set[str] = set()
            for name in [model_id, *aliases]:
                if not name:
                    raise RegistryError(f"model {model_id!r} has an empty name")
                if name in seen:
                    raise RegistryError(f"model {model_id!r} lists the name {name!r} twice")
                seen.add(name)
                owner = self._owner_of(name)
                if owner is not None:
                    raise RegistryError(
                        f"the name {name!r} of model {model_id!r} is already used by model {owner.id!r}"
                    )

    def attach(self, model: Any, spec: ModelSpec | None = None) -> Entry:
        """Add a loaded model (and, with a spec, the means to reload it)."""
        aliases = tuple(getattr(model, "aliases", ()))
        kind: Kind = "chat" if getattr(model, "supports_chat", True) else "embedding"
        with self._lock:
            self.check_names(model.model_id, aliases)
            entry = Entry(model.model_id, aliases, kind, spec=spec, model=model)
            entry.info = _info_of(model)
            self._entries[entry.id] = entry
        record(self.observer, lambda: ModelAttached(at_ms=now_ms(), model=entry.id))
        return entry

    def configure(self, spec: ModelSpec) -> Entry:
        """Add a model that is loaded on first use."""
        with self._lock:
            self.check_names(spec.id, spec.aliases)
            entry = Entry(spec.id, spec.aliases, spec.kind, spec=spec)
            entry.info = {
                "id": spec.id,
                "aliases": list(spec.aliases),
                "path": spec.path,
                "size_bytes": _file_size(spec.path),
            }
            # the context it will be served with, when its options fix one (a
            # chat model's ``ctx``; 0: the model's own, known once it is loaded)
            ctx = getattr(spec.options, "ctx", 0)
            if spec.kind == "chat" and isinstance(ctx, int) and ctx > 0:
                entry.info["context"] = ctx
            self._entries[entry.id] = entry
        return entry

    def detach(self, model_id: str) -> Entry:
        """Take a model out of routing now; it is unloaded once its in-flight
        requests are done (see :meth:`unload_when_idle`)."""
        with self._lock:
            entry = self._entries.pop(model_id, None)
            if entry is None:
                raise KeyError(model_id)
            entry.detached = True
            if entry.model is not None and entry.leases > 0:
                self._leaving.append(entry)
        record(self.observer, lambda: ModelDetached(at_ms=now_ms(), model=model_id))
        return entry

    async def unload_when_idle(self, entry: Entry, poll: float = 0.05) -> None:
        while entry.leases > 0:
            await asyncio.sleep(poll)
        model, entry.model = entry.model, None
        if model is not None and hasattr(model, "close"):
            await asyncio.to_thread(model.close)

    def remove(self, model_id: str) -> Entry:
        """Detach, and unload in the background when idle (needs a loop). A
        group goes with its replicas; a replica alone is refused
        (:class:`RegistryError`): it is removed with its group."""
        member = self._entries.get(model_id)
        if member is not None and member.member_of is not None:
            raise RegistryError(
                f"{model_id!r} is a replica of {member.member_of!r}; detach the group (replicas go with it)"
            )
        entry = self.detach(model_id)
        gone = [entry]
        if entry.group is not None:
            entry.group.close()
            gone += [self.detach(r.entry.id) for r in entry.group.replicas if r.entry.id in self._entries]
        for e in gone:
            task = asyncio.ensure_future(self.unload_when_idle(e))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
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
        if routing not in ROUTINGS:
            raise RegistryError(f"unknown routing {routing!r} for {group_id!r} (one of: {', '.join(ROUTINGS)})")
        with self._lock:
            self.check_names(group_id, aliases)
            for name, model, spec in members:
                member_id = spec.id if spec is not None else model.model_id
                if member_id != f"{group_id}@{name}":
                    raise RegistryError(f"replica {name!r} of {group_id!r} must be attached as {group_id}@{name}")
                self.check_names(member_id, ())
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
                on_change=self._replica_changed,
            )
            for e, r in zip(entries, replicas):
                e.replica, e.member_of = r, group_id
            entry = Entry(group_id, aliases, "chat", group=group)
            ctx = [int(e.info.get("context") or 0) for e in entries]
            entry.info = {
                "id": group_id,
                "aliases": list(aliases),
                "kind": "replicas",
                "context": min((c for c in ctx if c), default=0),
                "description": f"{len(replicas)} replicas",
                "parameters": 0,
                "size_bytes": 0,
                "path": None,
            }
            self._entries[group_id] = entry
            for e in entries:  # listed after their group
                self._entries[e.id] = self._entries.pop(e.id)
        record(self.observer, lambda: ModelAttached(at_ms=now_ms(), model=group_id))
        return entry

    def _replica_changed(self, replica: Replica, state: str, reason: str) -> None:
        member = replica.entry.id
        record(self.observer, lambda: ModelHealth(at_ms=now_ms(), model=member, state=state, reason=reason))

    # -- views -----------------------------------------------------------------
    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def models(self) -> list[Any]:
        """The models resident in memory now: a detached one too while it
        finishes its requests (the views and metrics show their work)."""
        with self._lock:
            self._leaving = [e for e in self._leaving if e.leases > 0 and e.model is not None]
            leaving = list(self._leaving)
        return [e.model for e in [*self.entries(), *leaving] if e.model is not None]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.models())

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def state(self) -> str:
        return "ready" if self._entries else "empty"

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
        with self._lock:
            return self._owner_of(name) or self._owner_of(_base_name(name))

    # -- routing ---------------------------------------------------------------
    def resolve(self, requested: str | None, capability: Capability = "chat") -> Route:
        with self._lock:
            capable = [e for e in self._entries.values() if e.capable(capability)]
            if requested:
                for name in (requested, _base_name(requested)):
                    for e in capable:
                        if name in e.names:
                            return Route(e, requested, e.id)
            # a group's members answer to their own names, but the group is
            # the one model a fallback may pick
            capable = [e for e in capable if e.member_of is None]
            if len(capable) == 1:
                return Route(capable[0], requested, capable[0].id)
            if not capable:
                what = "chat" if capability == "chat" else "embeddings"
                raise RoutingError(503, f"no model capable of this request ({what}) is loaded", "model_not_available")
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

    async def acquire(
        self,
        requested: str | None,
        capability: Capability = "chat",
        key: Callable[[], str | None] | None = None,
        exclude: frozenset[str] = frozenset(),
        room_wait: float | None = None,
    ) -> tuple[Route, Callable[[], None]]:
        """Resolve, load on demand (waiting up to ``room_wait`` seconds for
        room under ``max_resident``), and lease the model for one request (for
        a replica group: the replica ``key`` routes to, never one named in
        ``exclude``). Call the returned release exactly once when the
        request is done."""
        self._ensure_reaper()
        route = self.resolve(requested, capability)
        if route.entry.group is not None:
            return await self._acquire_replica(route, capability, key, exclude)
        entry = route.entry
        self.check(entry)
        if entry.model is None and entry.failure is not None:
            self._may_reload(entry)
        entry.leases += 1  # leased before any await, so nothing unloads it
        if entry.spec is not None:  # a request without its own keep-alive gets the operator's
            entry.keep_alive = entry.spec.keep_alive
        try:
            if entry.model is None:
                t0 = time.perf_counter()
                await self._load(entry, room_wait)
                route.load_seconds = time.perf_counter() - t0
        except BaseException:
            entry.leases -= 1
            raise
        model = entry.model
        self._in_use[id(model)] = self._in_use.get(id(model), 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                entry.leases -= 1
                entry.last_used = time.monotonic()
                left = self._in_use.get(id(model), 1) - 1
                if left:
                    self._in_use[id(model)] = left
                else:
                    self._in_use.pop(id(model), None)

        entry.last_used = time.monotonic()
        return route, release

    async def _acquire_replica(
        self, route: Route, capability: Capability, key: Callable[[], str | None] | None, exclude: frozenset[str]
    ) -> tuple[Route, Callable[[], None]]:
        group = route.entry.group
        assert group is not None
        skip = frozenset(r.name for r in group.replicas if not r.entry.capable(capability)) | exclude
        routing = key() if key is not None else None
        while True:
            replica = group.pick(routing, skip)
            if replica is None:
                raise RoutingError(503, f"no replica of {group.id!r} can take this request", "model_not_available")
            # (a replica with no room to load waits for it only when no other could serve)
            others = any(r.name not in skip and r is not replica for r in group.replicas)
            try:
                member, release_member = await self.acquire(
                    replica.entry.id, capability, room_wait=0.0 if others else None
                )
                break
            except RoutingError as exc:  # a local replica failed and backs off: the next one
                if exc.code not in ROOM_CODES:  # (no room to load it is not a failure of it)
                    group.failed(replica, exc.message)
                elif not others:
                    raise  # the last one: its 503 and Retry-After
                skip |= {replica.name}
        finished = group.started(replica)

        def release() -> None:
            finished()
            release_member()

        served = Route(
            member.entry, route.requested, member.entry.id, member.load_seconds, group=group, replica=replica
        )
        return served, release

    async def _load(self, entry: Entry, room_wait: float | None = None) -> None:
        if entry.spec is None or self.loader is None:
            raise RoutingError(503, f"model {entry.id!r} is not loaded and cannot be reloaded", "model_not_available")
        if entry._loading is None:
            entry._loading = asyncio.ensure_future(self._do_load(entry, room_wait))
        try:
            await asyncio.shield(entry._loading)
        finally:
            if entry._loading is not None and entry._loading.done():
                entry._loading = None

    async def _do_load(self, entry: Entry, room_wait: float | None) -> None:
        room_wait = ROOM_WAIT_SECONDS if room_wait is None else room_wait
        if not await self.reserve(exclude=entry, wait=room_wait):
            if self._stopping:
                raise RoutingError(
                    503, "the server is shutting down; try again shortly", "shutting_down", retry_after=ROOM_RETRY_AFTER
                )
            raise RoutingError(
                503,
                f"model {entry.id!r} is not loaded, {self.max_resident} model(s) are resident (max resident "
                f"models) and every one has stayed busy for {room_wait:g} s; try again later",
                "max_resident",
                retry_after=ROOM_RETRY_AFTER,
            )
        try:
            model = await asyncio.to_thread(self.loader, entry.spec)  # type: ignore[arg-type]
        except Exception as exc:
            if entry.failure is not None:  # a failed model's reload failed too
                self._failed(entry, f"reload failed: {exc}")
            raise
        finally:
            self.unreserve()
        entry.model = model
        entry.info = _info_of(model)
        entry.stalled = False
        entry.healthy_since = time.monotonic()
        if entry.failure is not None:
            log.warning("%s reloaded after an engine failure (%s)", entry.id, entry.failure)
            entry.failure = None
        record(self.observer, lambda: ModelAttached(at_ms=now_ms(), model=entry.id))

    # -- health ----------------------------------------------------------------
    def check(self, entry: Entry) -> None:
        """Take a model whose engine died out of memory (reloaded on demand),
        note a stalled one, and forget old failures of one that has run well
        for a while. Call on the event loop."""
        model = entry.model
        if model is None:
            return
        if entry.replica is None:  # a lone remote model: what its requests found (passive)
            unreachable = getattr(model, "unreachable", None)
            if unreachable != entry.unreachable:
                entry.unreachable = unreachable
                state, why = ("down", unreachable) if unreachable else ("ok", "answering again")
                record(self.observer, lambda: ModelHealth(at_ms=now_ms(), model=entry.id, state=state, reason=why))
        failure = getattr(model, "failure", None)
        if failure:
            entry.model = None
            self._failed(entry, f"engine failure: {failure}")
            record(self.observer, lambda: ModelDetached(at_ms=now_ms(), model=entry.id, reason=entry.failure))
            self._close_later(model)
            return
        now = time.monotonic()
        if entry.failures and now - entry.healthy_since >= HEALTHY_AFTER:
            entry.failures = 0
        stalled_for = getattr(model, "stalled_for", None)
        seconds = float(stalled_for()) if stalled_for is not None else 0.0
        if seconds >= self.stall_timeout and not entry.stalled:
            entry.stalled = True
            why = entry.stall_reason = f"no engine step for {seconds:.0f} s while requests wait"
            log.error("%s is stalled: %s", entry.id, why)
            record(self.observer, lambda: ModelHealth(at_ms=now_ms(), model=entry.id, state="stalled", reason=why))
        elif entry.stalled and seconds < self.stall_timeout:
            entry.stalled = False
            log.warning("%s is making progress again", entry.id)
            record(self.observer, lambda: ModelHealth(at_ms=now_ms(), model=entry.id, state="ok"))

    def _failed(self, entry: Entry, why: str) -> None:
        entry.failure = why
        entry.failures += 1
        backoff = min(MAX_BACKOFF, 2.0 ** (entry.failures - 1))
        entry.retry_at = time.monotonic() + backoff
        log.error(
            "%s failed (%d in a row): %s; reloaded on demand after %.0f s", entry.id, entry.failures, why, backoff
        )

    def _may_reload(self, entry: Entry) -> None:
        """Refuse (503) a reload of a failed model while it backs off, or
        once it has failed :data:`MAX_FAILURES` times in a row."""
        if entry.failures >= MAX_FAILURES:
            raise RoutingError(
                503,
                f"model {entry.id!r} failed {entry.failures} times in a row ({entry.failure}); "
                "it is not reloaded again until it is attached anew",
                "model_failed",
            )
        wait = entry.retry_at - time.monotonic()
        if wait > 0:
            raise RoutingError(
                503,
                f"model {entry.id!r} failed ({entry.failure}); it is reloaded in {wait:.0f} s",
                "model_failed",
                retry_after=max(1, round(wait)),
            )

    def _close_later(self, model: Any) -> None:
        """Close a model taken out of its entry once no request holds it."""
        if not hasattr(model, "close"):
            return

        async def close() -> None:
            while self._in_use.get(id(model), 0) > 0:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(model.close)

        task = asyncio.ensure_future(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def reserve(self, exclude: Entry | None = None, wait: float = 0.0) -> bool:
        """A place for one more resident model, held until :meth:`unreserve`
        (call it once the model is loaded, or failed to). While every
        resident model is busy, waits up to ``wait`` seconds for one to go
        idle (as Ollama's scheduler waits); False if none did."""
        deadline = time.monotonic() + wait
        while True:
            if self._stopping:
                return False
            async with self._room_lock:
                if await self.make_room(exclude):
                    self._reserved += 1
                    return True
            if time.monotonic() >= deadline:
                log.warning("max resident models reached and every resident model is busy")
                return False
            await asyncio.sleep(ROOM_POLL_SECONDS)

    def unreserve(self) -> None:
        self._reserved -= 1

    def stop_waiting(self) -> None:
        """A shutdown's deadline: a load still waiting for room gives up (a
        503 ``shutting_down``) rather than holding the exit."""
        self._stopping = True

    async def make_room(self, exclude: Entry | None = None) -> bool:
        """Room for one more resident model under ``max_resident`` (loads in
        progress count as resident): evicts least-recently-used idle,
        reloadable models past the cap. False when the cap is reached and
        every resident model is busy."""
        if not self.max_resident:
            return True
        resident = [
            e
            for e in self.entries()
            if e.model is not None and e is not exclude and not getattr(e.model, "takes_messages", False)
        ]  # a remote model holds no memory here
        while len(resident) + self._reserved >= self.max_resident:
            idle = [e for e in resident if e.leases == 0 and e.spec is not None]
            if not idle:
                return False
            victim = min(idle, key=lambda e: e.last_used)
            await self._unload(victim, "evicted (max resident models)")
            resident.remove(victim)
        return True

    async def _unload(self, entry: Entry, why: str) -> None:
        model, entry.model = entry.model, None
        if model is None:
            return
        log.info("unloading %s: %s", entry.id, why)
        record(self.observer, lambda: ModelDetached(at_ms=now_ms(), model=entry.id, reason=why))
        if hasattr(model, "close"):
            await asyncio.to_thread(model.close)

    # -- idle unload -------------------------------------------------------------
    def set_keep_alive(self, entry: Entry, seconds: float | None) -> None:
        """A request's own keep-alive for its model (Ollama's ``keep_alive``):
        ``seconds`` idle before unloading (0: as soon as it is idle), None:
        resident until unloaded otherwise. It holds until the next request,
        which brings back the operator's unless it sets its own (as Ollama's
        default comes back). Only reloadable models."""
        if entry.spec is None:
            return
        entry.keep_alive = seconds
        self._ensure_reaper()

    def start(self) -> None:
        """Start the watchdog with the event loop (call on it), so a model
        loaded at start and never used is unloaded after its keep-alive too,
        and a failed or stalled one is noticed without a request."""
        self._ensure_reaper()

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())

    async def _reap(self, every: float = 0.5) -> None:
        """The watchdog: health checks and idle unloads, twice a second."""
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for e in self.entries():
                if e.group is not None:
                    e.group.tick()
                try:
                    self.check(e)
                except Exception:  # pragma: no cover - the watchdog never dies
                    log.exception("checking %s failed", e.id)
                ka = e.keep_alive if e.spec is not None else None
                if ka is not None and e.model is not None and e.leases == 0 and now - e.last_used >= ka:
                    await self._unload(e, f"idle for {ka:g}s (keep-alive)")

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for e in self.entries():
            if e.group is not None:
                e.group.close()
            aclose = getattr(e.model, "aclose", None)  # a remote engine's connections
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # noqa: BLE001 - shutting down goes on
                    log.exception("closing %s's connections failed", e.id)
        for task in list(self._closing):
            await task


def _info_of(model: Any) -> dict[str, Any]:
    try:
        return dict(model.info())
    except Exception:  # a model without info() still routes
        return {"id": model.model_id, "aliases": list(getattr(model, "aliases", ()))}


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
