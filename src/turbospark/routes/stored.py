"""The Responses API's state around the generic handler (issue 37): a turn
continuing ``previous_response_id`` gets the chain's items before its own
input (``instructions`` are not carried over, as OpenAI documents); a turn
with ``store`` (the default) is written when it starts and when it ends, and
one that cannot be written is a 503, never answered as if stored. The
chain's first response names the KV session every later turn continues."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request

from ..core.request import Final
from ..dialects.common import BadRequest, new_id
from ..dialects.openai_chat import timings
from ..dialects.openai_responses import ResponsesRenderer, ResponsesRequest
from ..dialects.render import Renderer
from ..dialects.translate import Translation
from ..state.db import StateError
from ..state.responses import ResponseStore, Stored
from .common import context, state_of

log = logging.getLogger("turbospark.responses")
#: the statuses of a turn that ended with an answer: its items join its conversation
ENDED = ("completed", "incomplete")
#: id prefixes of input items, by type
_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


class NotStored(BadRequest):
    """The store could not keep a response: 503, nothing answered as stored."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(
            f"the response could not be stored ({exc}); retry, or send store: false",
            None,
            status=503,
            code="store_unavailable",
            type="server_error",
        )


def not_found(rid: str, param: str = "previous_response_id") -> BadRequest:
    code = "previous_response_not_found" if param == "previous_response_id" else "not_found"
    return BadRequest(f"Previous response with id '{rid}' not found.", param, status=404, code=code)


