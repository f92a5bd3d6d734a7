"""Tenants see only their own (CONTRACT §5): with API keys, a non-admin key
sees in /v1/events, /v1/stats and /v1/slots only its own tenant's requests
and slots (and every model attach/detach); an admin key sees everything;
session keys are shown hashed, never raw, keys or no keys."""

from __future__ import annotations

import asyncio

import httpx
import openai
import orjson
import pytest

from turbospark.access.auth import tenant_of
from turbospark.observe import (
    FanOut,
    Generated,
    ListObserver,
    ModelAttached,
    RequestFinished,
    RequestRouted,
    RequestStarted,
    request_tenant,
)
from turbospark.routes.admin import owner_hash, session_hash
from turbospark.sinks.live import LiveEvents

from .views_support import FrameReader, chat, fresh_server

KEY_A, KEY_B, ADMIN = "key-a", "key-b", "admin-k"
SESSION_A, SESSION_B = "sess-a-secret", "sess-b-secret"
TIMEOUT = httpx.Timeout(60.0)
#: the chat requests this module made as each tenant, in order
MADE: dict[str, list[int]] = {"a": [], "b": []}


# ------------------------------------------------------ the sink, by itself


def request(rid: int, new: int = 1) -> list:
    return [
        RequestStarted(id=rid, at_ms=rid, method="POST", path="/v1/chat/completions"),
        RequestRouted(id=rid, requested="m", served="m", stream=False),
        Generated(
            id=rid,
            model="m",
            prompt_tokens=3,
            new_tokens=new,
            prefill_seconds=0.1,
            decode_seconds=0.1,
            stop_reason="maxTokens",
            reused_prefix_tokens=0,
            session_slot_evicted=False,
        ),
        RequestFinished(id=rid, status=200, duration_ms=300),
    ]


def run(live: LiveEvents, rid: int, tenant: str | None, new: int = 1) -> None:
    """One request as the middleware reports it: its start, then (if its key
    was accepted) its tenant, then the rest."""
    start, *rest = request(rid, new)
    live.record(start)
    if tenant is not None:
        live.request_tenant(rid, tenant)
    for e in rest:
        live.record(e)


def ids(items) -> list[int | None]:
    return [orjson.loads(i.data).get("id") for i in items]


def test_fold_ring_and_replay_are_per_tenant_models_for_everyone():
    async def main():
        live = LiveEvents()
        live.record(ModelAttached(at_ms=0, model="m"))
        run(live, 1, "a", new=2)
        run(live, 2, "b", new=5)
        run(live, 3, None)  # refused: never told a tenant
        run(live, 4, "a", new=3)
        a = live.summary(tenant="a")
        assert [r["id"] for r in a["records"]] == [1, 4]
        assert (a["requests"], a["newTokens"], a["generations"], a["models"]) == (2, 5, 2, ["m"])
        assert live.summary(tenant="b")["newTokens"] == 5
        assert live.summary(tenant="nobody")["records"] == [] and live.summary(tenant="nobody")["models"] == ["m"]
        everyone = live.summary()
        assert [r["id"] for r in everyone["records"]] == [1, 2, 3, 4] and everyone["newTokens"] == 11
        assert a["seq"] == everyone["seq"] == 17

        sub, gap, replay = live.subscribe(0, "a")
        assert gap is None
        assert ids(replay) == [None, 1, 1, 1, 1, 4, 4, 4, 4]
        assert replay[0].kind == "modelAttached"
        _, _, all_of_it = live.subscribe(0)
        assert len(all_of_it) == 17
        # resumed mid-way: holes in the numbering, no gap
        _, gap, later = live.subscribe(replay[2].seq, "a")
        assert gap is None and [i.seq for i in later] == [i.seq for i in replay[3:]]

    asyncio.run(main())


def test_live_stream_skips_other_tenants_without_gaps_and_holds_a_start_until_told():
    async def main():
        live = LiveEvents(max_queue=3)
        sub, _, _ = live.subscribe(None, "a")
        admin, _, _ = live.subscribe(None)
        for rid in range(10, 20):  # far more than the queue holds, all B's
            run(live, rid, "b")
        assert live.take(sub) == (None, [])
        assert live.take(admin)[0] is not None  # the admin's queue did overflow
        # a start whose tenant is not known yet is held, in order, until told
        start, *rest = request(30)
        live.record(start)
        assert live.take(sub) == (None, [])
        live.request_tenant(30, "a")
        await asyncio.wait_for(sub.wake.wait(), 1)
        sub.wake.clear()
        gap, items = live.take(sub)
        assert gap is None and ids(items) == [30]
        for e in rest:
            live.record(e)
        assert ids(live.take(sub)[1]) == [30, 30, 30]
        # refused: its start is dropped once it is over
        run(live, 31, None)
        assert live.take(sub) == (None, [])
        live.record(ModelAttached(at_ms=1, model="n"))
        assert [i.kind for i in live.take(sub)[1]] == ["modelAttached"]

    asyncio.run(main())


