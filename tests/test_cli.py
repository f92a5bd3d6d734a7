"""`turbospark serve` as a user runs it: start-up summary, a request, the
event log, and a clean Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest


def turbospark(*args: str) -> list[str]:
    return [sys.executable, "-m", "turbospark.cli", *args]


def listening_url(proc: subprocess.Popen, lines: list[str] | None = None) -> str:
    """The address a starting ``turbospark serve`` prints (its stderr lines
    so far are appended to ``lines``)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if lines is not None:
            lines.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return m.group(1)
    raise AssertionError("the server never said where it listens: " + "".join(lines or []))


def say_hi(url: str, model: str = "m", max_tokens: int = 3, stream: bool = False) -> httpx.Response:
    """One short chat request to a server the test started; it must be answered."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={**body, "stream": stream})
    assert r.status_code == 200, r.text
    return r


def test_serve_default_model_event_log_and_ctrl_c(tmp_path):
    log = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        turbospark("serve", "--port", "0", "--event-log", str(log), "--ctx", "2048", "--alias", "house-model"),
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines: list[str] = []
        url = listening_url(proc, lines)
        text = "".join(lines)
        assert "loading SmolLM2-135M-Instruct.Q4_1.gguf" in text  # progress display
        assert "model smollm2-135m" in text and "context 2048" in text  # start-up summary
        say_hi(url, "gpt-4o", max_tokens=4)
        assert httpx.get(url + "/health").json()["state"] == "ready"
        assert httpx.get(url + "/v1/models/house-model").json()["id"] == "smollm2-135m"
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "shutting down" in err
    events = [json.loads(x) for x in log.read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "modelAttached"
    assert "generated" in kinds and kinds.count("requestFinished") == 3


def test_models_lists_catalog():
    out = subprocess.run(turbospark("models"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert re.search(r"smollm2-135m\s+installed", out.stdout)


def test_missing_model_exits_2(tmp_path):
    out = subprocess.run(
        turbospark("serve", "--model", str(tmp_path / "nope.gguf")), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "nope.gguf" in out.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--host", "0.0.0.0"], "refusing to listen on 0.0.0.0 without an API key"),
        (["--api-key-file", "/nonexistent/keys"], "cannot read the API key file /nonexistent/keys"),
        (["--max-body", "lots"], "not a size"),
    ],
)
def test_unsafe_or_broken_security_settings_exit_2(args, message):
    out = subprocess.run(turbospark("serve", *args), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_a_cache_dir_that_cannot_keep_records_exits_2_at_start(tmp_path):
    """Found at start (it was found only when the KV was written at the exit)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = subprocess.run(
        turbospark("serve", "--port", "0", "--cache-dir", str(blocker)), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert f"--cache-dir {blocker}:" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("where", ["missing/e.jsonl", ".", "/proc/e.jsonl"])
def test_an_event_log_that_cannot_be_opened_exits_2_with_a_message(tmp_path, where):
    path = where if where.startswith("/") else str(tmp_path / where)
    out = subprocess.run(
        turbospark("serve", "--port", "0", "--event-log", path), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert f"cannot open the event log {path}" in out.stderr and "Traceback" not in out.stderr


def test_a_hangup_whose_terminal_is_gone_still_closes_everything(tmp_path):
    """A real hangup: the terminal the server wrote to is gone, so writing
    the shutdown line failed (EIO) and skipped closing the models and the
    event log; and the terminal's SIGHUP often comes twice (the shell, then
    the kernel), which is no second signal."""
    import pty

    log = tmp_path / "events.jsonl"
    master, terminal = pty.openpty()
    proc = subprocess.Popen(
        turbospark("serve", "--port", "0", "--event-log", str(log)),
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    try:
        seen = b""
        deadline = time.monotonic() + 60
        while (m := re.search(rb"listening on (http://\S+?)\r?\n", seen)) is None:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            seen += os.read(master, 4096)
        url = m.group(1).decode()
        rid = int(say_hi(url).headers["x-request-id"])
    finally:
        os.close(master)  # the terminal closes ...
        proc.send_signal(signal.SIGHUP)  # ... and hangs up, twice
        time.sleep(0.2)
        proc.send_signal(signal.SIGHUP)
        proc.wait(timeout=60)
    assert proc.returncode == 0
    kinds = [e["kind"] for e in map(json.loads, log.read_text().splitlines()) if e.get("id") == rid]
    assert kinds == ["requestStarted", "requestRouted", "generated", "requestFinished"], kinds


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_flushes_the_event_log_and_exits_0(tmp_path, sig):
    """uvicorn re-raised the signal after stopping, which killed the process
    before the event log was flushed: a request finished 0.1 s before
    SIGTERM lost half its events. A closed terminal's SIGHUP drains the
    same way (it killed the process on the spot)."""
    log = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        turbospark("serve", "--port", "0", "--event-log", str(log)),
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = listening_url(proc)
        rids = []
        for stream in (False, True):
            rids.append(int(say_hi(url, stream=stream).headers["x-request-id"]))
        time.sleep(0.1)
    finally:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "shutting down" in err
    events = [json.loads(x) for x in log.read_text().splitlines()]
    for rid in rids:
        kinds = [e["kind"] for e in events if e.get("id") == rid]
        assert kinds == ["requestStarted", "requestRouted", "generated", "requestFinished"], kinds
