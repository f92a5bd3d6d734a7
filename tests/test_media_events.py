"""Issue 43 item 6: the events and every view tell the truth about media.

``generated`` carries the prompt's media (items, their tokens — inside
``promptTokens`` —, the items this run encoded, the encode seconds), the
fold sums them, and the report, the console, the dashboard, Prometheus and
OpenTelemetry show them. The unit tests feed constructed events; the real
one runs the bundled SmolLM2 with the tests' random projector
(tests/mmproj.py) in a real server, through the generation core with the
server's own observers (the HTTP dialects' image forms are issue 43 item 2),
and reads every view of it: ``/metrics``, ``/v1/stats``, the dashboard in
Chromium, the console over ``/v1/events``, the event log and its report."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from rich.text import Text

from turbospark import ListObserver, Server
from turbospark.core import generation
from turbospark.core.request import ChatRequest, Media
from turbospark.engine import media
from turbospark.engine.model import ModelOptions
from turbospark.engine.types import MEDIA_MARKER, CancelFlag, GenerationConfig, RawDecodeResult, StopReason
from turbospark.models.catalog import resolve_model
from turbospark.observe import Generated, Reporter, RequestFinished, RequestRouted, RequestStarted, now_ms
from turbospark.sinks.jsonl import JsonlSink
from turbospark.sinks.prometheus import PrometheusSink
from turbospark.views.console.app import COLUMNS, ConsoleApp, details_text, row_cells
from turbospark.views.fold import Fold, well_formed
from turbospark.views.report import fold_file, summary_lines

from .media_samples import RED
from .mmproj import N_IMAGE_TOKENS, write_mmproj
from .test_metrics import parse, value

COL = {key: i for i, (_, key) in enumerate(COLUMNS)}
MEDIA_KEYS = ("mediaItems", "mediaTokens", "mediaEncoded", "mediaEncodeSeconds")


def plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def gen(rid: int, model: str = "m", **kw: Any) -> Generated:
    base: dict[str, Any] = dict(
        id=rid,
        model=model,
        prompt_tokens=40,
        new_tokens=4,
        prefill_seconds=0.25,
        decode_seconds=0.5,
        stop_reason="endOfTurn",
        reused_prefix_tokens=0,
        session_slot_evicted=False,
    )
    base.update(kw)
    return Generated(**base)


def request(rid: int, *events: Generated) -> list[dict[str, Any]]:
    """One whole request's events, as dicts."""
    return [
        RequestStarted(id=rid, at_ms=1000 + rid, method="POST", path="/v1/chat/completions").to_dict(),
        RequestRouted(id=rid, requested="m", served="m", stream=False).to_dict(),
        *(e.to_dict() for e in events),
        RequestFinished(id=rid, status=200, duration_ms=2000).to_dict(),
    ]


IMAGE = dict(media_items=1, media_tokens=16, media_encoded=1, media_encode_seconds=0.125)
AGAIN = dict(media_items=1, media_tokens=16, media_encoded=0, media_encode_seconds=0.0, reused_prefix_tokens=30)


# ------------------------------------------------------------------ the event
def test_generated_carries_the_results_media_and_leaves_them_out_without():
    obs = ListObserver()
    result = RawDecodeResult(
        prompt_tokens=40,
        new_tokens=3,
        prefill_seconds=0.25,
        decode_seconds=0.5,
        reason=StopReason.MAX_TOKENS,
        media_items=2,
        media_tokens=32,
        media_encoded=1,
        media_encode_seconds=0.0625,
    )
    Reporter(obs, 7).generated("m", result)
    Reporter(obs, 8).generated(
        "m", dataclasses.replace(result, media_items=0, media_tokens=0, media_encoded=0, media_encode_seconds=0.0)
    )
    with_media, without = (e.to_dict() for e in obs.events)
    assert {k: with_media[k] for k in MEDIA_KEYS} == {
        "mediaItems": 2,
        "mediaTokens": 32,
        "mediaEncoded": 1,
        "mediaEncodeSeconds": 0.0625,
    }
    assert with_media["promptTokens"] == 40  # (the media tokens are inside it, not added)
    assert not any(k in without for k in MEDIA_KEYS), without
    assert well_formed(with_media) and well_formed(without)
    assert not well_formed({**with_media, "mediaTokens": "16"})
    assert not well_formed({**with_media, "mediaEncodeSeconds": float("nan")})


