"""Ollama's model management over the store: ``/api/pull`` (progress as
Ollama's NDJSON lines), ``/api/delete`` and ``/api/copy``. Admin routes
(``access.auth.ADMIN_PATHS``): with keys configured, an admin key."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import AsyncIterator
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects.common import BadRequest
from ..pull.fetch import FetchError, plain
from ..pull.hf import NeedsQuant
from ..pull.puller import Pulled, Puller, PullUpdate
from ..pull.refs import BadReference, parse
from ..pull.store import NoSpace, StoreError
from ..serving.state import ServerState
from .common import JSONResponse, read_body, state_of, streaming_response

NDJSON = "application/x-ndjson"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,200}$")


class _Named(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = Field(default=None, min_length=1)
    name: str | None = Field(default=None, min_length=1)  # (older clients)

    def requested(self) -> str:
        value = self.model or self.name
        if not value:
            raise BadRequest("'model' is required", "model")
        return value


class PullBody(_Named):
    stream: bool = True
    insecure: bool = False


class CopyBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


def puller_of(st: ServerState) -> Puller:
    if st.puller is None:
        raise BadRequest("this server keeps no model store (it was started without one)", "model", status=501)
    return st.puller


def pull_failure(exc: BaseException) -> BadRequest:
    """What a failed pull answers (and, mid-stream, its error line says)."""
    if isinstance(exc, BadReference | NeedsQuant):
        return BadRequest(str(exc), "model")
    if isinstance(exc, NoSpace):
        return BadRequest(str(exc), "model", status=507, code="insufficient_storage")
    if isinstance(exc, FetchError):
        return BadRequest(str(exc), "model", status=exc.status, code="pull_failed")
    if isinstance(exc, StoreError):
        return BadRequest(str(exc), "model", status=503, code="store_unavailable")
    return BadRequest(f"the pull failed: {plain(exc)}", "model", status=502, code="pull_failed")


def _lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]) -> Any:
    def put(update: PullUpdate) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, update.wire())

    return put


async def run_pull(st: ServerState, text: str, on_update: Any = None, register: bool = True) -> Pulled:
    """A pull on a worker thread; with ``register``, the model is then known
    to the registry (loaded on first use)."""
    puller = puller_of(st)
    ref = parse(text, bare_is_ollama=True)
    pulled = await asyncio.to_thread(puller.pull, ref, on_update)
    if register:
        await asyncio.to_thread(st.registry.configure_on_demand, pulled.name)
    return pulled


async def pull(request: Request) -> Response:
    st = state_of(request)
    body = await read_body(request, PullBody)
    text = body.requested()
    if body.insecure:
        raise BadRequest("insecure pulls are not supported: the registry is TURBOSPARK_OLLAMA_REGISTRY", "insecure")
    try:
        parse(text, bare_is_ollama=True)
    except BadReference as exc:
        raise pull_failure(exc) from None
    puller_of(st)
    if not body.stream:
        try:
            await run_pull(st, text)
        except Exception as exc:
            raise pull_failure(exc) from None
        return JSONResponse({"status": "success"})
    queue: asyncio.Queue[Any] = asyncio.Queue()
    task = asyncio.ensure_future(run_pull(st, text, _lines(asyncio.get_running_loop(), queue)))
    task.add_done_callback(functools.partial(_ended, queue))
    return streaming_response(_stream(queue, task), media_type=NDJSON)


def _ended(queue: asyncio.Queue[Any], task: asyncio.Future[Pulled]) -> None:
    """The end marker; a pull whose client left still ends, and its failure is read."""
    queue.put_nowait(None)
    if not task.cancelled():
        task.exception()


async def _stream(queue: asyncio.Queue[Any], task: asyncio.Future[Pulled]) -> AsyncIterator[bytes]:
    """The progress lines, then an ``error`` line if the pull failed. A
    client that leaves does not stop the pull: a later one finds it done."""
    while (line := await queue.get()) is not None:
        yield orjson.dumps(line) + b"\n"
    while not queue.empty():  # (lines queued after the end marker)
        if (line := queue.get_nowait()) is not None:
            yield orjson.dumps(line) + b"\n"
    exc = task.exception()
    if exc is not None:
        yield orjson.dumps({"error": pull_failure(exc).message}) + b"\n"


async def delete(request: Request) -> Response:
    """Forget a pulled model and delete its files; one being served stops
    taking requests and unloads once its in-flight ones end."""
    st = state_of(request)
    name = (await read_body(request, _Named)).requested()
    store = puller_of(st).store
    found = await asyncio.to_thread(store.find, name)
    if found is None:
        raise BadRequest(f"model '{name}' not found", "model", status=404, code="model_not_found")
    entry = st.registry.lookup(found.name)
    if entry is not None and entry.spec is not None and entry.spec.path in store.paths(found):
        with contextlib.suppress(KeyError):
            st.registry.remove(entry.id)
    await asyncio.to_thread(store.remove, found.name)
    return Response(status_code=200)


async def copy(request: Request) -> Response:
    st = state_of(request)
    body = await read_body(request, CopyBody)
    if not _NAME.match(body.destination) or ".." in body.destination:
        raise BadRequest(f"{body.destination!r} is not a valid model name", "destination")
    store = puller_of(st).store
    if await asyncio.to_thread(store.find, body.destination) is not None or st.registry.lookup(body.destination):
        raise BadRequest(f"model '{body.destination}' already exists", "destination", status=409)
    try:
        await asyncio.to_thread(store.copy, body.source, body.destination)
    except KeyError:
        raise BadRequest(f"model '{body.source}' not found", "source", status=404, code="model_not_found") from None
    return Response(status_code=200)


routes = [
    Route("/api/pull", pull, methods=["POST"]),
    Route("/api/delete", delete, methods=["DELETE"]),
    Route("/api/copy", copy, methods=["POST"]),
]
