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
    allow_media_urls = ["images.example.com"] # hosts image URLs are fetched from (default: none)
    max_images = 16                          # images and sounds one request may carry
    max_rerank_documents = 1000              # documents one rerank request may carry
    models_dirs = ["/srv/models"]            # where admin attach may load GGUF files from
    remote_key_envs = ["GPU_BOX_KEY"]        # variables an attach body may name in api_key_env
    drain_timeout = 30                       # seconds requests in flight get at SIGTERM
    stall_timeout = 60                       # seconds without an engine step before /health degrades
    send_timeout = 60                        # seconds a client may read nothing before it is dropped
    body_timeout = 30                        # seconds a request body may pause before a 408
    strict_model_names = false               # true: a name no model answers to is a 404
    sse_keepalive = 15                       # seconds a quiet stream waits before a keep-alive (0: none)

    [defaults]                # every model, unless its own section says otherwise
    ctx = 4096
    parallel = 4

    [models.chat]             # the section name is the model id; each section is a preset
    model = "smollm2-135m"    # a GGUF path (relative to this file), a packaged model, or a
                              # model to pull as serve --model takes it: org/repo:Q4_K_M, ollama:name
    default = true            # serves names no model answers to (else: the first section)
    aliases = ["gpt-4o"]
    system = "You are terse."
    temperature = 0.2         # sampling defaults (also top_p, top_k, min_p, seed, repeat_penalty,
    top_k = 40                # presence_penalty, frequency_penalty; [defaults] too): a request's own win

    [models.fetched]
    pull = "org/repo:Q4_K_M"  # no model: the file this reference names (load_config's pull resolver)
    ctx = 8192

    [models.eyes]             # a model with a multimodal projector (images, sound)
    model = "models/SmolVLM-256M-Instruct-Q8_0.gguf"
    mmproj = "models/mmproj-SmolVLM-256M-Instruct-f16.gguf"   # relative to this file
                              # (a pulled model brings its own; mmproj = false leaves it off,
                              # here or in [defaults])

    [models.embed]
    model = "smollm2-135m"
    kind = "embedding"

    [models.reranker]         # /v1/rerank, /v2/rerank (a GGUF whose pooling is rank is one anyway)
    pull = "gpustack/bge-reranker-v2-m3-GGUF:Q8_0"
    kind = "rerank"

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
is loaded. Explicit command-line flags override the file. A running server
reads it again on SIGHUP, ``POST /v1/admin/config/reload`` and, with
``--watch-config``, when it changes (``compose.ConfigReloader``): models
added, removed and reloaded, ``[server]`` changes reported for a restart.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .engine.model import ModelOptions
from .models.catalog import ModelNotFound, resolve_model
from .models.loading import GROUP_KEYS, GroupOptions, RemoteConfigError, remote_options, replica_name
from .models.replicas import ROUTINGS
from .pull.refs import BadReference, parse
from .upstream.model import RemoteOptions


class ConfigError(ValueError):
    pass