# ------------------------------------------------------------------ the fold
def test_the_fold_sums_media_per_request_per_model_and_overall():
    f = Fold().feed_all(
        [
            *request(1, gen(1, **IMAGE)),
            *request(2, gen(2, **AGAIN)),
            *request(3, gen(3)),  # text only
            # a re-ask is a second generation of the same request: both count
            *request(4, gen(4, **IMAGE), gen(4, **{**IMAGE, "media_encode_seconds": 0.25})),
        ]
    )
    assert f.malformed == 0
    recs = {r["id"]: r for r in f.summary()["records"]}
    media = lambda r: (r["mediaItems"], r["mediaTokens"], r["mediaEncoded"], r["mediaEncodeMs"])  # noqa: E731
    assert media(recs[1]) == (1, 16, 1, 125.0)
    assert media(recs[2]) == (1, 16, 0, 0.0) and recs[2]["promptTokens"] == 40
    assert media(recs[3]) == (0, 0, 0, 0.0)
    assert media(recs[4]) == (2, 32, 2, 375.0)
    s = f.summary()
    assert media(s) == (4, 64, 3, 500.0)
    assert media(s["perModel"]["m"]) == (4, 64, 3, 500.0)
    assert s["promptTokens"] == 200  # media tokens inside, never added on top


def test_the_report_prints_the_media(tmp_path: Path):
    log = tmp_path / "events.jsonl"
    events = [*request(1, gen(1, **IMAGE)), *request(2, gen(2, **AGAIN))]
    log.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    lines = {line[:24].strip(): line[24:] for line in summary_lines(fold_file(str(log)))}
    assert lines["media items"] == "2"
    assert lines["media tokens in prompt"] == "32"
    assert lines["media encoded"] == "1"
    assert lines["media encode ms"] == "125.00"


def test_the_consoles_cells_and_the_text_only_dash():
    f = Fold().feed_all([*request(1, gen(1, **IMAGE)), *request(2, gen(2, **AGAIN)), *request(3, gen(3))])
    rows = {rid: [plain(c) for c in row_cells(rec)] for rid in (1, 2, 3) if (rec := f.record(rid))}
    assert (rows[1][COL["media"]], rows[1][COL["encoded"]]) == ("1 · 16 tok", "1 · 125.0 ms")
    assert (rows[2][COL["media"]], rows[2][COL["encoded"]]) == ("1 · 16 tok", "0 · 0.0 ms")
    assert (rows[3][COL["media"]], rows[3][COL["encoded"]]) == ("–", "–")
    assert rows[1][COL["prompt"]] == "40" and rows[2][COL["reused"]] == "30"
    # the details pane: media lines for a request that had media only
    shown = {rid: details_text(rec).plain for rid in (1, 3) if (rec := f.record(rid))}
    assert "mediaTokens      16" in shown[1] and "mediaEncodeMs    125.00" in shown[1]
    assert "media" not in shown[3]


# ------------------------------------------------------------------ the sinks
def test_prometheus_counts_media_and_times_only_encodes():
    sink = PrometheusSink()
    for e in (gen(1, **IMAGE), gen(2, **AGAIN), gen(3), gen(4, model="n", **IMAGE)):
        sink.record(e)
    s = parse(sink.exposition()[0].decode())
    assert value(s, "turbospark_media_items_total", model="m") == 2
    assert value(s, "turbospark_media_tokens_total", model="m") == 32
    assert value(s, "turbospark_media_encoded_total", model="m") == 1
    assert value(s, "turbospark_prompt_tokens_total", model="m") == 120  # (the media tokens are in it)
    # one observation per generation that encoded: a reuse is no zero-second encode
    assert value(s, "turbospark_media_encode_time_seconds_count", model="m") == 1
    assert value(s, "turbospark_media_encode_time_seconds_sum", model="m") == pytest.approx(0.125)
    assert value(s, "turbospark_media_items_total", model="n") == 1


def test_otel_puts_the_media_on_the_span():
    from .test_otel import memory_sink

    sink, exporter = memory_sink()
    for rid, g in ((1, gen(1, **IMAGE)), (2, gen(2))):
        sink.record(RequestStarted(id=rid, at_ms=1000, method="POST", path="/v1/chat/completions"))
        sink.record(RequestRouted(id=rid, requested="m", served="m", stream=False))
        sink.record(g)
        sink.record(RequestFinished(id=rid, status=200, duration_ms=2000))
    sink.flush()
    with_media, without = sorted(exporter.get_finished_spans(), key=lambda sp: sp.attributes["turbospark.request_id"])
    a = with_media.attributes
    assert (a["turbospark.media.items"], a["turbospark.media.tokens"], a["turbospark.media.encoded"]) == (1, 16, 1)
    assert a["turbospark.media.encode_seconds"] == pytest.approx(0.125) and a["gen_ai.usage.input_tokens"] == 40
    assert not any(k.startswith("turbospark.media.") for k in without.attributes)
    sink.close()


