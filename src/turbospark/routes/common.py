"""Glue shared by every route module: state, body parsing, routing, errors,
disconnect watching, and the one shape of a generating route (:func:`respond`,
:func:`run_nonstream`, :func:`stream_frames`). Dialect specifics stay in
``turbospark.dialects``."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from ..answer import Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallDelta
from ..auth import TENANT_KEY
from ..backend import Backend
from ..dialects.common import BadRequest, parse_json_object, validate
from ..dialects.errors import ErrorShape, Failure
from ..dialects.render import SSE, ChoicesRenderer, FrameOut, Renderer
from ..dialects.stamps import normalize_messages
from ..drain import Drain, ShuttingDown
from ..engine.types import AdmissionError, CancelFlag, ContextOverflow, EngineError, Overloaded, ReaderBehind
from ..generation import prepare, stream
from ..middleware import CANCEL_KEY, DISCONNECTED, ERROR_KEY, LEASES_KEY, REPORTER_KEY, TOO_SLOW
from ..observe import NO_REPORTER, REQUEST_ID_KEY, Observer, Reporter, RequestIds, RequestRouted, record
from ..registry import Capability, Registry, Route, RoutingError
from ..replicas import routing_key
from ..request import ChatRequest, Final, Prepared
from ..upstream.client import UpstreamError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..sinks.live import LiveEvents

log = logging.getLogger("turbospark.http")
T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")

#: the request's :class:`Failover`, when it was routed to a replica
FAILOVER_KEY = "turbospark.failover"
#: id(route) -> its lease's release, for routes to a replica
REPLICA_LEASES_KEY = "turbospark.replica_leases"


@dataclass
class ServerState:
    """Everything a handler needs; lives on ``app.state.turbospark``."""

    registry: Registry
    observer: Observer | None = None
    #: the live event feed behind /v1/events and /v1/stats (``sinks.live``)
    live: LiveEvents | None = None
    ids: RequestIds = field(default_factory=RequestIds)
    started_at: float = field(default_factory=time.time)
    version: str = "0"
    #: tool-call guardrails (validate, re-ask once) unless a request says otherwise
    guardrails: bool = True
    #: take known per-session client stamps out of prompts (``dialects/stamps.py``)
    normalize_client_stamps: bool = True
    #: the server's PrometheusSink (``GET /metrics``)
    metrics: Any = None
    #: folders admin attach may load GGUF files from (``--models-dir``)
    model_folders: tuple[str, ...] = ()
    #: environment variables an attach body may name in ``api_key_env``
    #: (``--remote-key-env``), besides those the configured models name
    remote_key_envs: tuple[str, ...] = ()
    #: the options an attached model starts from (the server's own defaults)
    model_defaults: dict[str, Any] = field(default_factory=dict)
    #: requests in flight, and whether new ones are taken (graceful shutdown)
    drain: Drain = field(default_factory=Drain)


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def state_of(request: Request) -> ServerState:
    return cast(ServerState, request.app.state.turbospark)


def request_id(request: Request) -> int | None:
    return cast("int | None", request.scope.get("state", {}).get(REQUEST_ID_KEY))


#: bodies larger than this are parsed on a worker thread
PARSE_OFF_LOOP = 1 << 20


async def _read(request: Request, parse: Callable[[bytes], T]) -> T:
    """The body through ``parse``, on a worker thread when it is large (a
    30 MB list of token ids took the event loop, so every stream and
    ``/health``, for seconds)."""
    body = await request.body()
    if len(body) > PARSE_OFF_LOOP:
        return await asyncio.to_thread(parse, body)
    return parse(body)


async def read_json(request: Request) -> dict[str, Any]:
    return await _read(request, parse_json_object)


async def read_body(request: Request, model: type[M]) -> M:
    """The body read as ``model`` (a dialect's pydantic request): parsed,
    its depth checked and validated in one go."""
    return await _read(request, lambda body: cast(M, validate(model, parse_json_object(body))))


def bind_request(req: Any, request: Request) -> Any:
    """Fill what the HTTP envelope knows into a ChatRequest's config: the
    tenant (KV reuse never crosses API keys) and the session: Claude Code's
    ``x-claude-code-session-id`` (it names the session, where the body's
    ``metadata.user_id`` it always sends names the device, shared by every
    session run on it), or an ``x-session-id`` header when the body named no
    session."""
    cfg = req.config
    cfg.owner = request.scope.get("state", {}).get(TENANT_KEY, "")
    if getattr(req, "guardrails", False) is None:
        req.guardrails = state_of(request).guardrails
    header = request.headers.get("x-claude-code-session-id") or None
    if header is None and cfg.session_key is None:
        header = request.headers.get("x-session-id")
    if header:
        cfg.session_key = header
    normalize(req, request)
    return req


def normalize(req: ChatRequest, request: Request) -> ChatRequest:
    """Take known client stamps out of the prompt, unless the server was
    told not to (``--normalize-client-stamps off``)."""
    if state_of(request).normalize_client_stamps and req.messages:
        req.normalized += normalize_messages(req.messages)
    return req


async def route_model(
    request: Request,
    requested: str | None,
    capability: Capability,
    stream: bool,
    normalized: int = 0,
    key: Callable[[], str | None] | None = None,
    exclude: frozenset[str] = frozenset(),
) -> tuple[Any, Route]:
    """Resolve (loading on demand) and lease the model, report
    ``requestRouted``, and bind the request's :class:`Reporter` (which the
    generation core reports ``generated`` through). ``key``: what a replica
    group routes the request by (``replicas.routing_key``), asked only when
    the model is one."""
    st = state_of(request)
    route, release = await st.registry.acquire(requested, capability, key, exclude)
    request.scope.setdefault("state", {}).setdefault(LEASES_KEY, []).append(release)
    if route.group is not None:  # a failover gives the failed replica back at once
        request.scope["state"].setdefault(REPLICA_LEASES_KEY, {})[id(route)] = release
    rid = request_id(request)
    if rid is not None:
        record(
            st.observer,
            lambda: RequestRouted(
                id=rid, requested=requested, served=route.served, stream=stream, normalized_stamps=normalized
            ),
        )
    request.scope["state"][REPORTER_KEY] = Reporter(st.observer, rid)
    return route.model, route


def reporter_of(request: Request) -> Reporter:
    return cast(Reporter, request.scope.get("state", {}).get(REPORTER_KEY, NO_REPORTER))


async def route_and_prepare(
    request: Request,
    req: ChatRequest,
    requested: str | None,
    streamed: bool,
    prepare_fn: Callable[[Any, ChatRequest], Prepared] = prepare,
) -> tuple[Any, Route, Prepared]:
    """Bind ``req`` to the HTTP envelope, route a chat model for it and
    prepare the generation (``prepare_fn``: a dialect's own wrapper of
    ``prepare``), all before any byte of the response is sent."""
    bind_request(req, request)
    model, route = await route_chat(request, req, requested, streamed)
    return await admit(request, model, req, requested, streamed, route, prepare_fn)


def _key_of(req: ChatRequest) -> Callable[[], str | None]:
    def key() -> str | None:
        prompt = req.prompt if req.prompt is not None else req.prompt_ids
        return routing_key(req.config.session_key, req.messages, req.tools, prompt)

    return key


async def route_chat(request: Request, req: ChatRequest, requested: str | None, streamed: bool) -> tuple[Any, Route]:
    """Route a bound chat request (a replica group picks by its routing key)."""
    return await route_model(request, requested, "chat", streamed, req.normalized, _key_of(req))


async def admit(
    request: Request,
    model: Any,
    req: ChatRequest,
    requested: str | None,
    streamed: bool,
    route: Route,
    prepare_fn: Callable[[Any, ChatRequest], Prepared] = prepare,
) -> tuple[Any, Route, Prepared]:
    """Prepare ``req`` on the routed ``model`` and take its place on the
    wait list. A request routed to a replica may move to another one
    (:class:`Failover`): a local replica whose wait list is full sends it
    there at once, as a busy remote one does, and stays up."""
    if route.group is None:
        return model, route, await prepare_and_admit(request, model, req, prepare_fn)

    def prepare_on(m: Any) -> Awaitable[Prepared]:
        return prepare_and_admit(request, m, req, prepare_fn)

    failover = Failover(request, requested, route, "chat", streamed, req.normalized, _key_of(req), prepare_on)
    request.scope["state"][FAILOVER_KEY] = failover
    try:
        return model, route, await prepare_on(model)
    except Overloaded:
        moved = await failover.next(busy=True)
        if moved is None:
            raise
        log.warning("replica %s is full; sent to %s", route.served, failover.route.served)
        return moved[0], failover.route, moved[1]


class Failover:
    """A request routed to a replica: when the replica fails it before its
    first token (a chat request) or before its answer (embeddings), it is
    marked down and the request goes (once) to another replica, re-routed
    (and a chat request prepared anew by ``prepare``); never after a token
    was sent."""

    def __init__(
        self,
        request: Request,
        requested: str | None,
        route: Route,
        capability: Capability,
        streamed: bool = False,
        normalized: int = 0,
        key: Callable[[], str | None] | None = None,
        prepare: Callable[[Any], Awaitable[Prepared]] | None = None,
    ) -> None:
        self.request, self.requested, self.route, self.capability = request, requested, route, capability
        self.streamed, self.normalized, self.key, self.prepare = streamed, normalized, key, prepare
        self.used = False

    def failed(self, exc: UpstreamError) -> None:
        """A failure of the replica itself (no answer, a 502/503/504) takes
        it out for the cooldown. An error it answered for this request (a
        500) or a busy signal (a 429, or a 503 with Retry-After: its wait
        list is full) only sends this request elsewhere: taking it out would
        let one bad request, or a burst, leave no replica up."""
        if self.route.group is not None and self.route.replica is not None and exc.retryable and exc.down:
            self.route.group.failed(self.route.replica, exc.message)

    async def reroute(self, busy: bool = False) -> Any | None:
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
        give_back = self.request.scope["state"].get(REPLICA_LEASES_KEY, {}).pop(id(self.route), None)
        if give_back is not None:
            give_back()
        try:
            model, self.route = await route_model(
                self.request, self.requested, self.capability, self.streamed, self.normalized, self.key, exclude
            )
        except RoutingError:
            return None
        return model

    async def next(self, busy: bool = False) -> tuple[Any, Prepared] | None:
        """A chat request routed anew and prepared on another replica (once), or None."""
        assert self.prepare is not None
        model = await self.reroute(busy)
        return None if model is None else (model, await self.prepare(model))


async def run_routed(
    request: Request,
    requested: str | None,
    capability: Capability,
    run: Callable[[Any], Awaitable[T]],
    normalized: int = 0,
) -> tuple[T, Route]:
    """Route a request that is answered whole (embeddings, a token count)
    and ``run`` it on the model; in a replica group, a replica that fails it
    is replaced once (:class:`Failover`), as a chat request's is before its
    first token."""
    model, route = await route_model(request, requested, capability, False, normalized)
    if route.group is None:
        return await run(model), route
    failover = Failover(request, requested, route, capability, normalized=normalized)
    try:
        return await run(model), route
    except UpstreamError as exc:
        failover.failed(exc)
        model = await failover.reroute(exc.busy) if exc.retryable else None
        if model is None:
            raise
        log.warning("replica %s failed (%s); retried on %s", route.served, exc.message, failover.route.served)
    try:
        return await run(model), failover.route
    except UpstreamError as exc:
        failover.failed(exc)  # the second replica is judged as the first was
        raise


async def generate_items(
    request: Request, model: Backend, prepared: Prepared, cancel: CancelFlag, live: bool = False
) -> AsyncGenerator[Any, None]:
    """The generation core's items for this request; a replica that fails
    before the first item is replaced once (:class:`Failover`). ``live``:
    they go out as they come (a stream)."""
    failover: Failover | None = request.scope.get("state", {}).get(FAILOVER_KEY)
    sent = False
    try:
        async for item in stream(model, prepared, cancel, reporter_of(request), live):
            sent = True
            yield item
        return
    except UpstreamError as exc:
        if failover is None:
            raise
        failover.failed(exc)
        moved = None if sent or not exc.retryable or cancel.cancelled else await failover.next(exc.busy)
        if moved is None:
            raise
        log.warning("replica failed before its first token (%s); retried on %s", exc.message, failover.route.served)
    model, prepared = moved
    try:
        async for item in stream(model, prepared, cancel, reporter_of(request), live):
            yield item
    except UpstreamError as exc:
        failover.failed(exc)  # the second replica is judged as the first was
        raise


async def prepare_and_admit(
    request: Request,
    model: Backend,
    req: ChatRequest,
    prepare_fn: Callable[[Any, ChatRequest], Prepared] = prepare,
) -> Prepared:
    """Template, tokenise and compile grammars on a worker thread (never on
    the event loop: a 4 MB prompt takes seconds), then take a place on the
    model's wait list: a full list is a 503 before the first byte, streams
    included. The place is released with the response if never used."""
    prepared = await asyncio.to_thread(prepare_fn, model, req)
    release = model.reserve(prepared.config)
    request.scope.setdefault("state", {}).setdefault(LEASES_KEY, []).append(release)
    return prepared


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Heavy, blocking work (templating, tokenising) on a worker thread."""
    return await asyncio.to_thread(fn, *args)


