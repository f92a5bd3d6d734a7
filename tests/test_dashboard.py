"""GET /dashboard (the web page's Activity view) in a real headless Chromium
against a live server with API keys (the page takes the key from an older
link's ``#key=`` into the tab's storage): rows in the DOM, charts drawn, a
non-blank screenshot, and live updates from /v1/events."""

from __future__ import annotations

import io
import os
import re
import time

import httpx
import pytest

from turbospark.observe import ListObserver, now_ms

from .chromium import LivePage, run_once
from .views_support import MIB, HeldPull, chat, fresh_server, group_with_a_replica_down, pulling_server, tell_pull

ARTIFACTS = os.path.join(os.path.dirname(__file__), "artifacts")
KEY = "dash-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DECODE_GREEN = (0x3F, 0xB9, 0x50)  # the decode bars' colour in the page


@pytest.fixture(scope="module")
def dashed(server):
    seen = ListObserver()
    with fresh_server(server, observers=[seen], api_keys=[KEY]) as srv:
        fallback = chat(srv.url, model="gpt-4o", max_tokens=6, headers=AUTH)
        # (its prompt leaves the first one's after "Say hello": a miss to show)
        streamed = chat(srv.url, model="smollm2-135m", stream=True, max_tokens=6, content="Say hello, please.",
                        headers=AUTH)  # fmt: skip
        missing = httpx.get(srv.url + "/v1/nope", headers=AUTH, timeout=30)
        ids = [int(r.headers["x-request-id"]) for r in (fallback, streamed, missing)]
        deadline = time.monotonic() + 30
        while sum(e.kind == "generated" for e in seen.events) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield srv, seen, ids


def generated(seen: ListObserver, rid: int):
    return next(e for e in seen.events if e.kind == "generated" and e.id == rid)


def row_cells(dom: str, rid: int) -> list[str]:
    m = re.search(rf'<tr data-id="{rid}"[^>]*>(.*?)</tr>', dom, re.S)
    assert m, f"no row for request {rid}"
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", m.group(1), re.S)]


def test_dashboard_dom_and_screenshot(dashed):
    srv, seen, (fallback, streamed, missing) = dashed
    url = f"{srv.url}/dashboard#key={KEY}"
    dom = run_once(url, "--virtual-time-budget=8000", "--window-size=1400,900", "--dump-dom")
    rows = re.findall(r'<tr data-id="(\d+)"', dom)
    assert sorted(map(int, rows)) == sorted([fallback, streamed, missing]), dom[-2000:]
    f, s, m = row_cells(dom, fallback), row_cells(dom, streamed), row_cells(dom, missing)
    # id, status, method, path, route, stream, prompt, new, ...
    assert m[1] == "404" and m[3] == "/v1/nope" and m[4] == "–"
    assert f[1] == "200" and f[4] == "gpt-4o → smollm2-135m" and f[5] == "no"
    assert s[1] == "200" and s[4] == "smollm2-135m → smollm2-135m" and s[5] == "yes"
    for cells, rid in ((f, fallback), (s, streamed)):
        g = generated(seen, rid)
        assert (cells[6], cells[7]) == (str(g.prompt_tokens), str(g.new_tokens))
        # reused, and where the prompt left the cache ("miss at")
        miss = "–" if g.prefix_miss_at is None else str(g.prefix_miss_at)
        assert (cells[15], cells[16]) == (str(g.reused_prefix_tokens), miss), cells
    assert generated(seen, streamed).prefix_miss_at is not None
    assert re.search(r'<b id="requests">3</b>', dom) and re.search(r'<b id="errors">1</b>', dom)
    assert re.search(r'<b id="state" class="live">live</b>', dom)
    assert re.search(r'<b id="models"><span>smollm2-135m</span></b>', dom)
    assert re.search(r'<canvas id="rateChart"[^>]*data-points="2"', dom), "decode-rate chart drew nothing"
    assert re.search(r'<canvas id="timeChart"[^>]*data-points="2"', dom), "time chart drew nothing"

    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "dashboard.png")
    if os.path.exists(shot):
        os.unlink(shot)
    run_once(url, "--virtual-time-budget=8000", "--window-size=1400,900", f"--screenshot={shot}")
    assert_drawn(open(shot, "rb").read())


