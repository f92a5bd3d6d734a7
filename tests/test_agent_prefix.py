"""Prefix reuse that survives agent clients, on the real models: Claude Code's
per-session attribution stamp is taken out of the prompt (counted in
``requestRouted``), its session header picks the session slot, and every
``generated`` says where its prompt left the cache (``prefixMissAt``)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from turbospark.dialects.stamps import strip_stamps
from turbospark.routes.admin import session_hash

LONG_SYSTEM = (
    "You are a careful coding agent working in a terminal. Read files before you change them, keep edits "
    "small, run the tests after each change, and explain what you did in one short paragraph. "
) * 6


def stamp(cch: str, version: str = "2.1.197.0df") -> str:
    return f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli; cch={cch};"


def system(cch: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": stamp(cch)}, {"type": "text", "text": LONG_SYSTEM}]


def test_strip_stamps():
    text, n = strip_stamps(stamp("a5145") + "\nYou are Claude Code.")
    assert (text, n) == ("You are Claude Code.", 1)
    assert strip_stamps("no stamp here") == ("no stamp here", 0)
    # only a whole line is a stamp
    assert strip_stamps("say x-anthropic-billing-header: hi")[1] == 0


def generated_of(hub, rid: int):
    return hub.wait_kind(rid, "generated", timeout=120)


def _ask(url: str, cch: str, question: str) -> httpx.Response:
    body = {
        "model": "m",
        "max_tokens": 4,
        "system": system(cch),
        "messages": [{"role": "user", "content": question}],
    }
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "x"}
    r = httpx.post(url + "/v1/messages", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_a_new_session_reuses_the_prompt_past_its_stamp(qwen_server):
    srv, hub = qwen_server
    first = _ask(srv.url, "a5145", "List the files.")
    second = _ask(srv.url, "9f0c2", "List the files.")
    routed = hub.wait_kind(int(second.headers["x-request-id"]), "requestRouted")
    assert routed.normalized_stamps == 1
    gen = generated_of(hub, int(second.headers["x-request-id"]))
    # the whole prompt but the last token comes from the cache: the stamp
    # that differs is not in it
    assert gen.reused_prefix_tokens == gen.prompt_tokens - 1
    assert gen.prefix_miss_at is None
    usage = second.json()["usage"]
    ant = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
    counted = ant.messages.count_tokens(
        model="m", system=system("77777"), messages=[{"role": "user", "content": "List the files."}]
    )
    assert counted.input_tokens == usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert first.status_code == 200


@pytest.fixture(scope="module")
def unnormalized(tmp_path_factory):
    """``turbospark serve --normalize-client-stamps off`` on the Qwen model
    (the flag as a user types it): ``(url, event log)``."""
    import subprocess
    import threading

    from tests.test_cli import listening_url, turbospark

    log = tmp_path_factory.mktemp("unnormalized") / "events.jsonl"
    args = ["serve", "--model", "qwen2.5-coder-0.5b", "--port", "0", "--ctx", "4096", "--parallel", "1"]
    proc = subprocess.Popen(
        turbospark(*args, "--normalize-client-stamps", "off", "--event-log", str(log)),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = listening_url(proc)
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # (never let its pipe fill)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _logged(log, rid: int, kind: str) -> dict:
    """Event ``kind`` of request ``rid`` from a server's event log (written
    in batches, behind the request)."""
    import json
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else []:
            e = json.loads(line)
            if e.get("id") == rid and e.get("kind") == kind:
                return e
        time.sleep(0.1)
    raise AssertionError(f"no {kind} for request {rid} in the event log")


def test_with_normalization_off_the_stamp_ends_reuse_and_says_where(unnormalized):
    url, log = unnormalized
    _ask(url, "a5145", "List the files.")
    second = _ask(url, "9f0c2", "List the files.")
    rid = int(second.headers["x-request-id"])
    routed = _logged(log, rid, "requestRouted")
    assert "normalizedStamps" not in routed, routed
    gen = _logged(log, rid, "generated")
    assert gen["prefixMissAt"] is not None and 0 < gen["prefixMissAt"] < 40, gen
    assert gen["reusedPrefixTokens"] <= gen["prefixMissAt"]


def test_prefix_miss_is_where_the_prompt_changed(base_url, hub):
    msgs = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "What is a unit test?"}]
    body = {"model": "m", "messages": msgs, "max_tokens": 2, "temperature": 0, "user": "miss-test"}
    first = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60)
    first_gen = generated_of(hub, int(first.headers["x-request-id"]))
    # other tests' prompts share the chat template's opening at most
    assert first_gen.prefix_miss_at is None or first_gen.prefix_miss_at < 10
    changed = [{"role": "system", "content": LONG_SYSTEM.replace("run the tests", "skip the tests", 1)}, msgs[1]]
    second = httpx.post(base_url + "/v1/chat/completions", json={**body, "messages": changed}, timeout=60)
    gen = generated_of(hub, int(second.headers["x-request-id"]))
    # the change is about 30 tokens into the system prompt
    assert gen.prefix_miss_at is not None and 20 < gen.prefix_miss_at < 60
    assert gen.reused_prefix_tokens == gen.prefix_miss_at


def test_agent_session_keys_pick_the_slot_on_qwen(qwen_server):
    """Claude Code's session header picks the slot even though its body
    names a user (``metadata.user_id``, the device: every session on it
    sends the same), and Codex's ``prompt_cache_key`` picks it over the
    Responses API; each conversation's next turn reuses its own slot."""
    import openai

    srv, hub = qwen_server

    def slot_keys() -> list[str | None]:
        return [s["session_key"] for s in httpx.get(srv.url + "/v1/slots", timeout=30).json()["data"]]

    body = {
        "model": "m",
        "max_tokens": 2,
        "metadata": {"user_id": '{"device_id":"7e0d915c","account_uuid":"","session_id":"x"}'},
        "messages": [{"role": "user", "content": "hello there"}],
    }
    headers = {"anthropic-version": "2023-06-01", "x-claude-code-session-id": "cc-session-7"}
    r = httpx.post(srv.url + "/v1/messages", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    assert session_hash("cc-session-7") in slot_keys()
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    first = oai.responses.with_raw_response.create(
        model="m", input="Say hi.", max_output_tokens=4, prompt_cache_key="codex-thread-3", temperature=0
    )
    assert session_hash("codex-thread-3") in slot_keys()
    again = oai.responses.with_raw_response.create(
        model="m",
        input=[
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": first.parse().output_text},
            {"role": "user", "content": "Again."},
        ],
        max_output_tokens=4,
        prompt_cache_key="codex-thread-3",
        temperature=0,
    )
    before = generated_of(hub, int(first.headers["x-request-id"]))
    gen = generated_of(hub, int(again.headers["x-request-id"]))
    assert gen.reused_prefix_tokens >= before.prompt_tokens - 1, (before, gen)
