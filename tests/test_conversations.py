"""Conversations (issue 37) on the real bundled model through the official
``openai`` SDK: a conversation created, read, its metadata replaced and
deleted; its items added, paged, read and deleted; ``responses.create``
turns in a conversation (one streamed) reading its items first and
appending theirs when they end, from warm KV, the last with the engine's
numbers for its request; tenants kept apart."""

from __future__ import annotations

import openai
import pytest

from turbospark import ListObserver, Server

KEYS = ("key-a", "key-b")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    events = ListObserver()
    srv = Server(
        observer=events,
        api_keys=KEYS,
        state_dir=str(tmp_path_factory.mktemp("state")),
        model_defaults={"ctx": 2048, "parallel": 2},
    ).start()
    yield srv, events
    srv.stop()


def client(srv: Server, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)


def said(n: int) -> dict:
    return {"type": "message", "role": "user", "content": f"Line {n}."}


def text(item) -> str:
    return item.content[0].text


def test_create_retrieve_update_delete(served):
    srv, _ = served
    oai = client(srv)
    made = oai.conversations.create(metadata={"topic": "demo"}, items=[said(0), said(1)])
    assert made.id.startswith("conv_") and made.object == "conversation" and made.metadata == {"topic": "demo"}
    assert made.created_at > 0
    again = oai.conversations.retrieve(made.id)
    assert again.model_dump() == made.model_dump()
    first = oai.conversations.items.list(made.id, order="asc").data
    assert [text(i) for i in first] == ["Line 0.", "Line 1."]
    assert all(i.id.startswith("msg_") and i.status == "completed" and i.role == "user" for i in first)

    updated = oai.conversations.update(made.id, metadata={"topic": "other", "k": "v"})
    assert updated.id == made.id and updated.metadata == {"topic": "other", "k": "v"}
    assert oai.conversations.retrieve(made.id).metadata == {"topic": "other", "k": "v"}

    gone = oai.conversations.delete(made.id)
    assert gone.model_dump() == {"id": made.id, "object": "conversation.deleted", "deleted": True}
    for call in (
        lambda: oai.conversations.retrieve(made.id),
        lambda: oai.conversations.delete(made.id),
        lambda: oai.conversations.items.list(made.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    empty = oai.conversations.create()
    assert empty.metadata == {} and oai.conversations.items.list(empty.id).data == []


def test_bad_bodies_are_400s(served):
    srv, _ = served
    oai = client(srv)
    with pytest.raises(openai.BadRequestError) as err:
        oai.conversations.create(items=[said(n) for n in range(21)])  # up to 20 at a time, as OpenAI
    assert err.value.param == "items"
    with pytest.raises(openai.BadRequestError) as err:
        oai.conversations.create(metadata={f"k{n}": "v" for n in range(17)})
    assert err.value.param == "metadata"
    with pytest.raises(openai.BadRequestError) as err:
        oai.conversations.create(items=[said(0), {"type": "bogus"}])
    assert err.value.param == "items[1].type"
    with pytest.raises(openai.BadRequestError) as err:
        oai.conversations.create(items=[{"type": "message", "role": "pirate", "content": "Arr"}])
    assert err.value.param.startswith("items[0]")
    made = oai.conversations.create()
    with pytest.raises(openai.BadRequestError):
        oai.conversations.items.create(made.id, items=[])
    with pytest.raises(openai.BadRequestError) as err:  # asked for, never silently left out
        oai.conversations.items.list(made.id, include=["message.output_text.logprobs"])
    assert err.value.param == "include"
    with pytest.raises(openai.NotFoundError):
        oai.conversations.items.create("conv_nope", items=[said(0)])


def test_items_create_list_retrieve_delete(served):
    srv, _ = served
    oai = client(srv)
    conv = oai.conversations.create(items=[said(0)])
    added = oai.conversations.items.create(conv.id, items=[said(n) for n in range(1, 5)])
    assert [text(i) for i in added.data] == ["Line 1.", "Line 2.", "Line 3.", "Line 4."]
    assert added.first_id == added.data[0].id and added.last_id == added.data[-1].id and not added.has_more

    page = oai.conversations.items.list(conv.id, order="asc", limit=2)
    assert [text(i) for i in page.data] == ["Line 0.", "Line 1."] and page.has_more
    rest = oai.conversations.items.list(conv.id, order="asc", limit=10, after=page.data[-1].id)
    assert [text(i) for i in rest.data] == ["Line 2.", "Line 3.", "Line 4."] and not rest.has_more
    newest = oai.conversations.items.list(conv.id, limit=2)  # desc, as OpenAI's default
    assert [text(i) for i in newest.data] == ["Line 4.", "Line 3."] and newest.has_more
    everything = [text(i) for i in oai.conversations.items.list(conv.id, order="asc", limit=2)]
    assert everything == [f"Line {n}." for n in range(5)]  # (the SDK pages through)

    third = added.data[1]
    assert oai.conversations.items.retrieve(third.id, conversation_id=conv.id).model_dump() == third.model_dump()
    after = oai.conversations.items.delete(third.id, conversation_id=conv.id)
    assert after.object == "conversation" and after.id == conv.id  # the conversation, as OpenAI answers
    left = [text(i) for i in oai.conversations.items.list(conv.id, order="asc")]
    assert left == ["Line 0.", "Line 1.", "Line 3.", "Line 4."]
    for call in (
        lambda: oai.conversations.items.retrieve(third.id, conversation_id=conv.id),
        lambda: oai.conversations.items.delete(third.id, conversation_id=conv.id),
        lambda: oai.conversations.items.retrieve("msg_nope", conversation_id="conv_nope"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()


def made_by(events: ListObserver, response_id: str) -> tuple:
    """The ``requestRouted`` and ``generated`` events of the request that made ``response_id``."""
    (routed,) = [e for e in events.events if e.kind == "requestRouted" and e.response_id == response_id]
    (gen,) = [e for e in events.events if e.kind == "generated" and e.id == routed.id]
    return routed, gen


def test_turns_in_a_conversation(served):
    srv, events = served
    oai = client(srv)
    conv = oai.conversations.create(metadata={"user": "ada"})
    first = oai.responses.create(
        model="m", input="My name is Ada. Say hello to me.", conversation=conv.id, max_output_tokens=12
    )
    assert first.conversation.id == conv.id and first.status in ("completed", "incomplete")
    asked = oai.responses.input_tokens.count(model="m", input="What is my name?", conversation=conv.id)
    streamed = list(
        oai.responses.create(
            model="m", input="What is my name?", conversation={"id": conv.id}, max_output_tokens=8, stream=True
        )
    )
    assert streamed[0].type == "response.created" and streamed[0].response.conversation.id == conv.id
    second = streamed[-1].response
    assert second.conversation.id == conv.id and second.previous_response_id is None
    # the conversation's items came before the new input: the first turn's input and answer
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens == asked.input_tokens  # what counting said the turn would prefill
    _, gen = made_by(events, second.id)
    assert gen.reused_prefix_tokens > 0  # the first turn's KV: the conversation names the session

    # both turns' inputs and outputs, in order
    items = list(oai.conversations.items.list(conv.id, order="asc"))
    inputs = [oai.responses.input_items.list(r.id).data[0].id for r in (first, second)]
    expected = [inputs[0], *[o.id for o in first.output], inputs[1], *[o.id for o in second.output]]
    assert [i.id for i in items] == expected
    assert text(items[0]) == "My name is Ada. Say hello to me." and items[0].role == "user"
    assert items[1].role == "assistant" and text(items[1]) == first.output_text
    assert oai.responses.retrieve(second.id).conversation.id == conv.id

    # store: false keeps no response, but its items still join the conversation (as OpenAI)
    loose = oai.responses.create(model="m", input="Thanks.", conversation=conv.id, store=False, max_output_tokens=2)
    assert loose.store is False and loose.conversation.id == conv.id
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(loose.id)
    tail = oai.conversations.items.list(conv.id, limit=len(loose.output) + 1).data
    assert [i.id for i in reversed(tail)][1:] == [o.id for o in loose.output]
    assert text(tail[-1]) == "Thanks."
    assert loose.usage.input_tokens > second.usage.input_tokens


def test_conversation_errors_on_responses(served):
    srv, _ = served
    oai = client(srv)
    conv = oai.conversations.create()
    first = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:  # one or the other, as OpenAI
        oai.responses.create(
            model="m", input="Hi", conversation=conv.id, previous_response_id=first.id, max_output_tokens=2
        )
    assert err.value.param == "conversation"
    with pytest.raises(openai.NotFoundError) as err:
        oai.responses.create(model="m", input="Hi", conversation="conv_nope", max_output_tokens=2)
    assert err.value.param == "conversation"
    assert oai.conversations.items.list(conv.id).data == []  # a refused turn added nothing


def test_another_tenant_finds_nothing(served):
    srv, _ = served
    mine = client(srv, KEYS[0])
    conv = mine.conversations.create(metadata={"owner": "a"}, items=[said(0)])
    (item,) = mine.conversations.items.list(conv.id).data
    theirs = client(srv, KEYS[1])
    for call in (
        lambda: theirs.conversations.retrieve(conv.id),
        lambda: theirs.conversations.update(conv.id, metadata={"owner": "b"}),
        lambda: theirs.conversations.delete(conv.id),
        lambda: theirs.conversations.items.list(conv.id),
        lambda: theirs.conversations.items.create(conv.id, items=[said(1)]),
        lambda: theirs.conversations.items.retrieve(item.id, conversation_id=conv.id),
        lambda: theirs.conversations.items.delete(item.id, conversation_id=conv.id),
        lambda: theirs.responses.create(model="m", input="Hi", conversation=conv.id, max_output_tokens=2),
    ):
        with pytest.raises(openai.NotFoundError):  # the same 404 as an id that never was
            call()
    assert mine.conversations.retrieve(conv.id).metadata == {"owner": "a"}  # untouched, still its owner's
    assert [i.id for i in mine.conversations.items.list(conv.id).data] == [item.id]


def test_a_turns_answer_keeps_the_engines_numbers(served):
    """The last item a turn adds to its conversation carries the engine's
    numbers for that request (this server's ``timings``: llama.cpp's object,
    the queue wait, the request's id), so a page read back later shows them
    without one request per answer; the response object itself is OpenAI's."""
    srv, events = served
    oai = client(srv)
    conv = oai.conversations.create()
    for stream in (False, True):
        if stream:
            done = list(oai.responses.create(model="m", input="Hi.", conversation=conv.id, max_output_tokens=3,
                                             stream=True))[-1].response  # fmt: skip
        else:
            done = oai.responses.create(model="m", input="Hi.", conversation=conv.id, max_output_tokens=3)
        routed, gen = made_by(events, done.id)
        last = oai.conversations.items.list(conv.id, limit=1).data[0].model_dump()
        assert last["id"] == done.output[-1].id and "timings" not in done.output[-1].model_dump()
        t = last["timings"]
        assert t["request_id"] == routed.id and t["predicted_n"] == gen.new_tokens == done.usage.output_tokens
        reused = gen.reused_prefix_tokens
        assert t["cache_n"] == reused and t["prompt_n"] == gen.prompt_tokens - reused
        assert t["prompt_ms"] == pytest.approx(gen.prefill_seconds * 1000)
        assert t["queue_ms"] == pytest.approx(gen.queue_seconds * 1000)
        assert t["predicted_ms"] == pytest.approx(gen.decode_seconds * 1000) and t["stop_reason"] == gen.stop_reason
        assert "timings" not in oai.responses.retrieve(done.id).output[-1].model_dump()