def assert_drawn(png: bytes) -> None:
    """A valid PNG with the page's colours and the decode bars in it."""
    import matplotlib.image as mpimg
    import numpy as np

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    img = (mpimg.imread(io.BytesIO(png), format="png")[..., :3] * 255).round().astype(np.uint8)
    assert img.shape[0] >= 600 and img.shape[1] >= 1000
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50, "the screenshot is blank"
    assert np.all(img == DECODE_GREEN, axis=-1).sum() > 100, "no decode bars in the screenshot"


def test_dashboard_updates_live_without_feeding_on_itself(dashed):
    srv, seen, ids = dashed
    with LivePage(f"{srv.url}/dashboard#key={KEY}") as page:
        page.wait("document.getElementById('state').textContent === 'live'")
        page.wait(f"document.querySelectorAll('#rows tr').length === {len(ids)}")
        r = chat(srv.url, model="gpt-4o", max_tokens=4, content="One more.", headers=AUTH)
        rid = int(r.headers["x-request-id"])
        cells = page.wait(
            f"(() => {{ const tr = document.querySelector('#rows tr[data-id=\"{rid}\"]');"
            " return tr && tr.children[1].textContent === '200' && tr.children[7].textContent !== '–'"
            " ? [...tr.children].map((td) => td.textContent) : null; })()"
        )
        g = generated(seen, rid)
        assert (cells[6], cells[7]) == (str(g.prompt_tokens), str(g.new_tokens))
        assert page.js("document.getElementById('requests').textContent") == str(len(ids) + 1)
        assert page.js("document.getElementById('rateChart').dataset.points") == "3"
        # the page re-reads /v1/stats because of OTHER clients' events only:
        # its own reads report events too, and following them would loop
        time.sleep(1.0)
        reads = lambda: sum(1 for e in seen.events if e.kind == "requestStarted" and e.path == "/v1/stats")
        before = reads()
        time.sleep(2.0)
        assert reads() == before
        # details pane and the errors-only filter
        page.js(f"document.querySelector('#rows tr[data-id=\"{rid}\"]').click()")
        assert f'"id": {rid}' in page.js("document.getElementById('details').textContent")
        toggle = (
            "(() => { const b = document.getElementById('errorsOnly'); b.checked = !b.checked;"
            " b.dispatchEvent(new Event('change')); })()"
        )
        page.js(toggle)
        assert page.js("document.querySelectorAll('#rows tr').length") == 1
        page.js(toggle)
        assert page.js("document.querySelectorAll('#rows tr').length") == len(ids) + 1
        os.makedirs(ARTIFACTS, exist_ok=True)
        assert_drawn(page.screenshot(os.path.join(ARTIFACTS, "dashboard-live.png")))


def test_dashboard_shows_a_replica_down(server):
    """A replica marked down is shown in red with its state among the
    models, and the reason in its tooltip."""
    with group_with_a_replica_down(server) as srv:
        dom = run_once(f"{srv.url}/dashboard", "--virtual-time-budget=8000", "--dump-dom")
        m = re.search(r'<b id="models">(.*?)</b>', dom, re.S)
        assert m, dom[-2000:]
        models = m.group(1)
        assert re.sub(r"<[^>]+>", "", models) == "pool@a, pool@b down, pool"  # members attach first
        down = re.search(r'<span class="s5 unwell" title="([^"]*)">pool@b down</span>', models)
        assert down and "unreachable" in down.group(1), models


def pull_row(page: LivePage, model: str, until: str = "true") -> dict:
    """What the page shows of one pull, once ``until`` (JS, of ``row``) holds."""
    return page.wait(
        f"(() => {{ const row = document.querySelector('#pulls .pull[data-model=\"{model}\"]');"
        " if (!row || document.getElementById('pulls').hidden) return null;"
        " const bar = row.querySelector('progress'), text = (c) => row.querySelector(c)?.textContent ?? null;"
        f" if (!({until})) return null;"
        " return { state: row.className, label: text('.state'), pct: text('.pct'), sizes: text('.sizes'),"
        " rate: text('.rate'), reason: text('.reason'), max: bar.getAttribute('max'),"
        " value: bar.getAttribute('value'), width: bar.getBoundingClientRect().width }; })()"
    )


