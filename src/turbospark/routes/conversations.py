"""OpenAI's Conversations API (issue 37): a conversation created (with its
metadata and up to 20 first items), read, its metadata replaced, deleted;
its items added (up to 20 at a time), listed (``after``/``limit``/``order``),
read and deleted one by one; and this server's own ``GET
/v1/conversations``, the caller's conversations, the last used first.
``responses.create(conversation=...)`` reads and extends the same list
(``routes/stored.py``). Another tenant's
conversation is not found, as an unknown one; ``include`` asks for nothing
this server has beyond the items themselves, so any value is refused."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dialects import openai_responses as oa
from ..dialects.common import BadRequest
from ..state.conversations import Conversation, ConversationStore
from .common import JSONResponse, read_body, state_of
from .responses import list_page, page_limit
from .stored import conversation_items, resolved, tenant_of

#: the most items one request may add, as OpenAI
MAX_ITEMS = 20


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class CreateConversation(_Body):
    metadata: dict[str, str] | None = None
    items: list[Any] | None = None


class UpdateConversation(_Body):
    metadata: dict[str, str]


class CreateItems(_Body):
    items: list[Any]


def store_of(request: Request) -> ConversationStore:
    store = state_of(request).responses
    if store is None:
        raise BadRequest("this server keeps no conversations (--store off)", None, status=404, code="not_found")
    return store.conversations


def _missing(cid: str) -> BadRequest:
    return BadRequest(f"Conversation with id '{cid}' not found.", None, status=404, code="not_found")


def _no_item(cid: str, item_id: str) -> BadRequest:
    return BadRequest(
        f"Item with id '{item_id}' not found in conversation '{cid}'.", None, status=404, code="not_found"
    )


def checked_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    """OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512."""
    metadata = metadata or {}
    if len(metadata) > 16:
        raise BadRequest("'metadata' may hold at most 16 key-value pairs", "metadata")
    for key, value in metadata.items():
        if len(key) > 64:
            raise BadRequest(f"metadata key {key[:64]!r}... is longer than 64 characters", "metadata")
        if len(value) > 512:
            raise BadRequest(f"the value of metadata key {key!r} is longer than 512 characters", "metadata")
    return metadata


def checked_items(items: list[Any]) -> list[dict[str, Any]]:
    """``items`` as a turn's input would take them (each validated, given an
    id and a status); at most :data:`MAX_ITEMS`."""
    if len(items) > MAX_ITEMS:
        raise BadRequest(f"'items' may hold at most {MAX_ITEMS} items (it has {len(items)})", "items")
    if items:
        try:
            oa.to_messages(oa.ResponsesRequest(input=items), [])
        except BadRequest as exc:
            param = exc.param.replace("input", "items", 1) if exc.param else "items"
            raise BadRequest(exc.message.replace("'input", "'items"), param) from None
    return conversation_items(items)


def refuse_include(request: Request) -> None:
    """``include`` asks for extra output (logprobs, encrypted reasoning, tool
    results) a conversation's items do not keep here: refused, never ignored."""
    asked = request.query_params.getlist("include") + request.query_params.getlist("include[]")
    if asked:
        raise BadRequest(
            f"include {asked!r} is not supported for conversation items: they are kept as they were sent",
            "include",
        )


async def given_items(request: Request, items: list[Any]) -> list[dict[str, Any]]:
    """``items`` as :func:`checked_items` takes them, ``item_reference``s
    replaced by the tenant's kept items they name."""
    store = state_of(request).responses
    if store is not None and len(items) <= MAX_ITEMS:  # (more: refused before any look-up)
        items = await resolved(store, tenant_of(request), items, "items")
    return checked_items(items)


async def conversation(request: Request) -> Conversation:
    cid = request.path_params["conversation_id"]
    found = await store_of(request).get(cid, tenant_of(request))
    if found is None:
        raise _missing(cid)
    return found


async def list_conversations(request: Request) -> Response:
    """This server's extension (OpenAI's API lists no conversations): the
    caller's conversations, the last used (an item added) first, ``after``
    a conversation id, ``limit`` 1 to 100 (20), ``search``: only titles (``metadata.title``)
    holding it, in any case."""
    q = request.query_params
    if q.get("order", "desc") != "desc":
        raise BadRequest("'order' must be 'desc': conversations are listed the last used first", "order")
    after, search = q.get("after") or None, q.get("search") or None
    listed = await store_of(request).listing(tenant_of(request), page_limit(request), after, search)
    if listed is None:
        raise BadRequest(f"no conversation with id '{after}' in this list", "after", status=404, code="not_found")
    found, more = listed
    data = [c.public() for c in found]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return JSONResponse({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more})


async def create(request: Request) -> Response:
    body = await read_body(request, CreateConversation)
    metadata = checked_metadata(body.metadata)
    items = await given_items(request, body.items or [])
    made = await store_of(request).create(tenant_of(request), metadata, items)
    return JSONResponse(made.public())


async def retrieve(request: Request) -> Response:
    return JSONResponse((await conversation(request)).public())


async def update(request: Request) -> Response:
    body = await read_body(request, UpdateConversation)
    cid = request.path_params["conversation_id"]
    found = await store_of(request).update(cid, tenant_of(request), checked_metadata(body.metadata))
    if found is None:
        raise _missing(cid)
    return JSONResponse(found.public())


async def delete(request: Request) -> Response:
    cid = request.path_params["conversation_id"]
    if not await store_of(request).delete(cid, tenant_of(request)):
        raise _missing(cid)
    return JSONResponse({"id": cid, "object": "conversation.deleted", "deleted": True})


async def list_items(request: Request) -> Response:
    refuse_include(request)
    cid = request.path_params["conversation_id"]
    items = await store_of(request).items(cid, tenant_of(request))
    if items is None:
        raise _missing(cid)
    return JSONResponse(list_page(items, request))


async def create_items(request: Request) -> Response:
    """The items added, as a list page of them (oldest first)."""
    refuse_include(request)
    body = await read_body(request, CreateItems)
    items = await given_items(request, body.items)
    cid = request.path_params["conversation_id"]
    if not items:
        raise BadRequest("'items' must hold at least one item", "items")
    if not await store_of(request).append(cid, tenant_of(request), items):
        raise _missing(cid)
    page = {"object": "list", "data": items, "first_id": items[0]["id"], "last_id": items[-1]["id"]}
    return JSONResponse({**page, "has_more": False})


async def retrieve_item(request: Request) -> Response:
    refuse_include(request)
    cid, item_id = request.path_params["conversation_id"], request.path_params["item_id"]
    found, item = await store_of(request).item(cid, tenant_of(request), item_id)
    if found is None:
        raise _missing(cid)
    if item is None:
        raise _no_item(cid, item_id)
    return JSONResponse(item)


async def delete_item(request: Request) -> Response:
    """The conversation (as OpenAI answers), without the item."""
    cid, item_id = request.path_params["conversation_id"], request.path_params["item_id"]
    found, had = await store_of(request).delete_item(cid, tenant_of(request), item_id)
    if found is None:
        raise _missing(cid)
    if not had:
        raise _no_item(cid, item_id)
    return JSONResponse(found.public())


routes = [
    Route("/v1/conversations", list_conversations, methods=["GET"]),
    Route("/v1/conversations", create, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", retrieve, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}", update, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", delete, methods=["DELETE"]),
    Route("/v1/conversations/{conversation_id}/items", list_items, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items", create_items, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", retrieve_item, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", delete_item, methods=["DELETE"]),
]
