"""Stateful Responses (issue 37) on the real bundled model through the
official ``openai`` SDK: stored responses read back and deleted, chains by
``previous_response_id`` (function calls across turns included) answered
from warm KV, input items paged, input tokens counted, tenants kept apart,
and a store that cannot write refusing with a 503."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from turbospark import ListObserver, Server

KEYS = ("key-a", "key-b")
#: an answer that goes on past 400 tokens at temperature 0 (a count ends within a few)
LONG = "Write a long story about a dragon who learns to bake bread, in many chapters."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    events = ListObserver()
    srv = Server(
        observer=events,
        api_keys=KEYS,
        state_dir=str(tmp_path_factory.mktemp("state")),
        model_defaults={"ctx": 2048, "parallel": 4},
    ).start()
    yield srv, events
    srv.stop()


def client(srv: Server, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)


def made(events: ListObserver, response_id: str) -> tuple:
    """The ``requestRouted`` and ``generated`` events of the request that made ``response_id``."""
    (routed,) = [e for e in events.events if e.kind == "requestRouted" and e.response_id == response_id]
    (gen,) = [e for e in events.events if e.kind == "generated" and e.id == routed.id]
    return routed, gen


def test_store_retrieve_chain_and_warm_kv(served):
    srv, events = served
    oai = client(srv)
    first = oai.responses.create(model="m", input="My name is Ada. Say hello to me.", max_output_tokens=12)
    assert first.store is True and first.status in ("completed", "incomplete")
    again = oai.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text and again.usage == first.usage

    second = oai.responses.create(
        model="m", input="What is my name?", previous_response_id=first.id, max_output_tokens=8
    )
    assert second.previous_response_id == first.id
    # the chain's items came before the new input: the first turn's input and answer
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens
    routed, gen = made(events, second.id)
    assert gen.reused_prefix_tokens > 0  # the first turn's KV, found with no session key from the client
    assert routed.previous_response_id == first.id and routed.to_dict()["responseId"] == second.id

    third = oai.responses.create(model="m", input="Thanks.", previous_response_id=second.id, max_output_tokens=4)
    assert third.usage.input_tokens > second.usage.input_tokens
    with pytest.raises(openai.NotFoundError) as err:
        oai.responses.create(model="m", input="hi", previous_response_id="resp_nope", max_output_tokens=2)
    assert err.value.code == "previous_response_not_found"


def test_store_false_keeps_nothing_and_delete_forgets(served):
    srv, _ = served
    oai = client(srv)
    loose = oai.responses.create(model="m", input="Hi", store=False, max_output_tokens=2)
    assert loose.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(loose.id)
    with pytest.raises(openai.NotFoundError) as err:
        oai.responses.create(model="m", input="Hi", previous_response_id=loose.id, max_output_tokens=2)
    assert err.value.code == "previous_response_not_found"
    kept = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    deleted = httpx.delete(f"{srv.url}/v1/responses/{kept.id}", headers={"Authorization": f"Bearer {KEYS[0]}"})
    assert deleted.json() == {"id": kept.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(kept.id)
    oai.responses.create(model="m", input="Hi", max_output_tokens=2)  # (the SDK's own delete too)
    listed = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    oai.responses.delete(listed.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(listed.id)


def test_another_tenant_finds_nothing(served):
    srv, _ = served
    mine = client(srv, KEYS[0]).responses.create(model="m", input="Hi", max_output_tokens=2)
    theirs = client(srv, KEYS[1])
    for call in (
        lambda: theirs.responses.retrieve(mine.id),
        lambda: theirs.responses.input_items.list(mine.id),
        lambda: theirs.responses.delete(mine.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.NotFoundError) as err:  # the same 404 as an id that never was
        theirs.responses.create(model="m", input="Hi", previous_response_id=mine.id, max_output_tokens=2)
    assert err.value.code == "previous_response_not_found"
    assert client(srv, KEYS[0]).responses.retrieve(mine.id).id == mine.id  # still there for its owner


def test_input_items_are_paged(served):
    srv, _ = served
    oai = client(srv)
    said = [{"role": "user", "content": f"Line {n}."} for n in range(5)]
    made = oai.responses.create(model="m", input=said, max_output_tokens=2)
    page = oai.responses.input_items.list(made.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["Line 0.", "Line 1."] and page.has_more
    rest = oai.responses.input_items.list(made.id, order="asc", limit=10, after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["Line 2.", "Line 3.", "Line 4."] and not rest.has_more
    newest = oai.responses.input_items.list(made.id)  # desc, as OpenAI's default
    assert newest.data[0].content[0].text == "Line 4."
    everything = [i.content[0].text for i in oai.responses.input_items.list(made.id, order="asc")]
    assert everything == [f"Line {n}." for n in range(5)]  # (the SDK pages through)


def test_input_tokens_count_without_generating(served):
    srv, events = served
    oai = client(srv)
    before = sum(1 for e in events.events if e.kind == "generated")
    alone = oai.responses.input_tokens.count(model="m", input="What is my name?")
    first = oai.responses.create(model="m", input="My name is Ada.", max_output_tokens=4)
    chained = oai.responses.input_tokens.count(model="m", input="What is my name?", previous_response_id=first.id)
    assert 0 < alone.input_tokens < chained.input_tokens
    after = oai.responses.create(
        model="m", input="What is my name?", previous_response_id=first.id, max_output_tokens=2
    )
    assert after.usage.input_tokens == chained.input_tokens  # what it said the turn would prefill
    assert sum(1 for e in events.events if e.kind == "generated") == before + 2  # counting generated nothing


def test_function_calls_across_turns_and_a_streamed_turn_replayed(served):
    srv, _ = served
    oai = client(srv)
    asked = oai.responses.create(
        model="m",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
    )
    (call,) = [item for item in asked.output if item.type == "function_call"]
    streamed = list(
        oai.responses.create(
            model="m",
            previous_response_id=asked.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear", "c": 21}'}],
            tools=[WEATHER],
            max_output_tokens=16,
            stream=True,
        )
    )
    done = streamed[-1].response  # (completed, or incomplete at the cap)
    assert done.previous_response_id == asked.id and done.status in ("completed", "incomplete")
    assert done.usage.input_tokens > asked.usage.input_tokens
    kept = oai.responses.retrieve(done.id)
    assert kept.output_text == done.output_text and kept.status == done.status
    replayed = list(oai.responses.retrieve(done.id, stream=True))
    assert replayed[0].type == "response.created" and replayed[-1].type == f"response.{done.status}"
    text = "".join(e.delta for e in replayed if e.type == "response.output_text.delta")
    assert text == done.output_text
    items = oai.responses.input_items.list(done.id).data
    assert [i.type for i in items] == ["function_call_output"]


def test_many_clients_lose_no_row(served):
    srv, _ = served
    ids: list[str] = []
    lock = threading.Lock()

    def one(n: int) -> None:
        made = client(srv).responses.create(model="m", input=f"Say {n}.", max_output_tokens=1)
        with lock:
            ids.append(made.id)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(set(ids)) == 64
    oai = client(srv)
    assert all(oai.responses.retrieve(rid).id == rid for rid in ids)


def test_a_store_that_cannot_write_is_a_503(served, monkeypatch):
    srv, events = served
    store = srv.assembly.state.responses

    async def broken(stored):  # a disk full, a lost volume: what no real model run can be made to do
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "put", broken)
    oai = client(srv)
    before = sum(1 for e in events.events if e.kind == "generated")
    with pytest.raises(openai.InternalServerError) as err:
        oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    assert err.value.status_code == 503 and "could not be stored" in err.value.message
    with pytest.raises(openai.InternalServerError):  # a stream too, before its first byte
        oai.responses.create(model="m", input="Hi", max_output_tokens=2, stream=True)
    assert sum(1 for e in events.events if e.kind == "generated") == before  # no engine time spent
    loose = oai.responses.create(model="m", input="Hi", store=False, max_output_tokens=2)
    assert loose.status in ("completed", "incomplete")


def test_a_state_file_that_cannot_be_used_is_refused_at_start(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "responses.sqlite3").write_bytes(b"this is no database" * 100)
    newer = tmp_path / "newer"
    newer.mkdir()
    with sqlite3.connect(newer / "responses.sqlite3") as db:
        db.execute("CREATE TABLE t (x)")
        db.execute("PRAGMA user_version=99")
    for folder, said in ((blocker / "state", "cannot be created"), (corrupt, "cannot be used"), (newer, "newer")):
        out = subprocess.run(
            [sys.executable, "-m", "turbospark.cli", "serve", "--port", "0", "--state-dir", str(folder)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2 and str(folder) in out.stderr and said in out.stderr, out.stderr


def _poll(oai: openai.OpenAI, rid: str, until: tuple[str, ...], seconds: float = 120):
    deadline = time.monotonic() + seconds
    while True:
        got = oai.responses.retrieve(rid)
        if got.status in until or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_background_answers_queued_runs_on_and_is_polled(served):
    srv, events = served
    oai = client(srv)
    queued = oai.responses.create(model="m", input="Say hello.", background=True, max_output_tokens=8)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    done = _poll(oai, queued.id, ("completed", "incomplete", "failed", "cancelled"))
    assert done.status in ("completed", "incomplete") and done.output_text and done.usage.output_tokens > 0
    assert done.background is True and done.created_at == queued.created_at
    # the run is a request of its own: started, routed (naming the response), generated, finished
    (routed,) = [e for e in events.events if e.kind == "requestRouted" and e.response_id == queued.id]
    own = [e.kind for e in _settled(events, routed.id)]
    assert own[0] == "requestStarted" and own[-1] == "requestFinished" and "generated" in own
    (began,) = [e for e in events.events if e.kind == "requestStarted" and e.id == routed.id]
    assert began.method == "POST" and began.path == "/v1/responses (background)"
    (ended,) = [e for e in events.events if e.kind == "requestFinished" and e.id == routed.id]
    assert ended.status == 200 and ended.error is None
    chained = oai.responses.create(model="m", input="Again.", previous_response_id=queued.id, max_output_tokens=2)
    assert chained.usage.input_tokens > done.usage.input_tokens  # a background response continues a chain


def _settled(events: ListObserver, rid: int, seconds: float = 30) -> list:
    deadline = time.monotonic() + seconds
    while not any(e.kind == "requestFinished" for e in events.of(rid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return events.of(rid)


def test_background_cancel_stops_the_engine_run(served):
    srv, events = served
    oai = client(srv)
    long = oai.responses.create(model="m", input=LONG, temperature=0, background=True, max_output_tokens=400)
    running = _poll(oai, long.id, ("in_progress", "completed", "incomplete", "failed"))
    assert running.status == "in_progress"
    cancelled = oai.responses.cancel(long.id)
    assert cancelled.id == long.id and cancelled.status == "cancelled"
    assert oai.responses.retrieve(long.id).status == "cancelled"
    assert oai.responses.cancel(long.id).status == "cancelled"  # again: the same answer (idempotent)
    (routed,) = [e for e in events.events if e.kind == "requestRouted" and e.response_id == long.id]
    (gen,) = [e for e in _settled(events, routed.id) if e.kind == "generated"]
    assert gen.stop_reason == "cancelled" and gen.new_tokens < 400  # the engine run stopped

    ended = oai.responses.create(model="m", input="Hi", background=True, max_output_tokens=2)
    _poll(oai, ended.id, ("completed", "incomplete"))
    with pytest.raises(openai.BadRequestError):  # already ended
        oai.responses.cancel(ended.id)
    foreground = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:  # not a background one
        oai.responses.cancel(foreground.id)
    assert "background" in err.value.message
    with pytest.raises(openai.NotFoundError):  # another tenant's
        client(srv, KEYS[1]).responses.cancel(long.id)


def test_background_needs_store(served):
    srv, _ = served
    oai = client(srv)
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model="m", input="Hi", background=True, store=False)
    assert err.value.param == "store"


def test_the_openai_agents_sdk_chains_its_turns(served):
    """The real OpenAI Agents SDK (its Responses model) with one function
    tool: the first turn calls it (required; the run stops on its output:
    the tiny model's own next move is not the test), the second continues by
    ``previous_response_id`` and answers."""
    agents = pytest.importorskip("agents")
    srv, events = served
    agents.set_tracing_disabled(True)
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"Sunny and 21 C in {city}."

    async def two_turns() -> tuple:
        oai = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=KEYS[0], max_retries=0, timeout=120)
        agent = agents.Agent(
            name="weather",
            instructions="Answer with the weather tool.",
            model=agents.OpenAIResponsesModel(model="m", openai_client=oai),
            tools=[get_weather],
            model_settings=agents.ModelSettings(tool_choice="required", max_tokens=200, temperature=0),
            tool_use_behavior="stop_on_first_tool",
        )
        first = await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3)
        talk = agent.clone(model_settings=agents.ModelSettings(tool_choice="none", max_tokens=200, temperature=0))
        second = await agents.Runner.run(
            talk, "Thanks! Anything else?", previous_response_id=first.last_response_id, max_turns=3
        )
        await oai.close()
        return first, second

    first, second = asyncio.run(two_turns())
    assert len(asked) == 1 and first.final_output == f"Sunny and 21 C in {asked[0]}."
    assert isinstance(second.final_output, str) and second.final_output
    (routed,) = [e for e in events.events if e.kind == "requestRouted" and e.response_id == second.last_response_id]
    assert routed.previous_response_id == first.last_response_id  # the second turn went by the chain
    kept = client(srv).responses.retrieve(second.last_response_id)
    assert kept.status == "completed" and kept.previous_response_id == first.last_response_id


def test_a_drain_waits_for_a_background_run_then_cuts_it(tmp_path):
    """A background run is a request in flight for the graceful drain: it
    gets the drain timeout, then is cut like any other and kept ``failed``
    (never left ``in_progress``), its own ``requestFinished`` naming why."""
    events = ListObserver()
    srv = Server(observer=events, state_dir=str(tmp_path), drain_timeout=0.5, model_defaults={"ctx": 2048}).start()
    try:
        oai = client(srv)
        long = oai.responses.create(model="m", input=LONG, temperature=0, background=True, max_output_tokens=400)
        assert _poll(oai, long.id, ("in_progress", "completed", "incomplete", "failed")).status == "in_progress"
    finally:
        srv.stop()
    with sqlite3.connect(tmp_path / "responses.sqlite3") as db:  # (as kept: no restart's recovery in between)
        status, body = db.execute("SELECT status, body FROM responses WHERE id = ?", (long.id,)).fetchone()
    assert status == "failed" and "shutting down" in json.loads(body)["error"]["message"]
    (routed,) = [e for e in events.events if e.kind == "requestRouted" and e.response_id == long.id]
    (ended,) = [e for e in events.of(routed.id) if e.kind == "requestFinished"]
    assert "shutting down" in (ended.error or "")
