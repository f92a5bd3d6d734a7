"""``turbospark serve | models``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from . import __version__
from .catalog import CATALOG, DEFAULT_MODEL, ModelNotFound
from .drain import DEFAULT_DRAIN_SECONDS
from .registry import STALL_TIMEOUT

DEFAULT_PARALLEL = 4


def _progress_printer(label: str) -> Callable[[float], None]:
    """A one-line progress bar on stderr while llama.cpp loads the weights."""
    tty = sys.stderr.isatty()
    last = [-1]

    def show(frac: float) -> None:
        pct = int(frac * 100)
        if pct == last[0] or (not tty and pct not in (0, 100)):
            return
        last[0] = pct
        bar = "#" * (pct // 4) + "-" * (25 - pct // 4)
        end = "\n" if pct >= 100 else ""
        sys.stderr.write(f"\r  loading {label} [{bar}] {pct:3d}%{end}")
        sys.stderr.flush()

    return show


#: serve flags that map onto model options; None on the command line means
#: "not given", so a config file value is kept
MODEL_FLAGS = {
    "ctx": "ctx",
    "threads": "threads",
    "parallel": "parallel",
    "session_slots": "session_slots",
    "draft_max": "draft_max",
    "max_queue": "max_queue",
    "cache_ram": "cache_ram",
    "cache_type": "cache_type",
    "cache_dir": "cache_dir",
    "flash_attn": "flash_attn",
    "batch": "batch",
    "prefill_chunk": "prefill_chunk",
    "keep_alive": "keep_alive",
}
FLAG_DEFAULTS = {"ctx": 4096, "parallel": DEFAULT_PARALLEL}


def _size(text: str) -> int:
    """``32M``, ``512k``, ``1G`` or plain bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        n = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 32M)") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return n


def _fail(message: str) -> int:
    print(f"turbospark: {message}", file=sys.stderr)
    return 2


def _local_options(opts: list[Any]) -> list[Any]:
    """The local models among ``opts``, a replica group's local replicas
    included: what the engine flags apply to (a remote model has its own)."""
    from .engine.model import ModelOptions
    from .loading import GroupOptions

    out = [o for o in opts if isinstance(o, ModelOptions)]
    for g in opts:
        if isinstance(g, GroupOptions):
            out += [r for _, r in g.replicas if isinstance(r, ModelOptions)]
    return out


