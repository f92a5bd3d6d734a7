"""A long prefill never loses the client (issue 42, item 16). Claude Code's
first request once took 302 s to prefill; the stream was silent after its
opening, and at 300 s Node's fetch gave up. While a streamed answer waits
(queued, prefilling, or any long gap) it sends its dialect's keep-alive
every ``sse_keepalive`` seconds: Anthropic's ``ping`` event, an SSE comment line
for the OpenAI dialects and llama-server's routes. Here a scripted model
waits longer than the clients' read timeout before each token, and every
official client reads its answer whole."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import orjson
import pytest

from turbospark import ListObserver, Server

from .fakes import Script, ScriptedModel

#: the clients give up after this long without a byte
READ_TIMEOUT = 1.0
#: the scripted model's wait before each of its two tokens (a prefill, then a slow step)
WAIT = 1.6
ANSWER = ["Hi", " there"]
TIMEOUT = httpx.Timeout(30.0, read=READ_TIMEOUT)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    model = ScriptedModel(scripts=[Script(ANSWER, delay=WAIT)])
    state = str(tmp_path_factory.mktemp("state"))
    with Server(models=[model], observer=ListObserver(), sse_keepalive=0.2, state_dir=state) as server:
        yield server


def test_anthropic_sdk_reads_a_stream_quiet_for_longer_than_its_timeout(srv: Server):
    timeout = anthropic.Timeout(30.0, read=READ_TIMEOUT)
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=timeout)

    def sdk() -> str:
        with client.messages.stream(
            model="scripted", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            return stream.get_final_text()

    def raw() -> str:
        with httpx.stream("POST", srv.url + "/v1/messages", timeout=TIMEOUT,
                          json={"model": "scripted", "max_tokens": 20, "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]}) as r:  # fmt: skip
            return r.read().decode()

    # both at once (the script waits between tokens): one answer's time
    with ThreadPoolExecutor(2) as pool:
        text, body = pool.submit(sdk), pool.submit(raw)
    assert text.result() == "".join(ANSWER)
    names = [line[7:] for line in body.result().splitlines() if line.startswith("event: ")]
    first_text = names.index("content_block_delta")
    # pings while the first token was awaited (the opening sends one of its own)
    assert names[:2] == ["message_start", "ping"] and names[2:first_text].count("ping") >= 3, names
    assert names[-1] == "message_stop"


def test_openai_sdk_chat_stream_stays_alive(srv: Server):
    client = openai.OpenAI(
        base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=openai.Timeout(30.0, read=READ_TIMEOUT)
    )
    stream = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "".join(ANSWER)


def test_openai_sdk_responses_stream_stays_alive(srv: Server):
    client = openai.OpenAI(
        base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=openai.Timeout(30.0, read=READ_TIMEOUT)
    )
    events = list(client.responses.create(model="scripted", input="hi", stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "".join(ANSWER)


def test_llama_server_completion_stream_sends_comment_lines(srv: Server):
    with httpx.stream("POST", srv.url + "/completion", timeout=TIMEOUT,
                      json={"prompt": "hi", "n_predict": 8, "stream": True}) as r:  # fmt: skip
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200
    comments = [line for line in lines if line.startswith(":")]
    assert comments and set(comments) == {": keep-alive"}, lines
    data = [orjson.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert "".join(d.get("content", "") for d in data) == "".join(ANSWER) and data[-1]["stop"] is True


def test_ollama_ndjson_gets_no_keep_alive_line(srv: Server):
    """Every NDJSON line is a message its clients parse: none is added (an
    Ollama client waits without an idle timer of its own)."""
    with httpx.stream("POST", srv.url + "/api/chat", timeout=httpx.Timeout(30.0),
                      json={"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}) as r:  # fmt: skip
        lines = [orjson.loads(line) for line in r.iter_lines() if line]
    assert "".join(line["message"]["content"] for line in lines) == "".join(ANSWER) and lines[-1]["done"]


def test_a_background_stream_and_its_reader_stay_alive(srv: Server):
    """A background run streamed (and followed again by its id) is a stream
    too: quiet while the run waits for its first token, it sends keep-alives."""
    client = openai.OpenAI(
        base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=openai.Timeout(30.0, read=READ_TIMEOUT)
    )

    def follow() -> tuple[int, list[str]]:
        started = client.responses.create(model="scripted", input="hi", background=True)
        with httpx.stream("GET", f"{srv.url}/v1/responses/{started.id}", params={"stream": "true"},
                          timeout=TIMEOUT) as r:  # fmt: skip
            return r.status_code, [line for line in r.iter_lines() if line]

    # the streamed run and the followed one at once (the script waits
    # between tokens): one run's time
    with ThreadPoolExecutor(2) as pool:
        followed = pool.submit(follow)
        events = list(client.responses.create(model="scripted", input="hi", stream=True, background=True))
        status, lines = followed.result()
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "".join(ANSWER)
    assert status == 200 and ": keep-alive" in lines, lines
    assert any('"response.completed"' in line for line in lines if line.startswith("data: "))


def test_the_real_model_keeps_a_long_prefill_alive():
    """The bundled model prefilling a long prompt (about a thousand tokens: far
    longer than the 20 ms keep-alive on any CPU) sends keep-alive comment
    lines before its first token, and the answer then streams whole."""
    story = " ".join(f"Line {i}: the quiet library kept its windows open in summer." for i in range(60))
    with Server(observer=ListObserver(), sse_keepalive=0.02, model_defaults={"ctx": 4096, "parallel": 1}) as real:
        body = {"model": "m", "stream": True, "max_tokens": 4,
                "messages": [{"role": "user", "content": story + "\nSummarize."}]}  # fmt: skip
        with httpx.stream("POST", real.url + "/v1/chat/completions", json=body, timeout=120) as r:
            lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200
    first_text = next(i for i, line in enumerate(lines) if '"content":"' in line and '"content":""' not in line)
    assert ": keep-alive" in lines[:first_text], lines[:first_text]
    assert lines[-1] == "data: [DONE]"
