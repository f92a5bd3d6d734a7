"""turbospark.toml: a good file serves its models; every bad one is one clear
error naming the key and the file, exit code 2, before anything loads."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from turbospark.config import ConfigError, load_config

from .test_cli import say_hi


def serve(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "turbospark.cli", "serve", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def write(tmp_path, text: str) -> str:
    p = tmp_path / "turbospark.toml"
    p.write_text(text)
    return str(p)


BAD = [
    ("[models.a]\nmodel = 'smollm2-135m'\nctxx = 5\n", "unknown key models.a.ctxx"),
    ("[models.a]\nmodel = 'smollm2-135m'\nctx = 'big'\n", "models.a.ctx must be int, not str"),
    ("[models.a]\nmodel = 'smollm2-135m'\nparallel = 0\n", "models.a.parallel must be at least 1"),
    ("[models.a]\nmodel = 'smollm2-135m'\nkind = 'vision'\n", "models.a.kind must be 'chat', 'embedding' or 'rerank'"),
    ("[models.a]\nmodel = 'smollm2-135m'\naliases = 'x'\n", "models.a.aliases must be list"),
    ("[models.a]\nctx = 512\n", "models.a.model is required"),
    ("[models.a]\nmodel = 'no-such-model'\n", "models.a.model: no model file at 'no-such-model'"),
    ("[server]\nport = 'eighty'\n", "server.port must be int"),
    ("[server]\nbogus = 1\n", "unknown key server.bogus"),
    ("[server]\nguardrails = 'no'\n", "server.guardrails must be bool, not str"),
    ("[defaults]\nthreads = -1\n", "defaults.threads must not be negative"),
    ("[extras]\nx = 1\n", "unknown section [extras]"),
    ("[models.a\nmodel = 1\n", "not valid TOML"),
    (
        "[models.a]\nmodel = 'smollm2-135m'\n[models.b]\nmodel = 'smollm2-135m'\naliases = ['a']\n",
        "the name 'a' of model 'b' is already used by model 'a'",
    ),
]


@pytest.mark.parametrize("text, message", BAD)
def test_bad_config_exits_2_naming_key_and_file(tmp_path, text, message):
    path = write(tmp_path, text)
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "turbospark.cli", "serve", "--config", path], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    if "already used" not in message:
        assert path in out.stderr
    assert "loading" not in out.stderr  # refused before anything loaded
    assert time.monotonic() - t0 < 30


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "absent.toml"))


def test_good_config_serves_its_models_and_flags_override(tmp_path):
    path = write(
        tmp_path,
        """
[server]
host = "127.0.0.1"
port = 0

[defaults]
ctx = 1024
parallel = 1

[models.chat]
model = "smollm2-135m"
aliases = ["gpt-4o", "claude-sonnet-4-5"]
system = "You always answer in English."

[models.embed]
model = "smollm2-135m"
kind = "embedding"
ctx = 512
""",
    )
    cfg = load_config(path)
    assert [m.id for m in cfg.models] == ["chat", "embed"]
    assert cfg.models[0].ctx == 1024 and cfg.models[1].ctx == 512 and cfg.models[1].kind == "embedding"
    assert cfg.models[0].default_system == "You always answer in English."
    log = tmp_path / "events.jsonl"
    proc = serve("--config", path, "--ctx", "2048", "--event-log", str(log))  # flags override the file
    try:
        url = None
        lines = []
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            url = m.group(1) if m else None
        assert url, "".join(lines)
        text = "".join(lines)
        assert "model chat:" in text and "model embed:" in text and "context 2048" in text
        ids = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
        assert ids == ["chat", "embed"]
        say_hi(url, "claude-sonnet-4-5")
        e = httpx.post(url + "/v1/embeddings", timeout=60, json={"model": "embed", "input": "hi"})
        assert e.status_code == 200
        # the embedding model takes no chat: the only chat model serves it (rule 2)
        other_id = int(say_hi(url, "embed").headers["x-request-id"])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    events = [json.loads(x) for x in log.read_text().splitlines()]
    routed = next(e for e in events if e["kind"] == "requestRouted" and e["id"] == other_id)
    assert (routed["requested"], routed["served"]) == ("embed", "chat")


def test_server_section_sets_views_and_guardrails_and_flags_win(tmp_path):
    from turbospark.cli import _model_options, parser

    path = write(
        tmp_path,
        """
