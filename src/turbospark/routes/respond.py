"""The one shape of a generating route's answer: one JSON body from the
dialect's renderer, or, when the client asked for a stream, its frames;
either way cancelled if the client disconnects (or cut by a drain that ran
out of time). A stream that has nothing to send for ``sse_keepalive`` seconds
(queued, prefilling a long prompt) sends its dialect's keep-alive, so no
client's idle timer fires while the server works."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Protocol, cast

from starlette.requests import ClientDisconnect
from starlette.responses import Response

from ..core.answer import Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallDelta
from ..core.backend import Backend
from ..core.request import Final, Prepared
from ..dialects.render import ChoicesRenderer, FrameOut, Renderer, ReportsProgress, ReportsTimings, keep_alive
from ..engine.types import CancelFlag, PromptProgress, TokenTimings
from ..serving.dispatch import Dispatch
from .common import JSONResponse, failed, streaming_response

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class Keeper(Protocol):
    """What keeps an answer before it is sent (``routes.stored.Turn``): the
    answer's body (and the answer, for its engine numbers), or the
    renderer's last one (a stream's)."""

    async def write(self, body: dict[str, Any] | None, final: Final | None = None) -> None: ...

    async def keep(self, renderer: Renderer) -> None: ...


class DisconnectWatch:
    """Cancels a generation when the client disconnects, even while it is
    still queued (nothing is being sent yet, so nothing else would notice)."""

    def __init__(self, receive: Receive, cancel: CancelFlag) -> None:
        self.receive = receive
        self.cancel = cancel
        self._task: asyncio.Task[None] | None = None
        #: the client disconnected
        self.gone = False

    async def _watch(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                self.cancel.cancel("the client disconnected")
                return

    async def __aenter__(self) -> DisconnectWatch:
        self._task = asyncio.ensure_future(self._watch())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._task is not None:
            self._task.cancel()


class Responder:
    """Answers one generating request: its dispatch (items, failover, the
    error note), the client's ``receive`` (disconnects) and the cancel flag
    its engine work obeys."""

    def __init__(self, dispatch: Dispatch, receive: Receive, turn: Keeper | None = None) -> None:
        self.dispatch = dispatch
        self.receive = receive
        #: keeps the answer (a stored response) before it is sent
        self.turn = turn
        self.cancel = CancelFlag()
        dispatch.ctx.cancel = self.cancel  # a too-slow client cancels it

    def _watched(self) -> tuple[Any, DisconnectWatch]:
        return self.dispatch.state.drain.watch(self.cancel), DisconnectWatch(self.receive, self.cancel)

    async def respond(
        self, model: Backend, prepared: Prepared, renderer: Renderer, headers: dict[str, str]
    ) -> Response:
        """One JSON body from the renderer, or, when the client asked for a
        stream, the renderer's frames."""
        if not renderer.stream:
            finals = await self.whole(model, prepared)
            if len(finals) > 1:  # only dialects with ``n`` ask for more than one
                return JSONResponse(cast(ChoicesRenderer, renderer).complete_choices(finals), headers=headers)
            answer = renderer.complete(finals[0])
            if self.turn is not None:
                await self.turn.write(answer, finals[0])
            return JSONResponse(answer, headers=headers)
        started = await self.first_item(model, prepared) if prepared.body is not None else None
        frames = self.frames(model, prepared, renderer, started)
        return streaming_response(frames, renderer.media_type, headers)

    async def whole(self, model: Backend, prepared: Prepared) -> list[Final]:
        """The whole answer (every choice)."""
        drain, disconnects = self._watched()
        with drain:
            async with disconnects as watch:
                items = self.dispatch.items(model, prepared, self.cancel)
                finals = [i async for i in items if isinstance(i, Final)]
            if watch.gone:  # nobody to answer: a 499, as a client gone while sending its body
                raise ClientDisconnect()
            return sorted(finals, key=lambda f: f.choice)

    async def frames(
        self,
        model: Backend,
        prepared: Prepared,
        renderer: Renderer,
        started: tuple[AsyncGenerator[Any, None], Any] | None = None,
    ) -> AsyncIterator[bytes]:
        """A streamed answer in ``renderer``'s dialect; any failure once the
        stream has begun becomes its error frame. ``started``: the items and
        the first of them, already taken (a remote engine's)."""
        drain, disconnects = self._watched()
        with drain:
            async with disconnects:
                items, first = (
                    started if started is not None else (self.dispatch.items(model, prepared, self.cancel, True), None)
                )
                beat, every = keep_alive(renderer), self.dispatch.state.sse_keepalive
                source = _beating(items, every) if beat is not None and every > 0 else items
                try:
                    for frame in frames_of(renderer.opening(len(prepared.prompt_ids))):
                        yield frame
                    if first is not None:
                        for frame in frames_of(render_item(renderer, first)):
                            yield frame
                    async for item in source:
                        if item is _BEAT:
                            assert beat is not None
                            yield beat
                            continue
                        frames = frames_of(render_item(renderer, item))
                        if isinstance(item, Final) and self.turn is not None:
                            await self.turn.keep(renderer)  # kept before it is said
                        for frame in frames:
                            yield frame
                except Exception as exc:  # noqa: BLE001 - framed for the client
                    yield renderer.error(failed(self.dispatch.ctx, exc))  # requestFinished carries its message
                    await self._keep_failed(renderer)
                finally:
                    if source is not items:
                        await source.aclose()  # (stops its pump, which closes the items)
                    await items.aclose()

    async def _keep_failed(self, renderer: Renderer) -> None:
        """A stream that failed is kept failed (if it can be)."""
        if self.turn is not None:
            try:
                await self.turn.keep(renderer)
            except Exception:  # noqa: BLE001 - the client has its error frame already
                pass

    async def first_item(self, model: Backend, prepared: Prepared) -> tuple[AsyncGenerator[Any, None], Any]:
        """Start a generation and wait for its first item, so that a remote
        engine's refusal (a 429 with its ``Retry-After``, a 400, no replica
        answering) is this response's status rather than an error frame
        after a 200. A client leaving meanwhile cancels it."""
        items = self.dispatch.items(model, prepared, self.cancel, True)
        drain, disconnects = self._watched()
        with drain:
            async with disconnects:
                try:
                    return items, await anext(items)
                except BaseException:
                    await items.aclose()
                    raise