def test_dashboard_shows_pulls_with_a_bar(tmp_path):
    """A pull in progress when the page opens is in its first paint (the
    server's fold has it), with a bar of the bytes done over the total and
    the percentage; what follows comes live: another pull's progress, the
    first one's end, a failure with its reason; ended pulls go after a while."""
    with pulling_server(str(tmp_path)) as (srv, reg):
        with HeldPull(srv, reg) as held, LivePage(f"{srv.url}/dashboard") as page:
            page.wait("document.getElementById('state').textContent === 'live'")
            row = pull_row(page, "smollm2:135m")
            assert (row["state"], row["label"], row["pct"]) == ("pull pulling", "pulling", "0%"), row
            assert (row["max"], row["value"]) == (str(held.size), "0") and row["width"] > 100, row
            at = now_ms()
            tell_pull(srv, "started", at)
            tell_pull(srv, "progress", at + 2000, 42 * MIB)
            row = pull_row(page, "org/big:Q8_0", "text('.pct') === '42%'")
            assert (row["max"], row["value"]) == (str(100 * MIB), str(42 * MIB)), row
            assert (row["sizes"], row["rate"]) == ("42.0 MiB / 100.0 MiB", "21.0 MiB/s"), row
            held.finish()
            row = pull_row(page, "smollm2:135m", "row.className === 'pull finished'")
            assert (row["label"], row["pct"]) == ("pulled", "100%"), row
            assert row["max"] == row["value"] == str(held.size), row
            tell_pull(srv, "failed", now_ms(), 42 * MIB, reason="no space left on device")
            row = pull_row(page, "org/big:Q8_0", "row.className === 'pull failed'")
            assert (row["label"], row["pct"], row["reason"]) == ("failed", "42%", "no space left on device"), row
            os.makedirs(ARTIFACTS, exist_ok=True)
            page.screenshot(os.path.join(ARTIFACTS, "dashboard-pulls.png"))
            # (30 s by default) the ended pulls go, and the pane with them
            page.js("turbospark.activity.shown.endedMs = 0; turbospark.activity.render();")
            page.wait("document.getElementById('pulls').hidden")


def test_dashboard_follows_a_responses_chain(server, tmp_path):
    """Real turns on a store-backed server: each row names its turn, the
    details its response and chain; a background run is a row of its own
    (its path says so) and a turn of the chain."""
    import openai

    with fresh_server(server, state_dir=str(tmp_path)) as srv:
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        first = oai.responses.create(model="smollm2-135m", input="My name is Ada.", max_output_tokens=4)
        second = oai.responses.create(
            model="smollm2-135m", input="What is my name?", previous_response_id=first.id, max_output_tokens=4
        )
        third = oai.responses.create(
            model="smollm2-135m", input="Say it again.", previous_response_id=second.id, background=True,
            max_output_tokens=4,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while oai.responses.retrieve(third.id).status in ("queued", "in_progress") and time.monotonic() < deadline:
            time.sleep(0.1)
        with LivePage(f"{srv.url}/dashboard") as page:
            rows = page.wait(
                "(() => { const rows = [...document.querySelectorAll('#rows tr')].map((tr) => ({ id: tr.dataset.id,"
                " status: tr.children[1].textContent, method: tr.children[2].textContent,"
                " path: tr.children[3].textContent, turn: tr.lastChild.textContent, title: tr.title }))"
                " .filter((r) => r.method === 'POST');"  # (not the GETs that polled the background run)
                " return rows.length === 4 && rows.every((r) => r.status === '200') ? rows.reverse() : null; })()"
            )
            assert [(r["path"], r["turn"]) for r in rows] == [
                ("/v1/responses", "1"),
                ("/v1/responses", "2"),
                ("/v1/responses", "–"),  # the background POST: it answered queued
                ("/v1/responses (background)", "3"),  # the run, a request of its own
            ], rows
            assert rows[1]["title"] == f"turn 2 of chain {first.id}"
            assert rows[3]["title"] == f"turn 3 of chain {first.id}"
            page.js(f"document.querySelector('#rows tr[data-id=\"{rows[1]['id']}\"]').click()")
            details = page.js("document.getElementById('details').textContent")
            assert details.startswith(f"{second.id}: turn 2 of chain {first.id}\n"), details
            assert f'"previousResponseId": "{first.id}"' in details