#: per-model key -> (ModelOptions field, accepted types)
MODEL_KEYS: dict[str, tuple[str, tuple[type, ...]]] = {
    "model": ("path", (str,)),
    "aliases": ("aliases", (list,)),
    "tags": ("tags", (list,)),
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
    "pull": ("pull", (str,)),
    "mmproj": ("mmproj", (str, bool)),
}
#: sampling defaults of a model (``ModelOptions.sampling``): a request that
#: does not set the field gets the value -> (accepted types, least, most)
SAMPLING_KEYS: dict[str, tuple[tuple[type, ...], float | None, float | None]] = {
    "temperature": ((int, float), 0.0, None),
    "top_p": ((int, float), 0.0, 1.0),
    "top_k": ((int,), 0, None),
    "min_p": ((int, float), 0.0, 1.0),
    "repeat_penalty": ((int, float), 0.0, None),
    "presence_penalty": ((int, float), -2.0, 2.0),
    "frequency_penalty": ((int, float), -2.0, 2.0),
    "seed": ((int,), 0, None),
}
#: the keys of a local model's section: its options, and its sampling defaults
SECTION_KEYS: dict[str, tuple[str, tuple[type, ...]]] = {
    **MODEL_KEYS,
    **{k: ("sampling", types) for k, (types, _, _) in SAMPLING_KEYS.items()},
}
#: (a projector belongs to one model: ``[defaults]`` may only turn them off)
DEFAULT_KEYS = {
    **{k: v for k, v in SECTION_KEYS.items() if k not in ("model", "aliases", "pull")},
    "mmproj": ("mmproj", (bool,)),
}
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
    "allow_media_urls": (list,),
    "max_images": (int,),
    "max_rerank_documents": (int,),
    "models_dirs": (list,),
    "remote_key_envs": (list,),
    "drain_timeout": (int, float),
    "stall_timeout": (int, float),
    "send_timeout": (int, float),
    "body_timeout": (int, float),
    "sse_keepalive": (int, float),
    "event_log_max_bytes": (int,),
    "state_dir": (str,),
    "slot_save_path": (str,),
    "store": (bool,),
    "store_ttl": (int, float),
    "strict_model_names": (bool,),
}
POSITIVE = {
    "ctx",
    "max_rerank_documents",
    "parallel",
    "draft_max",
    "max_body",
    "event_log_max_bytes",
    "stall_timeout",
    "send_timeout",
    "body_timeout",
    "store_ttl",
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
    "sse_keepalive",
    "max_images",
}


#: how a ``pull`` reference (``org/repo:Q4_K_M``) becomes a GGUF path: the
#: seam the pull feature plugs into (``load_config(path, pull=...)``); it
#: may raise (ValueError, OSError, LookupError, ConfigError: the message is
#: shown naming the key and the file)
#: (or the GGUF and the projector pulled beside it: ``(path, mmproj or None)``)
PullResolver = Callable[[str], str | tuple[str, str | None]]


def no_pull(reference: str) -> str:
    """The resolver when none is given: a section that names its model only
    by ``pull`` is refused."""
    raise ConfigError(
        f"pull references need the pull feature to fetch {reference!r}; give model = a GGUF path "
        "or a packaged model name instead"
    )


@dataclass
class Config:
    server: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    #: local models, remote ones and replica groups, in the file's order
    models: list[ModelOptions | RemoteOptions | GroupOptions] = field(default_factory=list)
    #: each model's section as written (``GET /v1/admin/config`` shows them)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the id of the section that says ``default = true`` (None: none does)
    default: str | None = None

    def presets(self) -> dict[str, dict[str, Any]]:
        """The model sections as written, with no secret: a header's value
        is never shown (only that it is set); ``api_key_env`` is only ever a
        variable's name."""
        return {model_id: _public(table) for model_id, table in self.sections.items()}


def _public(table: dict[str, Any]) -> dict[str, Any]:
    out = dict(table)
    if isinstance(out.get("headers"), dict):
        out["headers"] = {name: "(set)" for name in out["headers"]}
    if isinstance(out.get("replicas"), list):
        out["replicas"] = [_public(r) if isinstance(r, dict) else r for r in out["replicas"]]
    return out


