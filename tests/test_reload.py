"""Presets and live reload: a config file's model sections carry sampling
defaults (and a ``pull`` reference), and SIGHUP, ``--watch-config`` or
``POST /v1/admin/config/reload`` re-read the file and apply the difference
while requests run; an invalid file changes nothing. All on the bundled
model, through ``turbospark serve`` as an operator runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from turbospark.config import ConfigError, load_config, model_fields
from turbospark.models.catalog import resolve_model

from .support import assert_openai_error, wait_until
from .test_cli import listening_url, say_hi, turbospark

#: two models of the bundled one, small; ``c`` pins greedy decoding
BASE = """
[defaults]
ctx = 512
parallel = 2
cache_ram = 0

[models.a]
model = "smollm2-135m"

[models.c]
model = "smollm2-135m"
temperature = 0
top_k = 1
"""
#: ``a`` gone, ``b`` new, ``c`` as it was
NEXT = BASE.replace("[models.a]", "[models.b]")


@dataclass
class Served:
    """A ``turbospark serve`` the tests started, its stderr read as it comes."""

    proc: subprocess.Popen
    url: str
    config: Path
    lines: list[str] = field(default_factory=list)

    def write(self, text: str) -> None:
        write(self.config, text)

    def reload(self, text: str | None = None) -> httpx.Response:
        if text is not None:
            self.write(text)
        return httpx.post(self.url + "/v1/admin/config/reload", timeout=120)

    def shown(self) -> dict[str, Any]:
        r = httpx.get(self.url + "/v1/admin/config", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def ids(self) -> list[str]:
        return [m["id"] for m in httpx.get(self.url + "/v1/models", timeout=10).json()["data"]]

    def stderr(self) -> str:
        return "".join(self.lines)


def write(path: Path, text: str) -> None:
    """Replace the file whole, as an editor saving it does (never read half written)."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.replace(fresh, path)