def test_the_event_log_writes_the_event_as_it_is(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path))
    event = gen(1, **IMAGE)
    sink.record(event)
    sink.close()
    (line,) = path.read_bytes().splitlines()
    assert orjson.loads(line) == event.to_dict()


# ------------------------------------------------------------------ real model
needs_mtmd = pytest.mark.skipif(not media.available(), reason="this llama-cpp-python is built without libmtmd")
TEXT = "Look at this:\n"


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, ListObserver, Path]]:
    """A server of SmolLM2 with the random projector, its event log, and
    what its observers saw."""
    if not media.available():
        pytest.skip("this llama-cpp-python is built without libmtmd")
    d = tmp_path_factory.mktemp("media-events")
    mmproj = write_mmproj(d / "mmproj-576.gguf")
    path, _ = resolve_model("smollm2-135m")
    opts = ModelOptions(path=path, mmproj=str(mmproj), ctx=1024, threads=2, gpu_layers=0, parallel=1, cache_ram=64)
    seen, log = ListObserver(), d / "events.jsonl"
    sink = JsonlSink(str(log))
    srv = Server(models=[opts], observers=[seen, sink]).start()
    try:
        yield srv, seen, log
    finally:
        srv.stop()
        sink.close()


def ask(srv: Server, seen: ListObserver, content: str, images: list[bytes]) -> Generated:
    """One request through the generation core, reported to the server's
    observers under an id of the server's own (as a route does)."""
    backend = srv.registry.models()[0]
    rid = srv.assembly.state.ids.next()
    obs = srv.observer
    assert obs is not None
    obs.record(RequestStarted(id=rid, at_ms=now_ms(), method="POST", path="/v1/chat/completions"))
    obs.record(RequestRouted(id=rid, requested=backend.model_id, served=backend.model_id, stream=False))
    req = ChatRequest(
        messages=[{"role": "user", "content": content}],
        media=[Media("image", data) for data in images],
        config=GenerationConfig(max_new_tokens=4, temperature=0.0, ignore_eos=True, speculative=False),
        max_tokens_explicit=True,
    )
    t0 = time.monotonic()
    prepared = generation.prepare(backend, req)
    asyncio.run(generation.complete(backend, prepared, CancelFlag(), Reporter(obs, rid)))
    obs.record(RequestFinished(id=rid, status=200, duration_ms=int((time.monotonic() - t0) * 1000) + 1))
    (generated,) = (e for e in seen.of(rid) if isinstance(e, Generated))
    return generated


@pytest.fixture(scope="module")
def asked(vision: tuple[Server, ListObserver, Path]) -> tuple[Generated, Generated, Generated]:
    srv, seen, _ = vision
    first = ask(srv, seen, TEXT + MEDIA_MARKER, [RED])
    again = ask(srv, seen, TEXT + MEDIA_MARKER, [RED])  # the same image, the same prefix: no second encode
    text = ask(srv, seen, TEXT, [])
    return first, again, text


@needs_mtmd
def test_generated_tells_the_images_tokens_and_its_one_encode(asked):
    first, again, text = asked
    assert (first.media_items, first.media_tokens, first.media_encoded) == (1, N_IMAGE_TOKENS, 1)
    assert first.media_encode_seconds > 0 and first.media_encode_seconds <= first.prefill_seconds
    # the image's tokens are prompt tokens: the prompt grows by exactly them
    assert first.prompt_tokens == text.prompt_tokens + N_IMAGE_TOKENS
    assert (again.media_items, again.media_tokens, again.media_encoded) == (1, N_IMAGE_TOKENS, 0)
    assert again.media_encode_seconds == 0 and again.prompt_tokens == first.prompt_tokens
    assert again.reused_prefix_tokens >= text.prompt_tokens  # past the image: its KV was reused
    d = first.to_dict()
    assert (d["mediaItems"], d["mediaTokens"], d["mediaEncoded"]) == (1, N_IMAGE_TOKENS, 1)
    assert not any(k in text.to_dict() for k in MEDIA_KEYS)


