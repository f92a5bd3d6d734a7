"""The Responses API's routes besides generation (issue 37): a stored
response read back (``?stream=true``: its events, from ``starting_after``;
a background run still going, live to its end), deleted, its
input items listed, and a prompt's tokens counted without generating.
Another tenant's response is not found, as an unknown one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..core.backend import Backend
from ..dialects import openai_responses as oa
from ..dialects.common import BadRequest
from ..dialects.render import SSE_KEEP_ALIVE
from ..serving import media
from ..state.responses import OPEN, ResponseStore, Stored
from .common import JSONResponse, dispatch, normalize, off_loop, read_body, state_of, streaming_response
from .stored import open_turn, tenant_of


def store_of(request: Request) -> ResponseStore:
    store = state_of(request).responses
    if store is None:
        raise BadRequest("this server keeps no responses (--store off)", None, status=404, code="not_found")
    return store


async def stored(request: Request) -> Stored:
    rid = request.path_params["response_id"]
    found = await store_of(request).get(rid, tenant_of(request))
    if found is None:
        raise BadRequest(f"Response with id '{rid}' not found.", None, status=404, code="not_found")
    return found


def starting_after(request: Request) -> int | None:
    """``?stream=true``: the number of the last event the reader has (-1:
    none); None: no stream asked for."""
    q = request.query_params
    after = q.get("starting_after")
    if q.get("stream", "").lower() not in ("true", "1"):
        if after is not None:
            raise BadRequest("'starting_after' is for a stream: send it with stream=true", "starting_after")
        return None
    if after is None:
        return -1
    try:
        n = int(after)
    except ValueError:
        n = -1
    if n < 0:
        raise BadRequest("'starting_after' must be an event's sequence_number (an integer from 0)", "starting_after")
    return n


async def events(request: Request, rid: str, after: int) -> AsyncIterator[bytes]:
    """The response's events after ``after``: a background run still going
    here is followed live; one that ended reads back the events it sent
    (its end made from the response when a crash cut it); any other is its
    replay."""
    store, tenant = store_of(request), tenant_of(request)
    live = state_of(request).background.log(rid)
    if live is not None:
        return live.follow(after, state_of(request).sse_keepalive, SSE_KEEP_ALIVE)
    found, kept = await store.events(rid, tenant)
    if found is None:  # (deleted or expired since)
        raise BadRequest(f"Response with id '{rid}' not found.", None, status=404, code="not_found")
    said = kept[after + 1 :] if kept else oa.replay(found.body)[after + 1 :]
    if kept and not oa.ends(kept[-1]):  # (cut by a crash: its end numbered after what the reader has)
        end = oa.terminal_of(found.body, max(len(kept), after + 1))
        said += [end] if end is not None else []

    async def read() -> AsyncIterator[bytes]:
        for event in said:
            yield event

    return read()


async def retrieve(request: Request) -> Response:
    after = starting_after(request)
    found = await stored(request)
    if after is None:
        return JSONResponse(found.body)
    return streaming_response(await events(request, found.id, after))


async def delete(request: Request) -> Response:
    """Delete a kept response; a background run of it still going is
    cancelled first (it would otherwise write its row and events back)."""
    found = await stored(request)
    await state_of(request).background.cancel(found.id)
    await store_of(request).delete(found.id, found.tenant)
    return JSONResponse({"id": found.id, "object": "response", "deleted": True})


def page_limit(request: Request) -> int:
    """A list page's ``limit``: 1 to 100, 20 when not given."""
    raw = request.query_params.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise BadRequest("'limit' must be an integer from 1 to 100", "limit")
    return int(raw)


def list_page(items: list[dict[str, Any]], request: Request) -> dict[str, Any]:
    """OpenAI's list page: ``order`` (asc | desc, default desc), ``after``
    (an item id), ``limit`` (1 to 100, default 20)."""
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("'order' must be 'asc' or 'desc'", "order")
    limit = page_limit(request)
    ordered = items if order == "asc" else list(reversed(items))
    after = q.get("after")
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise BadRequest(f"no item with id '{after}' in this list", "after", status=404, code="not_found")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": len(ordered) > limit,
    }


async def input_items(request: Request) -> Response:
    return JSONResponse(list_page((await stored(request)).input, request))


async def input_tokens(request: Request) -> Response:
    """The tokens ``input`` (a chain's included) would prefill, counted by
    the model's own template and tokenizer; nothing is generated or kept."""
    raw = await read_body(request, oa.ResponsesRequest)
    body, _ = await open_turn(raw, request)
    assert isinstance(body, oa.ResponsesRequest)
    tr = oa.translate(body.model_copy(update={"stream": False, "store": False, "background": None}))
    assert tr.request is not None
    req = normalize(tr.request, request)

    async def count(model: Backend) -> int:
        ready = await media.counted(state_of(request).media, model, req)  # (URLs fetched; none it cannot take)
        return await off_loop(model.count_prompt, ready)

    n, _ = await dispatch(request).run(body.model, "chat", count, req.normalized)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})


async def cancel(request: Request) -> Response:
    """Stop a background run and answer its response, ``cancelled``. Only a
    background response can be cancelled; one that already ended is a 400,
    except one already cancelled (answered again, as OpenAI does)."""
    found = await stored(request)
    if not found.body.get("background"):
        raise BadRequest("Only responses created with background=true can be cancelled.", None)
    if found.status == "cancelled":
        return JSONResponse(found.body)
    if found.status not in OPEN:
        raise BadRequest(f"Cannot cancel a response with status '{found.status}'.", None)
    store = store_of(request)
    if not await state_of(request).background.cancel(found.id):  # not running here (any more)
        again = await store.get(found.id, found.tenant)
        if again is not None and again.status not in OPEN:
            return JSONResponse(again.body)
        found.body["status"] = found.status = "cancelled"
        await store.put(found)
        return JSONResponse(found.body)
    again = await store.get(found.id, found.tenant)
    return JSONResponse((again or found).body)


routes = [
    Route("/v1/responses/input_tokens", input_tokens, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"]),
    Route("/v1/responses/{response_id}/cancel", cancel, methods=["POST"]),
]
