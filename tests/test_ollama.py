"""Ollama's native API on the real bundled model through the official
``ollama`` SDK, raw NDJSON framing line by line, model facts, refusals, and
scripted mid-stream failures."""

from __future__ import annotations

import json
import re

import httpx
import ollama
import pytest

from turbospark import Server

from .fakes import ScriptedModel
from .support import assert_ollama_error

HELLO = [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
RFC3339_NANO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")
DURATIONS = ("total_duration", "prompt_eval_duration", "eval_duration")


class Ids:
    """Collects the x-request-id of every response an SDK client gets."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, response: httpx.Response) -> None:
        self.ids.append(response.headers["x-request-id"])

    @property
    def last(self) -> str:
        return self.ids[-1]


@pytest.fixture()
def ids() -> Ids:
    return Ids()


@pytest.fixture()
def client(server, ids):
    with ollama.Client(host=server.url, timeout=120, event_hooks={"response": [ids]}) as c:
        yield c


def kinds(events):
    return [e.kind for e in events]


def four_events(hub, rid, path, stream):
    events = hub.wait_for(lambda es: "generated" in kinds(es) and "requestFinished" in kinds(es), rid)
    assert sorted(kinds(events)) == sorted(["requestStarted", "requestRouted", "generated", "requestFinished"])
    assert kinds(events)[:2] == ["requestStarted", "requestRouted"]
    started, routed = events[0], events[1]
    assert started.path == path and started.method == "POST"
    assert routed.stream is stream and routed.served == "smollm2-135m"
    finished = next(e for e in events if e.kind == "requestFinished")
    assert finished.status == 200
    return routed, next(e for e in events if e.kind == "generated")


def check_final(last, gen):
    """The closing numbers are the engine's own."""
    assert last["done"] is True
    assert last["prompt_eval_count"] == gen.prompt_tokens
    assert last["eval_count"] == gen.new_tokens
    for key in DURATIONS:
        assert isinstance(last[key], int) and last[key] > 0, key
    assert last["load_duration"] == 0
    assert last["prompt_eval_duration"] == round(gen.prefill_seconds * 1e9)
    assert last["eval_duration"] == round(gen.decode_seconds * 1e9)
    assert last["total_duration"] >= last["prompt_eval_duration"] + last["eval_duration"]


# -- /api/chat -------------------------------------------------------------------
def test_chat_non_stream_sdk_usage_and_events(client, ids, hub):
    r = client.chat(model="smollm2-135m:latest", messages=HELLO, options={"temperature": 0, "num_predict": 40})
    assert r.model == "smollm2-135m:latest"  # the client's name is echoed
    assert r.message.role == "assistant" and r.message.content.strip()
    assert r.done is True and r.done_reason in ("stop", "length")
    assert RFC3339_NANO.match(r.created_at)
    routed, gen = four_events(hub, ids.last, "/api/chat", stream=False)
    assert routed.requested == "smollm2-135m"  # ':latest' is Ollama's default tag
    check_final(r.model_dump(), gen)
    assert (r.done_reason == "length") == (gen.stop_reason == "maxTokens")


def test_chat_stream_sdk_matches_non_stream(client, ids, hub):
    kw = dict(model="smollm2-135m", messages=HELLO, options={"temperature": 0, "num_predict": 24})
    full = client.chat(**kw).message.content
    parts = list(client.chat(stream=True, **kw))
    rid = ids.last
    assert all(p.done is False for p in parts[:-1]) and parts[-1].done is True
    assert "".join(p.message.content for p in parts) == full
    assert parts[-1].message.content == "" and parts[-1].message.role == "assistant"
    assert all(p.done_reason is None and p.eval_count is None for p in parts[:-1])
    _, gen = four_events(hub, rid, "/api/chat", stream=True)
    check_final(parts[-1].model_dump(), gen)


def test_num_predict_caps_with_done_reason_length(client, ids, hub):
    r = client.chat(model="m", messages=STORY, options={"temperature": 0, "num_predict": 5})
    assert r.done_reason == "length" and r.eval_count == 5
    gen = hub.wait_kind(ids.last, "generated")
    assert gen.stop_reason == "maxTokens" and gen.new_tokens == 5


def test_stop_option_is_honoured(client):
    kw = dict(model="m", messages=[{"role": "user", "content": "Count from 1 to 10 separated by commas."}])
    full = client.chat(options={"temperature": 0, "num_predict": 40}, **kw).message.content
    assert "4" in full, full
    r = client.chat(options={"temperature": 0, "num_predict": 40, "stop": ["4"]}, **kw)
    assert r.done_reason == "stop"
    assert "4" not in r.message.content and full.startswith(r.message.content)
    streamed = "".join(
        p.message.content
        for p in client.chat(stream=True, options={"temperature": 0, "num_predict": 40, "stop": ["4"]}, **kw)
    )
    assert streamed == r.message.content


def test_seeded_sampling_and_ollama_options(client):
    opts = {
        "temperature": 1.0,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.05,
        "seed": 7,
        "num_predict": 10,
        "repeat_penalty": 1.2,
        "repeat_last_n": -1,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.1,
        "num_thread": 2,
        "num_gpu": 0,
    }  # load-time options are accepted and ignored
    a = client.chat(model="m", messages=HELLO, options=opts).message.content
    b = client.chat(model="m", messages=HELLO, options=opts).message.content
    assert a == b


def test_system_message_and_history_reach_the_template(server, client):
    msgs = [
        {"role": "system", "content": "You are terse."},
        *HELLO,
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Spain?"},
    ]
    r = client.chat(model="m", messages=msgs, options={"temperature": 0, "num_predict": 4})
    model = server.registry.lookup("smollm2-135m").model.engine
    assert r.prompt_eval_count == len(model.render_chat(msgs))


# -- /api/generate -------------------------------------------------------------------
def test_generate_non_stream_and_stream_sdk(client, ids, hub):
    kw = dict(
        model="smollm2-135m",
        prompt="Why is the sky blue? Answer briefly.",
        options={"temperature": 0, "num_predict": 20},
    )
    r = client.generate(**kw)
    rid = ids.last
    assert r.response.strip() and r.done is True and RFC3339_NANO.match(r.created_at)
    _, gen = four_events(hub, rid, "/api/generate", stream=False)
    check_final(r.model_dump(), gen)

    parts = list(client.generate(stream=True, **kw))
    rid = ids.last
    assert "".join(p.response for p in parts) == r.response
    assert parts[-1].done is True and parts[-1].response == ""
    _, gen = four_events(hub, rid, "/api/generate", stream=True)
    check_final(parts[-1].model_dump(), gen)


def test_generate_system_and_raw_prompts(server, client):
    model = server.registry.lookup("smollm2-135m").model.engine
    r = client.generate(model="m", prompt="Hello", system="Reply in French.", options={"num_predict": 2})
    assert r.prompt_eval_count == len(
        model.render_chat([{"role": "system", "content": "Reply in French."}, {"role": "user", "content": "Hello"}])
    )
    r = client.generate(model="m", prompt="1, 2, 3,", raw=True, options={"num_predict": 2, "temperature": 0})
    assert r.prompt_eval_count == len(model.prompt_ids("1, 2, 3,"))  # no template


def test_generate_without_prompt_is_the_load_call(client, ids, hub):
    r = client.generate(model="smollm2-135m")
    assert r.done is True and r.done_reason == "load" and r.response == ""
    events = hub.wait_for(lambda es: "requestFinished" in kinds(es), ids.last)
    assert "generated" not in kinds(events)
    assert client.generate(model="smollm2-135m", keep_alive=0).done_reason == "unload"
    # keep_alive -1: loaded (again, if the unload came first) and resident for
    # good, as the other tests on this shared server expect
    r = client.chat(model="smollm2-135m", messages=[], keep_alive=-1)
    assert r.done_reason == "load" and r.message.content == ""


# -- raw framing ------------------------------------------------------------------------
def test_raw_ndjson_framing_stream_defaults_to_true(base_url, hub):
    body = {"model": "smollm2-135m", "messages": STORY, "options": {"num_predict": 6, "temperature": 0}}
    with httpx.stream("POST", base_url + "/api/chat", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/x-ndjson"
        rid = r.headers["x-request-id"]
        raw = r.read().decode()
    assert raw.endswith("\n") and "\n\n" not in raw
    lines = [json.loads(line) for line in raw.splitlines()]
    assert len(lines) >= 2
    for line in lines[:-1]:
        assert list(line) == ["model", "created_at", "message", "done"]
        assert line["done"] is False and line["model"] == "smollm2-135m"
        assert line["message"]["role"] == "assistant" and line["message"]["content"]
        assert RFC3339_NANO.match(line["created_at"])
    last = lines[-1]
    assert list(last) == [
        "model",
        "created_at",
        "message",
        "done",
        "done_reason",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    ]
    assert last["message"] == {"role": "assistant", "content": ""}
    assert last["done_reason"] == "length" and last["eval_count"] == 6
    _, gen = four_events(hub, rid, "/api/chat", stream=True)
    check_final(last, gen)


def test_raw_generate_framing_and_stream_false(base_url, hub):
    body = {"model": "m", "prompt": "Tell me a story.", "options": {"num_predict": 3}}
    with httpx.stream("POST", base_url + "/api/generate", json=body, timeout=120) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [list(x) for x in lines[:-1]] == [["model", "created_at", "response", "done"]] * (len(lines) - 1)
    assert lines[-1]["done"] is True and lines[-1]["response"] == "" and "context" not in lines[-1]

    r = httpx.post(base_url + "/api/generate", json={**body, "stream": False}, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    one = r.json()
    assert one["done"] is True and one["done_reason"] == "length" and one["eval_count"] == 3
    assert one["response"]
    _, gen = four_events(hub, r.headers["x-request-id"], "/api/generate", stream=False)
    check_final(one, gen)


# -- num_ctx, format, images, warnings --------------------------------------------------------
def test_num_ctx_is_honoured_and_a_larger_one_warned(base_url, server):
    model = server.registry.lookup("smollm2-135m").model.engine
    n = len(model.render_chat(STORY))
    body = {
        "model": "m",
        "messages": STORY,
        "stream": False,
        "options": {"num_ctx": n + 3, "num_predict": -1, "temperature": 0},
    }
    r = httpx.post(base_url + "/api/chat", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["eval_count"] == 3 and r.json()["done_reason"] == "length"
    assert "x-turbospark-warning" not in r.headers

    body["options"] = {"num_ctx": 1_000_000, "num_predict": 2}
    r = httpx.post(base_url + "/api/chat", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["eval_count"] == 2
    assert "num_ctx 1000000" in r.headers["x-turbospark-warning"]

    body["options"] = {"num_ctx": n, "num_predict": -2}  # no room left for a reply
    r = httpx.post(base_url + "/api/chat", json=body, timeout=120)
    assert r.status_code == 400 and "num_ctx" in r.json()["error"]
    # the prompt fills the context exactly: true numbers (it said "n > n")
    assert f"prompt is too long: {n} tokens > {n - 1} maximum" in r.json()["error"], r.json()

    body["options"] = {"num_ctx": n + 2, "num_predict": 5}  # an explicit budget is never cut
    r = httpx.post(base_url + "/api/chat", json=body, timeout=120)
    assert r.status_code == 400 and str(n + 5) in r.json()["error"]


def test_template_is_warned_format_and_think_are_honoured(base_url):
    body = {
        "model": "m",
        "prompt": "Give me a JSON object.",
        "stream": False,
        "format": "json",
        "template": "{{ .Prompt }}",
        "think": False,
        "keep_alive": "5m",
        "options": {"num_predict": 2},
    }
    r = httpx.post(base_url + "/api/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    warning = r.headers["x-turbospark-warning"]
    assert "'template'" in warning
    assert "format" not in warning and "think" not in warning  # enforced / honoured (test_tools_ollama.py)
    assert r.json()["response"].lstrip().startswith("{")  # the JSON grammar holds from the first token
    chat = {
        "model": "m",
        "stream": False,
        "format": {"type": "object"},
        "think": False,
        "keep_alive": -1,
        "messages": [{"role": "user", "content": "hi"}],
        "options": {"num_predict": 2},
    }
    r = httpx.post(base_url + "/api/chat", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    assert "x-turbospark-warning" not in r.headers  # format enforced, think honoured: nothing ignored


#: SmolLM2's ChatML with a thinking switch, as Qwen3's template has one
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


def test_which_templates_think():
    from turbospark.tools.prompting import template_thinks

    assert template_thinks(THINKING_TEMPLATE) and template_thinks("{{ '<thought>' }}")  # EXAONE-Deep's tag
    assert template_thinks("{% if reasoning_effort %}{% endif %}")  # gpt-oss's switch
    assert not template_thinks("<|im_start|>{{ m.content }}<|im_end|>")


def test_think_on_a_model_without_thinking_is_refused_as_ollama_does(server, base_url, client, hub):
    """Ollama answers ``think`` on a model that cannot think with a 400 that
    clients catch ("does not support thinking") to ask again without it, and
    lists "thinking" among /api/show's capabilities for those that can."""
    refused_ids = []
    for path, body in (
        ("/api/chat", {"messages": HELLO}),
        ("/api/generate", {"prompt": "Hello"}),
    ):
        for think in (True, "low", "high"):
            for stream in (False, True):
                r = httpx.post(
                    base_url + path,
                    json={"model": "smollm2-135m", "think": think, "stream": stream, **body},
                    timeout=60,
                )
                assert_ollama_error(r, 400, '"smollm2-135m" does not support thinking')
                refused_ids.append(r.headers["x-request-id"])
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="smollm2-135m", messages=HELLO, think=True)
    assert refused.value.status_code == 400 and "does not support thinking" in refused.value.error
    for rid in refused_ids:  # refused before any engine work
        finished = hub.wait_kind(rid, "requestFinished")
        assert finished.status == 400 and "generated" not in kinds(hub.of(rid))
    # false, or no think at all, is answered
    r = client.chat(model="smollm2-135m", messages=HELLO, think=False, options={"num_predict": 3})
    assert r.done and r.message.content
    assert "thinking" not in client.show("smollm2-135m").capabilities

    # the same model with a template that switches thinking: listed, and answered
    attach = {"model": "smollm2-135m", "id": "thinker", "ctx": 512, "parallel": 1, "chat_template": THINKING_TEMPLATE}
    r = httpx.post(base_url + "/v1/admin/models", json=attach, timeout=120)
    assert r.status_code == 201, r.text
    try:
        assert client.show("thinker").capabilities == ["completion", "tools", "thinking"]
        r = client.chat(model="thinker", messages=HELLO, think=True, options={"num_predict": 6, "temperature": 0})
        assert r.done and r.eval_count == 6  # (what it wrote may be blank: no text is asserted)
        g = client.generate(model="thinker", prompt="Hello", think="low", options={"num_predict": 3})
        assert g.done
    finally:
        assert httpx.delete(base_url + "/v1/admin/models/thinker", timeout=60).status_code == 200


# -- model facts ---------------------------------------------------------------------------------
def test_list_show_ps_through_the_sdk(client):
    models = client.list().models
    assert [m.model for m in models] == ["smollm2-135m"]
    m = models[0]
    assert m.size > 0 and len(m.digest) == 64 and m.modified_at is not None
    d = m.details
    assert (d.format, d.family, d.families) == ("gguf", "llama", ["llama"])
    assert d.parameter_size == "134.52M" and d.quantization_level == "Q4_1"

    for name in ("smollm2-135m", "smollm2-135m:latest"):
        s = client.show(name)
        assert s.capabilities == ["completion", "tools"]
        assert s.modelinfo["general.architecture"] == "llama"
        assert s.modelinfo["llama.context_length"] == 4096
        assert s.template and "FROM " in s.modelfile and "num_ctx" in s.parameters
        assert s.details.quantization_level == "Q4_1"

    running = client.ps().models
    assert [(r.name, r.model) for r in running] == [("smollm2-135m", "smollm2-135m")]
    assert running[0].size_vram == 0 and running[0].context_length == 4096
    assert running[0].expires_at.year > 2100 and running[0].digest == m.digest


def test_show_never_falls_back(client, base_url):
    with pytest.raises(ollama.ResponseError) as exc:
        client.show("llama3.2")
    assert exc.value.status_code == 404 and exc.value.error == "model 'llama3.2' not found"
    r = httpx.post(base_url + "/api/show", json={"name": "smollm2-135m"}, timeout=30)  # legacy field
    assert r.status_code == 200 and r.json()["details"]["family"] == "llama"
    r = httpx.post(base_url + "/api/show", json={}, timeout=30)
    assert r.status_code == 400 and r.json() == {"error": "model is required"}


def test_version_and_root(base_url):
    r = httpx.get(base_url + "/api/version", timeout=30)
    assert r.status_code == 200 and list(r.json()) == ["version"]
    assert re.match(r"^0\.\d+\.\d+$", r.json()["version"])
    r = httpx.get(base_url + "/", timeout=30)
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert r.headers["content-type"].startswith("text/plain")
    r = httpx.head(base_url + "/", timeout=30)
    assert r.status_code == 200 and r.content == b""


# -- malformed bodies ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, body",
    [
        ("/api/chat", {"messages": HELLO}),  # no model
        ("/api/chat", {"model": "", "messages": HELLO}),
        ("/api/chat", {"model": "m", "messages": "hi"}),
        ("/api/chat", {"model": "m", "messages": [{"role": "robot", "content": "hi"}]}),
        ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": 3}]}),
        ("/api/chat", {"model": "m", "messages": HELLO, "options": {"temperature": "hot"}}),
        ("/api/chat", {"model": "m", "messages": HELLO, "options": {"top_p": 2}}),
        ("/api/chat", {"model": "m", "messages": HELLO, "options": {"num_predict": -5}}),
        ("/api/chat", {"model": "m", "messages": HELLO, "options": {"num_predict": 0}}),
        ("/api/chat", {"model": "m", "messages": HELLO, "options": "fast"}),
        ("/api/chat", {"model": "m", "messages": HELLO, "stream": "no"}),
        ("/api/chat", {"model": "m", "messages": HELLO, "format": "yaml"}),
        ("/api/chat", {"model": "m", "messages": HELLO, "options": {"num_predict": 100_000}}),
        ("/api/generate", {"prompt": "hi"}),
        ("/api/generate", {"model": "m", "prompt": ["hi"]}),
        ("/api/generate", {"model": "m", "prompt": "hi", "raw": "yes"}),
        ("/api/generate", {"model": "m", "prompt": "hi", "suffix": "bye"}),
        ("/api/generate", {"model": "m", "prompt": "hi", "options": {"num_ctx": 0}}),
        ("/api/show", {"model": 5}),
    ],
)
def test_malformed_bodies_are_400_in_ollama_shape(base_url, path, body):
    assert_ollama_error(httpx.post(base_url + path, json=body, timeout=30), 400)


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/show"])
def test_bad_json_is_400_in_ollama_shape(base_url, path, hub):
    r = httpx.post(base_url + path, content=b'{"model": ', timeout=30)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
    fin = hub.wait_kind(r.headers["x-request-id"], "requestFinished")
    assert fin.status == 400 and fin.error.startswith("malformed JSON")


# -- several models, and scripted failures ------------------------------------------------------------
def test_unknown_model_is_404_with_strict_model_names():
    # (without them the default model, alpha, serves it: tests/test_default_model.py)
    with Server(models=[ScriptedModel("alpha"), ScriptedModel("beta")], strict_model_names=True) as srv:
        r = httpx.post(srv.url + "/api/chat", timeout=30, json={"model": "gamma", "messages": HELLO})
        assert r.status_code == 404 and "gamma" in r.json()["error"]
        r = httpx.post(
            srv.url + "/api/chat", timeout=30, json={"model": "beta:latest", "messages": HELLO, "stream": False}
        )
        assert r.status_code == 200 and r.json()["message"]["content"] == "Hello world"
        r = httpx.post(srv.url + "/api/show", timeout=30, json={"model": "alpha:latest"})
        assert r.status_code == 200 and r.json()["capabilities"] == ["completion", "tools"]
        names = [m["name"] for m in httpx.get(srv.url + "/api/tags", timeout=30).json()["models"]]
        assert names == ["alpha", "beta"]


@pytest.mark.parametrize("path, key", [("/api/chat", "message"), ("/api/generate", "response")])
def test_midstream_failure_ends_with_an_error_line(failing, path, key):
    srv, _, obs = failing
    body = {"model": "x", "messages": HELLO} if key == "message" else {"model": "x", "prompt": "hi"}
    with httpx.stream("POST", srv.url + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line]
    texts = [x["message"]["content"] if key == "message" else x["response"] for x in lines]
    assert texts == ["one", " two", ""]
    assert [x["done"] for x in lines] == [False, False, True]
    assert lines[-1]["done_reason"] == "error"
    assert lines[-1]["error"].startswith("engine error: scripted failure")
    assert not [e for e in obs.events if e.kind == "generated"]


def test_midstream_failure_raises_in_the_sdk(failing):
    srv, _, _ = failing
    got = []
    with pytest.raises(ollama.ResponseError) as exc:
        for part in ollama.Client(host=srv.url).chat(model="x", messages=HELLO, stream=True):
            got.append(part.message.content)
    assert got == ["one", " two"] and "scripted failure" in exc.value.error


def test_non_stream_failure_is_500_in_shape(failing):
    srv, _, obs = failing
    r = httpx.post(srv.url + "/api/generate", json={"model": "x", "prompt": "hi", "stream": False}, timeout=30)
    assert assert_ollama_error(r, 500).startswith("engine error")
    fin = [e for e in obs.events if e.kind == "requestFinished"][-1]
    assert fin.status == 500 and fin.error.startswith("engine error")
    with pytest.raises(ollama.ResponseError) as exc:
        ollama.Client(host=srv.url).chat(model="x", messages=HELLO)
    assert exc.value.status_code == 500


def test_tools_and_tool_turns_are_accepted(client):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    msgs = [
        *HELLO,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "weather"},
    ]
    r = client.chat(model="m", messages=msgs, tools=tools, options={"temperature": 0, "num_predict": 4})
    assert r.done is True and r.eval_count >= 1


def test_client_that_leaves_cancels_the_generation(base_url, hub):
    body = {"model": "m", "messages": STORY, "options": {"num_predict": 2000, "temperature": 0}}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", base_url + "/api/chat", json=body) as r:
            rid = r.headers["x-request-id"]
            first = json.loads(next(r.iter_lines()))
            assert first["done"] is False
    gen = hub.wait_kind(rid, "generated", timeout=15)
    assert gen.stop_reason == "cancelled" and gen.new_tokens < 2000
