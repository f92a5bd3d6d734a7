"""Background responses (``background: true``, issue 37): the POST answers
at once with the response ``queued`` (kept so); the run goes on in a task
the server owns (``serving.background``), not the client's connection, and
moves the stored response to ``in_progress``, then to its end (completed,
incomplete, failed, or ``cancelled`` by ``POST /v1/responses/{id}/cancel``).

The run is a request of its own in the events: a new request id with its
``requestStarted`` (``POST /v1/responses (background)``), its
``requestRouted`` naming the response, its ``generated``, and its
``requestFinished`` when the run ends; the POST that started it ends when it
answers. A graceful drain waits for it as for any request in flight, then
cuts it (kept ``failed``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..core.backend import Backend
from ..core.request import ChatRequest, Final, Prepared
from ..dialects import openai_responses as oa
from ..dialects.base import Kind, Served
from ..dialects.openai_responses import ResponsesRenderer
from ..dialects.render import SSE_KEEP_ALIVE
from ..dialects.translate import Translation
from ..observe import RequestFinished, RequestStarted, now_ms, record, request_tenant
from ..serving.background import RunLog
from ..serving.context import RequestContext
from ..serving.dispatch import Dispatch
from ..serving.state import ServerState
from .common import JSONResponse, context, failed, state_of, streaming_response
from .respond import Responder, frames_of, render_item
from .stored import Turn

#: the path a background run's own ``requestStarted`` names
PATH = "/v1/responses (background)"
#: how long a run's end waits for its ``generated`` events to be reported
SETTLE_SECONDS = 30.0
#: how often a run's new events are written to the store while it runs
FLUSH_SECONDS = 0.5
log_ = logging.getLogger("turbospark.responses")


async def _never() -> MutableMapping[str, Any]:
    """The receive of a run no client holds: no disconnect ever comes."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@dataclass