def test_a_tenant_gets_a_gap_only_for_its_own_evicted_events():
    async def main():
        live = LiveEvents(max_events=4)
        run(live, 1, "a")  # seqs 1-4
        run(live, 2, "b")  # 5-8
        run(live, 3, "b")  # 9-12: the ring holds these only
        _, gap, replay = live.subscribe(0, "a")
        assert gap is not None and gap.to_dict() == {"missed": 4, "from": 1, "to": 4} and replay == []
        _, gap, replay = live.subscribe(4, "a")  # it saw its own: B's evictions are no gap
        assert gap is None and replay == []
        _, gap, replay = live.subscribe(0, "b")
        assert gap.to_dict() == {"missed": 4, "from": 5, "to": 8} and ids(replay) == [3, 3, 3, 3]
        _, gap, _ = live.subscribe(0)
        assert gap.to_dict() == {"missed": 8, "from": 1, "to": 8}

    asyncio.run(main())


def test_the_side_channel_reaches_only_observers_that_want_it():
    live, plain = LiveEvents(), ListObserver()
    assert FanOut([plain, ListObserver()]).request_tenant is None  # nobody wants it: no hook at all
    fan = FanOut([plain, live])
    fan.record(request(5)[0])
    fan.request_tenant(5, "a")
    request_tenant(fan, 6, "a")
    request_tenant(plain, 7, "a")  # no hook: nothing happens
    request_tenant(None, 8, "a")
    assert live.summary(tenant="a")["requests"] == 1
    assert [e.kind for e in plain.events] == ["requestStarted"]  # the events stay as they were


# ------------------------------------------------------- a real server


@pytest.fixture(scope="module")
def tenants(server):
    """A server with two tenants and an admin key, around the session's model."""
    with fresh_server(server, api_keys=[KEY_A, KEY_B], admin_keys=[ADMIN]) as srv:
        yield srv


