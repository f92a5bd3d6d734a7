"""The Responses API's stored state holds (issue 42, items 6, 7, 12, 13), on
the real bundled model through the official ``openai`` SDK: an expired
response or conversation is a 404 on every route at once, whatever the
clean-up timer; the store's folder and files are its owner's only; a
background run is streamed live (``background`` with ``stream``), watched
from the start or resumed after ``starting_after`` with no event missed or
repeated; ``item_reference`` inputs name a kept item."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import stat
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from turbospark import Server
from turbospark.state.responses import ResponseStore, Stored

KEYS = ("key-a", "key-b")
#: an answer that goes on past 400 tokens at temperature 0 (a count ends within a few)
LONG = "Write a long story about a dragon who learns to bake bread, in many chapters."
ENDS = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def stored(rid: str, tenant: str = "") -> Stored:
    body = {"id": rid, "object": "response", "status": "completed", "output": []}
    return Stored(rid, tenant, "completed", None, rid, None, body, [])


# -- item 7: the store is private -------------------------------------------------


def test_the_store_is_private_whatever_the_umask(tmp_path):
    folder = str(tmp_path / "made" / "state")
    old = os.umask(0)  # (the most open umask: nothing may depend on it)
    try:
        store = ResponseStore(folder)
        asyncio.run(store.put(stored("resp_1")))
    finally:
        os.umask(old)
    try:
        path = store.path
        assert mode(folder) == 0o700
        for name in (path, path + "-wal", path + "-shm"):
            assert os.path.exists(name) and mode(name) == 0o600, (name, oct(mode(name)))
    finally:
        store.close()
    for name in (path, path + "-wal", path + "-shm"):  # an older version's file, left open to all
        if os.path.exists(name):
            os.chmod(name, 0o644)
    again = ResponseStore(folder)
    try:
        assert mode(path) == 0o600 and asyncio.run(again.get("resp_1", "")) is not None
        assert all(mode(path + side) == 0o600 for side in ("-wal", "-shm") if os.path.exists(path + side))
    finally:
        again.close()


# -- item 6: expiry, read by read --------------------------------------------------


def test_a_short_ttl_expires_on_time_without_the_clean_up(tmp_path):
    """Kept 0.5 s: read back before, not found after (no clean-up ran in
    between). The store's own clock is moved, so a slow box cannot make the
    reads "before" come after the TTL."""
    now = [time.time()]
    store = ResponseStore(str(tmp_path), ttl=0.5, clock=lambda: now[0])
    try:

        async def before() -> tuple:
            await store.put(stored("resp_1"))
            conv = await store.conversations.create("", {}, [{"id": "msg_1", "type": "message"}])
            return conv, await store.get("resp_1", ""), await store.conversations.get(conv.id, "")

        conv, response, found = asyncio.run(before())
        assert response is not None and found is not None
        now[0] += 0.6  # (past the TTL: each read above kept it 0.5 s more at most)

        async def after() -> tuple:
            return (
                await store.get("resp_1", ""),
                await store.chain("resp_1", ""),
                await store.delete("resp_1", ""),
                await store.conversations.get(conv.id, ""),
                await store.conversations.items(conv.id, ""),
                await store.conversations.delete(conv.id, ""),
            )

        assert asyncio.run(after()) == (None, None, False, None, None, False)
    finally:
        store.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    srv = Server(
        api_keys=KEYS,
        state_dir=str(tmp_path_factory.mktemp("state")),
        model_defaults={"ctx": 2048, "parallel": 4},
    ).start()
    yield srv
    srv.stop()


def client(srv: Server, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)


@contextlib.contextmanager
def later(srv: Server, seconds: float) -> Iterator[None]:
    """The store's clock ``seconds`` ahead (its clean-up timer left as it is)."""
    store = srv.assembly.state.responses
    assert store is not None
    store.clock = lambda: time.time() + seconds
    try:
        yield
    finally:
        store.clock = time.time


def test_expired_is_404_on_every_route_at_once(served):
    oai = client(served)
    kept = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    conv = oai.conversations.create(items=[{"type": "message", "role": "user", "content": "Hello."}])
    (item,) = oai.conversations.items.list(conv.id).data
    headers = {"Authorization": f"Bearer {KEYS[0]}"}
    routes = [
        lambda: oai.responses.retrieve(kept.id),
        lambda: oai.responses.input_items.list(kept.id),
        lambda: oai.responses.create(model="m", input="Hi", previous_response_id=kept.id, max_output_tokens=2),
        lambda: oai.responses.cancel(kept.id),
        lambda: oai.responses.delete(kept.id),
        lambda: oai.conversations.retrieve(conv.id),
        lambda: oai.conversations.update(conv.id, metadata={"k": "v"}),
        lambda: oai.conversations.items.list(conv.id),
        lambda: oai.conversations.items.retrieve(item.id, conversation_id=conv.id),
        lambda: oai.conversations.items.create(conv.id, items=[{"role": "user", "content": "More."}]),
        lambda: oai.conversations.items.delete(item.id, conversation_id=conv.id),
        lambda: oai.responses.create(model="m", input="Hi", conversation=conv.id, max_output_tokens=2),
        lambda: oai.responses.create(model="m", input=[{"type": "item_reference", "id": item.id}], max_output_tokens=2),
        lambda: oai.conversations.delete(conv.id),
    ]
    with later(served, 31 * 86400):  # (past the default 30 days)
        for n, call in enumerate(routes):
            with pytest.raises(openai.NotFoundError):
                call()
                pytest.fail(f"route {n} answered an expired id")
        replay = httpx.get(f"{served.url}/v1/responses/{kept.id}?stream=true", headers=headers)
        assert replay.status_code == 404
    # nothing was deleted meanwhile: the same ids, read while they are kept, are there
    assert oai.responses.retrieve(kept.id).id == kept.id
    assert oai.conversations.items.retrieve(item.id, conversation_id=conv.id).id == item.id


