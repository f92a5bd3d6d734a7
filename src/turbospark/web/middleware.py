"""The observing middleware: ``requestStarted``/``requestFinished`` for EVERY
HTTP request, including the 404s, 401s and rejected bodies no handler sees.

Pure ASGI on purpose: Starlette's ``BaseHTTPMiddleware`` buffers and breaks
streaming responses. The request id is minted here and put in the request's
context (``context.RequestContext``) so the handler's own events carry the same id.

When ``requestFinished`` fires: when the response is really over (CONTRACT
§2) — the app has sent its last body byte, or the client went away — and the
request's engine runs have been reported, so it always comes after the
request's ``generated`` events, streams included. Its ``error`` is what the
handler noted (the context's ``error``: the message of the error body or stream error
frame the client got), else ``"client disconnected"``, else ``HTTP <status>``
for a status ≥ 400: nothing is parsed back out of a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Any, cast

import orjson

from ..access.guard import CORS_EXPOSE, CORS_MAX_AGE, CORS_METHODS, BrowserPolicy
from ..dialects.base import CorsHeaders, ErrorShapes
from ..dialects.common import BadRequest
from ..observe import (
    TRACE_HEADERS,
    Observer,
    RequestFinished,
    RequestIds,
    RequestStarted,
    now_ms,
    record,
    request_tenant,
    trace_context,
)
from ..serving.context import CONTEXT_KEY, DISCONNECTED, TOO_SLOW, RequestContext, context_of
from ..serving.drain import Drain, ShuttingDown

Scope = dict[str, Any]
#: How long the end of a request waits for its engine runs to be reported
#: (a cancelled run ends at the engine's next step).
SETTLE_SECONDS = 30.0


class ObserveMiddleware:
    def __init__(self, app: Any, ids: RequestIds, observer_ref: Any) -> None:
        self.app = app
        self.ids = ids
        #: a zero-argument callable returning the current observer (or None),
        #: so observers can be attached after the app is built
        self.observer_ref = observer_ref

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        ctx.id = rid = self.ids.next()
        observer: Observer | None = self.observer_ref()
        if observer is None:
            await self.app(scope, receive, _with_headers(send, [(b"x-request-id", str(rid).encode())]))
            return
        method, path = scope.get("method", ""), scope.get("path", "")
        record(observer, lambda: RequestStarted(id=rid, at_ms=now_ms(), method=method, path=path))
        if getattr(observer, "trace_context", None) is not None:
            carrier = {
                k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", []) if k in TRACE_HEADERS
            }
            if carrier:
                trace_context(observer, rid, carrier)
        await _Observed(observer, ctx, method == "HEAD").run(self.app, scope, receive, send)


class _Observed:
    """One observed request: its status, whether its response is complete
    or its client gone, and its one ``requestFinished``."""

    def __init__(self, observer: Observer, ctx: RequestContext, head: bool) -> None:
        self.observer, self.ctx, self.head = observer, ctx, head
        self.started = time.perf_counter()
        self.status = 0
        self.complete = False  # the last body byte was handed to the server
        self.gone = False  # the client disconnected before that
        self.finished = False

    async def run(self, app: Any, scope: Scope, receive: Any, send: Any) -> None:
        ctx = self.ctx

        async def watched_receive() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] == "http.disconnect" and not self.complete:
                self.gone = True
            return message

        async def observed_send(message: dict[str, Any]) -> None:
            await send(self.sending(message))

        try:
            await app(scope, watched_receive, observed_send)
        except BaseException as exc:
            self.status = self.status or 500
            if self.gone or isinstance(exc, OSError):
                if not ctx.open_ended:
                    ctx.note_error(DISCONNECTED)
            else:
                ctx.note_error(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            if ctx.reporter is not None and isinstance(exc, Exception):
                await ctx.reporter.settled(SETTLE_SECONDS)  # its generated events first
            self.finish()
            raise
        if ctx.reporter is not None:
            await ctx.reporter.settled(SETTLE_SECONDS)  # its generated events first
        self.finish()

    def sending(self, message: dict[str, Any]) -> dict[str, Any]:
        kind = message["type"]
        if kind == "http.response.start":
            message = {
                **message,
                "headers": [*message.get("headers", []), (b"x-request-id", str(self.ctx.id).encode())],
            }
            self.status = int(message["status"])
        # the last body bytes end a response; a HEAD response has none,
        # so its headers are its end (the client holds it from then on)
        if (kind == "http.response.body" and not message.get("more_body", False)) or (
            kind == "http.response.start" and self.head
        ):
            self.complete = True
            if self.ctx.reporter is None or self.ctx.reporter.idle:
                # recorded as the last bytes are handed over, so a client
                # never holds a whole response whose end is not recorded
                self.finish()
        return message

    def outcome(self) -> str | None:
        if self.ctx.error:
            return self.ctx.error
        if self.gone and not self.ctx.open_ended:  # (before the response's end: a
            # non-streamed body rendered after the client left is handed to a closed socket)
            return DISCONNECTED
        return f"HTTP {self.status}" if self.status >= 400 else None

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        ms = int((time.perf_counter() - self.started) * 1000)
        rid, status, error = self.ctx.id, self.status, self.outcome()
        assert rid is not None
        record(self.observer, lambda: RequestFinished(id=rid, status=status, duration_ms=ms, error=error))


async def refuse(
    scope: Scope,
    send: Any,
    shapes: ErrorShapes,
    status: int,
    message: str,
    *,
    type: str | None = None,
    code: str | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """An error in the path's dialect shape, sent without reading the body."""
    context_of(scope).error = message
    names = [name.decode("latin-1") for name, _ in scope.get("headers", ())]
    shape = shapes.for_path(scope.get("path", ""), names)
    body = orjson.dumps(shape(status, message, type=type, param=None, code=code))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(BadRequest):
    """The body passed ``--max-body`` while it was being read (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request body is larger than this server's limit of {limit} bytes (--max-body)",
            status=413,
            code="request_too_large",
        )


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return cast(str, v.decode("latin-1"))
    return None


class GuardMiddleware:
    """Browser safety and body size (``guard.BrowserPolicy``), before any
    body is read: a ``Host`` that is not ours (DNS rebinding) or an
    ``Origin`` that is not allowed is a 403; allowed origins get CORS
    answers (preflights included); a body over the limit is a 413, by its
    ``Content-Length`` or, chunked, as its bytes arrive (never buffered past
    the limit). Sits inside :class:`ObserveMiddleware`: refusals are observed."""

    def __init__(self, app: Any, policy: BrowserPolicy, shapes: ErrorShapes, cors: CorsHeaders) -> None:
        self.app = app
        self.policy = policy
        self.shapes = shapes
        self.cors = cors

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        browser_send = await self._browser(scope, send)
        if browser_send is None:
            return
        if await self._declared_too_large(scope, browser_send):
            return
        await self._limited(scope, receive, browser_send)

    async def _browser(self, scope: Scope, send: Any) -> Any | None:
        """The ``Host`` and ``Origin`` checks and CORS: the ``send`` to
        answer through (with CORS headers for an allowed origin), or None
        when the request was answered here (a refusal, a preflight)."""
        host = _header(scope, b"host")
        if not self.policy.host_allowed(host):
            message = (
                f"host {host!r} is not allowed: this server answers to "
                "loopback names, its own address and --allowed-host names"
            )
            await refuse(scope, send, self.shapes, 403, message, type="permission_error")
            return None
        origin = _header(scope, b"origin")
        if origin is None:
            return send
        if not self.policy.origin_allowed(origin, host):
            message = f"origin {origin!r} is not allowed to call this server (--cors-origin)"
            await refuse(scope, send, self.shapes, 403, message, type="permission_error")
            return None
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if scope.get("method") == "OPTIONS" and _header(scope, b"access-control-request-method") is not None:
            asked = _header(scope, b"access-control-request-headers") or ""
            preflight = [
                *cors,
                (b"access-control-allow-methods", CORS_METHODS.encode()),
                (b"access-control-allow-headers", self.cors.allowed(asked).encode()),
                (b"access-control-max-age", CORS_MAX_AGE.encode()),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": preflight})
            await send({"type": "http.response.body", "body": b""})
            return None
        return _with_headers(send, [*cors, (b"access-control-expose-headers", CORS_EXPOSE.encode())])

    async def _declared_too_large(self, scope: Scope, send: Any) -> bool:
        """Refused by its ``Content-Length`` (malformed: 400; over: 413)."""
        length = _header(scope, b"content-length")
        if length is None:
            return False
        try:
            declared = int(length)
        except ValueError:
            declared = -1
        if declared < 0:
            await refuse(scope, send, self.shapes, 400, "malformed Content-Length header")
            return True
        if declared > self.policy.max_body:
            message = BodyTooLarge(self.policy.max_body).message
            await refuse(scope, send, self.shapes, 413, message, headers=[(b"connection", b"close")])
            return True
        return False

    async def _limited(self, scope: Scope, receive: Any, send: Any) -> None:
        """The app, its body counted as it arrives (chunked: never buffered
        past the limit)."""
        limit = self.policy.max_body
        started = False
        seen = 0

        async def counted_receive() -> dict[str, Any]:
            nonlocal seen
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracked_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge as exc:  # a handler that did not shape it itself
            if started:
                raise
            await refuse(scope, send, self.shapes, 413, exc.message, headers=[(b"connection", b"close")])


def _with_headers(send: Any, extra: list[tuple[bytes, bytes]]) -> Any:
    async def sender(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sender


class AuthMiddleware:
    """401s before the body is read, in the error shape of the path's dialect.
    Sits inside :class:`ObserveMiddleware`, so refusals are observed too."""

    def __init__(self, app: Any, auth: Any, shapes: ErrorShapes, observer_ref: Any = None) -> None:
        self.app = app
        self.auth = auth
        self.shapes = shapes
        #: as :class:`ObserveMiddleware`'s: told each accepted request's tenant
        self.observer_ref = observer_ref

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.auth.enabled:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        decision = self.auth.check(scope.get("method", ""), scope.get("path", ""), headers)
        if not decision.allowed:
            if decision.status == 401:
                await refuse(
                    scope,
                    send,
                    self.shapes,
                    401,
                    decision.reason,
                    type="authentication_error",
                    headers=[(b"www-authenticate", b'Bearer realm="turbospark"')],
                )
            else:
                await refuse(scope, send, self.shapes, decision.status, decision.reason, type="permission_error")
            return
        ctx = context_of(scope)
        ctx.tenant, ctx.admin = decision.tenant, decision.admin
        if self.observer_ref is not None:  # the views show each tenant its own requests
            request_tenant(self.observer_ref(), ctx.id, decision.tenant)
        await self.app(scope, receive, send)


#: paths a drain neither refuses nor waits for: ``/health`` says "draining"
#: itself, and the live event feed never ends by itself (it is closed last)
DRAIN_EXEMPT = ("/health", "/v1/events")


class DrainMiddleware:
    """Counts the requests in flight for a graceful shutdown
    (``drain.Drain``); once it has begun, new requests get a 503 with
    ``Retry-After`` in their dialect's shape, and their connection is closed.
    Sits inside :class:`ObserveMiddleware`: refusals are observed."""

    def __init__(self, app: Any, drain: Any, shapes: ErrorShapes) -> None:
        self.app = app
        self.drain = drain
        self.shapes = shapes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in DRAIN_EXEMPT:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            refused = ShuttingDown()
            headers = [(b"retry-after", str(refused.retry_after).encode()), (b"connection", b"close")]
            await refuse(scope, send, self.shapes, 503, str(refused), code="shutting_down", headers=headers)
            return
        with self.drain.entered():
            await self.app(scope, receive, send)


class LeaseMiddleware:
    """Releases the registry leases a request took (``Dispatch.route``) once its
    response is complete, streams included, so a detached or idle model is
    unloaded only after the requests using it are done."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            ctx = scope.get(CONTEXT_KEY)  # (none for lifespan scopes: nothing held)
            if ctx is not None:
                ctx.release_all()


