"""The event layer: shapes, ring, fan-out, the reporting decorator."""

from __future__ import annotations

import json

import pytest

from turbospark.observe import (
    FanOut,
    Generated,
    ModelAttached,
    ModelDetached,
    RequestFinished,
    RequestIds,
    RequestRouted,
    RequestStarted,
    RingObserver,
    combine,
    record,
)
from turbospark.sinks.jsonl import JsonlSink


def sample_events():
    return [
        RequestStarted(id=1, at_ms=5, method="POST", path="/v1/x"),
        RequestRouted(id=1, requested=None, served="m", stream=True),
        Generated(
            id=1,
            model="m",
            prompt_tokens=3,
            new_tokens=4,
            prefill_seconds=0.5,
            decode_seconds=0.25,
            stop_reason="endOfTurn",
            reused_prefix_tokens=2,
            session_slot_evicted=False,
        ),
        RequestFinished(id=1, status=200, duration_ms=9),
        RequestFinished(id=2, status=400, duration_ms=1, error="bad"),
        ModelAttached(at_ms=1, model="m"),
        ModelDetached(at_ms=2, model="m"),
    ]


def test_event_shapes_are_the_contract():
    keys = [set(e.to_dict()) for e in sample_events()]
    assert keys == [
        {"kind", "id", "atMs", "method", "path"},
        {"kind", "id", "requested", "served", "stream"},
        {
            "kind",
            "id",
            "model",
            "promptTokens",
            "newTokens",
            "prefillSeconds",
            "decodeSeconds",
            "stopReason",
            "reusedPrefixTokens",
            "sessionSlotEvicted",
            "queueSeconds",
            "prefixMissAt",
        },
        {"kind", "id", "status", "durationMs"},  # error omitted when none
        {"kind", "id", "status", "durationMs", "error"},
        {"kind", "atMs", "model"},
        {"kind", "atMs", "model"},
    ]
    kinds = [e.to_dict()["kind"] for e in sample_events()]
    assert kinds == [
        "requestStarted",
        "requestRouted",
        "generated",
        "requestFinished",
        "requestFinished",
        "modelAttached",
        "modelDetached",
    ]
    assert json.loads(sample_events()[1].to_json())["requested"] is None


def test_request_ids_are_monotonic():
    ids = RequestIds()
    seen = [ids.next() for _ in range(100)]
    assert seen == sorted(seen) and len(set(seen)) == 100


def test_no_observer_builds_nothing():
    def build():
        raise AssertionError("an event was built with nobody listening")

    record(None, build)
    assert combine([None, None]) is None


def test_raising_observer_is_contained():
    class Boom:
        def record(self, event):
            raise RuntimeError("boom")

    got = []

    class Keep:
        def record(self, event):
            got.append(event)

    fan = FanOut([Boom(), Keep()])
    record(fan, lambda: ModelAttached(at_ms=1, model="m"))
    assert len(got) == 1
    record(Boom(), lambda: ModelAttached(at_ms=1, model="m"))  # does not raise


def test_ring_drops_oldest_by_count():
    ring = RingObserver(max_events=3)
    for i in range(5):
        ring.record(RequestStarted(id=i, at_ms=0, method="GET", path="/"))
    d = ring.drain()
    assert [e["id"] for e in d.events] == [2, 3, 4]
    assert d.dropped == 2
    d2 = ring.drain()
    assert d2.events == [] and d2.dropped == 0  # each event and each drop reported once


def test_ring_drops_oldest_by_bytes_and_drain_max():
    one = len(RequestStarted(id=0, at_ms=0, method="GET", path="/").to_json())
    ring = RingObserver(max_events=1000, max_bytes=one * 4)
    for i in range(10):
        ring.record(RequestStarted(id=i, at_ms=0, method="GET", path="/"))
    assert len(ring) == 4
    first = ring.drain(3)
    assert [e["id"] for e in first.events] == [6, 7, 8] and first.dropped == 6
    rest = ring.drain(10)
    assert [e["id"] for e in rest.events] == [9] and rest.dropped == 0
    ring.record(RequestStarted(id=10, at_ms=0, method="GET", path="/"))
    assert len(ring) == 1  # the byte budget was given back by the drain