def as_a(srv, **extra) -> int:
    """A chat request as tenant A, through the OpenAI SDK; its request id."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY_A, max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=2,
        temperature=0,
        extra_headers={"x-session-id": SESSION_A},
        **extra,
    )
    raw.parse()
    MADE["a"].append(int(raw.headers["x-request-id"]))
    return MADE["a"][-1]


def as_b(srv) -> int:
    r = chat(srv.url, max_tokens=2, headers={"x-api-key": KEY_B, "x-session-id": SESSION_B})
    assert r.status_code == 200, r.text
    MADE["b"].append(int(r.headers["x-request-id"]))
    return MADE["b"][-1]


def get(srv, path: str, key: str, **params) -> httpx.Response:
    r = httpx.get(srv.url + path, params=params, headers={"authorization": f"Bearer {key}"}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r


def test_stats_show_each_key_its_own_requests_and_the_admin_all(tenants):
    a1, b1, a2 = as_a(tenants), as_b(tenants), as_a(tenants)
    refused = httpx.post(tenants.url + "/v1/chat/completions", json={}, headers={"x-api-key": "wrong"})
    assert refused.status_code == 401
    refused_id = int(refused.headers["x-request-id"])

    everyone = get(tenants, "/v1/stats", ADMIN, requests=1000).json()
    by_id = {r["id"]: r for r in everyone["records"]}
    assert {a1, b1, a2, refused_id} <= set(by_id)

    for tenant, key in (("a", KEY_A), ("b", KEY_B)):
        own = MADE[tenant]
        mine = get(tenants, "/v1/stats", key, requests=1000).json()
        recs = mine["records"]  # the views' own reads (/v1/stats, /v1/events) are left out
        assert [r["id"] for r in recs if r["path"] == "/v1/chat/completions"] == own
        assert {r["path"] for r in recs} <= {"/v1/chat/completions", "/v1/slots"}
        assert (mine["requests"], mine["errors"], mine["generations"]) == (len(recs), 0, len(own))
        assert mine["newTokens"] == sum(by_id[i]["newTokens"] for i in own)
        assert mine["promptTokens"] == sum(by_id[i]["promptTokens"] for i in own)
        assert mine["models"] == everyone["models"] == ["smollm2-135m"]
        assert mine["perModel"]["smollm2-135m"]["requests"] == len(own)
        assert mine["seq"] >= everyone["seq"]
    assert {a1, a2} <= set(MADE["a"]) and b1 in MADE["b"]
    assert everyone["requests"] >= 4 and everyone["errors"] >= 1
    assert everyone["newTokens"] >= sum(by_id[i]["newTokens"] for i in MADE["a"] + MADE["b"])


def test_event_replay_and_live_stream_carry_only_the_tenants_requests(tenants):
    a1, b1, a2 = as_a(tenants), as_b(tenants), as_a(tenants)
    with httpx.Client(timeout=TIMEOUT, headers={"x-api-key": KEY_A}) as client:
        with client.stream("GET", tenants.url + "/v1/events", params={"since": 0}) as resp:
            assert resp.status_code == 200
            reader = FrameReader(resp)
            frames = reader.until(
                lambda fs: any(f.get("event") == "requestFinished" and f["data"]["id"] == a2 for f in fs)
            )
            evs = [f for f in frames if "event" in f]
            assert not [f for f in evs if f["event"] == "gap"]
            assert [f["data"]["model"] for f in evs if f["event"] == "modelAttached"] == ["smollm2-135m"]
            seen = {f["data"]["id"] for f in evs if "id" in f["data"]}
            assert {a1, a2} <= seen and not seen & set(MADE["b"])
            assert [int(f["id"]) for f in evs] == sorted({int(f["id"]) for f in evs})  # increasing
            # live: B's request, then A's, come in that order; only A's shows
            b2 = as_b(tenants)
            a3 = as_a(tenants)
            more = reader.until(
                lambda fs: any(f.get("event") == "requestFinished" and f["data"]["id"] == a3 for f in fs)
            )
            live_ids = {f["data"].get("id") for f in more if "event" in f}
            assert a3 in live_ids and b2 not in live_ids and not live_ids & set(MADE["b"])
            assert not [f for f in more if f.get("event") == "gap"]
            last = max(int(f["id"]) for f in more if "event" in f)
    # resuming from the last id seen: no gap frame for the other tenant's events in between
    b3 = as_b(tenants)
    a4 = as_a(tenants)
    with httpx.Client(timeout=TIMEOUT, headers={"x-api-key": KEY_A, "last-event-id": str(last)}) as client:
        with client.stream("GET", tenants.url + "/v1/events") as resp:
            frames = FrameReader(resp).until(
                lambda fs: any(f.get("event") == "requestFinished" and f["data"]["id"] == a4 for f in fs)
            )
    evs = [f for f in frames if "event" in f]
    resumed = {f["data"].get("id") for f in evs}
    assert a4 in resumed and b3 not in resumed and not [f for f in evs if f["event"] == "gap"]
    assert all(int(f["id"]) > last for f in evs)
    # the admin sees every tenant's events
    with httpx.Client(timeout=TIMEOUT, headers={"x-api-key": ADMIN}) as client:
        with client.stream("GET", tenants.url + "/v1/events", params={"since": 0}) as resp:
            frames = FrameReader(resp).until(
                lambda fs: any(f.get("event") == "requestFinished" and f["data"]["id"] == a4 for f in fs)
            )
    admin_ids = {f["data"].get("id") for f in frames if "event" in f}
    assert {a1, b1, a2, b2, a3, b3, a4} <= admin_ids


def test_slots_show_each_key_its_own_with_session_keys_hashed(tenants):
    as_a(tenants)
    as_b(tenants)
    mine, theirs = owner_hash(tenant_of(KEY_A)), owner_hash(tenant_of(KEY_B))
    a = get(tenants, "/v1/slots", KEY_A)
    assert SESSION_A not in a.text and SESSION_B not in a.text
    slots_a = a.json()["data"]
    assert slots_a and {s["owner"] for s in slots_a} == {mine}
    assert session_hash(SESSION_A) in {s["session_key"] for s in slots_a}
    assert session_hash(SESSION_A) == session_hash(SESSION_A) != SESSION_A  # stable, never the key

    b = get(tenants, "/v1/slots", KEY_B)
    assert SESSION_A not in b.text
    assert {s["owner"] for s in b.json()["data"]} == {theirs}

    admin = get(tenants, "/v1/slots", ADMIN)
    assert SESSION_A not in admin.text and SESSION_B not in admin.text
    owners = {s["owner"] for s in admin.json()["data"]}
    assert {mine, theirs} <= owners
    keys = {s["session_key"] for s in admin.json()["data"]}
    assert {session_hash(SESSION_A), session_hash(SESSION_B)} <= keys


def test_without_keys_everything_shows_but_session_keys_are_hashed(server):
    secret = "sess-open-secret"
    r = chat(server.url, max_tokens=2, headers={"x-session-id": secret})
    assert r.status_code == 200
    rid = int(r.headers["x-request-id"])
    slots = httpx.get(server.url + "/v1/slots", timeout=TIMEOUT)
    assert slots.status_code == 200 and secret not in slots.text
    assert session_hash(secret) in {s["session_key"] for s in slots.json()["data"]}
    stats = httpx.get(server.url + "/v1/stats", params={"requests": 1000}, timeout=TIMEOUT).json()
    assert rid in {rec["id"] for rec in stats["records"]}
