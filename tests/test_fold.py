"""The one fold every view uses, and the live ring behind /v1/events
(unit level: no server; the HTTP side is in test_events_stream.py)."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from rich.text import Text

from turbospark.observe import (
    Generated,
    ModelAttached,
    ModelDetached,
    ModelHealth,
    ModelPull,
    RequestFinished,
    RequestRouted,
    RequestStarted,
)
from turbospark.sinks.live import LiveEvents
from turbospark.views.console.app import COLUMNS, details_text, row_cells
from turbospark.views.console.charts import pull_bar, rate_chart, size_text, sparkline, time_chart
from turbospark.views.console.client import SSEParser
from turbospark.views.fold import PULLS_KEPT, Chains, Fold, RequestRecord, percentile


def gen(rid, new=10, prompt=20, prefill=0.1, decode=0.5, reused=0, evicted=False, model="m", **kw):
    return Generated(
        id=rid,
        model=model,
        prompt_tokens=prompt,
        new_tokens=new,
        prefill_seconds=prefill,
        decode_seconds=decode,
        stop_reason="endOfTurn",
        reused_prefix_tokens=reused,
        session_slot_evicted=evicted,
        **kw,
    ).to_dict()


def started(rid, path="/v1/chat/completions", at=1000):
    return RequestStarted(id=rid, at_ms=at, method="POST", path=path).to_dict()


def routed(rid, stream=False, requested="gpt-4o", served="m", response=None, previous=None):
    return RequestRouted(
        id=rid, requested=requested, served=served, stream=stream, response_id=response, previous_response_id=previous
    ).to_dict()


def finished(rid, status=200, ms=1000, error=None):
    return RequestFinished(id=rid, status=status, duration_ms=ms, error=error).to_dict()


def test_percentile_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([1.0], 95) == 1.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 95) == 95.0


def test_fold_requests_tokens_timings_and_queue():
    f = Fold()
    f.feed(ModelAttached(at_ms=1, model="m").to_dict())
    # 1: non-streamed, fallback, prefix reuse; the engine's queue 250 ms;
    # overhead = 1000 - (250 + 100 + 500) = 150 ms
    for e in (started(1), routed(1), gen(1, new=10, prompt=20, reused=5, queue_seconds=0.25), finished(1, ms=1000)):
        f.feed(e)
    # 2: streamed: running until its requestFinished, which comes after generated
    f.feed(started(2))
    f.feed(routed(2, stream=True, requested=None))
    f.feed(gen(2, new=30, prompt=40, prefill=0.2, decode=1.5, evicted=True, drafted_tokens=8, accepted_tokens=5))
    assert f.record(2).state == "running" and f.in_flight == 1
    f.feed(finished(2, ms=1800))
    # 3: a 404 that never routed; 4: still running; 5: a stream that failed after its headers
    f.feed(started(3, path="/nope"))
    f.feed(finished(3, status=404, ms=1, error="no route"))
    f.feed(started(4))
    f.feed_all([started(5), routed(5, stream=True), finished(5, status=200, ms=50, error="engine error: boom")])
    s = f.summary()
    assert (s["requests"], s["inFlight"], s["errors"], s["generations"]) == (5, 1, 2, 2)
    assert (s["promptTokens"], s["newTokens"]) == (60, 40)
    assert s["decodeTokPerSec"] == pytest.approx(40 / 2.0)
    assert s["prefixReuseRatio"] == pytest.approx(5 / 60)
    assert s["evictions"] == 1 and (s["draftedTokens"], s["acceptedTokens"]) == (8, 5)
    assert s["prefillMs"] == {"p50": pytest.approx(100.0), "p95": pytest.approx(200.0), "n": 2}
    assert s["queueMs"] == {"p50": pytest.approx(0.0), "p95": pytest.approx(250.0), "n": 2}
    assert s["overheadMs"] == {"p50": pytest.approx(100.0), "p95": pytest.approx(150.0), "n": 2}
    assert s["models"] == ["m"]
    assert s["perModel"]["m"]["requests"] == 3 and s["perModel"]["m"]["newTokens"] == 40
    assert s["perModel"]["m"]["decodeTokPerSec"] == pytest.approx(20.0)
    recs = {r["id"]: r for r in s["records"]}
    assert recs[1]["queuedMs"] == pytest.approx(250.0) and recs[1]["requested"] == "gpt-4o"
    assert recs[1]["overheadMs"] == pytest.approx(150.0)
    assert recs[2]["queuedMs"] == 0.0 and recs[2]["state"] == "done" and recs[2]["evicted"]
    assert recs[2]["overheadMs"] == pytest.approx(100.0)
    assert recs[3]["status"] == 404 and recs[3]["error"] == "no route" and recs[3]["served"] is None
    assert recs[4]["state"] == "running"
    assert recs[5]["status"] == 200 and recs[5]["error"] == "engine error: boom" and recs[5]["overheadMs"] is None
    f.feed(ModelDetached(at_ms=2, model="m").to_dict())
    assert f.summary()["models"] == []


def test_fold_sums_a_guardrail_reask_and_hides_the_views_own_traffic():
    f = Fold()
    f.feed_all(
        [
            started(1),
            routed(1),
            gen(1, new=4, decode=0.1, queue_seconds=0.05),
            gen(1, new=6, decode=0.2, queue_seconds=0.01),
            finished(1, ms=900),
        ]
    )
    rec = f.record(1)
    assert (rec.usage.generations, rec.usage.new_tokens) == (2, 10)
    assert rec.usage.decode_tok_per_sec == pytest.approx(10 / 0.3)  # summed over summed
    assert rec.queued_ms == pytest.approx(60.0)
    assert rec.overhead_ms == pytest.approx(900 - (0.06 + 0.2 + 0.3) * 1000)
    assert f.summary()["queueMs"]["n"] == 2  # one sample per generation
    for rid, path in ((2, "/v1/events"), (3, "/v1/stats"), (4, "/dashboard")):
        f.feed(started(rid, path=path))
        f.feed(finished(rid))
    s = f.summary()
    assert s["requests"] == 1 and s["inFlight"] == 0 and [r["id"] for r in s["records"]] == [1]
    everything = Fold(hide_paths=frozenset()).feed_all([started(2, path="/v1/stats"), finished(2)])
    assert everything.requests == 1


def test_fold_bounds_records_counts_gaps_and_joins_mid_stream():
    f = Fold(max_requests=3)
    for rid in range(1, 11):
        f.feed_all([started(rid), routed(rid), gen(rid), finished(rid)])
    s = f.summary()
    assert s["requests"] == 10 and s["newTokens"] == 100  # aggregates cover everything
    assert [r["id"] for r in s["records"]] == [8, 9, 10]
    assert [r["id"] for r in f.summary(max_requests=2)["records"]] == [9, 10]
    f.feed({"kind": "gap", "missed": 7, "from": 1, "to": 7})
    assert f.summary()["droppedEvents"] == 7
    # a view that joined mid-stream: a finish whose start it never saw is not a request
    late = Fold()
    late.feed(finished(99))
    late.feed(gen(98))
    s = late.summary()
    assert s["requests"] == 0 and s["errors"] == 0 and s["newTokens"] == 10


def turn(rid, response, previous=None, path="/v1/responses"):
    return [started(rid, path=path), routed(rid, response=response, previous=previous), gen(rid), finished(rid)]


def place(f: Fold, rid: int) -> tuple:
    rec = f.record(rid)
    return rec.chain, rec.turn, rec.chain_start_seen


def test_fold_follows_responses_chains():
    f = Fold()
    f.feed_all([*turn(1, "resp_a"), *turn(2, "resp_b", "resp_a"), *turn(3, "resp_x")])
    # a chat request makes no response: no chain
    f.feed_all([started(4), routed(4), gen(4), finished(4)])
    # a background run is a request of its own (the POST answered queued, and
    # never routed); it is running until the run ends
    f.feed_all([started(5, path="/v1/responses"), finished(5)])
    f.feed_all([started(6, path="/v1/responses (background)"), routed(6, response="resp_c", previous="resp_b")])
    assert f.record(6).state == "running"
    assert place(f, 1) == ("resp_a", 1, True) and place(f, 2) == ("resp_a", 2, True)
    assert place(f, 3) == ("resp_x", 1, True) and place(f, 4) == (None, None, None)
    assert place(f, 6) == ("resp_a", 3, True)
    f.feed_all([gen(6), finished(6)])
    assert f.record(6).state == "done" and place(f, 6) == ("resp_a", 3, True)
    # a fork: another turn continuing the first
    f.feed_all(turn(7, "resp_d", "resp_a"))
    assert place(f, 7) == ("resp_a", 2, True)
    # the server restarted (ids start again): a stored chain goes on
    f.feed_all(turn(1, "resp_e", "resp_c"))
    assert f.runs == 2 and place(f, 1) == ("resp_a", 4, True)
    recs = f.summary()["records"]
    last = recs[-1]
    assert (last["responseId"], last["previousResponseId"]) == ("resp_e", "resp_c")
    assert (last["chain"], last["turn"], last["chainStartSeen"]) == ("resp_a", 4, True)
    assert last["chainText"] == "turn 4 of chain resp_a"
    assert f.record(1).chain_text == "turn 4 of chain resp_a"
    # an offline fold keeps the earlier run's records, and their places
    report = Fold(max_requests=None).feed_all([*turn(1, "resp_a"), *turn(1, "resp_b", "resp_a")])
    assert [(r["id"], r["chain"], r["turn"]) for r in report.summary()["records"]] == [
        (1, "resp_a", 1),
        (1, "resp_a", 2),
    ]


def test_fold_chains_whose_start_it_never_saw_start_at_the_earliest_seen():
    f = Fold()
    f.feed_all([*turn(1, "resp_y", "resp_unseen"), *turn(2, "resp_z", "resp_y")])
    assert place(f, 1) == ("resp_y", 1, False) and place(f, 2) == ("resp_y", 2, False)
    assert f.record(2).chain_text == "turn 2 of chain resp_y (earlier turns not seen)"
    # a live fold remembers the newest places only
    chains = Chains(kept=2)
    recs = [RequestRecord(id=i, response_id=f"r{i}", previous_response_id=f"r{i - 1}" if i else None) for i in range(4)]
    for rec in recs:
        chains.place(rec)
    assert [(r.chain, r.turn, r.chain_start_seen) for r in recs] == [("r0", i + 1, True) for i in range(4)]
    late = RequestRecord(id=9, response_id="r9", previous_response_id="r1")  # r1's place was let go
    chains.place(late)
    assert (late.chain, late.turn, late.chain_start_seen) == ("r9", 1, False)
    # a response id that is not text is not an event as the server writes it
    bad = Fold()
    bad.feed_all([started(1), {**routed(1), "responseId": 7}])
    assert bad.malformed == 1 and bad.record(1).response_id is None


def test_console_shows_a_requests_turn_and_chain():
    f = Fold().feed_all([*turn(1, "resp_a"), *turn(2, "resp_b", "resp_a"), *turn(3, "resp_q", "resp_p")])
    col = [key for _, key in COLUMNS].index("turn")
    assert [row_cells(f.record(i))[col] for i in (1, 2, 3)] == ["1", "2", "1+"]
    f.feed_all([started(4), finished(4)])
    assert row_cells(f.record(4))[col] == "–"
    details = details_text(f.record(2)).plain
    assert "resp_b: turn 2 of chain resp_a" in details and "previousResponseId" in details
    assert "(earlier turns not seen)" in details_text(f.record(3)).plain
    assert "chain" not in details_text(f.record(4)).plain


def test_fold_keeps_the_models_that_are_down_and_a_tenants_fold_starts_with_them():
    live = LiveEvents()
    for m in ("pool@a", "pool@b", "pool"):
        live.record(ModelAttached(at_ms=0, model=m))
    live.record(ModelHealth(at_ms=1, model="pool@b", state="down", reason="unreachable (ConnectError)"))
    live.record(ModelHealth(at_ms=2, model="pool@a", state="down", reason="health check failed: 500"))
    live.record(ModelHealth(at_ms=3, model="pool@a", state="ok"))
    s = live.summary()
    assert s["modelStates"] == {"pool@b": {"state": "down", "reason": "unreachable (ConnectError)"}}
    # a tenant's fold, made after those events (its first request), knows the same
    live.record(RequestStarted(id=1, at_ms=4, method="POST", path="/v1/chat/completions"))
    live.request_tenant(1, "t1")
    assert live.summary(tenant="t1")["modelStates"] == s["modelStates"] and live.summary(tenant="t1")["requests"] == 1
    live.record(ModelDetached(at_ms=5, model="pool@b"))
    assert live.summary()["modelStates"] == {} and live.summary(tenant="t1")["modelStates"] == {}
    # a model attached again under the name starts well
    live.record(ModelHealth(at_ms=6, model="pool@b", state="down", reason="late report"))
    live.record(ModelAttached(at_ms=7, model="pool@b"))
    assert live.summary()["modelStates"] == {}
    fold = Fold().feed_all([{"kind": "modelHealth", "model": "m", "state": "stalled", "reason": "no step"}])
    assert fold.unwell == {"m": ("stalled", "no step")} and fold.fresh().unwell == fold.unwell


def pull(model, phase, at, completed=0, total=0, fetched=None, **kw):
    fetched = completed if fetched is None else fetched
    return ModelPull(at_ms=at, model=model, phase=phase, completed=completed, total=total, fetched=fetched, **kw)


MiB = 1 << 20


def test_fold_follows_pulls_in_progress_and_keeps_the_newest_that_ended():
    f = Fold()
    f.feed_all(
        e.to_dict()
        for e in (
            pull("a", "started", 1000, total=100 * MiB),
            pull("b", "started", 1500, completed=10 * MiB, total=20 * MiB, fetched=0),  # (10 MiB already there)
            pull("a", "progress", 3000, completed=40 * MiB, total=100 * MiB),
            pull("b", "progress", 2500, completed=15 * MiB, total=20 * MiB, fetched=5 * MiB),
        )
    )
    a, b = f.summary()["pulls"]
    assert (a["model"], a["state"], a["completed"], a["total"]) == ("a", "pulling", 40 * MiB, 100 * MiB)
    assert a["bytesPerSec"] == pytest.approx(20 * MiB) and a["startedMs"] == 1000 and a["atMs"] == 3000
    assert b["bytesPerSec"] == pytest.approx(5 * MiB)  # what came over the network, not what was there
    f.feed(pull("a", "finished", 5000, completed=100 * MiB, total=100 * MiB, seconds=4.0).to_dict())
    f.feed(
        pull(
            "b", "failed", 5100, completed=15 * MiB, total=20 * MiB, fetched=5 * MiB, reason="sha256 mismatch"
        ).to_dict()
    )
    a, b = f.summary()["pulls"]  # ended: in the order they ended
    assert (a["state"], a["seconds"], a["bytesPerSec"]) == ("finished", 4.0, pytest.approx(25 * MiB))
    assert (b["state"], b["reason"], b["completed"]) == ("failed", "sha256 mismatch", 15 * MiB)
    assert not f.pulls.active and f.events == 6
    # a view that joined mid-pull: the rate from the first event it saw
    late = Fold().feed_all(
        [pull("c", "progress", 1000, 50, 100).to_dict(), pull("c", "progress", 2000, 80, 100).to_dict()]
    )
    assert late.summary()["pulls"][0]["bytesPerSec"] == pytest.approx(30.0) and late.malformed == 0
    # a pull of the same model again starts afresh; the newest PULLS_KEPT ended are kept
    for i in range(PULLS_KEPT + 2):
        f.feed_all(
            [pull(f"m{i}", "started", 6000 + i).to_dict(), pull(f"m{i}", "failed", 7000 + i, reason="x").to_dict()]
        )
    f.feed(pull("a", "started", 9000, total=100).to_dict())
    s = f.summary()["pulls"]
    assert [(p["model"], p["state"]) for p in s] == [("a", "pulling")] + [
        (f"m{i}", "failed") for i in range(2, PULLS_KEPT + 2)
    ]
    assert s[0]["completed"] == 0 and s[0]["bytesPerSec"] is None
    # a tenant's fold (made when its first request comes) starts with the pulls, its own copy
    copy = f.fresh()
    assert copy.summary()["pulls"] == s
    f.feed(pull("a", "progress", 9500, completed=50, total=100).to_dict())
    assert copy.summary()["pulls"][0]["completed"] == 0
    # shaped as the server writes them, or counted malformed and left out
    for bad in (
        {"kind": "modelPull", "model": "x"},
        {"kind": "modelPull", "model": "x", "phase": "progress", "total": "9"},
    ):
        n = Fold()
        n.feed(bad)
        assert n.malformed == 1 and n.summary()["pulls"] == []


def test_a_tenant_sees_the_pulls_in_its_stream_and_its_fold():
    async def main():
        live = LiveEvents()
        live.record(pull("m", "started", 1, total=100))
        live.record(RequestStarted(id=1, at_ms=2, method="GET", path="/v1/stats"))
        live.request_tenant(1, "t1")  # its fold, made now, knows the pull in progress
        sub, _, _ = live.subscribe(since=None, tenant="t1")
        live.record(pull("m", "progress", 500, completed=60, total=100))
        _, items = live.take(sub)
        assert [(i.kind, orjson.loads(i.data)["completed"]) for i in items] == [("modelPull", 60)]
        (shown,) = live.summary(tenant="t1")["pulls"]
        assert (shown["model"], shown["state"], shown["completed"]) == ("m", "pulling", 60)
        assert live.summary(tenant="t1")["pulls"] == live.summary()["pulls"]
        live.unsubscribe(sub)

    asyncio.run(main())


def test_sse_parser():
    p = SSEParser()
    frames = [
        p.feed(line)
        for line in ["retry: 1000", "", ": keep-alive", "", "id: 7", "event: generated", 'data: {"a":', "data: 1}", ""]
    ]
    got = [f for f in frames if f is not None]
    assert len(got) == 1 and got[0].id == 7 and got[0].event == "generated" and got[0].data == '{"a":\n1}'


def test_text_charts():
    assert sparkline([0, 1, 2, 4]) == "▁▃▅█"
    assert sparkline([]) == "" and sparkline([0, 0]) == "▁▁"
    f = Fold().feed_all(
        [
            started(1),
            routed(1),
            gen(1, model="a"),
            finished(1),
            started(2),
            routed(2, stream=True),
            finished(2),
            gen(2, model="b", decode=1.0),
        ]
    )
    rates = rate_chart(f.records())
    assert isinstance(rates, Text) and "a " in rates.plain and "b " in rates.plain
    times = time_chart(f.records(), width=40)
    assert "#1" in times.plain and "#2" in times.plain and "█" in times.plain
    assert "no generations" in time_chart([]).plain


def test_pull_bars():
    f = Fold().feed_all(
        e.to_dict()
        for e in (
            pull("org/m:Q4_K_M", "started", 0, total=100 * MiB),
            pull("org/m:Q4_K_M", "progress", 2000, completed=42 * MiB + 7, total=100 * MiB),
            pull("u", "started", 0),
            pull("x[bold]\x1b", "failed", 10, reason="no \x1b space"),
            pull("done", "finished", 3000, completed=3 * MiB, total=3 * MiB, seconds=1.5),
        )
    )
    going, unsized = f.pulls.active.values()
    bad, done = f.pulls.ended
    line = pull_bar(going, width=20)
    assert line.plain.startswith("pulling org/m:Q4_K_M  ")
    assert "████████░░░░░░░░░░░░  42%  42.0 MiB / 100.0 MiB  21.0 MiB/s" in line.plain  # (rounded down)
    assert "░" * 20 + "   –%  0 B" in pull_bar(unsized, width=20).plain
    f.feed(pull("u", "finished", 10, seconds=0.5).to_dict())  # (a packaged model: no size told)
    assert "████ 100%  0 B in 0.5 s" in pull_bar(f.pulls.ended[-1], width=4).plain
    assert pull_bar(done, width=4).plain == "pulled  done  ████ 100%  3.0 MiB / 3.0 MiB in 1.5 s  2.0 MiB/s"
    failed = pull_bar(bad, width=4).plain
    assert failed.startswith("failed  x[bold]\\x1b  ") and failed.endswith("no \\x1b space"), failed
    assert (size_text(512), size_text(2048), size_text(3 << 30)) == ("512 B", "2.0 KiB", "3.0 GiB")


# -------------------------------------------------------------- live ring


def events(n, start=1):
    return [RequestStarted(id=i, at_ms=i, method="GET", path="/x") for i in range(start, start + n)]


def test_live_ring_replays_after_since_and_marks_what_it_no_longer_holds():
    async def main():
        live = LiveEvents(max_events=5)
        for e in events(12):
            live.record(e)
        sub, gap, replay = live.subscribe(since=3)
        assert gap is not None and gap.to_dict() == {"missed": 4, "from": 4, "to": 7}
        assert [i.seq for i in replay] == [8, 9, 10, 11, 12]
        assert orjson.loads(replay[0].data) == events(12)[7].to_dict()
        sub2, gap2, replay2 = live.subscribe(since=10)
        assert gap2 is None and [i.seq for i in replay2] == [11, 12]
        sub3, gap3, replay3 = live.subscribe(since=None)  # live only
        assert gap3 is None and replay3 == []
        sub4, _, replay4 = live.subscribe(since=500)  # a client of an earlier server run
        assert [i.seq for i in replay4] == [8, 9, 10, 11, 12]
        assert live.subscribers == 4
        for s in (sub, sub2, sub3, sub4):
            live.unsubscribe(s)
        assert live.subscribers == 0

    asyncio.run(main())


def test_slow_subscriber_never_blocks_record_and_gets_a_gap():
    async def main():
        live = LiveEvents(max_queue=3)
        sub, _, _ = live.subscribe(since=None)
        t0 = time.perf_counter()
        for e in events(10_000):
            live.record(e)
        elapsed = time.perf_counter() - t0
        assert elapsed < 5  # generous: O(1) per event, nothing waits on the reader
        gap, items = live.take(sub)
        assert gap is not None and gap.to_dict() == {"missed": 9997, "from": 1, "to": 9997}
        assert [i.seq for i in items] == [9998, 9999, 10000]
        await asyncio.wait_for(sub.wake.wait(), 1)  # it was woken (once)
        assert live.take(sub) == (None, [])
        live.record(events(1)[0])
        gap, items = live.take(sub)
        assert gap is None and [i.seq for i in items] == [10001]
        assert live.summary(max_requests=0)["seq"] == 10001

    asyncio.run(main())


def test_record_from_another_thread_wakes_the_stream():
    import threading

    async def main():
        live = LiveEvents()
        sub, _, _ = live.subscribe(since=None)
        threading.Thread(target=live.record, args=(events(1)[0],)).start()
        await asyncio.wait_for(sub.wake.wait(), 5)
        assert [i.seq for i in live.take(sub)[1]] == [1]
        live.close()
        assert sub.closed

    asyncio.run(main())
