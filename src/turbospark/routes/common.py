"""Glue shared by every route module: state, the request's context and
dispatch, body parsing, binding a request to its envelope, and errors.
Answering a generation is ``routes.respond``; routing, admission and
failover are ``dispatch`` (no HTTP there); dialect specifics stay in
``turbospark.dialects``."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from ..core.request import ChatRequest
from ..dialects.common import BadRequest, parse_json_object, validate
from ..dialects.errors import ErrorShape, Failure
from ..dialects.render import SSE
from ..dialects.stamps import normalize_messages
from ..engine.types import AdmissionError, ContextOverflow, EngineError, Overloaded, ReaderBehind
from ..models.registry import RoutingError
from ..serving.context import DISCONNECTED, TOO_SLOW, RequestContext, context_of
from ..serving.dispatch import Dispatch
from ..serving.drain import ShuttingDown
from ..serving.state import ServerState
from ..upstream.client import UpstreamError

if TYPE_CHECKING:
    from pydantic import BaseModel


log = logging.getLogger("turbospark.http")
T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def state_of(request: Request) -> ServerState:
    return cast(ServerState, request.app.state.turbospark)


def context(request: Request) -> RequestContext:
    """The request's one typed context (``context.RequestContext``)."""
    return context_of(request.scope)


def request_id(request: Request) -> int | None:
    return context(request).id


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


def bind_request(req: ChatRequest, request: Request) -> ChatRequest:
    """Fill what the HTTP envelope knows into a ChatRequest's config: the
    tenant (KV reuse never crosses API keys) and the session: Claude Code's
    ``x-claude-code-session-id`` (it names the session, where the body's
    ``metadata.user_id`` it always sends names the device, shared by every
    session run on it), or an ``x-session-id`` header when the body named no
    session."""
    cfg = req.config
    tenant = context(request).tenant
    cfg.owner = tenant if tenant is not None else ""
    if req.guardrails is None:
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


def dispatch(request: Request) -> Dispatch:
    """The request's routing, admission and failover (``dispatch.Dispatch``)."""
    return Dispatch(state_of(request), context(request))


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


def failed(ctx: RequestContext | None, exc: BaseException) -> Failure:
    """Classify ``exc`` and note its message for the request's
    ``requestFinished`` (the middleware reads it; nothing is parsed back)."""
    failure = classify(exc)
    if ctx is not None:
        ctx.error = failure.message
    return failure


def error_response(shape: ErrorShape, exc: BaseException, request: Request | None = None) -> Response:
    """Any exception as a response in the dialect's shape."""
    failure = failed(context(request) if request is not None else None, exc)
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
