"""The server's live event feed: a bounded ring of recent events numbered by
a server-assigned sequence, a :class:`~turbospark.views.fold.Fold` kept current,
and subscribers (``GET /v1/events`` streams) that each get a bounded queue.

Always installed in the server's observer fan-out (``Server``, ``turbospark
serve``, or ``build_app`` itself), so ``/v1/events``, ``/v1/stats`` and the
dashboard work on every server.

``record`` is called from request handlers AND the engine's scheduler
thread, so it only does O(1) work under one short lock: number the event,
fold it, append it to the ring and to each subscriber's queue. A slow
subscriber never blocks it: its queue drops the OLDEST events on overflow
and the stream says so with a gap marker. Subscribers are woken with
``call_soon_threadsafe`` at most once per batch.

Tenants (CONTRACT §5): with API keys, a non-admin caller sees only its own
tenant's requests (and every model event: attach/detach, health, pulls; a
tenant's fold starts with the models, their states and the pulls already
told, so its first paint shows a pull in progress). The events carry no
tenant (their schema is the same for every sink); the auth middleware tells
this sink through the ``request_tenant(id, tenant)`` side channel right
after ``requestStarted``. Kept for that, all bounded: an id → tenant map
(LRU, ``2 × max_events`` ids, so every request with an event still in the
ring is in it), the ``requestStarted`` events still waiting for their
tenant (at most ``max_events``, dropped at ``requestFinished``), and per
tenant (at most ``max_tenants``, LRU) a :class:`Fold` of its own events and
the sequence numbers of its events the ring evicted (for its gap markers).
A tenant's stream skips other tenants' events without gap markers: its
sequence numbers just have holes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..observe import ServerEvent
from ..views.fold import Fold

log = logging.getLogger("turbospark.sinks")

#: Events that belong to no request: every tenant sees them (a pull is the
#: server's, as a model attaching is: its progress is everyone's to watch).
MODEL_KINDS = frozenset({"modelAttached", "modelDetached", "modelHealth", "modelPull"})


@dataclass(frozen=True, slots=True)
class Numbered:
    """One event as the ring keeps it: sequence number, kind, JSON, and the
    request it belongs to (None for a model event)."""

    seq: int
    kind: str
    data: bytes
    rid: int | None = None


@dataclass(frozen=True, slots=True)
class Gap:
    """Events ``first..last`` (sequence numbers) a subscriber will not see."""

    missed: int
    first: int
    last: int

    def to_dict(self) -> dict[str, int]:
        return {"missed": self.missed, "from": self.first, "to": self.last}


class Subscriber:
    """One live stream's bounded queue. Filled under :class:`LiveEvents`'
    lock by any thread; drained by its stream on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_queue: int, tenant: str | None = None) -> None:
        self.loop = loop
        self.max_queue = max_queue
        #: whose events it gets: None for an admin (everything)
        self.tenant = tenant
        self.items: deque[Numbered] = deque()
        self.gap: Gap | None = None
        self.wake = asyncio.Event()
        self.closed = False
        self._notified = False
        #: items held back at the head of the queue until their request's
        #: tenant is known
        self._held = False
        #: whether a dropped item would have been shown (None: every one)
        self._counts: Callable[[Numbered], bool] | None = None

    def _push(self, item: Numbered, counts: Callable[[Numbered], bool] | None = None) -> bool:
        """Queue an item (dropping the oldest on overflow, which makes a gap
        when ``counts`` says this stream would have shown it); True when the
        stream must be woken."""
        if len(self.items) >= self.max_queue:
            old = self.items.popleft()
            g = self.gap
            if counts is None or counts(old):
                self.gap = Gap(g.missed + 1, g.first, old.seq) if g else Gap(1, old.seq, old.seq)
        self.items.append(item)
        if self._notified:
            return False
        self._notified = True
        return True

    def _take(self) -> tuple[Gap | None, list[Numbered]]:
        gap, self.gap = self.gap, None
        items = list(self.items)
        self.items.clear()
        self._notified = False
        return gap, items

    def _wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.wake.set)
        except RuntimeError:  # the loop is closed: the stream is gone anyway
            pass


