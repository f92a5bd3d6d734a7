"""Recorded conformance: requests the real agent CLIs sent (Claude Code
2.1.197 and Codex 0.171.0, recorded by ``scripts/agents.py record``; long
texts trimmed, every field and the structure kept; Codex's empty-input probe,
which no recorded run sent, is derived from its recorded turns and marked
``derived``) replayed against a real server on
the real model. Every reply is 2xx and framed exactly as the CLI's parser
needs it.

Claude Code: ``HEAD /`` at start; ``/v1/messages?beta=true`` with its beta
headers, ``thinking: {type: adaptive}``, ``context_management``,
``output_config``, a system entry inside ``messages[]``, ``tool_result`` with
``cache_control``; ``count_tokens``. Codex: ``/v1/responses`` with
``developer`` messages, function tools beside a ``namespace`` and
``web_search`` tool, ``reasoning``, ``include: [reasoning.encrypted_content]``,
``prompt_cache_key``, ``client_metadata``, ``function_call`` /
``function_call_output`` history; its empty-input probe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import Hub
from turbospark.engine.model import ModelOptions
from turbospark.models.catalog import resolve_model
from turbospark.server import Server

FIXTURES = Path(__file__).parent / "fixtures" / "agents"


def recorded(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines() if line]


@pytest.fixture(scope="module")
def replay():
    """SmolLM2 with its whole 8k context (the trimmed Claude Code prompt is
    about 5.6k tokens) and one sequence: the recorded turns share their
    prefix, so only the first is prefilled whole."""
    path, _ = resolve_model("smollm2-135m")
    events = Hub()
    srv = Server(models=[ModelOptions(path=path, ctx=8192, parallel=1)], observer=events).start()
    yield srv, events
    srv.stop()


#: the reply's budget in a replay (the CLIs ask for 32k tokens or none: the
#: whole context, minutes of decoding on a small machine); nothing else of a
#: recorded body is changed
BUDGET = {"/v1/messages": "max_tokens", "/v1/responses": "max_output_tokens"}


def send(srv: Server, rec: dict[str, Any]) -> httpx.Response:
    url = srv.url + rec["path"] + (f"?{rec['query']}" if rec["query"] else "")
    body_obj = rec["body"]
    if rec["path"] in BUDGET and isinstance(body_obj, dict):
        key = BUDGET[rec["path"]]
        body_obj = {**body_obj, key: min(body_obj.get(key) or 24, 24)}
    body = None if body_obj is None else orjson.dumps(body_obj)
    return httpx.request(rec["method"], url, headers=rec["headers"], content=body, timeout=600)


def sse(text: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of every SSE frame; a frame of comment lines only
    (the keep-alive sent while a slow prefill runs) is skipped, as every SSE
    parser does."""
    out = []
    for frame in text.strip().split("\n\n"):
        if all(line.startswith(":") for line in frame.splitlines()):
            continue
        event, data = None, None
        for line in frame.splitlines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = orjson.loads(line[6:])
        assert data is not None, frame
        out.append((event, data))
    return out