# -- item 12: a background run watched and resumed --------------------------------


def numbered(events: list) -> list[int]:
    return [e.sequence_number for e in events]


def deltas(events: list) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_background_stream_is_live_and_resumes_after_starting_after(served):
    """Streamed as it runs; the client leaves after a few deltas and comes
    back after the last event it had: the rest, live, to its end (a cancel,
    so the test does not wait on 400 tokens)."""
    oai = client(served)
    first: list = []
    with oai.responses.create(
        model="m", input=LONG, temperature=0, max_output_tokens=400, background=True, stream=True
    ) as events:
        for event in events:
            first.append(event)
            if sum(e.type == "response.output_text.delta" for e in first) == 3:
                break  # the client leaves: the run goes on
    created = first[0]
    assert created.type == "response.created" and created.response.status == "queued"
    assert created.response.background is True and numbered(first) == list(range(len(first)))
    rid, last = created.response.id, first[-1].sequence_number
    assert oai.responses.retrieve(rid).status == "in_progress"  # still going when the reader comes back

    rest: list = []
    cancelled = None
    for event in oai.responses.retrieve(rid, stream=True, starting_after=last):
        rest.append(event)
        if cancelled is None and sum(e.type == "response.output_text.delta" for e in rest) == 3:
            cancelled = oai.responses.cancel(rid)  # (the stream goes on to its end)
    assert cancelled is not None and cancelled.status == "cancelled"
    assert numbered(rest) == list(range(last + 1, last + 1 + len(rest)))  # no gap, nothing twice
    assert [e.type for e in rest if e.type in ENDS] == ["response.cancelled"] == [rest[-1].type]
    end = rest[-1].response  # (an event type the SDK does not model: its fields as sent)
    kept = oai.responses.retrieve(rid)
    assert end["id"] == rid and end["status"] == kept.status == "cancelled"
    assert deltas(first + rest) == kept.output_text and kept.output_text

    # ended: the same events read back from the store, numbered as they were sent
    again = list(oai.responses.retrieve(rid, stream=True, starting_after=last))
    assert [(e.type, e.sequence_number) for e in again] == [(e.type, e.sequence_number) for e in rest]
    assert deltas(again) == deltas(rest)
    whole = list(oai.responses.retrieve(rid, stream=True))
    assert numbered(whole) == list(range(len(whole))) and deltas(whole) == kept.output_text


def test_a_running_background_response_deleted_stays_deleted(served):
    """Deleting a response whose background run still goes stops the run
    first: neither its row nor its events come back when the run ends."""
    oai = client(served)
    started = oai.responses.create(model="m", input=LONG, temperature=0, max_output_tokens=400, background=True)
    deadline = time.monotonic() + 120
    while oai.responses.retrieve(started.id).status == "queued" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert oai.responses.delete(started.id) is None
    assert served.assembly.state.background.log(started.id) is None  # the run is over
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(started.id)
    with pytest.raises(openai.NotFoundError):
        list(oai.responses.retrieve(started.id, stream=True))


