"""The event log never takes the server down (issue 16 point 4): a full
disk is reported once, counted and survived; writing resumes when the disk
accepts again, after a gap marker; the queue is bounded; the file rotates."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import httpx

from turbospark.observe import RequestStarted
from turbospark.sinks.jsonl import JsonlSink
from turbospark.views.fold import Fold

from .test_cli import listening_url, turbospark


def started(i: int) -> RequestStarted:
    return RequestStarted(id=i, at_ms=1_700_000_000_000 + i, method="POST", path="/v1/chat/completions")


def lines_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_full_disk_is_reported_once_counted_and_the_server_keeps_serving():
    proc = subprocess.Popen(
        turbospark("serve", "--port", "0", "--ctx", "2048", "--event-log", "/dev/full"),
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    early: list[str] = []  # (what it said before it listened: a write may fail that soon on a slow machine)
    try:
        url = listening_url(proc, early)
        for stream in (False, True, False):
            r = httpx.post(
                url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": stream},
                timeout=60,
            )
            assert r.status_code == 200
        errors = 0.0
        for _ in range(100):  # the writer tries within its flush interval
            metrics = httpx.get(url + "/metrics", timeout=30).text
            errors = _counter(metrics, "turbospark_event_log_errors_total")
            if errors >= 1:
                break
            subprocess.run(["sleep", "0.1"])
        assert errors >= 1
        assert _counter(metrics, "turbospark_event_log_dropped_total") >= 1
        assert httpx.get(url + "/health", timeout=30).json()["status"] == "ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    err = "".join(early) + err
    assert proc.returncode == 0, err
    assert err.count("writing the event log /dev/full failed") == 1, err
    assert "Traceback" not in err


def _counter(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_writing_resumes_when_the_disk_accepts_again_after_a_gap_marker(tmp_path):
    """A real write failure: the file-size limit (RLIMIT_FSIZE, in a child
    process) makes writes fail with EFBIG as a full disk would, then is
    lifted."""
    path = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import resource, signal, sys, time
        sys.path[:0] = {sys.path!r}
        from turbospark.observe import RequestStarted
        from turbospark.sinks.jsonl import JsonlSink
        ev = lambda i: RequestStarted(id=i, at_ms=1, method="GET", path="/x")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        sink = JsonlSink({str(path)!r}, flush_every=0.05)
        sink.record(ev(1))
        time.sleep(0.5)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, hard))  # the disk is full
        for i in range(2, 40):
            sink.record(ev(i))
        deadline = time.time() + 20
        while sink.errors == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert sink.errors >= 1, "no write failed"
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
        time.sleep(1.5)  # past the writer's retry pause
        sink.record(ev(100))
        sink.close()
        print(sink.errors, sink.dropped)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    errors, dropped = map(int, out.stdout.split())
    assert errors >= 1 and dropped >= 1
    assert out.stderr.count("writing the event log") == 1  # reported once
    assert "writable again" in out.stderr
    lines = lines_of(path)
    ids = [e.get("id") for e in lines if e["kind"] == "requestStarted"]
    assert ids[0] == 1 and ids[-1] == 100  # before the failure and after it
    gaps = [e for e in lines if e["kind"] == "gap"]
    assert len(gaps) == 1 and gaps[0]["missed"] == dropped
    # the gap comes right before the first event written after the outage
    assert lines[lines.index(gaps[0]) + 1]["kind"] == "requestStarted"
    # readers count what was lost
    assert Fold().feed_all(lines).dropped_events == dropped


def test_the_queue_is_bounded_dropping_the_oldest_and_counting(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path), max_queue=5)
    with sink._cond:  # the writer cannot take anything meanwhile
        for i in range(1, 21):
            sink.record(started(i))
        assert len(sink._queue) == 5
    sink.close()
    assert sink.dropped == 15
    lines = lines_of(path)
    assert lines[0]["kind"] == "gap" and lines[0]["missed"] == 15
    assert [e["id"] for e in lines[1:]] == [16, 17, 18, 19, 20]  # the newest kept


def test_a_log_ending_in_a_partial_line_is_appended_to_on_a_new_line(tmp_path):
    """A process killed mid-write leaves half a line: the next run's first
    event was glued to it, and lost to every reader."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b'{"kind":"requestStarted","id":1,"atMs":0,"method":"GET","path":"/x"}\n{"kind":"generated","id":7,"mo'
    )
    sink = JsonlSink(str(path))
    sink.record(started(2))
    sink.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == b'{"kind":"generated","id":7,"mo' and json.loads(lines[2])["id"] == 2 and lines[3] == b""


def test_the_log_rotates_past_max_bytes_keeping_one_old_file(tmp_path):
    path = tmp_path / "events.jsonl"
    one = len(json.dumps(started(1).to_dict(), separators=(",", ":"))) + 1
    sink = JsonlSink(str(path), flush_every=0.01, max_bytes=one * 10)
    for i in range(1, 61):
        sink.record(started(i))
        if i % 5 == 0:  # several writes, so rotation happens between them
            _settle(sink)
    sink.close()
    old, new = lines_of(tmp_path / "events.jsonl.1"), lines_of(path)
    assert path.stat().st_size <= one * 10 and (tmp_path / "events.jsonl.1").stat().st_size <= one * 10
    ids = [e["id"] for e in old + new]
    assert ids == list(range(ids[0], 61))  # the newest events, in order, none lost between the files
    assert not list(tmp_path.glob("events.jsonl.2"))
    # both files readable by their owner only (errors in them may quote requests)
    assert path.stat().st_mode & 0o077 == 0 and (tmp_path / "events.jsonl.1").stat().st_mode & 0o077 == 0
    older = tmp_path / "older.jsonl"  # one an older version made readable by all
    older.write_text("")
    older.chmod(0o644)
    JsonlSink(str(older)).close()
    assert older.stat().st_mode & 0o777 == 0o600


def _settle(sink: JsonlSink) -> None:
    for _ in range(400):
        with sink._cond:
            if not sink._queue:
                return
        subprocess.run(["sleep", "0.01"])


def test_an_event_that_cannot_be_serialized_does_not_stop_the_writer(tmp_path):
    class Broken:
        def to_dict(self) -> dict:
            return {"kind": "broken", "value": {1, 2}}  # a set: not JSON

    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path), flush_every=0.01)
    sink.record(started(1))
    sink.record(Broken())  # type: ignore[arg-type]
    _settle(sink)
    sink.record(started(2))
    sink.close()
    lines = lines_of(path)
    assert [e["id"] for e in lines if e["kind"] == "requestStarted"] == [1, 2]
    assert sink.dropped == 1 and [e["missed"] for e in lines if e["kind"] == "gap"] == [1]