def input_items(value: str | list[Any]) -> list[dict[str, Any]]:
    """A request's ``input`` as the items the store keeps (each with an id)."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    out = []
    for raw in value:
        item = dict(raw) if isinstance(raw, dict) else raw
        if isinstance(item, dict):
            kind = str(item.setdefault("type", "message"))
            item.setdefault("id", new_id(_PREFIX.get(kind, "item_")))
            if kind == "message" and isinstance(item.get("content"), str):  # as OpenAI lists it
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": item["content"]}]
        out.append(item)
    return out


def conversation_items(value: str | list[Any]) -> list[dict[str, Any]]:
    """Items as a conversation keeps them: each with an id and a status."""
    return [{**item, "status": item.get("status") or "completed"} for item in input_items(value)]


def figures(final: Final, request_id: int | None) -> dict[str, Any]:
    """The engine's numbers for a turn's answer, kept with its last item in
    a conversation (this server's extension ``timings``, docs/SERVING.md, Conversations):
    llama.cpp's ``timings`` object, the engine's queue wait (``queue_ms``),
    why its run ended (``stop_reason``, the ``generated`` event's) and the
    request's id (its ``x-request-id``)."""
    engine = {"queue_ms": final.queue_seconds * 1000.0, "stop_reason": final.result.reason.value}
    return {**timings(final), **engine, "request_id": request_id}


def conversation_named(body: ResponsesRequest) -> str | None:
    """The id ``conversation`` names (a string, or ``{"id": ...}``); 400
    with ``previous_response_id`` too, as OpenAI."""
    value = body.conversation
    if value is None:
        return None
    if body.previous_response_id is not None:
        raise BadRequest(
            "Mutually exclusive parameters: Ensure you are only providing one of: "
            "'previous_response_id' or 'conversation'.",
            "conversation",
            code="mutually_exclusive_parameters",
        )
    cid = value.get("id") if isinstance(value, dict) else value
    if not isinstance(cid, str) or not cid:
        raise BadRequest("'conversation' must be a conversation id or an object with its 'id'", "conversation")
    return cid


async def conversation_before(store: ResponseStore, cid: str, tenant: str) -> list[dict[str, Any]]:
    """The conversation's items, to come before a turn's input (404: not this tenant's)."""
    items = await store.conversations.items(cid, tenant)
    if items is None:
        raise BadRequest(f"Conversation with id '{cid}' not found.", "conversation", status=404, code="not_found")
    return items


def chain_items(chain: list[Stored]) -> list[dict[str, Any]]:
    """What the model saw and said, turn by turn."""
    out: list[dict[str, Any]] = []
    for stored in chain:
        out += stored.input
        out += [item for item in stored.body.get("output") or [] if isinstance(item, dict)]
    return out


@dataclass
class Turn:
    """One ``/v1/responses`` request with the store behind it."""

    store: ResponseStore
    tenant: str
    id: str
    #: the client asked for it to be kept (``store``, true unless false)
    kept: bool
    previous_id: str | None
    root_id: str
    input: list[dict[str, Any]]
    extras: dict[str, Any] = field(default_factory=dict)
    #: the conversation its items join when it ends
    conversation_id: str | None = None
    joined: bool = False
    #: the request's id (``x-request-id``), kept with the answer's numbers
    request_id: int | None = None

    @property
    def background(self) -> bool:
        """Run by the server, not the client's connection (``background: true``)."""
        return bool(self.extras.get("background"))

    def annotate(self, tr: Translation) -> None:
        """What the renderer echoes, and the KV session: the chain's own
        (unless the client named one), so its next turn finds this one's KV."""
        tr.extras["stored"] = {
            "id": self.id,
            "store": self.kept,
            "previous_response_id": self.previous_id,
            **self.extras,
        }
        if tr.request is not None and tr.request.config.session_key is None:
            tr.request.config.session_key = self.session()

    def session(self) -> str:
        """The KV session: the conversation's, else the chain's."""
        if self.conversation_id is not None:
            return f"conversation:{self.conversation_id}"
        return f"response-chain:{self.root_id}"

    async def join(self, body: dict[str, Any] | None, final: Final | None = None) -> None:
        """Once the turn has ended (completed or incomplete), its input and
        output items are appended to its conversation, stored or not (as
        OpenAI does), the last with the engine's numbers (``final``'s);
        raises :class:`NotStored` when they cannot be."""
        if self.conversation_id is None or self.joined or body is None or body.get("status") not in ENDED:
            return
        self.joined = True
        said = [item for item in body.get("output") or [] if isinstance(item, dict)]
        if said and final is not None:  # (a copy: the response object is left as it is)
            said[-1] = {**said[-1], "timings": figures(final, self.request_id)}
        try:
            there = await self.store.conversations.append(self.conversation_id, self.tenant, self.input + said)
        except Exception as exc:  # noqa: BLE001 - any failure to keep them is a 503
            log.error("response %s could not join conversation %s: %s", self.id, self.conversation_id, exc)
            raise NotStored(exc) from None
        if not there:
            log.warning("conversation %s was deleted before response %s ended", self.conversation_id, self.id)

    def _row(self, body: dict[str, Any]) -> Stored:
        status = str(body.get("status") or "in_progress")
        return Stored(
            self.id, self.tenant, status, self.previous_id, self.root_id, self.conversation_id, body, self.input
        )

    async def write(self, body: dict[str, Any] | None, final: Final | None = None) -> None:
        """Keep the response as it is now (raises :class:`NotStored`);
        ``final``: the answer it ended with."""
        await self.join(body, final)
        if not self.kept or body is None:
            return
        try:
            await self.store.put(self._row(body))
        except (StateError, OSError, Exception) as exc:  # noqa: BLE001 - any failure to keep it is a 503
            log.error("response %s could not be stored: %s", self.id, exc)
            raise NotStored(exc) from None

    async def keep(self, renderer: Renderer) -> None:
        """Keep the response the renderer last built (a stream's end)."""
        if isinstance(renderer, ResponsesRenderer):
            await self.write(renderer.result, renderer.answered)

    async def begin(self, renderer: Renderer) -> None:
        """Keep it as running, before generation (a 503 before any byte)."""
        if isinstance(renderer, ResponsesRenderer):
            await self.write(renderer.snapshot())


def _check_background(body: ResponsesRequest) -> None:
    """A background response is kept (OpenAI: it needs ``store``): it is
    polled, or streamed (``stream``, or ``GET ...?stream=true`` later), by its id."""
    if body.background and body.store is False:
        raise BadRequest("background responses require store: true (a background run is polled by its id)", "store")


async def resolved(store: ResponseStore, tenant: str, items: list[Any], field: str = "input") -> list[Any]:
    """``items`` with each ``item_reference`` replaced by the item it names:
    one this tenant keeps (a stored response's input or output, or a
    conversation's); 404 naming it when there is none."""
    out: list[Any] = []
    for n, raw in enumerate(items):
        if isinstance(raw, dict) and raw.get("type") == "item_reference":
            item_id = raw.get("id")
            if not isinstance(item_id, str) or not item_id:
                raise BadRequest(f"'{field}[{n}].id' must be the id of a stored item", f"{field}[{n}].id")
            found = await store.item(item_id, tenant)
            if found is None:
                raise BadRequest(
                    f"Item with id '{item_id}' not found.", f"{field}[{n}].id", status=404, code="not_found"
                )
            raw = found
        out.append(raw)
    return out


def tenant_of(request: Request) -> str:
    tenant = context(request).tenant
    return tenant if tenant is not None else ""


async def open_turn(body: BaseModel, request: Request) -> tuple[BaseModel, Turn | None]:
    """The body as the translation should see it (a chain's items before the
    new input), and the turn (None: this server keeps no responses)."""
    store = state_of(request).responses
    if store is None or not isinstance(body, ResponsesRequest):
        return body, None
    _check_background(body)
    tenant = tenant_of(request)
    if isinstance(body.input, list):
        body = body.model_copy(update={"input": await resolved(store, tenant, body.input)})
    cid = conversation_named(body)
    own = conversation_items(body.input) if cid is not None else input_items(body.input)
    items: list[dict[str, Any]] = []
    root = rid = new_id("resp_")
    if body.previous_response_id is not None:
        chain = await store.chain(body.previous_response_id, tenant)
        if chain is None:
            raise not_found(body.previous_response_id)
        items, root = chain_items(chain), chain[0].root_id
    elif cid is not None:
        items = await conversation_before(store, cid, tenant)
    update = {
        "input": items + own if items else body.input,
        "previous_response_id": None,
        "conversation": None,
        "background": None,
    }
    expanded = body.model_copy(update=update)
    turn = Turn(store, tenant, rid, body.store is not False, body.previous_response_id, root, own)
    if cid is not None:
        turn.conversation_id, turn.extras["conversation"] = cid, {"id": cid}
    if body.background:
        turn.extras["background"] = True
    ctx = context(request)
    ctx.response_id, ctx.previous_response_id = rid, body.previous_response_id
    turn.request_id = ctx.id
    return expanded, turn
