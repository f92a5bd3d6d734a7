"""Routing, admission and failover of one request, without HTTP: which
model serves it (``Registry.acquire``, ``requestRouted``, the request's
:class:`~turbospark.observe.Reporter`), its preparation and place on the
model's wait list, and, for a request routed to a replica, the one move to
another replica (:class:`Failover`), written once (:meth:`Failover.twice`)
for a chat request's admission, its generation before the first item, and a
request answered whole (embeddings, a token count)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ..core.backend import Backend
from ..core.generation import prepare, stream
from ..core.request import ChatRequest, Prepared
from ..engine.types import CancelFlag, Overloaded
from ..models.registry import Capability, Route, RoutingError
from ..models.replicas import routing_key
from ..observe import Reporter, RequestRouted, record
from ..upstream.client import UpstreamError
from . import media
from .context import RequestContext
from .state import ServerState

log = logging.getLogger("turbospark.http")
T = TypeVar("T")
#: a chat request's preparation on a model (a dialect's own wrapper of ``prepare``)
Prepare = Callable[[Backend, ChatRequest], Prepared]
#: judges an attempt's failure (marking a replica down when it is): None
#: when the request may not move, else whether the replica was only busy
Moves = Callable[[BaseException], bool | None]
_END = object()


def key_of(req: ChatRequest) -> Callable[[], str | None]:
    """What a replica group routes a chat request by, asked only when the
    model is one (``replicas.routing_key``)."""

    def key() -> str | None:
        prompt = req.prompt if req.prompt is not None else req.prompt_ids
        return routing_key(req.config.session_key, req.messages, req.tools, prompt)

    return key


class Dispatch:
    """One request's way to a model, over the server's state and the
    request's context (where its leases, reporter and failover go)."""

    def __init__(self, state: ServerState, ctx: RequestContext) -> None:
        self.state, self.ctx = state, ctx

    async def route(
        self,
        requested: str | None,
        capability: Capability,
        stream: bool,
        normalized: int = 0,
        key: Callable[[], str | None] | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> tuple[Backend, Route]:
        """Resolve (loading on demand) and lease the model, report
        ``requestRouted``, and bind the request's reporter (which the
        generation core reports ``generated`` through). ``key``: what a
        replica group routes the request by, asked only when the model is one."""
        route, release = await self.state.registry.acquire(requested, capability, key, exclude)
        ctx = self.ctx
        ctx.hold(release)
        if route.group is not None:  # a failover gives the failed replica back at once
            ctx.replica_leases[id(route)] = release
        rid, observer = ctx.id, self.state.observer
        if rid is not None:
            record(
                observer,
                lambda: RequestRouted(
                    id=rid,
                    requested=requested,
                    served=route.served,
                    stream=stream,
                    normalized_stamps=normalized,
                    response_id=ctx.response_id,
                    previous_response_id=ctx.previous_response_id,
                ),
            )
        ctx.reporter = Reporter(observer, rid)
        model = route.model
        assert model is not None, "an acquired model is loaded"
        return model, route

    async def route_chat(self, req: ChatRequest, requested: str | None, streamed: bool) -> tuple[Backend, Route]:
        """Route a bound chat request (a replica group picks by its routing key)."""
        return await self.route(requested, "chat", streamed, req.normalized, key_of(req))

    async def prepare_and_admit(self, model: Backend, req: ChatRequest, prepare_fn: Prepare = prepare) -> Prepared:
        """The media made ready (``media.ready``: refused where the model
        takes none, URLs fetched), then template, tokenise and compile
        grammars on a worker thread (never on the event loop: a 4 MB prompt
        takes seconds), then take a place on the model's wait list: a full list is a 503 before the first byte,
        streams included. The place is released with the response if never used."""
        await media.ready(self.state.media, model, req)
        prepared = await asyncio.to_thread(prepare_fn, model, req)
        for each in (prepared, *prepared.batch):  # (a request's several prompts: a place each)
            self.ctx.hold(model.reserve(each.config))
        return prepared

    async def admit(
        self,
        model: Backend,
        req: ChatRequest,
        requested: str | None,
        streamed: bool,
        route: Route,
        prepare_fn: Prepare = prepare,
    ) -> tuple[Backend, Route, Prepared]:
        """Prepare ``req`` on the routed ``model`` and take its place on the
        wait list. A request routed to a replica may move to another one: a
        local replica whose wait list is full sends it there at once, as a
        busy remote one does, and stays up."""
        if route.group is None:
            return model, route, await self.prepare_and_admit(model, req, prepare_fn)

        async def prepare_on(m: Backend) -> Prepared:
            return await self.prepare_and_admit(m, req, prepare_fn)

        failover = Failover(self, requested, route, "chat", streamed, req.normalized, key_of(req), prepare_on)
        self.ctx.failover = failover
        prepared, model = await failover.twice(model, lambda m, _: prepare_on(m), _busy_if_full)
        return model, failover.route, prepared

    async def run(
        self, requested: str | None, capability: Capability, run: Callable[[Backend], Awaitable[T]], normalized: int = 0
    ) -> tuple[T, Route]:
        """Route a request that is answered whole (embeddings, a token count)
        and ``run`` it on the model; in a replica group, a replica that fails
        it is replaced once, as a chat request's is before its first token."""
        model, route = await self.route(requested, capability, False, normalized)
        if route.group is None:
            return await run(model), route
        failover = Failover(self, requested, route, capability, normalized=normalized)
        result, _ = await failover.twice(model, lambda m, _: run(m), failover.judge)
        return result, failover.route

    async def items(
        self, model: Backend, prepared: Prepared, cancel: CancelFlag, live: bool = False
    ) -> AsyncGenerator[Any, None]:
        """The generation core's items for this request; a replica that fails
        before the first item is replaced once. ``live``: they go out as they
        come (a stream)."""
        failover = self.ctx.failover
        if failover is None:
            async for item in stream(model, prepared, cancel, self.ctx.reporting, live):
                yield item
            return

        async def opened(m: Backend, moved: bool) -> tuple[AsyncIterator[Any], Any]:
            assert failover is not None and failover.prepare is not None
            p = await failover.prepare(m) if moved else prepared
            items = stream(m, p, cancel, self.ctx.reporting, live)
            return items, await anext(items, _END)

        def moves(exc: BaseException) -> bool | None:
            verdict = failover.judge(exc)
            return None if cancel.cancelled else verdict

        (items, first), _ = await failover.twice(model, opened, moves)
        try:
            if first is _END:
                return
            yield first
            async for item in items:
                yield item
        except UpstreamError as exc:
            failover.failed(exc)  # judged as before its first item, but never moved once one went out
            raise


def _busy_if_full(exc: BaseException) -> bool | None:
    """A local replica whose wait list is full sends its request on at once."""
    return True if isinstance(exc, Overloaded) else None


class Failover:
    """A request routed to a replica: when the replica fails it before its
    first token (a chat request) or before its answer (embeddings), it is
    marked down and the request goes (once) to another replica, re-routed
    (and a chat request prepared anew by ``prepare``); never after a token
    was sent."""

    def __init__(
        self,
        dispatch: Dispatch,
        requested: str | None,
        route: Route,
        capability: Capability,
        streamed: bool = False,
        normalized: int = 0,
        key: Callable[[], str | None] | None = None,
        prepare: Callable[[Backend], Awaitable[Prepared]] | None = None,
    ) -> None:
        self.dispatch, self.requested, self.route, self.capability = dispatch, requested, route, capability
        self.streamed, self.normalized, self.key, self.prepare = streamed, normalized, key, prepare
        self.used = False

    async def twice(
        self, model: Backend, attempt: Callable[[Backend, bool], Awaitable[T]], moves: Moves
    ) -> tuple[T, Backend]:
        """THE loop: try ``attempt`` on ``model``; a failure ``moves`` lets
        move reroutes the request (once) and tries once more on the other
        replica (``attempt``'s flag: it moved); the second try's failure is
        judged as the first was, and raised."""
        first = self.route.served
        try:
            return await attempt(model, False), model
        except Exception as exc:
            busy = moves(exc)
            moved = None if busy is None else await self.reroute(busy)
            if moved is None:
                raise
            log.warning("replica %s failed (%s); retried on %s", first, exc, self.route.served)
        try:
            return await attempt(moved, True), moved
        except Exception as exc:
            moves(exc)
            raise

    def judge(self, exc: BaseException) -> bool | None:
        """An upstream failure is judged (:meth:`failed`); the request may
        move when it is retryable (busy or not)."""
        if not isinstance(exc, UpstreamError):
            return None
        self.failed(exc)
        return exc.busy if exc.retryable else None

    def failed(self, exc: UpstreamError) -> None:
        """A failure of the replica itself (no answer, a 502/503/504) takes
        it out for the cooldown. An error it answered for this request (a
        500) or a busy signal (a 429, or a 503 with Retry-After: its wait
        list is full) only sends this request elsewhere: taking it out would
        let one bad request, or a burst, leave no replica up."""
        if self.route.group is not None and self.route.replica is not None and exc.retryable and exc.down:
            self.route.group.failed(self.route.replica, exc.message)

    async def reroute(self, busy: bool = False) -> Backend | None:
        """The model of another replica the request is now routed to (once),
        or None. A ``busy`` replica's request moves only to one that is up:
        else its client is better served by the busy signal and its
        Retry-After."""
        if self.used or self.route.replica is None or self.route.group is None:
            return None
        if busy and not any(r.up for r in self.route.group.replicas if r is not self.route.replica):
            return None
        self.used = True
        exclude = frozenset({self.route.replica.name})
        # the failed replica's lease and in-flight count end now, not with the response
        # (releases are idempotent: the lease middleware's later call does nothing)
        give_back = self.dispatch.ctx.replica_leases.pop(id(self.route), None)
        if give_back is not None:
            give_back()
        try:
            model, self.route = await self.dispatch.route(
                self.requested, self.capability, self.streamed, self.normalized, self.key, exclude
            )
        except RoutingError:
            return None
        return model
