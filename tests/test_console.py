"""``turbospark console`` driven by Textual's test pilot against a live
server, fed only by its /v1/events stream."""

from __future__ import annotations

import asyncio
import time

import httpx
from rich.text import Text

from turbospark.observe import ListObserver, now_ms
from turbospark.views.console.app import COLUMNS, ConsoleApp
from turbospark.views.console.charts import size_text

from .views_support import MIB, HeldPull, chat, fresh_server, group_with_a_replica_down, pulling_server, tell_pull

COL = {key: i for i, (_, key) in enumerate(COLUMNS)}


def plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


async def until(pilot, cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("the console never got there")
        await pilot.pause(0.05)


def test_console_shows_requests_from_the_event_stream(server):
    seen = ListObserver()
    with fresh_server(server, observers=[seen], api_keys=["k1"]) as srv:
        auth = {"Authorization": "Bearer k1"}

        async def main() -> None:
            app = ConsoleApp(srv.url, api_key="k1")
            async with app.run_test(size=(200, 50)) as pilot:
                await until(pilot, lambda: app.source.connected and app.fold.models == ["smollm2-135m"])
                missing = await asyncio.to_thread(httpx.get, srv.url + "/v1/nope", headers=auth, timeout=30)
                streamed = await asyncio.to_thread(chat, srv.url, model="smollm2-135m", stream=True, headers=auth)
                # (its prompt leaves the stream's after "Say hello": a miss to show)
                fallback = await asyncio.to_thread(
                    chat, srv.url, model="gpt-4o", max_tokens=5, content="Say hello, please.", headers=auth
                )
                assert (missing.status_code, streamed.status_code, fallback.status_code) == (404, 200, 200)
                ids = [int(r.headers["x-request-id"]) for r in (missing, streamed, fallback)]
                table = app.query_one("#requests")

                def settled() -> bool:
                    recs = [app.fold.record(i) for i in ids]
                    return table.row_count == 3 and all(r is not None and r.state == "done" for r in recs)

                await until(pilot, settled)
                await pilot.pause(0.4)  # one more redraw after the last event
                rows = {i: [plain(c) for c in table.get_row(str(i))] for i in ids}
                assert table.row_count == 3  # the console's own /v1/events is not a row

                gens = {e.id: e for e in seen.events if e.kind == "generated"}
                r404, rstream, rfall = (rows[i] for i in ids)
                assert r404[COL["status"]] == "404" and r404[COL["path"]] == "/v1/nope"
                assert r404[COL["route"]] == "–" and r404[COL["new"]] == "–"
                assert rstream[COL["status"]] == "200" and rstream[COL["stream"]] == "yes"
                assert rstream[COL["route"]] == "smollm2-135m → smollm2-135m"
                assert rfall[COL["status"]] == "200" and rfall[COL["stream"]] == "no"
                assert rfall[COL["route"]] == "gpt-4o → smollm2-135m"
                for rid, row in ((ids[1], rstream), (ids[2], rfall)):
                    g = gens[rid]
                    assert row[COL["prompt"]] == str(g.prompt_tokens)
                    assert row[COL["new"]] == str(g.new_tokens)
                    assert row[COL["reused"]] == str(g.reused_prefix_tokens)
                    assert row[COL["miss"]] == ("–" if g.prefix_miss_at is None else str(g.prefix_miss_at))
                    assert row[COL["prefill"]] == f"{g.prefill_seconds * 1000:.1f}"
                    assert row[COL["decode"]] == f"{g.decode_seconds * 1000:.1f}"
                assert gens[ids[2]].prefix_miss_at is not None
                assert rfall[COL["new"]] == "5" or gens[ids[2]].stop_reason != "maxTokens"
                assert rstream[COL["queued"]] != "–" and rfall[COL["queued"]] != "–"  # the engine's, streams too

                band = app.query_one("#band").render()
                text = band.plain if isinstance(band, Text) else str(band)
                assert "state live" in text and "requests 3" in text and "errors 1" in text
                assert "in flight 0" in text and "log gaps 0" in text and "smollm2-135m" in text

                # details pane follows the cursor; filters and pause work
                table.focus()
                table.move_cursor(row=table.get_row_index(str(ids[2])))
                await pilot.pause(0.1)
                details = app.query_one("#details").render()
                assert "gpt-4o" in (details.plain if isinstance(details, Text) else str(details))
                await pilot.press("e")
                await until(pilot, lambda: table.row_count == 1)
                assert plain(table.get_row(str(ids[0]))[COL["status"]]) == "404"
                await pilot.press("e")
                await until(pilot, lambda: table.row_count == 3)
                await pilot.press("m")  # the one model: the 404 never reached it
                await until(pilot, lambda: table.row_count == 2)
                assert app.model_filter == "smollm2-135m"
                await pilot.press("m")
                await until(pilot, lambda: table.row_count == 3)
                await pilot.press("p")
                assert app.paused
                extra = await asyncio.to_thread(httpx.get, srv.url + "/v1/nope2", headers=auth, timeout=30)
                await until(pilot, lambda: app.fold.record(int(extra.headers["x-request-id"])) is not None)
                await pilot.pause(0.4)
                assert table.row_count == 3  # frozen, but folded
                await pilot.press("p")
                await until(pilot, lambda: table.row_count == 4)

                # the charts drew the two generations
                rates = app.query_one("#rates").render()
                times = app.query_one("#times").render()
                assert "smollm2-135m" in rates.plain and "tok/s" in rates.plain
                assert f"#{ids[1]}" in times.plain and f"#{ids[2]}" in times.plain

        asyncio.run(main())


def test_console_shows_a_replica_down(server):
    """A replica marked down (a ``modelHealth`` event) is shown in red with
    its state among the models, its group and the other replica as usual."""
    with group_with_a_replica_down(server) as srv:

        async def main() -> None:
            app = ConsoleApp(srv.url)
            async with app.run_test(size=(200, 50)) as pilot:
                await until(pilot, lambda: app.source.connected and "pool@b" in app.fold.unwell)
                await pilot.pause(0.4)
                band = app.query_one("#band").render()  # a Textual Content: plain text and spans
                plain = band.plain  # type: ignore[union-attr]
                assert "pool@a, pool@b down, pool" in plain  # members attach first
                down, up = plain.index("pool@b down"), plain.index("pool@a")
                spans = band.spans  # type: ignore[union-attr]
                assert any("red" in str(sp.style) for sp in spans if sp.start <= down < sp.end), spans
                assert not any("red" in str(sp.style) for sp in spans if sp.start <= up < sp.end), spans
                assert app.fold.unwell["pool@b"][0] == "down" and "unreachable" in app.fold.unwell["pool@b"][1]

        asyncio.run(main())


def pulls_shown(app: ConsoleApp) -> list[str]:
    widget = app.query_one("#pulls")
    if not widget.display:
        return []
    content = widget.render()
    return str(getattr(content, "plain", content)).splitlines()


def pull_line(app: ConsoleApp, start: str) -> str | None:
    return next((line for line in pulls_shown(app) if line.startswith(start)), None)


def test_console_shows_pulls_with_a_bar(tmp_path):
    """A pull in progress gets a bar under the band (the model, a bar of the
    bytes done over the total, the percentage, the sizes); one that ended
    stays a while as pulled, or failed with its reason, then goes."""
    with pulling_server(str(tmp_path)) as (srv, reg):

        async def main() -> None:
            app = ConsoleApp(srv.url)
            async with app.run_test(size=(200, 50)) as pilot:
                await until(pilot, lambda: app.source.connected)
                assert pulls_shown(app) == []  # nothing pulled yet: no pane at all
                held = HeldPull(srv, reg)
                try:
                    await asyncio.to_thread(held.start)
                    await until(pilot, lambda: pull_line(app, "pulling smollm2:135m") is not None)
                    line = pull_line(app, "pulling smollm2:135m")
                    assert f"   0%  0 B / {size_text(held.size)}" in line and "░" in line and "█" not in line, line
                    at = now_ms()
                    tell_pull(srv, "started", at)
                    tell_pull(srv, "progress", at + 2000, 42 * MIB)
                    await until(pilot, lambda: "42%" in (pull_line(app, "pulling org/big:Q8_0") or ""))
                    line = pull_line(app, "pulling org/big:Q8_0")
                    assert "█░" in line and "42%  42.0 MiB / 100.0 MiB  21.0 MiB/s" in line, line
                    await asyncio.to_thread(held.finish)
                finally:
                    held.hold.release()
                await until(pilot, lambda: pull_line(app, "pulled  smollm2:135m") is not None)
                line = pull_line(app, "pulled  smollm2:135m")
                assert "100%" in line and "░" not in line and f"{size_text(held.size)} / " in line, line
                assert pull_line(app, "pulling smollm2") is None
                tell_pull(srv, "failed", now_ms(), 42 * MIB, reason="no space left on device")
                await until(pilot, lambda: pull_line(app, "failed  org/big:Q8_0") is not None)
                assert pull_line(app, "failed  org/big:Q8_0").endswith("no space left on device")
                assert [line.split()[0] for line in pulls_shown(app)] == ["pulled", "failed"]
                app.show_ended_s = 0.0  # (30 s by default) the ended pulls go, and the pane with them
                await until(pilot, lambda: pulls_shown(app) == [])

        asyncio.run(main())


def test_what_a_stranger_sends_is_shown_as_plain_text(server):
    """A path or model name anyone may send (no key needed for a 404; a web
    page can make the request with an <img>) is shown as written: Textual
    markup in it crashed the console (and again on every restart while the
    event was in the server's ring), and escape sequences in it reached the
    operator's terminal (a clipboard write, a title change)."""
    with fresh_server(server) as srv:
        hostile = [
            ("/[/x]", "/[/x]"),
            ("/%1b]52;c;aGk=%07x", "/\\x1b]52;c;aGk=\\x07x"),
            ("/%e2%80%aex", "/\\u202ex"),
        ]

        async def main() -> None:
            app = ConsoleApp(srv.url)
            async with app.run_test(size=(200, 50)) as pilot:
                await until(pilot, lambda: app.source.connected)
                ids = []
                for raw, _ in hostile:
                    r = await asyncio.to_thread(httpx.get, srv.url + raw, timeout=30)
                    assert r.status_code == 404
                    ids.append(int(r.headers["x-request-id"]))
                asked = await asyncio.to_thread(
                    chat, srv.url, model="[bold]x\x1b[2J[/bold]", max_tokens=2, content="Hi"
                )  # a model name no model has: the single model serves it
                ids.append(int(asked.headers["x-request-id"]))
                table = app.query_one("#requests")
                await until(pilot, lambda: table.row_count == len(ids))
                await pilot.pause(0.4)
                paths = [plain(table.get_row(str(i))[COL["path"]]) for i in ids[:3]]
                assert paths == [shown for _, shown in hostile]
                route = plain(table.get_row(str(ids[3]))[COL["route"]])
                assert route == "[bold]x\\x1b[2J[/bold] → smollm2-135m"
                table.focus()
                table.move_cursor(row=table.get_row_index(str(ids[1])))
                await pilot.pause(0.1)
                details = app.query_one("#details").render()
                text = details.plain if isinstance(details, Text) else str(details)
                assert "\\x1b]52" in text and "\x1b" not in text

        asyncio.run(main())


def test_frames_that_are_not_events_are_skipped_not_fatal():
    """A console pointed at something that is not turbospark (or a proxy
    that mangles the stream) exited with a traceback on a data line that is
    not JSON, or JSON of another shape; such frames are skipped."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from turbospark.views.console.client import EventSource
    from turbospark.views.fold import Fold

    body = (
        b"id: 1\nevent: modelAttached\ndata: not json\n\n"
        b"id: 2\nevent: modelAttached\ndata: 42\n\n"
        b"id: 3\nevent: gap\ndata: [1]\n\n"
        b"id: 4\nevent: modelAttached\ndata: {}\n\n"
        b'id: 5\nevent: modelAttached\ndata: {"kind":"modelAttached","atMs":1,"model":"m"}\n\n'
    )

    class Stream(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            time.sleep(5)  # held open, as the server's stream is

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Stream)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    async def read() -> list:
        got: list = []
        source = EventSource(f"http://127.0.0.1:{httpd.server_port}", retry_s=0.1)
        async for event in source.events():
            got.append(event)
            if isinstance(event, dict) and event.get("model") == "m":
                return got
        return got

    try:
        events = asyncio.run(asyncio.wait_for(read(), 30))
    finally:
        httpd.shutdown()
    fold = Fold().feed_all(events)
    assert fold.models == ["m"] and fold.malformed == 3
