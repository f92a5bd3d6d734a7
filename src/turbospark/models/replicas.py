"""Replica groups: one model id served by several engines (remote upstreams
and/or local GGUFs), and which of them takes a request. No HTTP types.

Routing (:meth:`ReplicaSet.pick`):

- A request with a routing key — its session key (the keys the local slots
  use: ``prompt_cache_key``/``user``, Anthropic ``metadata.user_id``,
  ``x-session-id``, Claude Code's session header), else a hash of how its
  prompt begins (tools, system prompt and first message: what every turn of
  one conversation repeats, see :func:`routing_key`) — goes to the replica
  that served that key last, while it is up and not over its share of the
  requests in flight; a key not seen before (or whose replica is down or
  overloaded) walks a consistent-hash ring from the key's point to the first
  replica under both bounds. That is *consistent hashing with bounded
  loads*: a replica takes no more than ``ceil(load_factor × (requests in
  flight + 1) / replicas up)`` requests at once (a key it already served:
  or ``load_slack`` more than the least loaded replica up, whichever is
  more), so a hot key spills over
  instead of piling onto one replica while a small imbalance never moves a
  conversation (a move costs its whole history's prefill, far more than a
  wait behind a few requests; vLLM's and SGLang's cache-aware routers leave
  the cache's choice until 64 requests separate the busiest replica from the
  idlest); and a new key goes to a replica holding
  no more than its even share of the keys active in the last
  :data:`ACTIVE_WINDOW` seconds (``ceil((active keys + 1) / replicas up)``),
  so conversations — and the KV they need — are spread evenly even when few.
- A request without a key goes to the replica with the fewest requests in
  flight (ties in turn).

``routing = "round-robin"`` (or ``"least-loaded"``) ignores the keys: every
request goes to the next replica up in turn (or to the least loaded one), as
a cache-blind balancer would; ``bench/replicas.py`` measures the difference.

Health: a replica that fails a request before its first token is marked
down at once (the request is retried once on another replica, never after a
token was sent); every ``health_interval`` seconds each replica is checked
(a remote's health path, a local model's engine state); a down replica is
not routed to for ``cooldown`` seconds and comes back at the first check
that passes after it.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

log = logging.getLogger("turbospark.replicas")

#: points each replica has on the ring
VNODES = 64
#: keys remembered with the replica that served them last
AFFINITY_KEYS = 65536
#: seconds a key counts as an active conversation of its replica
ACTIVE_WINDOW = 600.0
#: characters of the prompt's beginning a keyless request is routed by
PREFIX_CHARS = 4096
#: the routing policies a group may use
ROUTINGS = ("affinity", "round-robin", "least-loaded")


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def routing_key(session_key: str | None, messages: list[dict[str, Any]], tools: Any, prompt: Any = None) -> str:
    """The key a request is routed by: its session key, else a digest of the
    beginning every turn of its conversation repeats: the tools, the system
    messages and the first other message, each hashed whole (a long tool
    list or system prompt must not hide what follows it), or a raw prompt's
    first :data:`PREFIX_CHARS` characters."""
    if session_key:
        return "session:" + session_key
    h = hashlib.blake2b(digest_size=16)
    h.update(orjson.dumps(tools or None, default=str))
    if prompt is not None:
        h.update(orjson.dumps(prompt[:PREFIX_CHARS] if isinstance(prompt, str) else list(prompt)[:1024]))
    for m in messages:
        h.update(orjson.dumps([m.get("role"), m.get("content")], default=str))
        if m.get("role") not in ("system", "developer"):
            break
    return "prefix:" + h.hexdigest()


@dataclass(eq=False)
class Replica:
    """One engine of a group, as the router sees it."""

    name: str
    #: the registry entry serving it (``group@name``)
    entry: Any
    up: bool = True
    #: why it is down, and until when it is not routed to
    reason: str = ""
    down_until: float = 0.0
    in_flight: int = 0
    served: int = 0
    failures: int = 0
    #: keys it served last, oldest first, with when (active within the window)
    keys: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def active_keys(self, now: float) -> int:
        while self.keys:
            key, used = next(iter(self.keys.items()))
            if now - used <= ACTIVE_WINDOW:
                break
            self.keys.popitem(last=False)
        return len(self.keys)

    def state(self) -> str:
        return "up" if self.up else "down"


@dataclass(eq=False)
class ReplicaSet:
    """The replicas of one model id and the routing state over them."""

    id: str
    replicas: list[Replica]
    health_interval: float = 5.0
    cooldown: float = 10.0
    load_factor: float = 1.25
    #: the imbalance (requests in flight) a key stays through in any case
    load_slack: int = 4
    #: "affinity" (the default, above), "round-robin" or "least-loaded"
    routing: str = "affinity"
    #: how a replica's health is checked: None when healthy, else why not
    probe: Callable[[Replica], Awaitable[str | None]] | None = None
    #: told when a replica goes down or up again: (replica, state, reason)
    on_change: Callable[[Replica, str, str], None] | None = None
    _ring: list[tuple[int, int]] = field(default_factory=list)
    _affinity: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _turn: int = 0
    _next_check: float = 0.0
    _checking: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._ring = sorted((_point(f"{r.name}#{v}"), i) for i, r in enumerate(self.replicas) for v in range(VNODES))

    def by_name(self, name: str) -> Replica | None:
        return next((r for r in self.replicas if r.name == name), None)

    # -- routing ---------------------------------------------------------------
    def pick(self, key: str | None, exclude: frozenset[str] = frozenset()) -> Replica | None:
        """The replica for a request (see the module docstring), or None
        when every replica is excluded. When none is up, the one down the
        longest is tried (better a request that may fail than none)."""
        now = time.monotonic()
        pool = [r for r in self.replicas if r.name not in exclude]
        if not pool:
            return None
        # without health checks a down replica is tried again after its cooldown
        up = [r for r in pool if r.up or (self.probe is None and r.down_until <= now)]
        if not up:
            return min(pool, key=lambda r: r.down_until)
        if self.routing == "round-robin":
            self._turn += 1
            return up[self._turn % len(up)]
        if key is None or self.routing == "least-loaded":
            least = min(r.in_flight for r in up)
            tied = [r for r in up if r.in_flight == least]
            self._turn += 1
            return tied[self._turn % len(tied)]
        bound = math.ceil(self.load_factor * (sum(r.in_flight for r in up) + 1) / len(up))
        # a key already placed stays through a small imbalance; a new one
        # (or one moving) goes where the bound alone allows
        stay = max(bound, min(r.in_flight for r in up) + self.load_slack)
        last = self._affinity.get(key)
        chosen = next((r for r in up if r.name == last and r.in_flight < stay), None)
        if chosen is None:
            active = {id(r): r.active_keys(now) - (key in r.keys) for r in up}
            share = math.ceil((sum(active.values()) + 1) / len(up))
            chosen = self._ring_walk(key, up, bound, {i for i, n in active.items() if n >= share})
        previous = self.by_name(last) if last is not None and last != chosen.name else None
        if previous is not None:
            previous.keys.pop(key, None)
        chosen.keys[key] = now
        chosen.keys.move_to_end(key)
        self._affinity[key] = chosen.name
        self._affinity.move_to_end(key)
        while len(self._affinity) > AFFINITY_KEYS:
            self._affinity.popitem(last=False)
        return chosen

    def _ring_walk(self, key: str, up: list[Replica], bound: int, full: set[int]) -> Replica:
        """From the key's point on the ring, the first replica up under the
        in-flight bound and not holding more than its share of keys (else
        the first under the bound, else the least loaded)."""
        allowed = {id(r) for r in up}
        start = bisect.bisect_left(self._ring, (_point(key), -1))
        n = len(self._ring)
        for skip in (full, set()):
            for step in range(n):
                r = self.replicas[self._ring[(start + step) % n][1]]
                if id(r) in allowed and id(r) not in skip and r.in_flight < bound:
                    return r
        return min(up, key=lambda r: r.in_flight)

    def started(self, replica: Replica) -> Callable[[], None]:
        """Count a request on ``replica``; call the returned function once when it is done."""
        replica.in_flight += 1
        replica.served += 1
        done = False

        def finished() -> None:
            nonlocal done
            if not done:
                done = True
                replica.in_flight -= 1

        return finished

    # -- health ------------------------------------------------------------------
    def failed(self, replica: Replica, why: str) -> None:
        """A request failed on it before its first token: down for the cooldown."""
        replica.failures += 1
        replica.down_until = time.monotonic() + self.cooldown
        if replica.up or replica.reason != why:
            replica.up, replica.reason = False, why
            log.warning("replica %s@%s is down: %s", self.id, replica.name, why)
            if self.on_change is not None:
                self.on_change(replica, "down", why)

    def _recovered(self, replica: Replica) -> None:
        if not replica.up:
            replica.up, replica.reason = True, ""
            log.warning("replica %s@%s is up again", self.id, replica.name)
            if self.on_change is not None:
                self.on_change(replica, "ok", "")

    def tick(self) -> None:
        """Start a health check of every replica when one is due (the
        registry's watchdog calls this on the event loop)."""
        now = time.monotonic()
        if self.probe is None or now < self._next_check or (self._checking and not self._checking.done()):
            return
        self._next_check = now + self.health_interval
        self._checking = asyncio.ensure_future(self.check())

    async def check(self) -> None:
        """Check every replica now."""
        if self.probe is None:
            return
        results = await asyncio.gather(*(self.probe(r) for r in self.replicas), return_exceptions=True)
        now = time.monotonic()
        for r, res in zip(self.replicas, results):
            why = f"health check failed: {res}" if isinstance(res, BaseException) else res
            if why is None:
                if r.down_until <= now:
                    self._recovered(r)
            else:
                r.down_until = max(r.down_until, now + self.cooldown)
                if r.up or r.reason != why:
                    r.up, r.reason = False, why
                    log.warning("replica %s@%s is down: %s", self.id, r.name, why)
                    if self.on_change is not None:
                        self.on_change(r, "down", why)

    def describe(self) -> list[dict[str, Any]]:
        """The replicas and their state, for model listings."""
        return [
            {
                "name": r.name,
                "id": r.entry.id,
                "state": r.state(),
                "reason": r.reason or None,
                "in_flight": r.in_flight,
                "served": r.served,
                "failures": r.failures,
                "upstream": r.entry.info.get("upstream"),
            }
            for r in self.replicas
        ]

    def close(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