def classify(exc: BaseException) -> Failure:
    if isinstance(exc, BadRequest):
        return Failure(exc.status, exc.message, exc.type, exc.code, exc.param, dict(exc.headers))
    if isinstance(exc, RoutingError):
        retry = {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}
        return Failure(exc.status, exc.message, None, exc.code, exc.param, retry)
    if isinstance(exc, AdmissionError):
        context = (exc.prompt_tokens, exc.limit) if isinstance(exc, ContextOverflow) else None
        return Failure(400, str(exc), "invalid_request_error", exc.code, exc.param, context=context)
    if isinstance(exc, Overloaded):
        return Failure(503, str(exc), None, "overloaded", None, {"Retry-After": str(exc.retry_after)})
    if isinstance(exc, ReaderBehind):
        return Failure(499, TOO_SLOW, None, "client_too_slow")
    if isinstance(exc, ClientDisconnect):  # gone while sending its body: its own doing, not ours
        return Failure(499, DISCONNECTED, None, "client_disconnected")
    if isinstance(exc, ShuttingDown):
        return Failure(503, str(exc), None, "shutting_down", None, {"Retry-After": str(exc.retry_after)})
    if isinstance(exc, UpstreamError):
        return upstream_failure(exc)
    if isinstance(exc, EngineError):
        return Failure(500, f"engine error: {exc}", "server_error")
    log.exception("unhandled error", exc_info=exc)
    return Failure(500, f"internal error: {type(exc).__name__}", "server_error")