def start(config: Path, *args: str) -> Served:
    proc = subprocess.Popen(
        turbospark("serve", "--config", str(config), "--port", "0", *args),
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        url = listening_url(proc, lines)
    except BaseException:
        proc.kill()
        proc.communicate(timeout=30)
        raise

    def drain() -> None:  # (a full pipe would stall the server's logging)
        for line in proc.stderr:
            lines.append(line)

    threading.Thread(target=drain, daemon=True).start()
    return Served(proc, url, config, lines)


def stop(served: Served) -> None:
    served.proc.send_signal(signal.SIGINT)
    served.proc.wait(timeout=60)
    assert served.proc.returncode == 0, served.stderr()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    config = tmp_path_factory.mktemp("reload") / "turbospark.toml"
    config.write_text(BASE)
    served = start(config)
    yield served
    stop(served)


@pytest.fixture()
def base(live: Served) -> Served:
    """The module's server with ``BASE`` in force (and the file left so)."""
    r = live.reload(BASE)
    assert r.status_code == 200, r.text
    assert "a" in live.ids() and "c" in live.ids()
    yield live
    live.write(BASE)


class Stream(threading.Thread):
    """A streamed chat that runs long (``ignore_eos``), read on a thread;
    ``first`` is set once its first text has come (or it ended)."""

    def __init__(self, url: str, model: str, max_tokens: int = 120) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.first = threading.Event()
        self.status = 0
        self.text = ""
        self.finish: str | None = None
        self.done = False
        self.ended_at: float | None = None
        self.start()

    def run(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=180) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    self.done = self.done or line == "data: [DONE]"
                    if not line.startswith("data: {"):
                        continue
                    for choice in json.loads(line[6:])["choices"]:
                        self.text += choice["delta"].get("content") or ""
                        self.finish = choice.get("finish_reason") or self.finish
                    if self.text:
                        self.first.set()
        finally:
            self.ended_at = time.monotonic()
            self.first.set()

    def started(self) -> Stream:
        assert self.first.wait(60) and self.ended_at is None, "the stream did not start, or ended at once"
        return self

    def completed(self) -> None:
        self.join(180)
        assert not self.is_alive(), "the stream never ended"
        assert self.status == 200 and self.done, (self.status, self.text)
        assert self.finish == "length" and self.text.strip(), (self.finish, self.text)


def chat(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


# ---------------------------------------------------------------- live reload
def test_a_reload_adds_and_removes_models_while_streams_run_to_their_end(base: Served):
    attached = httpx.post(
        base.url + "/v1/admin/models",
        json={"model": "smollm2-135m", "id": "z", "ctx": 256, "parallel": 1},
        timeout=120,
    )
    assert attached.status_code == 201, attached.text
    on_c, on_a = Stream(base.url, "c").started(), Stream(base.url, "a").started()
    sent = time.monotonic()
    r = base.reload(NEXT)
    assert r.status_code == 200, r.text
    result = r.json()
    assert (result["added"], result["removed"], result["reloaded"]) == (["b"], ["a"], [])
    assert result["unchanged"] == ["c"] and result["ok"] and result["trigger"] == "admin"
    # the stream on the third model, and the one on the model taken out, run to their end
    for stream in (on_c, on_a):
        stream.completed()
        assert stream.ended_at is not None and stream.ended_at > sent
    ids = base.ids()
    assert "a" not in ids and {"b", "c", "z"} <= set(ids)
    # "a" names no model now: the default (the file's first section, b now) serves it
    gone = chat(base.url, "a")
    assert gone.status_code == 200, gone.text
    records = httpx.get(base.url + "/v1/stats", params={"requests": 1000}, timeout=10).json()["records"]
    (record,) = [x for x in records if x["id"] == int(gone.headers["x-request-id"])]
    assert (record["requested"], record["served"]) == ("a", "b")
    assert chat(base.url, "b").status_code == 200
    shown = base.shown()
    assert [m["id"] for m in shown["models"]] == ["b", "c"]
    assert all(m["state"] == "loaded" for m in shown["models"])
    assert shown["last_reload"]["added"] == ["b"] and shown["other_models"] == ["z"]  # attached: left alone
    assert shown["loaded_at"] == shown["last_reload"]["at"]
    assert httpx.delete(base.url + "/v1/admin/models/z", timeout=10).status_code == 200


def test_a_changed_section_is_reloaded_on_sighup_while_its_old_model_ends_its_stream(base: Served):
    old = Stream(base.url, "c").started()
    t0 = time.time()
    base.write(BASE.replace("top_k = 1", "top_k = 1\nctx = 384\nsystem = 'You are terse.'"))
    base.proc.send_signal(signal.SIGHUP)

    def reloaded() -> dict[str, Any] | None:
        last = base.shown()["last_reload"]
        return last if last is not None and last["trigger"] == "SIGHUP" and last["at"] >= t0 else None

    result = wait_until(reloaded, 60, "the SIGHUP reload")
    assert result["ok"] and result["reloaded"] == ["c"] and result["unchanged"] == ["a"], result
    old.completed()  # the old model finished what it had
    card = httpx.get(base.url + "/v1/models/c", timeout=10).json()
    assert card["context_length"] == 384 and card["state"] == "loaded"
    assert chat(base.url, "c").status_code == 200
    preset = next(m for m in base.shown()["models"] if m["id"] == "c")["preset"]
    assert preset["ctx"] == 384 and preset["system"] == "You are terse."
    assert base.proc.poll() is None  # a hangup with a config file re-reads it, it does not stop the server


BAD_FILES = [
    (BASE + "\n[models.d\n", "not valid TOML"),
    (BASE.replace("top_k = 1", "top_k = 1\ntemprature = 0.5"), "unknown key models.c.temprature"),
    (BASE.replace("top_k = 1", "top_k = -1"), "models.c.top_k must be at least 0"),
    (BASE + "\n[models.d]\nmodel = 'smollm2-135m'\naliases = ['c']\n", "is already used by model 'c'"),
]


@pytest.mark.parametrize("text, message", BAD_FILES)
def test_an_invalid_file_is_refused_and_the_models_in_force_kept(base: Served, text: str, message: str):
    before, shown_before = base.ids(), base.shown()
    stream = Stream(base.url, "c", max_tokens=40).started()
    err = assert_openai_error(base.reload(text), 400, None, message)
    assert err["code"] == "invalid_config" and str(base.config) in err["message"]
    stream.completed()
    assert base.ids() == before
    assert chat(base.url, "a").status_code == 200 and chat(base.url, "c").status_code == 200
    shown = base.shown()
    assert shown["models"] == shown_before["models"] and shown["loaded_at"] == shown_before["loaded_at"]
    assert shown["last_reload"]["ok"] is False and message in shown["last_reload"]["error"]
    # a SIGHUP with the same file is refused the same way, and logged
    refusals = base.stderr().count("config reload (SIGHUP) refused")
    base.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: base.shown()["last_reload"]["trigger"] == "SIGHUP", 30, "the SIGHUP reload")
    wait_until(lambda: base.stderr().count("config reload (SIGHUP) refused") > refusals, 30, "the refusal's log")
    assert any("(SIGHUP) refused" in line and message in line for line in base.stderr().splitlines())
    assert base.ids() == before


def test_a_server_setting_changed_in_the_file_is_reported_as_needing_a_restart(base: Served):
    r = base.reload("[server]\nmax_body = 1048576\n" + BASE)
    assert r.status_code == 200, r.text
    assert r.json()["restart_needed"] == ["max_body"] and r.json()["unchanged"] == ["a", "c"]
    assert base.shown()["server"]["max_body"] is None  # what is in force: the setting at start


# ---------------------------------------------------------------- presets
def test_a_preset_gives_sampling_defaults_to_requests_that_do_not_set_them(base: Served):
    def settings(model: str, **body: Any) -> dict[str, Any]:
        r = httpx.post(
            base.url + "/completion", json={"model": model, "prompt": "Once upon", "n_predict": 4, **body}, timeout=60
        )
        assert r.status_code == 200, r.text
        return r.json()["generation_settings"]

    greedy, plain = settings("c"), settings("a")
    assert (greedy["temperature"], greedy["top_k"]) == (0.0, 1)  # c's preset
    assert (plain["temperature"], plain["top_k"]) == (0.8, 0)  # the engine's defaults
    own = settings("c", temperature=0.5)  # a request's own value wins over the preset
    assert (own["temperature"], own["top_k"]) == (0.5, 1)
    # the same in another dialect (the preset is applied once, in the core)
    r = httpx.post(base.url + "/v1/responses", json={"model": "c", "input": "Hi", "max_output_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["temperature"] == 0.0, r.text
    # two identical requests without a seed: the same text only because c is greedy
    texts = {say_hi(base.url, "c", max_tokens=12).json()["choices"][0]["message"]["content"] for _ in range(2)}
    assert len(texts) == 1
    assert httpx.get(base.url + "/v1/models/c", timeout=10).json()["sampling"] == {"temperature": 0.0, "top_k": 1}
    assert "sampling" not in httpx.get(base.url + "/v1/models/a", timeout=10).json()
    shown = httpx.post(base.url + "/api/show", json={"model": "c"}, timeout=10).json()
    assert "PARAMETER temperature 0\n" in shown["modelfile"] and "top_k" in shown["parameters"]


def test_sampling_keys_are_checked_and_defaults_reach_every_local_model(tmp_path: Path):
    f = tmp_path / "t.toml"
    f.write_text(
        "[defaults]\ntemperature = 0.2\nseed = 7\n"
        "[models.x]\nmodel = 'smollm2-135m'\nmin_p = 0.1\n"
        "[models.y]\nmodel = 'smollm2-135m'\ntemperature = 1\n"
    )
    x, y = load_config(str(f)).models
    assert x.sampling == {"temperature": 0.2, "seed": 7, "min_p": 0.1}
    assert y.sampling == {"temperature": 1.0, "seed": 7} and isinstance(y.sampling["temperature"], float)
    assert model_fields({"ctx": 512, "top_p": 0.9, "aliases": ["q"]}) == {
        "ctx": 512,
        "sampling": {"top_p": 0.9},
        "aliases": ("q",),
    }
    for bad, message in [
        ("top_p = 1.5", "models.x.top_p must be between 0 and 1"),
        ("temperature = -1", "models.x.temperature must be at least 0"),
        ("seed = 1.5", "models.x.seed must be int, not float"),
        ("top_k = true", "models.x.top_k must be int, not bool"),
    ]:
        f.write_text(f"[models.x]\nmodel = 'smollm2-135m'\n{bad}\n")
        with pytest.raises(ConfigError, match=message):
            load_config(str(f))


def test_a_pull_reference_is_kept_and_resolved_through_the_seam(tmp_path: Path):
    f = tmp_path / "t.toml"
    f.write_text("[models.p]\npull = 'org/repo:Q4_K_M'\nctx = 256\n")
    with pytest.raises(ConfigError, match=r"models\.p\.pull: pull references need the pull feature"):
        load_config(str(f))
    asked: list[str] = []

    def resolve(reference: str) -> str:
        asked.append(reference)
        return resolve_model("smollm2-135m")[0]

    (p,) = load_config(str(f), pull=resolve).models
    assert asked == ["org/repo:Q4_K_M"] and p.pull == "org/repo:Q4_K_M" and p.path.endswith(".gguf")

    def offline(reference: str) -> str:
        raise OSError("no network")

    with pytest.raises(ConfigError, match=r"models\.p\.pull: 'org/repo:Q4_K_M' could not be resolved: no network"):
        load_config(str(f), pull=offline)
    # with a model too, the model is the file and the reference is kept beside it
    f.write_text("[models.p]\nmodel = 'smollm2-135m'\npull = 'org/repo:Q4_K_M'\n")
    (p,) = load_config(str(f)).models
    assert p.pull == "org/repo:Q4_K_M" and p.path == resolve_model("smollm2-135m")[0]
    for bad in ("pull = ''", "pull = 'a b'", "pull = 3"):
        f.write_text(f"[models.p]\n{bad}\n")
        with pytest.raises(ConfigError, match=r"models\.p\.pull"):
            load_config(str(f))


# ---------------------------------------------------------------- watching the file
def test_watch_config_applies_an_edit_and_keeps_the_command_lines_model_and_the_cap(tmp_path: Path):
    config = tmp_path / "turbospark.toml"
    one = "[models.x]\nmodel = 'smollm2-135m'\n"
    config.write_text(one)
    served = start(
        config, "--watch-config", "--model", "smollm2-135m", "--ctx", "256", "--parallel", "1", "--max-resident", "2"
    )
    try:
        assert served.shown()["watch"] is True and served.shown()["other_models"] == ["smollm2-135m"]
        write(config, one + "[models.y]\nmodel = 'smollm2-135m'\n")
        wait_until(lambda: "y" in served.ids(), 30, "the watched file's new model")
        last = served.shown()["last_reload"]
        assert last["trigger"] == "watch" and last["added"] == ["y"], last
        cards = {m["id"]: m for m in httpx.get(served.url + "/v1/models", timeout=10).json()["data"]}
        assert cards["y"]["state"] == "unloaded"  # past --max-resident 2: it loads on first use
        assert chat(served.url, "y").status_code == 200
        write(config, "[models.y]\nmodel = 'smollm2-135m'\n")
        wait_until(lambda: "x" not in served.ids(), 30, "the watched file's removal")
        assert set(served.ids()) == {"smollm2-135m", "y"}  # the command line's model stays
    finally:
        stop(served)


def test_reload_needs_a_config_file(tmp_path: Path):
    out = subprocess.run(turbospark("serve", "--watch-config"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--watch-config needs --config" in out.stderr
