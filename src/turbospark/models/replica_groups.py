"""A replica group as the registry holds it: the checks on its members'
names, its own entry (which has no model: its :class:`ReplicaSet` routes),
and the lease of one replica for a request. The group's members are entries
``group@name`` that answer to their names but never take a fallback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .entry import Capability, Entry, ModelSpec, RegistryError, Route, RoutingError
from .names import ModelNames
from .replicas import ROUTINGS, ReplicaSet
from .residency import ROOM_CODES

#: the registry's acquire of one member: (its id, capability, seconds to wait for room or None)
AcquireMember = Callable[[str, Capability, float | None], Awaitable[tuple[Route, Callable[[], None]]]]


def check_members(
    names: ModelNames,
    group_id: str,
    aliases: tuple[str, ...],
    members: list[tuple[str, Any, ModelSpec | None]],
    routing: str,
) -> None:
    """Refuse an unknown routing, or a name of the group or of a member
    (``group_id@name``) that is wrong or already taken."""
    if routing not in ROUTINGS:
        raise RegistryError(f"unknown routing {routing!r} for {group_id!r} (one of: {', '.join(ROUTINGS)})")
    names.check_names(group_id, aliases)
    for name, model, spec in members:
        member_id = spec.id if spec is not None else model.model_id
        if member_id != f"{group_id}@{name}":
            raise RegistryError(f"replica {name!r} of {group_id!r} must be attached as {group_id}@{name}")
        names.check_names(member_id, ())


def group_entry(group_id: str, aliases: tuple[str, ...], group: ReplicaSet, members: list[Entry]) -> Entry:
    """The group's own entry: its names, its routing state and its facts."""
    entry = Entry(group_id, aliases, "chat", group=group)
    ctx = [int(e.info.get("context") or 0) for e in members]
    entry.info = {
        "id": group_id,
        "aliases": list(aliases),
        "kind": "replicas",
        "context": min((c for c in ctx if c), default=0),
        "description": f"{len(group.replicas)} replicas",
        "parameters": 0,
        "size_bytes": 0,
        "path": None,
    }
    return entry


async def acquire_replica(
    route: Route,
    capability: Capability,
    key: Callable[[], str | None] | None,
    exclude: frozenset[str],
    acquire: AcquireMember,
) -> tuple[Route, Callable[[], None]]:
    """Lease the replica of ``route``'s group that ``key`` routes to (never
    one named in ``exclude``): a local replica that fails to load, or has
    no room while another could serve, passes the request on."""
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
            member, release_member = await acquire(replica.entry.id, capability, 0.0 if others else None)
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

    served = Route(member.entry, route.requested, member.entry.id, member.load_seconds, group=group, replica=replica)
    return served, release
