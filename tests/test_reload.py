"""Presets: a config file's model sections carry sampling defaults (and a
``pull`` reference). On the bundled model, through ``turbospark serve`` as
an operator runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from turbospark.config import ConfigError, load_config, model_fields
from turbospark.models.catalog import resolve_model

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


@dataclass
class Served:
    """A ``turbospark serve`` the tests started, its stderr read as it comes."""

    proc: subprocess.Popen
    url: str
    config: Path
    lines: list[str] = field(default_factory=list)

    def write(self, text: str) -> None:
        write(self.config, text)

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


# ---------------------------------------------------------------- presets
def test_a_preset_gives_sampling_defaults_to_requests_that_do_not_set_them(live: Served):
    def settings(model: str, **body: Any) -> dict[str, Any]:
        r = httpx.post(
            live.url + "/completion", json={"model": model, "prompt": "Once upon", "n_predict": 4, **body}, timeout=60
        )
        assert r.status_code == 200, r.text
        return r.json()["generation_settings"]

    greedy, plain = settings("c"), settings("a")
    assert (greedy["temperature"], greedy["top_k"]) == (0.0, 1)  # c's preset
    assert (plain["temperature"], plain["top_k"]) == (0.8, 0)  # the engine's defaults
    own = settings("c", temperature=0.5)  # a request's own value wins over the preset
    assert (own["temperature"], own["top_k"]) == (0.5, 1)
    # the same in another dialect (the preset is applied once, in the core)
    r = httpx.post(live.url + "/v1/responses", json={"model": "c", "input": "Hi", "max_output_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["temperature"] == 0.0, r.text
    # two identical requests without a seed: the same text only because c is greedy
    texts = {say_hi(live.url, "c", max_tokens=12).json()["choices"][0]["message"]["content"] for _ in range(2)}
    assert len(texts) == 1
    assert httpx.get(live.url + "/v1/models/c", timeout=10).json()["sampling"] == {"temperature": 0.0, "top_k": 1}
    assert "sampling" not in httpx.get(live.url + "/v1/models/a", timeout=10).json()
    shown = httpx.post(live.url + "/api/show", json={"model": "c"}, timeout=10).json()
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