def test_ring_rejects_silly_limits():
    with pytest.raises(ValueError):
        RingObserver(max_events=0)


def test_the_reporter_records_each_run_with_its_wall_timings():
    from turbospark.engine.types import RawDecodeResult, StopReason
    from turbospark.observe import ListObserver, Reporter

    obs = ListObserver()
    result = RawDecodeResult(
        prompt_tokens=5,
        new_tokens=3,
        prefill_seconds=0.25,
        decode_seconds=0.5,
        reason=StopReason.MAX_TOKENS,
        queue_seconds=0.125,
    )
    Reporter(obs, 7).generated("m", result)
    (g,) = obs.events
    assert g.to_dict() == {
        "kind": "generated",
        "id": 7,
        "model": "m",
        "promptTokens": 5,
        "newTokens": 3,
        "prefillSeconds": 0.25,
        "decodeSeconds": 0.5,
        "stopReason": "maxTokens",
        "reusedPrefixTokens": 0,
        "sessionSlotEvicted": False,
        "queueSeconds": 0.125,
        "prefixMissAt": None,
    }
    Reporter(None, 8).generated("m", result)  # nobody listens: nothing built
    Reporter(obs, None).generated("m", result)  # outside a request: nothing
    assert len(obs.events) == 1


def test_the_reporter_waits_for_its_runs():
    import asyncio

    from turbospark.observe import Reporter

    async def main() -> list[str]:
        order: list[str] = []
        reporter = Reporter(None, 1)

        async def run() -> None:
            await asyncio.sleep(0.05)
            order.append("run ended")

        reporter.running(asyncio.ensure_future(run()))
        await reporter.settled(5)
        order.append("settled")
        await reporter.settled(5)  # nothing left: returns at once
        return order

    assert asyncio.run(main()) == ["run ended", "settled"]


def test_jsonl_sink_writes_every_event(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path))
    for e in sample_events():
        sink.record(e)
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [e.to_dict() for e in sample_events()]


def test_generated_carries_speculation_counts_only_when_drafting():
    g = Generated(
        id=1,
        model="m",
        prompt_tokens=3,
        new_tokens=4,
        prefill_seconds=0.5,
        decode_seconds=0.25,
        stop_reason="endOfTurn",
        reused_prefix_tokens=2,
        session_slot_evicted=False,
        drafted_tokens=8,
        accepted_tokens=5,
    )
    d = g.to_dict()
    assert d["draftedTokens"] == 8 and d["acceptedTokens"] == 5
    plain = Generated(
        id=2,
        model="m",
        prompt_tokens=3,
        new_tokens=4,
        prefill_seconds=0.5,
        decode_seconds=0.25,
        stop_reason="endOfTurn",
        reused_prefix_tokens=2,
        session_slot_evicted=False,
    ).to_dict()
    assert "draftedTokens" not in plain and "acceptedTokens" not in plain


def test_trace_context_reaches_observers_that_want_it_and_a_raising_one_spoils_nothing():
    from turbospark.observe import FanOut, trace_context

    got: list[tuple[int, dict]] = []

    class Bad:
        def record(self, event):
            pass

        def trace_context(self, rid, carrier):
            raise RuntimeError("boom")

    class Good:
        def record(self, event):
            pass

        def trace_context(self, rid, carrier):
            got.append((rid, carrier))

    class Plain:  # no hook: skipped
        def record(self, event):
            pass

    trace_context(FanOut([Bad(), Plain(), Good()]), 7, {"traceparent": "00-a-b-01"})
    trace_context(None, 8, {"traceparent": "x"})
    assert got == [(7, {"traceparent": "00-a-b-01"})]


def test_a_fan_out_without_trace_observers_offers_no_hook():
    from turbospark.observe import FanOut

    class Plain:
        def record(self, event):
            pass

    assert getattr(FanOut([Plain(), Plain()]), "trace_context", None) is None