def upstream_failure(exc: UpstreamError) -> Failure:
    """A remote engine's error with its status (429/503 keep ``Retry-After``).
    Its refusal of this server's own key is not the client's: a 502."""
    headers = {"Retry-After": exc.retry_after} if exc.retry_after else {}
    if exc.status in (401, 403, 407):
        return Failure(502, f"the upstream refused this server's credentials ({exc.status}): {exc.message}")
    return Failure(exc.status, exc.message, None, exc.code, None, headers)


def failed(request: Request | None, exc: BaseException) -> Failure:
    """Classify ``exc`` and note its message for the request's
    ``requestFinished`` (the middleware reads it; nothing is parsed back)."""
    failure = classify(exc)
    if request is not None:
        request.scope.setdefault("state", {})[ERROR_KEY] = failure.message
    return failure


def error_response(shape: ErrorShape, exc: BaseException, request: Request | None = None) -> Response:
    """Any exception as a response in the dialect's shape."""
    failure = failed(request, exc)
    return JSONResponse(failure.body(shape), status_code=failure.status, headers=failure.headers)


def endpoint(
    shape: ErrorShape,
) -> Callable[[Callable[[Request], Awaitable[Response]]], Callable[[Request], Awaitable[Response]]]:
    """Turn every failure of a handler into a response in its dialect's shape;
    nothing a client sends can produce an unshaped 500."""

    def deco(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(fn)
        async def wrapper(request: Request) -> Response:
            try:
                return await fn(request)
            except Exception as exc:  # noqa: BLE001 - mapped to a dialect error
                return error_response(shape, exc, request)

        return wrapper

    return deco


class DisconnectWatch:
    """Cancels a generation when the client disconnects, even while it is
    still queued (nothing is being sent yet, so nothing else would notice)."""

    def __init__(self, request: Request, cancel: CancelFlag) -> None:
        self.request = request
        self.cancel = cancel
        self._task: asyncio.Task[None] | None = None
        #: the client disconnected
        self.gone = False

    async def _watch(self) -> None:
        receive = self.request.receive
        while True:
            message = await receive()
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


async def run_nonstream(request: Request, model: Backend, prepared: Prepared, cancel: CancelFlag) -> list[Final]:
    """The whole answer (every choice), cancelled if the client disconnects while waiting
    (or cut by a drain that ran out of time)."""
    with state_of(request).drain.watch(cancel):
        async with DisconnectWatch(request, cancel) as watch:
            finals = [i async for i in generate_items(request, model, prepared, cancel) if isinstance(i, Final)]
        if watch.gone:  # nobody to answer: a 499, as a client gone while sending its body
            raise ClientDisconnect()
        return sorted(finals, key=lambda f: f.choice)


async def stream_frames(
    request: Request,
    model: Backend,
    prepared: Prepared,
    cancel: CancelFlag,
    renderer: Renderer,
    started: tuple[AsyncGenerator[Any, None], Any] | None = None,
) -> AsyncIterator[bytes]:
    """A streamed answer in ``renderer``'s dialect, cancelled if the client
    disconnects (or cut by a drain that ran out of time); any failure once the
    stream has begun becomes its error frame. ``started``: the items and the
    first of them, already taken (:func:`respond`, for a remote engine)."""
    with state_of(request).drain.watch(cancel):
        async with DisconnectWatch(request, cancel):
            items, first = (
                started if started is not None else (generate_items(request, model, prepared, cancel, True), None)
            )
            try:
                for frame in _frames(renderer.opening(len(prepared.prompt_ids))):
                    yield frame
                if first is not None:
                    for frame in _frames(_render(renderer, first)):
                        yield frame
                async for item in items:
                    for frame in _frames(_render(renderer, item)):
                        yield frame
            except Exception as exc:  # noqa: BLE001 - framed for the client
                yield renderer.error(failed(request, exc))  # requestFinished carries its message
            finally:
                await items.aclose()


async def first_item(
    request: Request, model: Backend, prepared: Prepared, cancel: CancelFlag
) -> tuple[AsyncGenerator[Any, None], Any]:
    """Start a generation and wait for its first item, so that a remote
    engine's refusal (a 429 with its ``Retry-After``, a 400, no replica
    answering) is this response's status rather than an error frame after a
    200. A client leaving meanwhile cancels it."""
    items = generate_items(request, model, prepared, cancel, True)
    with state_of(request).drain.watch(cancel):
        async with DisconnectWatch(request, cancel):
            try:
                return items, await anext(items)
            except BaseException:
                await items.aclose()
                raise


def _render(renderer: Renderer, item: Any) -> FrameOut:
    if isinstance(item, Delta):
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
    return None


def _frames(out: FrameOut) -> Iterable[bytes]:
    if out is None:
        return ()
    if isinstance(out, (bytes, bytearray)):
        return (out,)
    return out


async def respond(
    request: Request, model: Backend, prepared: Prepared, renderer: Renderer, headers: dict[str, str]
) -> Response:
    """Every generating route's answer: one JSON body from the renderer, or,
    when the client asked for a stream, the renderer's frames."""
    cancel = CancelFlag()
    request.scope.setdefault("state", {})[CANCEL_KEY] = cancel  # a too-slow client cancels it
    if not renderer.stream:
        finals = await run_nonstream(request, model, prepared, cancel)
        if len(finals) > 1:  # only dialects with ``n`` ask for more than one
            return JSONResponse(cast(ChoicesRenderer, renderer).complete_choices(finals), headers=headers)
        return JSONResponse(renderer.complete(finals[0]), headers=headers)
    started = await first_item(request, model, prepared, cancel) if prepared.body is not None else None
    frames = stream_frames(request, model, prepared, cancel, renderer, started)
    return streaming_response(frames, renderer.media_type, headers)


def streaming_response(
    frames: AsyncIterator[bytes], media_type: str = SSE, headers: dict[str, str] | None = None
) -> StreamingResponse:
    """A stream no proxy buffers or caches."""
    h = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
    return StreamingResponse(frames, media_type=media_type, headers=h)


#: the longest warning header sent: clients read response heads into a
#: bounded buffer (Node's HTTP parser: 16 KiB), and a request can name
#: thousands of ignored tools
MAX_WARNING = 4096


def warning_headers(warnings: list[str]) -> dict[str, str]:
    """The warnings as one header. They may quote the request (a tool type,
    a field name): a header value is Latin-1 without control characters, so
    anything else is escaped (``\\u6f22``) rather than failing the answer,
    and a long one is cut."""
    if not warnings:
        return {}
    text = header_safe("; ".join(warnings))
    if len(text) > MAX_WARNING:
        text = f"{text[: MAX_WARNING - 40]}... ({len(text) - MAX_WARNING + 40} more characters)"
    return {"X-Turbospark-Warning": text}


def header_safe(text: str) -> str:
    """``text`` as printable ASCII: control characters and anything past
    ASCII escaped as Python writes them."""
    return "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii") for c in text)
