"""Stored responses across restarts of ``turbospark serve`` (issue 37): a
server killed with SIGKILL mid-stream comes back with every finished
response intact and the cut one ``incomplete``, never ``in_progress``; and a
chain continued after a graceful restart with ``--cache-dir`` starts from
the KV kept on disk (``reusedPrefixTokens`` > 0)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import openai

from .test_cli import listening_url, turbospark

#: an answer that goes on past 400 tokens at temperature 0 (a count ends within a few)
LONG = "Write a long story about a dragon who learns to bake bread, in many chapters."


def serve(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        turbospark("serve", "--port", "0", "--ctx", "2048", *args),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        return proc, listening_url(proc)
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert sig == signal.SIGKILL or proc.returncode == 0, err


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_sigkill_mid_stream_keeps_the_finished_and_marks_the_cut(tmp_path):
    state = str(tmp_path / "state")
    proc, url = serve("--state-dir", state)
    try:
        oai = client(url)
        kept = [oai.responses.create(model="m", input=f"Say {w}.", max_output_tokens=6) for w in ("one", "two")]
        cut_id = None
        with oai.responses.create(model="m", input=LONG, temperature=0, max_output_tokens=300, stream=True) as events:
            for event in events:
                if event.type == "response.created":
                    cut_id = event.response.id
                if event.type == "response.output_text.delta":
                    proc.kill()  # SIGKILL: no drain, no last write
                    proc.wait(30)
                    break
        assert cut_id is not None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    proc, url = serve("--state-dir", state)
    try:
        oai = client(url)
        for before in kept:
            after = oai.responses.retrieve(before.id)
            assert after.status == before.status and after.output_text == before.output_text
            assert after.usage == before.usage
        cut = oai.responses.retrieve(cut_id)
        assert cut.status in ("incomplete", "failed"), cut.status
        chained = oai.responses.create(model="m", input="Hi", previous_response_id=kept[1].id, max_output_tokens=2)
        assert chained.previous_response_id == kept[1].id
    finally:
        stop(proc)


def _made(log: Path, response_id: str) -> dict:
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (routed,) = [e for e in events if e["kind"] == "requestRouted" and e.get("responseId") == response_id]
    (gen,) = [e for e in events if e["kind"] == "generated" and e["id"] == routed["id"]]
    return gen


def test_a_chain_continues_warm_after_a_restart_with_cache_dir(tmp_path):
    state, cache = str(tmp_path / "state"), str(tmp_path / "kv")
    first_log, second_log = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    proc, url = serve("--state-dir", state, "--cache-dir", cache, "--event-log", str(first_log))
    try:
        oai = client(url)
        first = oai.responses.create(
            model="m", instructions="You are terse.", input="My name is Ada. Greet me.", max_output_tokens=8
        )
        second = oai.responses.create(
            model="m", input="What is my name?", previous_response_id=first.id, max_output_tokens=8
        )
    finally:
        stop(proc)
    assert _made(first_log, second.id)["reusedPrefixTokens"] > 0

    proc, url = serve("--state-dir", state, "--cache-dir", cache, "--event-log", str(second_log))
    try:
        third = client(url).responses.create(
            model="m", input="Thanks.", previous_response_id=second.id, max_output_tokens=4
        )
        assert third.previous_response_id == second.id and third.status in ("completed", "incomplete")
    finally:
        stop(proc)
    gen = _made(second_log, third.id)
    assert gen["reusedPrefixTokens"] > 0, gen  # the chain's KV, read back from --cache-dir
