"""``GET /v1/events`` (the event stream as SSE) and ``GET /v1/stats`` (the
server's fold of it). Both read :class:`~turbospark.sinks.live.LiveEvents`;
neither computes anything itself.

One SSE frame per event, numbered by the server's event sequence (not the
request id), so a client resumes with ``?since=SEQ`` or the standard
``Last-Event-ID`` header::

    id: 42
    event: generated
    data: {"kind":"generated","id":7,...}

A ``gap`` frame (``data: {"missed": N, "from": a, "to": b}``) says which
events the client will not get: the ring no longer reaches back to
``since``, or the client read too slowly and its queue overflowed.

With API keys a non-admin caller sees only its own tenant's requests (and
the server's model events: attaching, detaching, health, pulls): in the stream, whose sequence numbers
then have holes (never gap frames) where other tenants' events were, and in
``/v1/stats``, a fold of its requests alone. An admin key sees everything,
as does every caller when no keys are configured.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects.common import BadRequest
from ..dialects.errors import openai_error
from ..sinks.live import Gap, LiveEvents, Numbered
from .common import JSONResponse, context, endpoint, state_of, streaming_response

RETRY_MS = 1000


def event_frame(item: Numbered) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (item.seq, item.kind.encode(), item.data)


def gap_frame(gap: Gap) -> bytes:
    # carries the id of the last missed event, so a reconnect after it does
    # not ask for the missed range again
    return b"id: %d\nevent: gap\ndata: %s\n\n" % (gap.last, orjson.dumps(gap.to_dict()))


def _int_param(raw: str | None, name: str) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, got {raw!r}", param=name) from None
    if value < 0:
        raise BadRequest(f"{name} must be >= 0", param=name)
    return value


def viewer(request: Request) -> str | None:
    """Whose requests the caller may see: its tenant, or None (everyone's)
    for an admin. No tenant in the state means no keys are configured (the
    auth middleware lets everything through untouched): one tenant, and the
    caller administers."""
    ctx = context(request)
    return None if ctx.tenant is None or ctx.admin else ctx.tenant


def live_of(request: Request) -> LiveEvents:
    live = state_of(request).live
    assert live is not None, "build_app always installs LiveEvents"
    return live


async def _frames(live: LiveEvents, since: int | None, tenant: str | None = None) -> AsyncIterator[bytes]:
    sub, gap, replay = live.subscribe(since, tenant)
    try:
        yield b"retry: %d\n\n" % RETRY_MS
        if gap is not None:
            yield gap_frame(gap)
        if replay:
            yield b"".join(event_frame(item) for item in replay)
        while not sub.closed:
            sub.wake.clear()
            gap, items = live.take(sub)
            if gap is None and not items:
                try:
                    await asyncio.wait_for(sub.wake.wait(), live.keepalive_s)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                continue
            chunk = gap_frame(gap) if gap is not None else b""
            yield chunk + b"".join(event_frame(item) for item in items)
    finally:
        live.unsubscribe(sub)


@endpoint(openai_error)
async def events(request: Request) -> Response:
    live = live_of(request)
    since = _int_param(request.headers.get("last-event-id"), "Last-Event-ID")
    if since is None:
        since = _int_param(request.query_params.get("since"), "since")
    if request.method == "HEAD":
        # the headers alone: the stream never ends, and a HEAD's body is
        # never sent, so streaming it would hold the connection for good
        return streaming_response(_no_frames())
    context(request).open_ended = True  # a watcher closing it is its end, not an error
    return streaming_response(_frames(live, since, viewer(request)))


async def _no_frames() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover (makes this an async generator)


@endpoint(openai_error)
async def stats(request: Request) -> Response:
    limit = _int_param(request.query_params.get("requests"), "requests")
    return JSONResponse(live_of(request).summary(100 if limit is None else limit, viewer(request)))


routes = [
    Route("/v1/events", events, methods=["GET"]),
    Route("/v1/stats", stats, methods=["GET"]),
]