def _model_options(args: argparse.Namespace) -> list[Any]:
    """Models from --config and --model, with explicit flags applied last.
    Also sets ``args.model_defaults``: the options a model attached later
    (``POST /v1/admin/models``) starts from (the file's [defaults], then the
    flags)."""
    from .config import MODEL_KEYS, ConfigError, load_config
    from .loading import options_for
    from .middleware import BODY_TIMEOUT, SEND_TIMEOUT

    opts: list[Any] = []
    server: dict[str, Any] = {}
    defaults: dict[str, Any] = dict(FLAG_DEFAULTS)
    if args.config:
        cfg = load_config(args.config)
        opts.extend(cfg.models)
        server = cfg.server
        defaults.update({MODEL_KEYS[k][0]: v for k, v in cfg.defaults.items()})
    base = {k: v for k, v in FLAG_DEFAULTS.items()}
    for arg in args.model or ([] if opts else [DEFAULT_MODEL]):
        opts.append(options_for(arg, **base))
    for alias in args.alias or []:
        target, sep, name = alias.partition("=")
        if not sep:
            if len(opts) != 1:
                raise ConfigError(f"--alias {alias}: several models are served; write --alias MODEL_ID={alias}")
            target, name = opts[0].id or "", alias
            chosen = opts[0]
        else:
            chosen = next((o for o in opts if o.id == target), None)
            if chosen is None:
                raise ConfigError(f"--alias {alias}: no model with id {target!r}")
        chosen.aliases = (*chosen.aliases, name)
    for o in _local_options(opts):
        for flag, attr in MODEL_FLAGS.items():
            value = getattr(args, flag)
            if value is not None:
                setattr(o, attr, value)
        if args.prefix_reuse is not None:
            o.prefix_reuse = args.prefix_reuse == "on"
        if args.speculative is not None:
            o.speculative = args.speculative == "ngram"
    given = {attr: getattr(args, flag) for flag, attr in MODEL_FLAGS.items()}
    defaults.update({attr: value for attr, value in given.items() if value is not None})
    if args.prefix_reuse is not None:
        defaults["prefix_reuse"] = args.prefix_reuse == "on"
    if args.speculative is not None:
        defaults["speculative"] = args.speculative == "ngram"
    args.model_defaults = defaults
    fallback = {
        "host": "127.0.0.1",
        "port": 8080,
        "max_resident": 0,
        "drain_timeout": DEFAULT_DRAIN_SECONDS,
        "stall_timeout": STALL_TIMEOUT,
        "send_timeout": SEND_TIMEOUT,
        "body_timeout": BODY_TIMEOUT,
    }
    for key in (
        "host",
        "port",
        "event_log",
        "max_resident",
        "otlp_endpoint",
        "drain_timeout",
        "stall_timeout",
        "send_timeout",
        "body_timeout",
    ):
        if getattr(args, key) is None:
            setattr(args, key, server.get(key, fallback.get(key)))
    for key in ("guardrails", "metrics_auth", "normalize_client_stamps"):  # on/off flags, booleans in the file
        if getattr(args, key) is None:
            setattr(args, key, "off" if server.get(key) is False else "on")
    args.api_key = list(args.api_key or []) + list(server.get("api_keys", []))
    args.admin_key = list(args.admin_key or []) + list(server.get("admin_keys", []))
    args.api_key_file = list(args.api_key_file or []) + ([server["api_key_file"]] if "api_key_file" in server else [])
    for key, flag in (
        ("allowed_hosts", "allowed_host"),
        ("cors_origins", "cors_origin"),
        ("models_dirs", "models_dir"),
        ("remote_key_envs", "remote_key_env"),
    ):
        setattr(args, flag, list(getattr(args, flag) or []) + list(server.get(key, [])))
    if args.max_body is None:
        args.max_body = server.get("max_body")
    if args.event_log_max_bytes is None:
        args.event_log_max_bytes = server.get("event_log_max_bytes")
    return opts


