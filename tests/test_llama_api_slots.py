"""llama-server's API, the rest of it (issue 46, items 6-9), on the real model
through one real server, sent as llama.cpp's own server tests send it:
``id_slot`` runs a request in the slot it names (a busy one is waited for,
the requests behind it go on) and answers say the slot they ran in; ``/slots``
counts follow save, erase and restore, and an idle slot has nothing left to
decode (``n_remain`` -1); the model lists carry ``aliases`` and ``tags``; an
idle model sleeps (``--sleep-idle-seconds``) and a request wakes it; ``--seed``
makes a streamed and a whole answer agree; ``/metrics`` has llama-server's
``llamacpp:*`` series."""

from __future__ import annotations

import threading

import httpx
import orjson
import pytest

from turbospark import ListObserver, Server
from turbospark.engine.model import ModelOptions
from turbospark.models.catalog import resolve_model

from .support import wait_until

PATH = resolve_model("smollm2-135m")[0]
FRANCE = "What is the capital of France?"
GERMANY = "What is the capital of Germany?"
SEED = 42


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, observer, slot folder): ``slots``, two slots side by side
    (no host tier: an erased slot's prefix is gone for good)."""
    folder = tmp_path_factory.mktemp("slotfiles")
    small = {"path": PATH, "speculative": False, "cache_ram": 0}
    # (--seed, --alias and --tags as the command line sets them)
    named = {"sampling": {"seed": SEED}, "aliases": ("slot-model",), "tags": ("chat", "small")}
    slots = ModelOptions(id="slots", ctx=1024, parallel=2, session_slots=2, **small, **named)
    # (unloaded after a second idle: llama-server's --sleep-idle-seconds 1)
    sleepy = ModelOptions(id="sleepy", ctx=512, parallel=1, keep_alive=1, **small)
    obs = ListObserver()
    with Server(models=[slots, sleepy], observer=obs, slot_save_path=str(folder)) as srv:
        yield srv, obs, folder


def complete(srv: Server, prompt: str, **more) -> dict:
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, **more}
    r = httpx.post(srv.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def slot(srv: Server, i: int) -> dict:
    return httpx.get(srv.url + "/slots", timeout=30).json()[i]


def act(srv: Server, i: int, action: str, filename: str | None = None) -> dict:
    body = {"filename": filename} if filename else None
    r = httpx.post(f"{srv.url}/slots/{i}?action={action}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_id_slot_runs_there_and_slot_counts_follow_save_erase_restore(served):
    """llama.cpp's test_slot_save_restore, on SmolLM2: a prompt in slot 1,
    saved; a second prompt sharing its start in slot 1 prefills only what
    differs; restored into slot 0, the second prompt there does too."""
    srv, _, _ = served
    for i in (0, 1):
        act(srv, i, "erase")
    first = complete(srv, FRANCE, id_slot=1)
    assert first["id_slot"] == 1 and first["timings"]["cache_n"] == 0
    held = slot(srv, 1)
    assert held["n_prompt_tokens"] == first["tokens_evaluated"] + first["tokens_predicted"] - 1
    # an idle slot has nothing left to decode (llama-server resets what it released)
    assert held["is_processing"] is False and held["next_token"][0]["n_remain"] == -1
    assert held["next_token"][0]["n_decoded"] == 0
    saved = act(srv, 1, "save", "slot1.bin")
    assert saved["n_saved"] == held["n_prompt_tokens"]
    again = complete(srv, GERMANY, id_slot=1)
    assert again["id_slot"] == 1 and 0 < again["timings"]["prompt_n"] < first["timings"]["prompt_n"]
    restored = act(srv, 0, "restore", "slot1.bin")
    assert restored["n_restored"] == saved["n_saved"] == slot(srv, 0)["n_prompt_tokens"]
    there = complete(srv, GERMANY, id_slot=0)
    assert there["id_slot"] == 0 and there["timings"]["prompt_n"] == again["timings"]["prompt_n"]
    assert there["content"] == again["content"]
    held = slot(srv, 0)["n_prompt_tokens"]
    assert act(srv, 0, "erase")["n_erased"] == held > 0
    assert slot(srv, 0)["n_prompt_tokens"] == 0
    # a slot number past the last wraps round, as llama-server takes it
    assert complete(srv, FRANCE, id_slot=3)["id_slot"] == 1


def test_a_busy_named_slot_is_waited_for_while_others_go_on(served):
    """A request naming a busy slot waits for it (llama-server defers it);
    one behind it that names none runs at once in the other slot."""
    srv, _, _ = served
    started = threading.Event()
    stop = threading.Event()
    seen: dict[str, object] = {}

    def long_stream() -> None:
        # (900 tokens: still running while two short requests pass on a machine
        # many times faster than CI's; closing the stream cancels the rest)
        body = {"prompt": FRANCE, "n_predict": 900, "ignore_eos": True, "stream": True, "id_slot": 0}
        with httpx.stream("POST", srv.url + "/completion", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen.setdefault("first", line)
                    started.set()
                if stop.is_set():
                    break
        started.set()

    def waiter() -> None:
        seen["waiter"] = complete(srv, GERMANY, id_slot=0, n_predict=2)

    reader = threading.Thread(target=long_stream)
    pinned = threading.Thread(target=waiter)
    reader.start()
    try:
        assert started.wait(60)
        assert '"id_slot":0' in str(seen["first"]).replace(" ", "")  # streamed chunks say it too
        pinned.start()

        def deferred() -> bool:  # (the pinned request waits for its slot before the free one is sent)
            metrics = httpx.get(srv.url + "/metrics", timeout=10).text
            return any(
                line.split()[-1] == "1"
                for line in metrics.splitlines()
                if "requests_deferred" in line and line[0] != "#"
            )

        wait_until(deferred, timeout=60, what="the request naming the busy slot to wait for it")
        free = complete(srv, GERMANY, n_predict=2)
        assert free["id_slot"] == 1
        assert pinned.is_alive() and slot(srv, 0)["is_processing"] is True
    finally:
        stop.set()  # (the long stream is left: its slot frees, and the waiting request runs there)
        reader.join(120)
    pinned.join(120)
    assert seen["waiter"]["id_slot"] == 0  # type: ignore[index]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_id_slot_on_the_openai_routes(served, path):
    srv, _, _ = served
    body = {"model": "slots", "max_tokens": 2, "temperature": 0}
    body |= {"messages": [{"role": "user", "content": FRANCE}]} if "chat" in path else {"prompt": FRANCE}
    for named in (1, 0):  # (the same prompt again: without id_slot it would go back to its slot)
        before = [slot(srv, i).get("id_task", 0) for i in (0, 1)]
        r = httpx.post(srv.url + path, json={**body, "id_slot": named}, timeout=120)
        assert r.status_code == 200, r.text
        after = [slot(srv, i).get("id_task", 0) for i in (0, 1)]
        assert after[1 - named] == before[1 - named] and after[named] > max(before)  # there, and only there


def test_several_choices_in_a_named_slot(served):
    """llama.cpp's own check: ``n`` 2 naming slot 0 does not lock the
    scheduler up (the first choice runs there, the other in a free slot)."""
    srv, _, _ = served
    body = {"max_tokens": 2, "n": 2, "id_slot": 0, "messages": [{"role": "user", "content": FRANCE}]}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert [c["finish_reason"] for c in r.json()["choices"]] == ["length", "length"]


def test_a_bad_id_slot_is_a_400(served):
    srv, _, _ = served
    r = httpx.post(srv.url + "/completion", json={"prompt": "hi", "n_predict": 1, "id_slot": -2}, timeout=30)
    assert r.status_code == 400 and "id_slot" in r.json()["error"]["message"]


# ------------------------------------------------------------------ --seed


def test_seed_flag_sets_the_default_seed_beside_the_files_sampling(tmp_path):
    from turbospark.cli import _model_options, parser

    config = tmp_path / "t.toml"
    config.write_text(f'[models.chat]\nmodel = "{PATH}"\ntemperature = 0.5\n')
    (o,) = _model_options(parser().parse_args(["serve", "--config", str(config), "--seed", "42"]))
    assert o.sampling == {"temperature": 0.5, "seed": 42}
    args = parser().parse_args(["serve", "--model", PATH, "-s", "7"])
    (o,) = _model_options(args)
    assert o.sampling == {"seed": 7} and args.model_defaults["sampling"] == {"seed": 7}
    (o,) = _model_options(parser().parse_args(["serve", "--model", PATH, "--seed", "-1"]))  # random
    assert "seed" not in o.sampling
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--seed", "4294967296"])


def test_without_a_seed_a_streamed_and_a_whole_answer_agree(served):
    """The server's default seed (--seed) is every request's that sets none,
    so llama-server's clients see the same sampled text either way."""
    srv, _, _ = served
    body = {"prompt": FRANCE, "n_predict": 8, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    whole = httpx.post(srv.url + "/completion", json=body, timeout=120).json()["content"]
    with httpx.stream("POST", srv.url + "/completion", json={**body, "stream": True}, timeout=120) as r:
        chunks = [orjson.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(c["content"] for c in chunks) == whole
    props = httpx.get(srv.url + "/props", timeout=30).json()
    assert props["default_generation_settings"]["params"]["seed"] == SEED


# ------------------------------------------------- models list and sleeping


def test_model_lists_carry_aliases_and_tags(served, tmp_path):
    srv, _, _ = served
    for path in ("/v1/models", "/models"):
        cards = {m["id"]: m for m in httpx.get(srv.url + path, timeout=30).json()["data"]}
        assert (cards["slots"]["aliases"], cards["slots"]["tags"]) == (["slot-model"], ["chat", "small"])
        assert (cards["sleepy"]["aliases"], cards["sleepy"]["tags"]) == ([], [])
    from turbospark.cli import _model_options, parser

    (o,) = _model_options(parser().parse_args(["serve", "--model", PATH, "--tags", "chat, fim,,small"]))
    assert o.tags == ("chat", "fim", "small")
    config = tmp_path / "t.toml"
    config.write_text(f'[models.chat]\nmodel = "{PATH}"\ntags = ["code"]\n')
    (o,) = _model_options(parser().parse_args(["serve", "--config", str(config)]))
    assert o.tags == ("code",)


def test_sleep_idle_seconds_is_the_keep_alive(served):
    from turbospark.cli import _model_options, parser

    (o,) = _model_options(parser().parse_args(["serve", "--model", PATH, "--sleep-idle-seconds", "1"]))
    assert o.keep_alive == 1
    (o,) = _model_options(parser().parse_args(["serve", "--model", PATH, "--sleep-idle-seconds", "-1"]))
    assert o.keep_alive is None  # (llama-server's -1: never)


def test_an_idle_model_sleeps_and_the_next_request_wakes_it(served):
    """llama.cpp's test_sleep: after its idle time the model is unloaded;
    /health, /props, /models and /metrics answer without waking it, and
    /props says it sleeps; a generation wakes it."""
    srv, obs, _ = served
    props = srv.url + "/props?model=sleepy"

    def sleeping() -> bool:
        return httpx.get(props, timeout=30).json()["is_sleeping"]

    wait_until(sleeping, timeout=30, what="the idle model going to sleep")
    asleep = [e for e in obs.events if e.kind == "modelDetached" and e.model == "sleepy"]
    assert asleep and "keep-alive" in (asleep[-1].reason or "")
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
    body = httpx.get(props, timeout=30).json()
    assert body["default_generation_settings"]["n_ctx"] == 512 and body["chat_template"]
    assert "sleepy" in [m["id"] for m in httpx.get(srv.url + "/models", timeout=30).json()["data"]]
    assert httpx.get(srv.url + "/metrics", timeout=30).status_code == 200
    assert sleeping() and srv.registry.lookup("sleepy").model is None  # none of them woke it
    body = {"model": "sleepy", "prompt": "Hello", "n_predict": 8, "stream": True}
    with httpx.stream("POST", srv.url + "/completion", json=body, timeout=120) as r:
        lines = r.iter_lines()
        assert r.status_code == 200 and next(x for x in lines if x.startswith("data: "))
        assert not sleeping()  # awake (and held by this stream)
        assert any('"stop":true' in x.replace(" ", "") for x in lines)
    # its engine's decodes stay counted once it sleeps again (a counter never goes back)
    awake = llamacpp_metrics(srv)["n_decode_total"]
    wait_until(sleeping, timeout=30, what="the model going back to sleep")
    assert llamacpp_metrics(srv)["n_decode_total"] == awake


# ------------------------------------------------------------- llamacpp:*

COUNTERS = [
    "prompt_tokens_total",
    "prompt_tokens_cached_total",
    "prompt_seconds_total",
    "tokens_predicted_total",
    "tokens_predicted_seconds_total",
    "n_decode_total",
    "n_tokens_max",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_drafts_total",
]
GAUGES = [
    "prompt_tokens_seconds",
    "predicted_tokens_seconds",
    "requests_processing",
    "requests_deferred",
    "n_busy_slots_per_decode",
]


def llamacpp_metrics(srv: Server, kinds: dict[str, str] | None = None) -> dict[str, float]:
    """llama-server's series as its own tests read them: name -> value
    (``kinds``: filled with each one's ``# TYPE``; every one has a ``# HELP``)."""
    r = httpx.get(srv.url + "/metrics", timeout=30)
    assert r.status_code == 200 and "process-start-time-unix" in r.headers
    types, out = {}, {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE llamacpp:"):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("llamacpp:"):
            name, value = line.split(" ", 1)
            assert name in types and f"# HELP {name} " in r.text
            out[name.removeprefix("llamacpp:")] = float(value)
    if kinds is not None:
        kinds.update({k.removeprefix("llamacpp:"): v for k, v in types.items()})
    return out


def test_metrics_export_llama_servers_series(served):
    """llama.cpp's test_metrics: the same names and types, prompt tokens
    prefilled and cached counted apart, tokens predicted as the answers say,
    the rate over decode steps and over the window since the last scrape."""
    srv, _, _ = served
    kinds: dict[str, str] = {}
    before = llamacpp_metrics(srv, kinds)
    assert {n: kinds[n] for n in COUNTERS + GAUGES} == {
        **dict.fromkeys(COUNTERS, "counter"),
        **dict.fromkeys(GAUGES, "gauge"),
    }
    answers = [complete(srv, "the quick brown fox jumps over the lazy dog", id_slot=0) for _ in range(2)]
    after = llamacpp_metrics(srv)
    timings = [a["timings"] for a in answers]
    assert timings[1]["cache_n"] > 0  # the second reused the first's prompt
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == sum(t["prompt_n"] for t in timings)
    assert after["prompt_tokens_cached_total"] - before["prompt_tokens_cached_total"] == sum(
        t["cache_n"] for t in timings
    )
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == sum(t["predicted_n"] for t in timings)
    assert after["n_decode_total"] > before["n_decode_total"] and after["requests_processing"] == 0
    assert after["predicted_tokens_seconds"] > 0 and 1 <= after["n_busy_slots_per_decode"] <= 2
    assert llamacpp_metrics(srv)["predicted_tokens_seconds"] == 0  # nothing ran since the last scrape
    # the first token is free (it comes from the prompt's last batch): the rate is over the others
    one = complete(srv, "I believe", n_predict=1)["timings"]
    assert one["predicted_n"] == 1 and one["predicted_per_second"] == one["predicted_per_token_ms"] == 0.0
    more = complete(srv, "I believe", n_predict=6, ignore_eos=True)["timings"]
    assert more["predicted_per_second"] == pytest.approx(1e3 / more["predicted_ms"] * 5)