@needs_mtmd
def test_metrics_and_stats_count_the_media(vision, asked):
    srv, _, _ = vision
    first, again, text = asked
    model = first.model
    s = parse(httpx.get(srv.url + "/metrics", timeout=30).text)
    assert value(s, "turbospark_media_items_total", model=model) == 2
    assert value(s, "turbospark_media_tokens_total", model=model) == 2 * N_IMAGE_TOKENS
    assert value(s, "turbospark_media_encoded_total", model=model) == 1
    assert value(s, "turbospark_media_encode_time_seconds_count", model=model) == 1
    assert value(s, "turbospark_media_encode_time_seconds_sum", model=model) == pytest.approx(
        first.media_encode_seconds
    )
    stats = httpx.get(srv.url + "/v1/stats", timeout=30).json()
    recs = {r["id"]: r for r in stats["records"]}
    for g in (first, again, text):
        r = recs[g.id]
        assert (r["promptTokens"], r["mediaItems"], r["mediaTokens"], r["mediaEncoded"]) == (
            g.prompt_tokens,
            g.media_items,
            g.media_tokens,
            g.media_encoded,
        )
        assert r["mediaEncodeMs"] == pytest.approx(g.media_encode_seconds * 1000)
    assert (stats["mediaItems"], stats["mediaTokens"], stats["mediaEncoded"]) == (2, 2 * N_IMAGE_TOKENS, 1)


@needs_mtmd
def test_the_dashboard_shows_the_media(vision, asked):
    from .chromium import run_once
    from .test_dashboard import row_cells as dom_cells

    srv, _, _ = vision
    first, again, text = asked
    dom = run_once(f"{srv.url}/dashboard", "--virtual-time-budget=8000", "--window-size=1400,900", "--dump-dom")
    ms = f"{first.media_encode_seconds * 1000:.1f}"
    # id, status, method, path, route, stream, prompt, new, media, encoded, ...
    assert dom_cells(dom, first.id)[6:10] == [
        str(first.prompt_tokens),
        "4",
        f"1 · {N_IMAGE_TOKENS} tok",
        f"1 · {ms} ms",
    ]
    assert dom_cells(dom, again.id)[8:10] == [f"1 · {N_IMAGE_TOKENS} tok", "0 · 0.0 ms"]
    assert dom_cells(dom, text.id)[8:10] == ["–", "–"]
    assert f'<b id="media">2 ({2 * N_IMAGE_TOKENS} tok, 1 encoded)</b>' in dom


@needs_mtmd
def test_the_console_shows_the_media_from_the_event_stream(vision, asked):
    srv, _, _ = vision
    first, again, text = asked
    ids = [first.id, again.id, text.id]

    async def main() -> None:
        app = ConsoleApp(srv.url)
        async with app.run_test(size=(220, 50)) as pilot:
            deadline = time.monotonic() + 60
            while not all((r := app.fold.record(i)) is not None and r.state == "done" for i in ids):
                assert time.monotonic() < deadline, "the console never got the requests"
                await pilot.pause(0.05)
            await pilot.pause(0.4)  # one more redraw after the last event
            table = app.query_one("#requests")
            rows = {i: [plain(c) for c in table.get_row(str(i))] for i in ids}  # type: ignore[attr-defined]
            ms = f"{first.media_encode_seconds * 1000:.1f}"
            assert rows[first.id][COL["media"]] == f"1 · {N_IMAGE_TOKENS} tok"
            assert rows[first.id][COL["encoded"]] == f"1 · {ms} ms"
            assert rows[again.id][COL["encoded"]] == "0 · 0.0 ms" and rows[text.id][COL["media"]] == "–"
            band = app.query_one("#band").render().plain  # type: ignore[union-attr]
            assert f"media 2 ({2 * N_IMAGE_TOKENS} tok, 1 encoded)" in band

    asyncio.run(main())


@needs_mtmd
def test_the_event_log_and_its_report_carry_the_media(vision, asked):
    _, _, log = vision
    first, again, _ = asked
    deadline = time.monotonic() + 30
    while True:  # (the log is written off the request path)
        lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
        logged = {e["id"]: e for e in lines if e["kind"] == "generated"}
        if again.id in logged or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert logged[first.id] == first.to_dict() and logged[again.id] == again.to_dict()
    lines_by_name = {line[:24].strip(): line[24:] for line in summary_lines(fold_file(str(log)))}
    assert lines_by_name["media items"] == "2" and lines_by_name["media encoded"] == "1"
    assert lines_by_name["media tokens in prompt"] == str(2 * N_IMAGE_TOKENS)