def model_fields(values: dict[str, Any]) -> dict[str, Any]:
    """A section's (or ``[defaults]``') keys as ``ModelOptions`` fields: the
    sampling keys gathered into ``sampling``, ``aliases`` a tuple."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        attr = SECTION_KEYS[key][0]
        if attr == "sampling":
            out.setdefault("sampling", {})[key] = float(value) if float in SAMPLING_KEYS[key][0] else value
        elif key == "mmproj":  # a file, or false: none (a pulled model's left off)
            out[attr] = value or None
        else:
            out[attr] = tuple(value) if key in ("aliases", "tags") else value
    return out


def _check(file: str, where: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(f"{file}: {where}.{key} must be {names}, not {type(value).__name__}")
    if key in POSITIVE and value < 1:
        raise ConfigError(f"{file}: {where}.{key} must be at least 1")
    if key in NON_NEGATIVE and value < 0:
        raise ConfigError(f"{file}: {where}.{key} must not be negative")
    if key == "kind" and value not in ("chat", "embedding", "rerank"):
        raise ConfigError(f"{file}: {where}.kind must be 'chat', 'embedding' or 'rerank', not {value!r}")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{file}: {where}.{key} must be a list of strings")
    if key in SAMPLING_KEYS:
        _, least, most = SAMPLING_KEYS[key]
        if (least is not None and value < least) or (most is not None and value > most):
            span = f"between {least:g} and {most:g}" if most is not None else f"at least {least:g}"
            raise ConfigError(f"{file}: {where}.{key} must be {span}")
    if key == "pull" and (not value.strip() or any(c.isspace() for c in value)):
        raise ConfigError(f"{file}: {where}.pull must be a model reference such as 'org/repo:Q4_K_M'")
    if key == "mmproj" and (value is True or value == ""):
        raise ConfigError(
            f"{file}: {where}.mmproj must be a projector GGUF's path, or false to leave a pulled model's off"
        )


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


def load_config(path: str, pull: PullResolver | None = None) -> Config:
    """The file at ``path``, checked whole (:class:`ConfigError` names the
    first problem's key and the file). A model section with ``pull`` and no
    ``model`` is the model ``pull`` resolves to (:data:`PullResolver`;
    without one, :func:`no_pull` refuses it)."""
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
    for key in ("state_dir", "slot_save_path"):
        if key in cfg.server:
            cfg.server[key] = os.path.join(here, os.path.expanduser(cfg.server[key]))
    if "models_dirs" in cfg.server:
        cfg.server["models_dirs"] = [os.path.join(here, d) for d in cfg.server["models_dirs"]]
    cfg.defaults = _section(path, "defaults", data.get("defaults", {}), DEFAULT_KEYS)
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{path}: [models] must hold one table per model, e.g. [models.chat]")
    base = os.path.dirname(os.path.abspath(path))
    ctx = _Where(path, base, cfg.defaults, pull or no_pull)
    for model_id, table in models.items():
        where = f"models.{model_id}"
        cfg.sections[model_id] = copy.deepcopy(table)
        if isinstance(table, dict) and "default" in table:
            table = dict(table)
            if _default(path, where, table.pop("default"), cfg.default):
                cfg.default = model_id
        if isinstance(table, dict) and ("replicas" in table or table.get("kind") == "remote"):
            cfg.models.append(_remote_or_group(ctx, where, model_id, table))
        else:
            cfg.models.append(_local(ctx, where, model_id, table))
    return cfg


def _default(file: str, where: str, value: Any, before: str | None) -> bool:
    """A section's ``default``: whether it is the server's default model
    (the one serving a name no model answers to; one section at most)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{file}: {where}.default must be bool, not {type(value).__name__}")
    if value and before is not None:
        raise ConfigError(f"{file}: {where}.default: models.{before} is the default model already (one at most)")
    return value


@dataclass
class _Where:
    """What reading a model section needs besides the section: the file, its
    folder (paths in it are relative to it), ``[defaults]`` and the
    resolver of ``pull`` references."""

    file: str
    base: str
    defaults: dict[str, Any]
    pull: PullResolver


def _local(at: _Where, where: str, model_id: str, table: Any) -> ModelOptions:
    """A local GGUF model's section (or a group's local replica)."""
    path = at.file
    values = _section(path, where, table, SECTION_KEYS)
    merged = {**at.defaults, **values}
    if "cache_dir" in merged:  # relative to the file, like every path in it
        merged["cache_dir"] = os.path.join(at.base, os.path.expanduser(merged["cache_dir"]))
    path, pulled_mmproj = _gguf(at, where, merged.pop("model", None), values.get("pull"))
    mmproj = merged.pop("mmproj", None)  # a file, false (none), or not given: the one pulled beside it
    kwargs: dict[str, Any] = {"path": path, "id": model_id}
    kwargs.update(model_fields(merged))
    kwargs["mmproj"] = pulled_mmproj if mmproj is None else _projector(at, where, mmproj) if mmproj else None
    if kwargs.get("kind") in ("embedding", "rerank"):
        if isinstance(mmproj, str):
            what = "an embedding model" if kwargs["kind"] == "embedding" else "a reranker"
            raise ConfigError(f"{at.file}: {where}.mmproj: {what} takes no projector")
        kwargs["mmproj"] = None
    return ModelOptions(**kwargs)


def _projector(at: _Where, where: str, value: str) -> str:
    """A section's ``mmproj``: a projector GGUF, relative to the file."""
    path = os.path.join(at.base, os.path.expanduser(value))
    if not os.path.isfile(path):
        raise ConfigError(f"{at.file}: {where}.mmproj: no such file {path}")
    return path


def _gguf(at: _Where, where: str, target: str | None, reference: str | None) -> tuple[str, str | None]:
    """The GGUF file a section's ``model`` names (a path, a packaged model,
    or a reference to pull, as ``serve --model`` takes), else the one its
    ``pull`` reference resolves to; and the projector pulled beside it."""
    key = f"{where}.model"
    if target is None:
        if reference is None:
            raise ConfigError(
                f"{at.file}: {key} is required (a GGUF path, a packaged model name or a reference to pull "
                "such as org/repo:Q4_K_M; or pull = a reference)"
            )
        return _pulled(at, f"{where}.pull", reference)
    candidate = target if os.path.isabs(target) else os.path.join(at.base, target)
    try:
        gguf, _ = resolve_model(candidate if os.path.isfile(candidate) else target)
    except ModelNotFound as exc:
        if _is_reference(target):  # (a packaged model not installed is one too)
            return _pulled(at, key, target)
        raise ConfigError(
            f"{at.file}: {key}: {exc}; nor is it a model to pull (org/repo:QUANT, hf.co/org/repo:QUANT, "
            "ollama:name[:tag], a URL; or give pull = a reference)"
        ) from None
    return gguf, None


def _is_reference(target: str) -> bool:
    """Whether a section's ``model`` names a model to pull rather than a
    file: it parses as a reference, and does not look like a path
    (``./x.gguf``, ``/srv/x.gguf``, ``models/x.gguf``)."""
    if os.path.isabs(target) or target.startswith((".", "~")) or "\\" in target:
        return False
    try:
        ref = parse(target)
    except BadReference:
        return False
    return not (ref.source == "hf" and not ref.file and ref.repo.lower().endswith(".gguf"))


def _pulled(at: _Where, key: str, reference: str) -> tuple[str, str | None]:
    """The GGUF a reference names, pulled when the store lacks it (the
    file's :data:`PullResolver`), and its projector."""
    try:
        found = at.pull(reference)
    except ConfigError as exc:
        raise ConfigError(f"{at.file}: {key}: {exc}") from None
    except (ValueError, OSError, LookupError) as exc:
        raise ConfigError(f"{at.file}: {key}: {reference!r} could not be resolved: {exc}") from None
    target, mmproj = found if isinstance(found, tuple) else (found, None)
    candidate = target if os.path.isabs(target) else os.path.join(at.base, target)
    try:
        gguf, _ = resolve_model(candidate if os.path.isfile(candidate) else target)
    except ModelNotFound as exc:
        raise ConfigError(f"{at.file}: {key}: {exc}") from None
    return gguf, mmproj


def _remote_or_group(at: _Where, where: str, model_id: str, table: dict[str, Any]) -> RemoteOptions | GroupOptions:
    """A ``kind = "remote"`` section, or a section with ``replicas``: each
    replica a table with ``base_url`` (remote, inheriting the section's
    remote keys) or without (a local GGUF, inheriting ``[defaults]``)."""
    path = at.file
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
            place = f"{where}.replicas[{i}]"
            if any(n == name for n, _ in members):
                raise ConfigError(f"{path}: {place}: two replicas are named {name!r}; give each a name")
            if "base_url" in rep:
                members.append((name, remote_options(f"{model_id}@{name}", {**values, **rep}, place)))
            else:
                members.append((name, _local(at, place, f"{model_id}@{name}", rep)))
        return GroupOptions(model_id, members, tuple(aliases), **group_values)
    except RemoteConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