def check_claude_stream(text: str) -> None:
    """What Claude Code's SDK parser needs: message_start first, content
    blocks opened before their deltas and closed, message_delta with
    stop_reason and usage, message_stop last; every frame's ``type`` equal
    to its event name."""
    frames = sse(text)
    names = [e for e, _ in frames if e != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    for event, data in frames:
        assert data["type"] == event
    start = frames[0][1]["message"]
    assert start["role"] == "assistant" and start["usage"]["input_tokens"] > 0
    open_blocks: set[int] = set()
    for event, data in frames:
        if event == "content_block_start":
            open_blocks.add(data["index"])
        elif event == "content_block_delta":
            assert data["index"] in open_blocks
        elif event == "content_block_stop":
            open_blocks.remove(data["index"])
    assert not open_blocks
    delta = next(d for e, d in frames if e == "message_delta")
    reasons = ("end_turn", "max_tokens", "tool_use", "model_context_window_exceeded")
    assert delta["delta"]["stop_reason"] in reasons and "output_tokens" in delta["usage"]


def check_codex_stream(text: str) -> dict[str, Any]:
    """What Codex's parser needs: every data has ``type`` (and equals the
    event name), ``response.created`` carries the response object, items
    are added before their deltas, and ``response.completed`` carries usage
    with the cached and reasoning token details. Returns the final
    response."""
    frames = sse(text)
    for event, data in frames:
        assert "type" in data and data["type"] == event
    assert frames[0][0] == "response.created" and frames[0][1]["response"]["object"] == "response"
    added: set[str] = set()
    for event, data in frames:
        if event == "response.output_item.added":
            added.add(data["item"]["id"])
        elif event.endswith(".delta"):
            assert data["item_id"] in added, event
    # completed, or incomplete when the token budget ran out (Codex reads both)
    assert frames[-1][0] in ("response.completed", "response.incomplete")
    response = frames[-1][1]["response"]
    assert response["status"] == frames[-1][0].split(".")[1]
    usage = response["usage"]
    assert usage["input_tokens"] > 0 and "cached_tokens" in usage["input_tokens_details"]
    assert "reasoning_tokens" in usage["output_tokens_details"]
    return response


def test_claude_code_replays(replay):
    srv, events = replay
    head, first, tool_result, count = recorded("claude-code")
    r = send(srv, head)
    assert r.status_code == 200
    for rec in (first, tool_result):
        assert rec["headers"]["anthropic-beta"] and rec["body"]["thinking"] == {"type": "adaptive"}
        r = send(srv, rec)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        check_claude_stream(r.text)
        # served by the one model, under the name the CLI asked for
        assert r.headers["x-request-id"]
    # the second turn is the first one's prefix plus the tool round: reused
    gens = [e for e in events.events if e.kind == "generated"]
    assert gens[-1].reused_prefix_tokens > gens[-1].prompt_tokens // 2
    # Claude Code's /context counts its tools' share (messages "foo", no
    # system): the count is what the same request prefills
    assert count["body"]["tools"] and "token-counting-2024-11-01" in count["headers"]["anthropic-beta"]
    counted = send(srv, count)
    assert counted.status_code == 200, counted.text
    same = send(srv, {**count, "path": "/v1/messages", "body": {**count["body"], "max_tokens": 1}})
    usage = same.json()["usage"]
    assert counted.json()["input_tokens"] == usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0) > 0


def test_codex_replays(replay):
    srv, _ = replay
    first, tool_result, probe = recorded("codex")
    assert any(t["type"] == "namespace" for t in first["body"]["tools"])
    for rec in (first, tool_result):
        r = send(srv, rec)
        assert r.status_code == 200, r.text
        check_codex_stream(r.text)
        # non-function tool types are ignored with a warning, never a 400
        assert "ignored" in r.headers.get("x-turbospark-warning", "")
    r = send(srv, probe)
    assert r.status_code == 200, r.text
    response = check_codex_stream(r.text)
    assert response["usage"]["output_tokens"] <= 1


def test_codex_replays_end_completed_when_the_model_ends_its_turn():
    """The real model above may spend the replay's whole budget (then the
    stream ends ``response.incomplete``, which Codex reports as an error);
    Codex sets no budget, so its turns end ``response.completed``: the same
    recorded bodies on a model that ends its turn end so, with the usage
    details Codex reads."""
    from tests.fakes import Script, ScriptedModel

    first, tool_result, _ = recorded("codex")
    model = ScriptedModel(scripts=[Script(["It ", "printed ", "hi."])], context=65536)
    with Server(models=[model]) as srv:
        for rec in (first, tool_result):
            r = send(srv, rec)
            assert r.status_code == 200, r.text
            assert sse(r.text)[-1][0] == "response.completed"
            response = check_codex_stream(r.text)
            assert (
                response["status"] == "completed" and response["output"][-1]["content"][0]["text"] == "It printed hi."
            )