def _serve(args: argparse.Namespace) -> int:
    from .auth import KeyFileError, OpenBind, check_bind, from_config
    from .compose import assemble
    from .config import ConfigError
    from .engine.memory import MemoryRefused
    from .guard import policy_from
    from .registry import RegistryError
    from .server import LiveUvicorn, bind_socket, uvicorn_config
    from .sinks.otel import otel_wanted

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        options = _model_options(args)
    except (ConfigError, ModelNotFound) as exc:
        return _fail(str(exc))
    from .engine.hostcache import folder_problem
    from .loading import GroupOptions

    local = [o for g in options for o in ([opts for _, opts in g.replicas] if isinstance(g, GroupOptions) else [g])]
    for folder in {os.path.expanduser(d) for d in (getattr(o, "cache_dir", None) for o in local) if d}:
        problem = folder_problem(folder)  # found now, not when the KV is written at the exit
        if problem is not None:
            return _fail(f"--cache-dir {folder}: {problem}")
    try:
        auth = from_config(
            args.api_key,
            args.admin_key,
            os.environ,
            metrics_auth=args.metrics_auth != "off",
            key_files=args.api_key_file,
        )
        check_bind(args.host, auth)
        policy = policy_from(args.host, args.allowed_host, args.cors_origin, args.max_body)
    except (KeyFileError, OpenBind, ValueError) as exc:
        return _fail(str(exc))

    started = [time.perf_counter()]

    def progress_for(spec: Any) -> Callable[[float], None]:
        started[0] = time.perf_counter()
        return _progress_printer(os.path.basename(spec.path))

    def loaded(model: Any) -> None:
        info = model.info()
        took = time.perf_counter() - started[0]
        if not model.capabilities.chat:
            print(
                f"  model {model.model_id}: {info['description']}, embeddings only, "
                f"threads {info['threads']}, loaded in {took:.1f}s",
                file=sys.stderr,
            )
            return
        print(
            f"  model {model.model_id}: {info['description']}, context {model.max_context}, "
            f"{info['parallel']} parallel / {info['session_slots']} slots, "
            f"threads {info['threads']}, loaded in {took:.1f}s",
            file=sys.stderr,
        )
        print(f"    {info['kv_cache']}; speculative: {'ngram' if info['speculative'] else 'off'}", file=sys.stderr)

    try:
        assembly = assemble(
            options,
            auth=auth,
            policy=policy,
            event_log=args.event_log,
            event_log_max_bytes=args.event_log_max_bytes,
            tracing=otel_wanted(args.otlp_endpoint),
            otlp_endpoint=args.otlp_endpoint,
            max_resident=args.max_resident,
            stall_timeout=args.stall_timeout,
            guardrails=args.guardrails == "on",
            normalize_client_stamps=args.normalize_client_stamps == "on",
            model_folders=args.models_dir or None,
            remote_key_envs=args.remote_key_env,
            model_defaults=args.model_defaults,
            progress_for=progress_for,
            on_loaded=loaded,
        )
    except ImportError as exc:
        return _fail(f"tracing needs the otel extra (pip install 'turbospark[otel]'): {exc}")
    except OSError as exc:
        if args.event_log and getattr(exc, "filename", None) == args.event_log:
            return _fail(f"cannot open the event log {args.event_log}: {exc.strerror or exc}")
        return _fail(str(exc))
    except (RegistryError, RuntimeError, ValueError, MemoryRefused) as exc:
        return _fail(str(exc))
    registry = assembly.registry
    for entry in registry.entries():
        if entry.group is not None:
            names = ", ".join(r.entry.id for r in entry.group.replicas)
            print(f"  model {entry.id}: {len(entry.group.replicas)} replicas ({names})", file=sys.stderr)
        elif entry.info.get("kind") == "remote":
            print(
                f"  model {entry.id}: remote, {entry.info['description']}, context {entry.info['context']}",
                file=sys.stderr,
            )
        elif entry.model is None:
            print(f"  model {entry.id}: configured, loads on first use", file=sys.stderr)

    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        assembly.close()
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc}")
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"turbospark {__version__} listening on http://{host}:{sock.getsockname()[1]}", file=sys.stderr)
    address = f"http://{host}:{sock.getsockname()[1]}"
    print(f"  dashboard: {address}/dashboard   console: turbospark console --url {address}", file=sys.stderr)
    print(
        "  auth: "
        + ("API key required" if auth.api_keys else "off (loopback only)")
        + "   browsers: "
        + (", ".join(policy.cors_origins) or "own pages only")
        + "   events: "
        + (args.event_log or "(no --event-log)")
        + "   traces: "
        + _traces_label(args),
        file=sys.stderr,
    )
    server = LiveUvicorn(
        uvicorn_config(
            assembly.app, send_timeout=args.send_timeout, body_timeout=args.body_timeout, drain=assembly.drain
        ),
        assembly.live,
        assembly.registry,
        assembly.drain,
        args.drain_timeout,
    )
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # pragma: no cover - uvicorn normally handles it
        pass
    finally:
        # (after a hangup the terminal is gone: writing to it fails, and the
        # models and the event log must still close)
        with contextlib.suppress(OSError):
            print("turbospark: shutting down", file=sys.stderr)
        assembly.close()
    return 0


def _traces_label(args: argparse.Namespace) -> str:
    from .sinks.otel import otel_wanted

    if not otel_wanted(args.otlp_endpoint):
        return "off"
    return "OTLP " + (args.otlp_endpoint or "(OTEL_* environment)")