#: seconds a client may leave a response chunk unread before it is dropped
SEND_TIMEOUT = 60.0
#: seconds a request body may pause before the request gets a 408
BODY_TIMEOUT = 30.0


class ClientTooSlow(Exception):
    """A client read nothing of its response for the send timeout."""


class BodyTimeout(BadRequest):
    """The request body stopped arriving (408)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the request body stopped arriving: nothing for {seconds:g} s (--body-timeout)",
            status=408,
            code="request_timeout",
            headers={"Connection": "close"},
        )


class ClientTimeouts:
    """Outermost, around the whole app (uvicorn calls it): a response body
    chunk the client does not take within ``send_timeout`` seconds (it holds
    the socket open and reads nothing, so the server's buffers are full)
    ends the request as a disconnect would — its engine work is cancelled,
    ``requestFinished`` says ``client too slow``, the connection is dropped;
    a request body that stops arriving for ``body_timeout`` seconds raises
    :class:`BodyTimeout` in the handler reading it (a 408 in its dialect's
    shape)."""

    def __init__(self, app: Any, send_timeout: float, body_timeout: float, drain: Drain | None = None) -> None:
        self.app = app
        self.send_timeout = send_timeout
        self.body_timeout = body_timeout
        #: a shutdown's drain ends both waits at its deadline (``Drain.until_cut``)
        self.drain = drain

    def _until_cut(self, timer: asyncio.Timeout) -> contextlib.AbstractContextManager[None]:
        return self.drain.until_cut(timer) if self.drain is not None else contextlib.nullcontext()

    def _cutting(self) -> bool:
        return self.drain is not None and self.drain.cutting

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        body_done = False

        async def timed_receive() -> dict[str, Any]:
            nonlocal body_done
            if body_done:  # after the body: a disconnect, whenever it comes
                return cast("dict[str, Any]", await receive())
            try:
                async with asyncio.timeout(self.body_timeout) as timer:
                    with self._until_cut(timer):
                        message: dict[str, Any] = await receive()
            except TimeoutError:
                if self._cutting():  # a 503 in its dialect's shape
                    raise ShuttingDown() from None
                raise BodyTimeout(self.body_timeout) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        # uvicorn's send waits only while its flow control has paused writing
        # (the client is not taking what was sent); until then no timer is
        # armed, so a frame that goes straight out costs nothing more
        flow = getattr(getattr(send, "__self__", None), "flow", None)

        async def timed_send(message: dict[str, Any]) -> None:
            if message["type"] != "http.response.body" or (flow is not None and not flow.write_paused):
                await send(message)
                return
            try:
                async with asyncio.timeout(self.send_timeout) as timer:
                    with self._until_cut(timer):
                        await send(message)
            except TimeoutError:
                # (a shutdown's deadline: the error frame could not go out either)
                why: Exception = ShuttingDown() if self._cutting() else ClientTooSlow(TOO_SLOW)
                ctx.error = str(why)
                if ctx.cancel is not None:
                    ctx.cancel.fail(why)
                _drop_connection(send)
                raise ClientTooSlow(str(why)) from None

        try:
            await self.app(scope, timed_receive, timed_send)
        except ClientTooSlow:
            # the connection is aborted (its loss is noted on the next loop
            # turn, so uvicorn sees a client gone, not an unfinished response)
            # and requestFinished has recorded it
            await asyncio.sleep(0)


def _drop_connection(send: Any) -> None:
    """Abort the connection under uvicorn's ``send`` (closing it would wait
    to flush buffers the client never reads)."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is not None:
        transport.abort()
