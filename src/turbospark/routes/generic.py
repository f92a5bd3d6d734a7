"""The one handler of every generating route, whatever its dialect: the body
validated against the request kind's schema, translated into the one
``ChatRequest``, routed, prepared and admitted, then answered through the
dialect's renderer (``dialects.base``)."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response

from ..core.backend import Backend
from ..core.generation import prepare
from ..core.request import ChatRequest, Prepared
from ..dialects.base import Dialect, Kind, Served
from ..engine.types import AdmissionError
from . import background
from .common import JSONResponse, bind_request, dispatch, read_body, request_id, warning_headers
from .respond import Responder
from .stored import open_turn

Handler = Callable[[Request], Awaitable[Response]]


def preparer(params: Mapping[str, str]) -> Callable[[Backend, ChatRequest], Prepared]:
    """``prepare``, with admission errors naming the dialect's own fields
    (``params``: engine name → the dialect's)."""
    if not params:
        return prepare

    def prepare_named(model: Backend, req: ChatRequest) -> Prepared:
        try:
            return prepare(model, req)
        except AdmissionError as exc:
            if exc.param is not None and exc.param in params:
                exc.param = params[exc.param]  # the same error (and code), in this dialect's field names
            raise

    return prepare_named


def response_headers(dialect: Dialect, request: Request, warnings: list[str]) -> dict[str, str]:
    """Warnings, and the request id where the dialect names a header for it."""
    headers = warning_headers(warnings)
    rid = request_id(request)
    if dialect.request_id_header is not None and rid is not None:
        headers[dialect.request_id_header] = str(rid)
    return headers


def handler(dialect: Dialect, kind: Kind) -> Handler:
    """The handler of one generating path of ``dialect`` (its error shape is
    applied by the route table). A request's ``keep_alive`` becomes its
    model's idle timeout (0: unloaded once idle); the time it spent loading
    the model is the renderer's to report."""
    prepare_fn = preparer(kind.params)

    async def generate(request: Request) -> Response:
        started = time.perf_counter_ns()
        body = await read_body(request, kind.schema)
        turn = None
        if kind.stored:  # (Responses: a chain's items first; the turn kept)
            body, turn = await open_turn(body, request)
        tr = kind.translate(body)
        if turn is not None:
            turn.annotate(tr)
        requested = kind.requested(body)
        req = bind_request(tr.request, request) if tr.request is not None else None
        if turn is not None and turn.background and req is not None:  # run by the server, answered queued
            return await background.start(request, kind, body, tr, req, turn, prepare_fn)
        way = dispatch(request)
        if req is not None:
            model, route = await way.route_chat(req, requested, tr.stream)
            if kind.check is not None:
                kind.check(req, model, requested)
        else:  # a load or unload request: no prompt to route by
            model, route = await way.route(requested, "chat", tr.stream)
        if tr.keep_alive is not None:
            keep = None if math.isinf(tr.keep_alive) else tr.keep_alive
            way.state.registry.set_keep_alive(route.entry, keep)
        load_ns = int(route.load_seconds * 1e9)
        if req is None:
            assert kind.idle is not None, "only a kind with an idle answer translates to no request"
            idle = kind.idle(body, tr, Served(route.served, model.max_context, load_ns, started))
            return JSONResponse(idle, headers=response_headers(dialect, request, tr.warnings))
        model, route, prepared = await way.admit(model, req, requested, tr.stream, route, prepare_fn)
        renderer = kind.renderer(body, tr, prepared, Served(route.served, model.max_context, load_ns, started))
        headers = response_headers(dialect, request, tr.warnings + prepared.warnings)
        if turn is not None:
            await turn.begin(renderer)  # (a 503 now, before any byte, if it cannot be kept)
        return await Responder(way, request.receive, turn).respond(model, prepared, renderer, headers)

    return generate
