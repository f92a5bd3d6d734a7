"""``turbospark report``: an event log written by a real server through the
``--event-log`` sink, folded, printed and plotted."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time

import httpx

from turbospark.cli import main
from turbospark.sinks.jsonl import JsonlSink
from turbospark.views.fold import Fold
from turbospark.views.report import PLOTS, summary_lines

from .views_support import chat, fresh_server


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_from_a_real_event_log(server, tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    sink = JsonlSink(str(log))
    with fresh_server(server, observers=[sink]) as srv:
        chat(srv.url, max_tokens=6)
        chat(srv.url, max_tokens=6)  # same prompt: prefix reuse
        chat(srv.url, model="smollm2-135m", stream=True, max_tokens=4)
        httpx.get(srv.url + "/v1/nope", timeout=30)
        httpx.get(srv.url + "/v1/stats", timeout=30)  # view traffic: not in the report
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the streamed turn closes with its generated
            s = srv.live.summary(max_requests=0)
            if s["generations"] == 3 and s["inFlight"] == 0:
                break
            time.sleep(0.05)
    sink.close()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(e["kind"] == "generated" for e in events) == 3

    out = tmp_path / "plots"
    assert main(["report", str(log), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    fold = Fold(max_requests=None).feed_all(events)
    s = fold.summary()
    for line in summary_lines(fold):  # exactly the fold's numbers
        assert line in printed
    table = {line[:24].strip(): line[24:].strip() for line in printed.splitlines() if len(line) > 24}
    assert table["requests"] == "4" == str(s["requests"])
    assert table["errors"] == "1"
    assert table["new tokens"] == str(sum(e["newTokens"] for e in events if e["kind"] == "generated"))
    assert table["prompt tokens"] == str(sum(e["promptTokens"] for e in events if e["kind"] == "generated"))
    assert table["reused prefix tokens"] == str(s["reusedTokens"]) and s["reusedTokens"] > 0
    assert table["decode tok/s"] == f"{s['decodeTokPerSec']:.2f}"
    assert table["prefill p95 ms"] == f"{s['prefillMs']['p95']:.2f}"
    assert table["queue p50 ms"] == f"{s['queueMs']['p50']:.2f}" and s["queueMs"]["n"] == 3  # streams too
    assert table["models attached at end"] == "smollm2-135m"
    for name in PLOTS:
        data = (out / name).read_bytes()
        w, h = png_size(data)
        assert w >= 400 and h >= 200 and len(data) > 5000
        assert f"wrote {out / name}" in printed


def test_report_command_line(tmp_path):
    log = tmp_path / "empty.jsonl"
    log.write_text('{"kind":"modelAttached","atMs":1,"model":"m"}\n{"kind":"requestSta')  # torn last line
    run = subprocess.run(
        [sys.executable, "-m", "turbospark.cli", "report", str(log), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "requests                0" in run.stdout and "models attached at end  m" in run.stdout
    assert all((tmp_path / "o" / name).exists() for name in PLOTS)
    missing = subprocess.run(
        [sys.executable, "-m", "turbospark.cli", "report", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "no such event log" in missing.stderr


def test_a_log_appended_to_by_two_runs_and_lines_of_other_shapes():
    """Ids start again at 1 in each server run: two requests a kill cut
    short vanished (the next run's same ids closed them), and the report
    said nothing was unfinished. A line that parses as JSON but is not an
    event as the server writes it crashed the report; it is counted and
    skipped, as a line that is not JSON is."""

    def req(rid: int, status: int | None) -> list[dict]:
        out: list[dict] = [{"kind": "requestStarted", "id": rid, "atMs": rid, "method": "POST", "path": "/v1/messages"}]
        if status is not None:
            out.append({"kind": "requestFinished", "id": rid, "status": status, "durationMs": 5})
        return out

    first = req(1, 200) + req(2, None) + req(3, None)  # killed with 2 and 3 running
    second = req(1, 200) + req(2, 200) + req(3, 200)
    odd: list = [42, [1, 2], None, "text", {"kind": "modelAttached"}, {"kind": "gap", "missed": "lots"}]
    odd += [{"kind": "requestFinished", "id": [3], "status": 200}, {**req(9, None)[0], "atMs": "soon"}]
    odd += [{"kind": "generated", "id": 1, "model": "m", "promptTokens": None, "prefillSeconds": "0.1"}]
    f = Fold(max_requests=None).feed_all([*first, *odd, *second])
    assert (f.runs, f.unfinished, f.malformed) == (2, 2, len(odd))
    # every run's records are kept (the report plots them)
    assert [(r.id, r.status) for r in f.records()] == [(1, 200), (2, None), (3, None), (1, 200), (2, 200), (3, 200)]
    assert (f.requests, f.finished, f.errors, f.in_flight) == (6, 4, 2, 0)
    assert f.usage.generations == 0  # the odd generated was not folded in part
    lines = summary_lines(f)
    assert "server runs             2" in lines and "unfinished (run ended)  2" in lines