[server]
guardrails = false
metrics_auth = false
otlp_endpoint = "http://127.0.0.1:4318"
""",
    )
    args = parser().parse_args(["serve", "--config", path])
    _model_options(args)
    assert (args.guardrails, args.metrics_auth, args.otlp_endpoint) == ("off", "off", "http://127.0.0.1:4318")
    args = parser().parse_args(["serve", "--config", path, "--guardrails", "on", "--otlp-endpoint", "http://h:1"])
    _model_options(args)
    assert (args.guardrails, args.metrics_auth, args.otlp_endpoint) == ("on", "off", "http://h:1")
    args = parser().parse_args(["serve"])  # no file: the defaults
    _model_options(args)
    assert (args.guardrails, args.metrics_auth, args.otlp_endpoint) == ("on", "on", None)


def test_catalog_listing_loads_nothing(tmp_path):
    env = {**os.environ, "TURBOSPARK_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-m", "turbospark.cli", "models"], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0
    assert re.search(r"smollm2-135m\s+(installed|not installed)", out.stdout)
    for name in ("qwen2.5-coder-0.5b", "gemma3-270m"):
        assert name in out.stdout
    assert not (tmp_path / "cache" / "models").exists() or not os.listdir(tmp_path / "cache" / "models")


def test_server_section_takes_the_security_settings_and_flags_add_to_them(tmp_path):
    from turbospark.cli import _model_options, parser

    path = write(
        tmp_path,
        """
[server]
allowed_hosts = ["llm.internal"]
cors_origins = ["http://localhost:3000"]
max_body = 1048576
models_dirs = ["/srv/models"]
api_key_file = "keys.txt"
remote_key_envs = ["GPU_BOX_KEY"]
""",
    )
    args = parser().parse_args(["serve", "--config", path, "--cors-origin", "http://a.test", "--max-body", "2M",
                                "--remote-key-env", "OTHER_KEY"])  # fmt: skip
    _model_options(args)
    assert args.remote_key_env == ["OTHER_KEY", "GPU_BOX_KEY"]
    assert args.allowed_host == ["llm.internal"]
    assert args.cors_origin == ["http://a.test", "http://localhost:3000"]
    assert args.max_body == 2 << 20 and args.models_dir == ["/srv/models"]
    assert args.api_key_file == [str(tmp_path / "keys.txt")]  # relative to the file
    bad = write(tmp_path, "[server]\nmax_body = 0\n")
    with pytest.raises(ConfigError, match="max_body must be at least 1"):
        load_config(bad)


def test_engine_tuning_and_cache_dir_come_from_the_file_and_flags_win(tmp_path):
    from turbospark.cli import _model_options, parser

    path = write(
        tmp_path,
        """
[defaults]
batch = 256
flash_attn = "off"
cache_dir = "kv-cache"

[models.a]
model = "smollm2-135m"
prefill_chunk = 128
""",
    )
    (o,) = _model_options(parser().parse_args(["serve", "--config", path]))
    assert (o.batch, o.prefill_chunk, o.flash_attn, o.cache_dir) == (256, 128, "off", str(tmp_path / "kv-cache"))
    args = ["serve", "--config", path, "--batch", "1024", "--flash-attn", "on", "--cache-dir", "/tmp/kv"]
    ns = parser().parse_args([*args, "--speculative", "off", "--max-queue", "7"])
    (o,) = _model_options(ns)
    assert (o.batch, o.prefill_chunk, o.flash_attn, o.cache_dir) == (1024, 128, "on", "/tmp/kv")
    # what a model attached later starts from: the file's [defaults], then the flags
    d = ns.model_defaults
    assert (d["batch"], d["flash_attn"], d["cache_dir"], d["speculative"], d["max_queue"]) == (
        1024,
        "on",
        "/tmp/kv",
        False,
        7,
    )
    assert "prefill_chunk" not in d  # a per-model setting, not a default