#: stands among the items for a keep-alive (:func:`_beating`)
_BEAT = object()


async def _beating(items: AsyncGenerator[Any, None], every: float) -> AsyncGenerator[Any, None]:
    """``items`` as they come, and :data:`_BEAT` each time none has come for
    ``every`` seconds. The items are read on a task of their own (a small
    queue between: a reader that stops reading stops it), so waiting for the
    next one never interrupts the generation; closing this cancels that task
    and closes ``items``."""
    queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue(maxsize=16)

    async def pump() -> None:
        try:
            async for item in items:
                await queue.put((True, item))
            await queue.put((False, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the reader, which raises it (it would wait forever)
            await queue.put((False, exc))
        finally:
            await items.aclose()

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                more, item = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    async with asyncio.timeout(every):
                        more, item = await queue.get()
                except TimeoutError:
                    yield _BEAT
                    continue
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def render_item(renderer: Renderer, item: Any) -> FrameOut:
    """One item of a run as ``renderer``'s frames (None: nothing to say)."""
    if isinstance(item, Delta):  # (the hot path first)
        return renderer.text(item)
    if isinstance(item, ReasoningDelta):
        return renderer.reasoning(item)
    if isinstance(item, ToolArgumentsDelta):
        return renderer.tool_arguments(item)
    if isinstance(item, ToolCallBegin):
        return renderer.tool_call_begin(item)
    if isinstance(item, ToolCallDelta):
        return renderer.tool_call(item)
    if isinstance(item, Final):
        return renderer.final(item)
    if isinstance(item, PromptProgress):  # (asked for: return_progress)
        return renderer.prompt_progress(item) if isinstance(renderer, ReportsProgress) else None
    if isinstance(item, TokenTimings):  # (asked for: timings_per_token)
        return renderer.token_timings(item) if isinstance(renderer, ReportsTimings) else None
    return None


def frames_of(out: FrameOut) -> Iterable[bytes]:
    if out is None:
        return ()
    if isinstance(out, (bytes, bytearray)):
        return (out,)
    return out
