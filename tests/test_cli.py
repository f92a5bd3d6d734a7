"""`turbospark serve` as a user runs it: start-up summary, a request, the
event log, and a clean Ctrl-C."""

from __future__ import annotations

import json
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
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=60,
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        )
        assert r.status_code == 200
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


@pytest.mark.parametrize("where", ["missing/e.jsonl", ".", "/proc/e.jsonl"])
def test_an_event_log_that_cannot_be_opened_exits_2_with_a_message(tmp_path, where):
    path = where if where.startswith("/") else str(tmp_path / where)
    out = subprocess.run(
        turbospark("serve", "--port", "0", "--event-log", path), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert f"cannot open the event log {path}" in out.stderr and "Traceback" not in out.stderr


def test_sigterm_flushes_the_event_log_and_exits_0(tmp_path):
    """uvicorn re-raised the signal after stopping, which killed the process
    before the event log was flushed: a request finished 0.1 s before
    SIGTERM lost half its events."""
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
            r = httpx.post(
                url + "/v1/chat/completions",
                timeout=60,
                json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": stream},
            )
            assert r.status_code == 200
            rids.append(int(r.headers["x-request-id"]))
        time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "shutting down" in err
    events = [json.loads(x) for x in log.read_text().splitlines()]
    for rid in rids:
        kinds = [e["kind"] for e in events if e.get("id") == rid]
        assert kinds == ["requestStarted", "requestRouted", "generated", "requestFinished"], kinds
