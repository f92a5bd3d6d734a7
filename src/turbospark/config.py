"""``turbospark.toml``: server settings, model defaults and per-model sections.

    [server]
    host = "127.0.0.1"
    port = 8080
    event_log = "events.jsonl"
    event_log_max_bytes = 104857600   # rotate past 100 MiB, keeping events.jsonl.1
    max_resident = 2          # most models in memory at once (0 = no cap)
    guardrails = true         # tool-call validation and one re-ask
    normalize_client_stamps = true  # drop Claude Code's per-session attribution stamp
    metrics_auth = true       # GET /metrics needs a key when keys are set
    otlp_endpoint = "http://127.0.0.1:4318"   # one OpenTelemetry span per request
    api_key_file = "/etc/turbospark/keys"    # API keys, one a line (not in the command line)
    allowed_hosts = ["llm.internal"]         # Host names besides loopback and the bound address
    cors_origins = ["http://localhost:3000"] # web pages that may call the API ("*": any)
    max_body = 33554432                      # bytes (default 32 MiB)
    models_dirs = ["/srv/models"]            # where admin attach may load GGUF files from
    remote_key_envs = ["GPU_BOX_KEY"]        # variables an attach body may name in api_key_env
    drain_timeout = 30                       # seconds requests in flight get at SIGTERM
    stall_timeout = 60                       # seconds without an engine step before /health degrades
    send_timeout = 60                        # seconds a client may read nothing before it is dropped
    body_timeout = 30                        # seconds a request body may pause before a 408

    [defaults]                # every model, unless its own section says otherwise
    ctx = 4096
    parallel = 4

    [models.chat]             # the section name is the model id
    model = "smollm2-135m"    # a GGUF path (relative to this file) or a packaged model
    aliases = ["gpt-4o"]
    system = "You are terse."

    [models.embed]
    model = "smollm2-135m"
    kind = "embedding"

    [models.big]              # a model another server runs (vLLM, SGLang, llama-server, turbospark)
    kind = "remote"
    base_url = "http://gpu-box:8000/v1"
    model = "Qwen/Qwen3-32B"  # the upstream's name for it
    api_key_env = "GPU_BOX_KEY"   # the variable holding its key (never the key)
    ctx = 32768

    [models.pool]             # one id over several engines (see models/replicas.py)
    model = "Qwen/Qwen3-32B"  # what every remote replica inherits (also api_key_env, ctx, headers ...)
    ctx = 32768
    health_interval = 5
    cooldown = 10
    replicas = [
      { name = "a", base_url = "http://gpu-a:8000/v1" },
      { name = "b", base_url = "http://gpu-b:8000/v1" },
      { name = "here", model = "qwen2.5-coder-0.5b", ctx = 8192 },   # no base_url: a local GGUF
    ]

Every problem is reported once, naming the key and the file, before anything
is loaded. Explicit command-line flags override the file.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from .engine.model import ModelOptions
from .models.catalog import ModelNotFound, resolve_model
from .models.loading import GROUP_KEYS, GroupOptions, RemoteConfigError, remote_options, replica_name
from .models.replicas import ROUTINGS
from .upstream.model import RemoteOptions


class ConfigError(ValueError):
    pass


#: per-model key -> (ModelOptions field, accepted types)
MODEL_KEYS: dict[str, tuple[str, tuple[type, ...]]] = {
    "model": ("path", (str,)),
    "aliases": ("aliases", (list,)),
    "kind": ("kind", (str,)),
    "ctx": ("ctx", (int,)),
    "context": ("ctx", (int,)),
    "parallel": ("parallel", (int,)),
    "session_slots": ("session_slots", (int,)),
    "threads": ("threads", (int,)),
    "system": ("default_system", (str,)),
    "reasoning": ("default_reasoning", (str,)),
    "chat_template": ("chat_template", (str,)),
    "prefix_reuse": ("prefix_reuse", (bool,)),
    "speculative": ("speculative", (bool,)),
    "draft_max": ("draft_max", (int,)),
    "max_queue": ("max_queue", (int,)),
    "cache_ram": ("cache_ram", (int,)),
    "cache_type": ("cache_type", (str,)),
    "cache_dir": ("cache_dir", (str,)),
    "flash_attn": ("flash_attn", (str,)),
    "batch": ("batch", (int,)),
    "prefill_chunk": ("prefill_chunk", (int,)),
    "keep_alive": ("keep_alive", (int, float)),
    "gpu_layers": ("gpu_layers", (int,)),
}
DEFAULT_KEYS = {k: v for k, v in MODEL_KEYS.items() if k not in ("model", "aliases")}
SERVER_KEYS: dict[str, tuple[type, ...]] = {
    "host": (str,),
    "port": (int,),
    "event_log": (str,),
    "max_resident": (int,),
    "api_keys": (list,),
    "admin_keys": (list,),
    "guardrails": (bool,),
    "normalize_client_stamps": (bool,),
    "metrics_auth": (bool,),
    "otlp_endpoint": (str,),
    "api_key_file": (str,),
    "allowed_hosts": (list,),
    "cors_origins": (list,),
    "max_body": (int,),
    "models_dirs": (list,),
    "remote_key_envs": (list,),
    "drain_timeout": (int, float),
    "stall_timeout": (int, float),
    "send_timeout": (int, float),
    "body_timeout": (int, float),
    "event_log_max_bytes": (int,),
}
POSITIVE = {
    "ctx",
    "parallel",
    "draft_max",
    "max_body",
    "event_log_max_bytes",
    "stall_timeout",
    "send_timeout",
    "body_timeout",
}
NON_NEGATIVE = {
    "session_slots",
    "threads",
    "max_queue",
    "cache_ram",
    "keep_alive",
    "port",
    "max_resident",
    "drain_timeout",
}


@dataclass
class Config:
    server: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    #: local models, remote ones and replica groups, in the file's order
    models: list[ModelOptions | RemoteOptions | GroupOptions] = field(default_factory=list)


def _check(file: str, where: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(f"{file}: {where}.{key} must be {names}, not {type(value).__name__}")
    if key in POSITIVE and value < 1:
        raise ConfigError(f"{file}: {where}.{key} must be at least 1")
    if key in NON_NEGATIVE and value < 0:
        raise ConfigError(f"{file}: {where}.{key} must not be negative")
    if key == "kind" and value not in ("chat", "embedding"):
        raise ConfigError(f"{file}: {where}.kind must be 'chat' or 'embedding', not {value!r}")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{file}: {where}.{key} must be a list of strings")


def _section(file: str, name: str, table: Any, allowed: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{file}: [{name}] must be a table")
    for key, value in table.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise ConfigError(f"{file}: unknown key {name}.{key} (known keys: {known})")
        spec = allowed[key]
        _check(file, name, key, value, spec[1] if isinstance(spec[0], str) else spec)
    return dict(table)


def load_config(path: str) -> Config:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for key in data:
        if key not in ("server", "defaults", "models"):
            raise ConfigError(f"{path}: unknown section [{key}] (known: server, defaults, models)")
    cfg = Config()
    cfg.server = _section(path, "server", data.get("server", {}), SERVER_KEYS)
    here = os.path.dirname(os.path.abspath(path))
    if "api_key_file" in cfg.server:  # paths in the file are relative to it
        cfg.server["api_key_file"] = os.path.join(here, cfg.server["api_key_file"])
    if "models_dirs" in cfg.server:
        cfg.server["models_dirs"] = [os.path.join(here, d) for d in cfg.server["models_dirs"]]
    cfg.defaults = _section(path, "defaults", data.get("defaults", {}), DEFAULT_KEYS)
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{path}: [models] must hold one table per model, e.g. [models.chat]")
    base = os.path.dirname(os.path.abspath(path))
    for model_id, table in models.items():
        where = f"models.{model_id}"
        if isinstance(table, dict) and ("replicas" in table or table.get("kind") == "remote"):
            cfg.models.append(_remote_or_group(path, where, model_id, table, cfg.defaults, base))
            continue
        cfg.models.append(_local(path, where, model_id, table, cfg.defaults, base))
    return cfg


def _local(path: str, where: str, model_id: str, table: Any, defaults: dict[str, Any], base: str) -> ModelOptions:
    """A local GGUF model's section (or a group's local replica)."""
    values = _section(path, where, table, MODEL_KEYS)
    if "model" not in values:
        raise ConfigError(f"{path}: {where}.model is required (a GGUF path or a packaged model name)")
    merged = {**defaults, **values}
    if "cache_dir" in merged:  # relative to the file, like every path in it
        merged["cache_dir"] = os.path.join(base, os.path.expanduser(merged["cache_dir"]))
    target = merged.pop("model")
    candidate = target if os.path.isabs(target) else os.path.join(base, target)
    try:
        gguf, _ = resolve_model(candidate if os.path.isfile(candidate) else target)
    except ModelNotFound as exc:
        raise ConfigError(f"{path}: {where}.model: {exc}") from None
    kwargs: dict[str, Any] = {"path": gguf, "id": model_id}
    for key, value in merged.items():
        attr = MODEL_KEYS[key][0]
        kwargs[attr] = tuple(value) if key == "aliases" else value
    return ModelOptions(**kwargs)


def _remote_or_group(
    path: str, where: str, model_id: str, table: dict[str, Any], defaults: dict[str, Any], base: str
) -> RemoteOptions | GroupOptions:
    """A ``kind = "remote"`` section, or a section with ``replicas``: each
    replica a table with ``base_url`` (remote, inheriting the section's
    remote keys) or without (a local GGUF, inheriting ``[defaults]``)."""
    values = dict(table)
    aliases = values.pop("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{path}: {where}.aliases must be a list of strings")
    values.pop("kind", None)
    replicas = values.pop("replicas", None)
    try:
        if replicas is None:
            return remote_options(model_id, values, where, tuple(aliases))
        if not isinstance(replicas, list) or not replicas or not all(isinstance(r, dict) for r in replicas):
            raise ConfigError(f"{path}: {where}.replicas must be a list of tables, one per replica")
        group_values = {k: values.pop(k) for k in list(values) if k in GROUP_KEYS}
        for key, value in group_values.items():
            if key == "routing":
                if value not in ROUTINGS:
                    raise ConfigError(f"{path}: {where}.routing must be one of {', '.join(ROUTINGS)}, not {value!r}")
            elif not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{path}: {where}.{key} must be a positive number of seconds")
        members: list[tuple[str, RemoteOptions | ModelOptions]] = []
        for i, rep in enumerate(replicas):
            rep = dict(rep)
            name = replica_name(rep, i)
            rep.pop("name", None)
            at = f"{where}.replicas[{i}]"
            if any(n == name for n, _ in members):
                raise ConfigError(f"{path}: {at}: two replicas are named {name!r}; give each a name")
            if "base_url" in rep:
                members.append((name, remote_options(f"{model_id}@{name}", {**values, **rep}, at)))
            else:
                members.append((name, _local(path, at, f"{model_id}@{name}", rep, defaults, base)))
        return GroupOptions(model_id, members, tuple(aliases), **group_values)
    except RemoteConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