@dataclass(slots=True)
class TenantView:
    """What one tenant sees besides the ring: a fold of its own requests
    (and the models), and the sequence numbers of its events (and model
    events) the ring has evicted, for the gap a late subscriber is due."""

    fold: Fold
    evicted: deque[int] = field(default_factory=deque)


class LiveEvents:
    """Ring + fold + subscribers. An :class:`~turbospark.observe.Observer`,
    with the ``request_tenant`` side channel (see the module docstring).

    Readers pass ``tenant``: None for an admin (every event, the global
    fold), else a tenant (its requests' events and the model events only,
    its own fold)."""

    def __init__(
        self,
        max_events: int = 4096,
        max_bytes: int = 4 << 20,
        max_queue: int = 1024,
        keepalive_s: float = 15.0,
        max_tenants: int = 64,
    ) -> None:
        if max_events < 1 or max_bytes < 1 or max_queue < 1 or max_tenants < 1:
            raise ValueError("ring, queue and tenant limits must be positive")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.max_queue = max_queue
        self.keepalive_s = keepalive_s
        self.max_tenants = max_tenants
        self.fold = Fold()
        self._ring: deque[Numbered] = deque()
        self._bytes = 0
        self._seq = 0
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self.closed = False
        #: request id -> tenant, least recently active first. An id is
        #: touched by each of its events, and the ring holds events of at
        #: most ``max_events`` requests, so twice that never forgets one
        #: the ring still shows.
        self._tenants: OrderedDict[int, str] = OrderedDict()
        self._max_ids = 2 * max_events
        #: ``requestStarted`` dicts whose tenant is not told yet (the auth
        #: middleware runs inside the one that reports them)
        self._pending: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._views: OrderedDict[str, TenantView] = OrderedDict()
        self._evicted_models: deque[int] = deque(maxlen=max_events)

    # -- the observer side ----------------------------------------------
    def record(self, event: ServerEvent) -> None:
        data = event.to_dict()
        body = orjson.dumps(data)
        kind = event.kind
        rid = None if kind in MODEL_KINDS else data.get("id")
        wake: dict[Subscriber, None] = {}
        with self._lock:
            self._seq += 1
            item = Numbered(self._seq, kind, body, rid)
            self._feed(self.fold, data)
            tenant: str | None = None
            if rid is None:  # a model event: every tenant's fold takes it
                for view in self._views.values():
                    self._feed(view.fold, data)
            else:
                tenant = self._tenants.get(rid)
                if tenant is not None:
                    self._tenants.move_to_end(rid)
                    self._feed(self._view(tenant).fold, data)
                elif kind == "requestStarted":
                    self._pending[rid] = data
                    if len(self._pending) > self.max_events:
                        self._pending.popitem(last=False)
                elif kind == "requestFinished" and self._pending.pop(rid, None) is not None:
                    # refused (no tenant ever): streams holding its start drop it now
                    wake.update((s, None) for s in self._subscribers if s._held)
            self._ring.append(item)
            self._bytes += len(body)
            while len(self._ring) > self.max_events or (self._bytes > self.max_bytes and len(self._ring) > 1):
                self._evict(self._ring.popleft())
            for sub in self._subscribers:
                # a start whose tenant is not known yet goes to every stream;
                # ``take`` sorts it out once it is
                if (
                    sub.tenant is None
                    or rid is None
                    or tenant == sub.tenant
                    or (tenant is None and kind == "requestStarted")
                ):
                    if sub._push(item, sub._counts):
                        wake[sub] = None
        for sub in wake:
            sub._wake()

    def request_tenant(self, rid: int, tenant: str) -> None:
        """The side channel: request ``rid`` runs for ``tenant`` (told once,
        by the auth middleware, right after its ``requestStarted``)."""
        with self._lock:
            if rid in self._tenants:
                return
            self._tenants[rid] = tenant
            while len(self._tenants) > self._max_ids:
                self._tenants.popitem(last=False)
            view = self._view(tenant)
            start = self._pending.pop(rid, None)
            if start is not None:
                self._feed(view.fold, start)
            held = [s for s in self._subscribers if s._held]
        for sub in held:
            sub._wake()

    def _feed(self, fold: Fold, data: dict[str, Any]) -> None:
        try:
            fold.feed(data, trusted=True)  # (made by ``to_dict`` a moment ago)
        except Exception:  # a fold bug must not cost the stream its events
            log.exception("folding %s failed", data.get("kind"))

    def _view(self, tenant: str) -> TenantView:
        view = self._views.get(tenant)
        if view is None:
            fold = self.fold.fresh()  # it missed the model events
            view = self._views[tenant] = TenantView(fold, deque(maxlen=self.max_events))
            if len(self._views) > self.max_tenants:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(tenant)
        return view

    def _evict(self, old: Numbered) -> None:
        self._bytes -= len(old.data)
        if old.rid is None:
            self._evicted_models.append(old.seq)
            return
        owner = self._tenants.get(old.rid)
        view = self._views.get(owner) if owner is not None else None
        if view is not None:
            view.evicted.append(old.seq)

    def _shows(self, tenant: str | None, item: Numbered) -> bool | None:
        """Whether ``tenant``'s stream shows ``item``; None while the tenant
        of its request is not known yet."""
        if tenant is None or item.rid is None:
            return True
        owner = self._tenants.get(item.rid)
        if owner is not None:
            return owner == tenant
        if item.kind == "requestStarted" and item.rid in self._pending:
            return None
        return False  # never told (refused, or forgotten): admins only

    # -- the reader side -------------------------------------------------
    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    def subscribe(self, since: int | None, tenant: str | None = None) -> tuple[Subscriber, Gap | None, list[Numbered]]:
        """Register a live subscriber and, atomically with it, take what the
        ring holds after ``since`` (nothing when None) and the gap before it
        if the ring no longer reaches back that far. A ``since`` beyond the
        last sequence number (a client of a previous server run) replays the
        whole ring. A ``tenant`` (None: an admin) gets only its requests'
        events and the model events, and a gap only for those."""
        sub = Subscriber(asyncio.get_running_loop(), self.max_queue, tenant)
        if tenant is not None:
            sub._counts = lambda old: self._shows(tenant, old) is not False
        with self._lock:
            sub.closed = self.closed  # shutting down: the stream ends after its replay
            self._subscribers.append(sub)
            if since is None:
                return sub, None, []
            if since > self._seq or since < 0:
                since = 0
            oldest = self._ring[0].seq if self._ring else self._seq + 1
            if tenant is None:
                gap = Gap(oldest - 1 - since, since + 1, oldest - 1) if since + 1 < oldest else None
                replay = [item for item in self._ring if item.seq > since]
                return sub, gap, replay
            gap = None
            if since + 1 < oldest:
                view = self._views.get(tenant)
                missed = [s for s in self._evicted_models if s > since]
                if view is not None:
                    missed += [s for s in view.evicted if s > since]
                if missed:
                    gap = Gap(len(missed), min(missed), max(missed))
            replay = [item for item in self._ring if item.seq > since and self._shows(tenant, item)]
        return sub, gap, replay

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def take(self, sub: Subscriber) -> tuple[Gap | None, list[Numbered]]:
        with self._lock:
            gap, items = sub._take()
            if sub.tenant is None or not items:
                return gap, items
            shown: list[Numbered] = []
            for n, item in enumerate(items):
                seen = self._shows(sub.tenant, item)
                if seen is None:  # hold it and what follows, in order, until told
                    sub.items.extendleft(reversed(items[n:]))
                    sub._held = True
                    break
                if seen:
                    shown.append(item)
            else:
                sub._held = False
            return gap, shown

    def summary(self, max_requests: int | None = None, tenant: str | None = None) -> dict[str, Any]:
        """The fold's summary plus ``seq``, the last event folded into it:
        a client that then streams ``/v1/events?since=seq`` misses nothing
        and sees nothing twice. A ``tenant`` (None: an admin, everything)
        gets the fold of its own requests."""
        with self._lock:
            if tenant is None:
                fold = self.fold
            else:
                view = self._views.get(tenant)
                fold = view.fold if view is not None else self.fold.fresh()
            out = fold.summary(max_requests)
            out["seq"] = self._seq
        return out

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def close(self) -> None:
        """End every live stream (server shutdown)."""
        with self._lock:
            self.closed = True
            subs = list(self._subscribers)
        for sub in subs:
            sub.closed = True
            sub._wake()