class Job:
    """One background run: what the POST validated, where it is kept, and
    its events (``log``: in memory while it runs, in the store as they go)."""

    state: ServerState
    ctx: RequestContext
    kind: Kind
    body: Any
    tr: Translation
    req: ChatRequest
    turn: Turn
    prepare: Callable[[Backend, ChatRequest], Prepared]
    #: the response as the POST answered it (queued): its id and creation time
    queued: ResponsesRenderer
    log: RunLog
    #: the renderer of the run as it is now (the queued one until it starts)
    current: ResponsesRenderer | None = None
    _flushed_at: float = 0.0

    async def run(self, responder: Responder) -> None:
        """The run, from its ``requestStarted`` to its ``requestFinished``."""
        state, ctx = self.state, self.ctx
        assert ctx.id is not None
        rid, began = ctx.id, time.perf_counter()
        record(state.observer, lambda: RequestStarted(id=rid, at_ms=now_ms(), method="POST", path=PATH))
        if ctx.tenant is not None:
            request_tenant(state.observer, rid, ctx.tenant)
        status = 200
        try:
            with state.drain.entered():
                await self._generate(responder)
        except Exception as exc:  # noqa: BLE001 - kept as the response's failure
            failure = failed(ctx, exc)
            status = failure.status
            renderer = self.current or self.queued
            said = renderer.error(failure)  # (its result: the failed response)
            with contextlib.suppress(Exception):  # (logged by the turn; nobody to answer)
                await self.turn.keep(renderer)
            self.log.add(oa.events_of(said))
        finally:
            await self._flush(force=True)
            self.log.end()
            ctx.release_all()
            if ctx.reporter is not None:
                await ctx.reporter.settled(SETTLE_SECONDS)
            ms, error = int((time.perf_counter() - began) * 1000), ctx.error
            record(state.observer, lambda: RequestFinished(id=rid, status=status, duration_ms=ms, error=error))

    async def _generate(self, responder: Responder) -> None:
        started = time.perf_counter_ns()
        way, req, requested = responder.dispatch, self.req, self.kind.requested(self.body)
        if responder.cancel.cancelled:  # cancelled while queued: it never runs
            return await self._cancelled(self.queued)
        model, route = await way.route_chat(req, requested, False)
        if self.kind.check is not None:
            self.kind.check(req, model, requested)
        model, route, prepared = await way.admit(model, req, requested, False, route, self.prepare)
        load_ns = int(route.load_seconds * 1e9)
        renderer = self.kind.renderer(
            self.body, self.tr, prepared, Served(route.served, model.max_context, load_ns, started)
        )
        if not isinstance(renderer, ResponsesRenderer):
            raise TypeError("a background run renders a Responses stream")
        renderer.created, renderer.seq = self.queued.created, self.queued.seq  # (its events go on from queued)
        self.current = renderer
        if responder.cancel.cancelled:
            return await self._cancelled(renderer)
        await self.turn.begin(renderer)  # in_progress
        await self._say(renderer.in_progress())
        await self._stream(responder, model, prepared, renderer)

    async def _stream(
        self, responder: Responder, model: Backend, prepared: Prepared, renderer: ResponsesRenderer
    ) -> None:
        """The run's items rendered as its events; its end kept before it is said."""
        with self.state.drain.watch(responder.cancel):
            items = responder.dispatch.items(model, prepared, responder.cancel, True)
            try:
                async for item in items:
                    if isinstance(item, Final):
                        said = renderer.final(item)
                        await self.turn.write(renderer.result, item)
                        await self._say(said)
                    else:
                        await self._say(b"".join(frames_of(render_item(renderer, item))))
            finally:
                await items.aclose()

    async def _say(self, frames: bytes | None) -> None:
        """Events for the readers now, and for the store (at most every
        :data:`FLUSH_SECONDS`, so a long run costs few writes)."""
        if frames:
            self.log.add(oa.events_of(frames))
            await self._flush()

    async def _flush(self, force: bool = False) -> None:
        log, now = self.log, time.monotonic()
        if log.kept == len(log.events) or (not force and now - self._flushed_at < FLUSH_SECONDS):
            return
        pending, self._flushed_at = log.events[log.kept :], now
        try:
            await self.turn.store.add_events(self.turn.id, log.kept, pending)
        except Exception as exc:  # noqa: BLE001 - tried again at the next flush; readers have them live
            log_.error("the events of response %s could not be stored: %s", self.turn.id, exc)
            return
        log.kept += len(pending)

    async def _cancelled(self, renderer: ResponsesRenderer) -> None:
        body = renderer.snapshot("cancelled")
        await self.turn.write(body)
        self.log.add(oa.events_of(renderer.ended(body)))


async def start(
    request: Request,
    kind: Kind,
    body: Any,
    tr: Translation,
    req: ChatRequest,
    turn: Turn,
    prepare: Callable[[Backend, ChatRequest], Prepared],
) -> Response:
    """Keep the response ``queued``, start its run, answer it (with
    ``stream``: its events, live, until it ends)."""
    state, own = state_of(request), context(request)
    queued = ResponsesRenderer(body, body.model or "", req.config, tr.extras["tools"], tr.extras.get("stored"))
    answer = queued.snapshot("queued")
    await turn.write(answer)  # (a 503 now if it cannot be kept: nothing runs)
    log = RunLog()
    log.add(oa.events_of(queued.queued()))
    ctx = RequestContext(id=state.ids.next(), tenant=own.tenant, admin=own.admin)
    ctx.response_id, ctx.previous_response_id = own.response_id, own.previous_response_id
    responder = Responder(Dispatch(state, ctx), _never, turn)
    job = Job(state, ctx, kind, body, tr, req, turn, prepare, queued, log)
    state.background.start(turn.id, responder.cancel, job.run(responder), log)
    if getattr(body, "stream", False):
        return streaming_response(log.follow(every=state.sse_keepalive, beat=SSE_KEEP_ALIVE))
    return JSONResponse(answer)