def test_a_running_background_response_is_watched_from_the_start(served):
    oai = client(served)
    queued = oai.responses.create(
        model="m", input="Name the planets of the solar system in order.", temperature=0, max_output_tokens=100,
        background=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while oai.responses.retrieve(queued.id).status == "queued" and time.monotonic() < deadline:
        time.sleep(0.02)
    with oai.responses.stream(response_id=queued.id) as events:  # the SDK's helper, as OpenAI's
        seen = list(events)
        final = events.get_final_response()
    assert numbered(seen) == list(range(len(seen))) and seen[0].type == "response.created"
    assert final.id == queued.id and final.output_text and deltas(seen) == final.output_text


def test_starting_after_on_any_stored_response_and_bad_values(served):
    oai = client(served)
    done = oai.responses.create(model="m", input="Say hi.", max_output_tokens=4)
    whole = list(oai.responses.retrieve(done.id, stream=True))
    after = list(oai.responses.retrieve(done.id, stream=True, starting_after=1))
    assert numbered(after) == numbered(whole)[2:] and after[-1].type == whole[-1].type
    headers = {"Authorization": f"Bearer {KEYS[0]}"}
    for query in ("stream=true&starting_after=x", "stream=true&starting_after=-2", "starting_after=1"):
        r = httpx.get(f"{served.url}/v1/responses/{done.id}?{query}", headers=headers)
        assert r.status_code == 400 and r.json()["error"]["param"] == "starting_after", r.text
    with pytest.raises(openai.NotFoundError):  # another tenant's, streamed or not
        list(client(served, KEYS[1]).responses.retrieve(done.id, stream=True))


# -- item 13: item_reference --------------------------------------------------------


def test_item_reference_names_a_kept_item(served):
    oai = client(served)
    first = oai.responses.create(model="m", input="My name is Ada.", max_output_tokens=6)
    (said,) = oai.responses.input_items.list(first.id).data
    answer = first.output[-1]
    conv = oai.conversations.create(items=[{"type": "message", "role": "user", "content": "I live in Paris."}])
    (line,) = oai.conversations.items.list(conv.id).data
    refs = [{"type": "item_reference", "id": i} for i in (said.id, answer.id, line.id)]
    turn = oai.responses.create(
        model="m", input=[*refs, {"role": "user", "content": "Where do I live?"}], max_output_tokens=4
    )
    assert turn.status in ("completed", "incomplete")
    kept = oai.responses.input_items.list(turn.id, order="asc").data
    assert [i.id for i in kept[:3]] == [said.id, answer.id, line.id]
    assert [i.content[0].text for i in kept[:3]] == ["My name is Ada.", first.output_text, "I live in Paris."]
    plain = oai.responses.create(model="m", input="Where do I live?", max_output_tokens=4)
    assert turn.usage.input_tokens > plain.usage.input_tokens  # the model was given them

    again = oai.conversations.items.create(conv.id, items=[{"type": "item_reference", "id": said.id}])
    assert again.data[0].content[0].text == "My name is Ada."
    # naming a conversation's item is a use of it: kept another ttl from now
    other = oai.conversations.create(items=[{"type": "message", "role": "user", "content": "Blue."}])
    (blue,) = oai.conversations.items.list(other.id).data
    ttl = served.assembly.state.responses.ttl
    with later(served, ttl * 0.8):
        oai.responses.create(model="m", input=[{"type": "item_reference", "id": blue.id}], max_output_tokens=2)
    with later(served, ttl * 1.5):
        assert oai.conversations.retrieve(other.id).id == other.id

    for key, rid in ((KEYS[0], "msg_nope"), (KEYS[1], said.id)):  # unknown, or another tenant's
        with pytest.raises(openai.NotFoundError) as err:
            client(served, key).responses.create(
                model="m", input=[{"type": "item_reference", "id": rid}], max_output_tokens=2
            )
        assert rid in err.value.message and err.value.param == "input[0].id"


def test_a_version_1_file_is_migrated_and_keeps_its_responses(tmp_path):
    """A file written before events were kept (schema 1) is brought up to
    date in place: its responses stay, a run's events are kept and read back
    after a restart, in order."""
    from turbospark.state import responses

    v1 = responses.V2.replace(responses.EVENTS + ";", "")
    with sqlite3.connect(tmp_path / responses.FILE) as db:
        db.executescript(v1)
        db.execute(
            "INSERT INTO responses VALUES ('resp_old', '', ?, ?, 'completed', NULL, 'resp_old', NULL, ?, '[]')",
            (time.time(), time.time() + 60, json.dumps(stored("resp_old").body)),
        )
        db.execute("PRAGMA user_version=1")
    store = ResponseStore(str(tmp_path))
    try:
        assert asyncio.run(store.get("resp_old", "")) is not None
        asyncio.run(store.add_events("resp_old", 0, [b"event: a\n\n", b"event: b\n\n"]))
        asyncio.run(store.add_events("resp_old", 2, [b"event: c\n\n"]))
    finally:
        store.close()
    again = ResponseStore(str(tmp_path))
    try:
        found, events = asyncio.run(again.events("resp_old", ""))
        assert found is not None and events == [b"event: a\n\n", b"event: b\n\n", b"event: c\n\n"]
        assert asyncio.run(again.events("resp_old", "someone else")) == (None, [])
    finally:
        again.close()
    with sqlite3.connect(tmp_path / responses.FILE) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == responses.VERSION


def test_kept_events_of_a_cut_run_end_with_its_recovered_status(served):
    """A run a crash cut kept some events and no end: read back, they end with
    the terminal event of the response as kept, numbered after what the
    reader has."""
    from turbospark.dialects.common import sse_event

    oai = client(served)
    done = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    store = served.assembly.state.responses
    opening = ("response.created", "response.in_progress")
    body = done.model_dump()
    cut = [sse_event(t, {"type": t, "sequence_number": n, "response": body}) for n, t in enumerate(opening)]
    asyncio.run(store.add_events(done.id, 0, cut))
    read = list(oai.responses.retrieve(done.id, stream=True))
    assert [(e.type, e.sequence_number) for e in read] == [
        ("response.created", 0), ("response.in_progress", 1), (f"response.{done.status}", 2),
    ]  # fmt: skip
    late = list(oai.responses.retrieve(done.id, stream=True, starting_after=5))
    assert [(e.type, e.sequence_number) for e in late] == [(f"response.{done.status}", 6)]
    assert late[0].response.id == done.id