def _console(args: argparse.Namespace) -> int:
    from .console import run

    return run(args.url, args.api_key or os.environ.get("TURBOSPARK_API_KEY"))


def _report(args: argparse.Namespace) -> int:
    from .report import report

    if not os.path.isfile(args.events):
        return _fail(f"no such event log: {args.events}")
    return report(args.events, args.out, sys.stdout)


def _models(args: argparse.Namespace) -> int:
    """The catalog, without loading (or assembling) any model."""
    for name, entry in sorted(CATALOG.items()):
        state = "installed" if entry.installed() else "not installed"
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"{name:<22} {state:<14} {entry.description}{default}")
        if state != "installed":
            print(f"{'':<22} get it with: {entry.pip}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turbospark", description="Local LLM server on llama.cpp.")
    p.add_argument("--version", action="version", version=f"turbospark {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve models over HTTP")
    s.add_argument("--model", "-m", action="append", help="GGUF path or packaged model name (repeatable)")
    s.add_argument("--config", metavar="FILE", help="turbospark.toml with server settings and models")
    s.add_argument(
        "--alias", action="append", metavar="[MODEL_ID=]NAME", help="another name a model answers to (repeatable)"
    )
    s.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=None, help="port (default 8080; 0 = any free port)")
    s.add_argument(
        "--ctx", type=int, default=None, help="context per request in tokens (default 4096; 0 = the model's)"
    )
    s.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    s.add_argument(
        "--parallel",
        type=int,
        default=None,
        help=f"sequences decoded together in one batch (default {DEFAULT_PARALLEL})",
    )
    s.add_argument(
        "--session-slots",
        type=int,
        default=None,
        help="conversations whose KV stays resident (>= parallel; default = parallel)",
    )
    s.add_argument("--prefix-reuse", choices=["on", "off"], default=None, help="reuse KV prefixes (default on)")
    s.add_argument(
        "--speculative",
        choices=["ngram", "off"],
        default=None,
        help="prompt-lookup speculative decoding, exact (default ngram)",
    )
    s.add_argument(
        "--draft-max",
        type=int,
        default=None,
        help="most tokens drafted per step (default 16; fewer are verified when this machine's step costs say so)",
    )
    s.add_argument(
        "--max-queue", type=int, default=None, help="most requests waiting for a sequence (0 = unbounded); full -> 503"
    )
    s.add_argument(
        "--cache-type",
        choices=["f16", "q8_0", "q4_0"],
        default=None,
        help="KV cache element type: f16 (default, exact) or quantised q8_0 / q4_0 (less memory, "
        "slightly different logits; see the README for the figures)",
    )
    s.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="keep the host-memory KV tier in DIR across restarts (written at shutdown, read at load), "
        "so returning conversations and shared system prompts start warm",
    )
    s.add_argument(
        "--flash-attn",
        choices=["auto", "on", "off"],
        default=None,
        help="flash attention (default auto: on where the backend has it for the model)",
    )
    s.add_argument(
        "--batch",
        type=int,
        default=None,
        help="tokens per llama_decode call (n_batch = n_ubatch; default 512, tuned by bench/prefill.py)",
    )
    s.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="most prompt tokens one request feeds per step while others decode, so they never wait long "
        "(default 256; with nobody decoding, prompts share the whole --batch)",
    )
    s.add_argument(
        "--cache-ram",
        type=int,
        default=None,
        metavar="MIB",
        help="host memory for the KV of conversations evicted from their slots, restored when they "
        "return (default: a quarter of the available memory, at most 4096; 0 = off)",
    )
    s.add_argument(
        "--keep-alive",
        type=float,
        default=None,
        metavar="SECONDS",
        help="unload a model after this long idle; it reloads on the next request",
    )
    s.add_argument(
        "--max-resident",
        type=int,
        default=None,
        help="most models in memory at once; least recently used is unloaded (0 = no cap)",
    )
    s.add_argument("--api-key", action="append", help="require this API key (repeatable; or TURBOSPARK_API_KEY)")
    s.add_argument("--admin-key", action="append", help="a separate key for /v1/admin routes (or TURBOSPARK_ADMIN_KEY)")
    s.add_argument(
        "--api-key-file",
        action="append",
        metavar="FILE",
        help="read API keys from FILE, one a line (keeps them out of the process list)",
    )
    s.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host name to answer besides loopback names and the bound address "
        "(repeatable; '*' = any; guards against DNS rebinding)",
    )
    s.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="a web origin whose pages may call the API, e.g. http://localhost:3000 "
        "(repeatable; '*' = any; default: only the server's own pages)",
    )
    s.add_argument(
        "--max-body",
        type=_size,
        default=None,
        metavar="BYTES",
        help="largest request body, e.g. 32M (default 32 MiB); larger ones get 413",
    )
    s.add_argument(
        "--models-dir",
        action="append",
        metavar="DIR",
        help="a folder admin attach may load GGUF files from (repeatable; default: "
        "the model cache and the folders of the models given at start)",
    )
    s.add_argument(
        "--remote-key-env",
        action="append",
        metavar="NAME",
        help="an environment variable an attach body may name in api_key_env (repeatable; besides "
        "those the configured remote models name): the key in it is sent to the body's base_url",
    )
    s.add_argument(
        "--guardrails",
        choices=["on", "off"],
        default=None,
        help="validate tool calls against their schemas and re-ask once (default on)",
    )
    s.add_argument(
        "--normalize-client-stamps",
        choices=["on", "off"],
        default=None,
        help="take known per-session client stamps (Claude Code's attribution header) out of prompts, "
        "so they do not end prefix reuse (default on)",
    )
    s.add_argument("--event-log", metavar="FILE", default=None, help="append every event to FILE as JSON lines")
    s.add_argument(
        "--event-log-max-bytes",
        type=_size,
        default=None,
        metavar="BYTES",
        help="rotate the event log past this size, e.g. 100M (one rotated file, FILE.1, is kept)",
    )
    s.add_argument(
        "--send-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="drop a client that reads nothing of its response for this long, cancelling its generation (default 60)",
    )
    s.add_argument(
        "--body-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="answer 408 when a request body stops arriving for this long (default 30)",
    )
    s.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="flag a model whose engine makes no step for this long while requests wait: /health "
        "answers 503 degraded, a modelHealth event and a log line (default 60)",
    )
    s.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long requests in flight may finish before they are ended "
        "with an error (default 30; new requests get 503 meanwhile; a second signal exits at once)",
    )
    s.add_argument(
        "--metrics-auth",
        choices=["on", "off"],
        default=None,
        help="GET /metrics needs the API key when keys are set (default on)",
    )
    s.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        default=None,
        help="export one OpenTelemetry span per request over OTLP/HTTP to URL "
        "(or set OTEL_EXPORTER_OTLP_ENDPOINT; needs turbospark[otel])",
    )
    s.add_argument("--verbose", "-v", action="store_true")
    s.set_defaults(func=_serve)

    m = sub.add_parser("models", help="list the packaged models and whether they are installed")
    m.set_defaults(func=_models)

    c = sub.add_parser("console", help="live terminal view of a server's events")
    c.add_argument("--url", default="http://127.0.0.1:8080", help="the server (default http://127.0.0.1:8080)")
    c.add_argument("--api-key", default=None, help="its API key (or TURBOSPARK_API_KEY)")
    c.set_defaults(func=_console)

    r = sub.add_parser("report", help="summary and PNG plots of an --event-log file")
    r.add_argument("events", metavar="EVENTS.jsonl", help="a file written by serve --event-log")
    r.add_argument(
        "--out", default="turbospark-report", metavar="DIR", help="where the PNG plots go (default ./turbospark-report)"
    )
    r.set_defaults(func=_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
