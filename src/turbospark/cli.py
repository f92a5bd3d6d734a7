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
from .cli_options import (
    CONSOLE,
    MODELS,
    PULL,
    REMOVE,
    REPORT,
    SERVE,
    Option,
    add_options,
    apply_values,
    merge_server,
    model_defaults,
    model_values,
    server_settings,
    with_values,
)
from .models.catalog import CATALOG, DEFAULT_MODEL, ModelNotFound, cache_dir


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


def _fail(message: str) -> int:
    print(f"turbospark: {message}", file=sys.stderr)
    return 2


def _local_options(opts: list[Any]) -> list[Any]:
    """The local models among ``opts``, a replica group's local replicas
    included: what the engine flags apply to (a remote model has its own)."""
    from .engine.model import ModelOptions
    from .models.loading import GroupOptions

    out = [o for o in opts if isinstance(o, ModelOptions)]
    for g in opts:
        if isinstance(g, GroupOptions):
            out += [r for _, r in g.replicas if isinstance(r, ModelOptions)]
    return out


def _model_options(args: argparse.Namespace) -> list[Any]:
    """Models from --config and --model, with explicit flags applied last.
    Also sets ``args.model_defaults``: the options a model attached later
    (``POST /v1/admin/models``) starts from (the file's [defaults], then the
    flags), ``args.config_loaded`` (the file as read) and the server
    settings the flags leave to the file."""

    opts: list[Any] = []
    server: dict[str, Any] = {}
    given = model_values(args)
    defaults = with_values(model_defaults(), given)
    args.config_loaded = None
    if args.config:
        cfg, defaults = _read_config(args, aliases=False)
        opts.extend(cfg.models)
        server = cfg.server
        args.config_loaded = cfg
    base = model_defaults()
    store = [*(args.models_dir or []), *server.get("models_dirs", [])]
    given_models = [_option_for(arg, base, store) for arg in args.model or ([] if opts else [DEFAULT_MODEL])]
    opts.extend(given_models)
    opts.extend(_rerankers(opts, given_models, args.rerank or [], base, store))
    for alias in args.alias or []:
        _add_alias(opts, alias)
    _add_projectors(opts, given_models, args.mmproj or [], bool(args.no_mmproj))
    args.default_model = _default_model(args.config_loaded, given_models, opts)
    for o in _local_options(opts):
        apply_values(o, given)
    args.model_defaults = defaults
    merge_server(args, server)
    return opts


def _default_model(cfg: Any, given: list[Any], opts: list[Any]) -> str | None:
    """The id of the model serving a name no model answers to: the config
    section that says ``default = true``, else the first ``--model``, else
    the first section."""
    from .models.presets import preset_id

    if cfg is not None and cfg.default is not None:
        return str(cfg.default)
    first = given or opts
    return preset_id(first[0]) if first else None


def _option_for(arg: str, base: dict[str, Any], store_dirs: list[str]) -> Any:
    """A ``--model``: a GGUF path or an installed packaged model as it is; a
    model to pull (``org/repo:Q4_K_M``, ``ollama:name``, a packaged one not
    installed) from the store, pulled first with a progress bar when missing."""
    from .models.loading import options_for

    if os.path.isfile(arg) or (arg in CATALOG and CATALOG[arg].installed()):
        return options_for(arg, **base)
    from .pull.bar import Bar
    from .pull.commands import ensure, store_at
    from .pull.specs import options

    store = store_at(store_dirs)
    try:
        pulled = ensure(arg, store, Bar(sys.stderr))
        return options_for(pulled.path, **base) if pulled.model is None else options(store, pulled.model, base)
    finally:
        store.close()


def _pull_resolver(store_dirs: list[str] | None) -> Callable[[str], tuple[str, str | None]]:
    """A config section's ``pull``: the GGUF it names, pulled into the store
    (the first ``--models-dir``, else the user cache's) with a progress bar
    when missing, and the projector pulled beside it (None: none). Raises
    ``PullFailed`` (a ``ValueError``)."""

    def resolve(reference: str) -> tuple[str, str | None]:
        from .pull.bar import Bar
        from .pull.commands import PullFailed, ensure, store_at
        from .pull.store import StoreError

        try:
            store = store_at(store_dirs)
        except StoreError as exc:
            raise PullFailed(str(exc)) from None
        try:
            pulled = ensure(reference, store, Bar(sys.stderr))
            mmproj = pulled.model.mmproj if pulled.model is not None else None
            return pulled.path, store.path(mmproj) if mmproj else None
        finally:
            store.close()

    return resolve


def _read_config(args: argparse.Namespace, aliases: bool = True) -> tuple[Any, dict[str, Any]]:
    """The --config file (read at start, and again at each reload): its
    models with the model flags applied (and, with ``aliases``, the
    ``--alias`` options that name one of them), and the options a model
    attached later starts from (``[defaults]``, then the flags)."""
    from .config import load_config, model_fields

    cfg = load_config(args.config, pull=_pull_resolver(args.models_dir))
    given = model_values(args)
    for o in _local_options(cfg.models):
        apply_values(o, given)
    if aliases:
        ids = {o.id for o in cfg.models}
        for alias in args.alias or []:
            target, sep, _ = alias.partition("=")
            if (sep and target in ids) or (not sep and not args.model and len(cfg.models) == 1):
                _add_alias(cfg.models, alias)
        if not args.model and not args.no_mmproj:  # (the file's one model's --mmproj)
            _add_projectors(cfg.models, [], args.mmproj or [], False)
    return cfg, with_values({**model_defaults(), **model_fields(cfg.defaults)}, given)


def _add_alias(opts: list[Any], alias: str) -> None:
    """``--alias [MODEL_ID=]NAME``: one more name for a model."""
    from .config import ConfigError

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


def _followed(opts: list[Any], given_models: list[Any], after: int, refusal: str) -> Any:
    """The ``--model`` a per-model flag follows (``after``: how many came
    before it); given before any ``--model``, the one model served, else a
    :class:`ConfigError` saying ``refusal``."""
    from .config import ConfigError

    if after:
        return given_models[after - 1]
    local = _local_options(opts)
    if len(opts) == 1 and len(local) == 1:
        return local[0]
    raise ConfigError(refusal)


def _rerankers(
    opts: list[Any],
    given_models: list[Any],
    given: list[tuple[int, str | None]],
    base: dict[str, Any],
    store: list[str],
) -> list[Any]:
    """``--rerank FILE``: a reranker besides the ``--model`` ones (returned);
    ``--rerank`` alone: the ``--model`` it follows is one (given before any
    ``--model``: the one model served)."""

    added = []
    for after, arg in given:
        if arg is not None:
            added.append(_option_for(arg, base, store))
            added[-1].kind = "rerank"
            continue
        refusal = "--rerank without a file comes before any --model: give it after the --model it marks"
        _followed(opts, given_models, after, refusal).kind = "rerank"
    return added


def _add_projectors(opts: list[Any], given_models: list[Any], given: list[tuple[int, str]], off: bool) -> None:
    """``--mmproj FILE``: the projector of the ``--model`` it follows
    (``given``: each file with how many ``--model`` came before it); given
    before any ``--model``, of the one model served."""
    from .config import ConfigError

    if given and off:
        raise ConfigError("--mmproj and --no-mmproj contradict each other: give one or the other")
    chosen: set[int] = set()
    for after, path in given:
        if not os.path.isfile(path):
            raise ConfigError(f"--mmproj {path}: no such file")
        refusal = (
            f"--mmproj {path} comes before any --model, and {len(opts)} models are served: "
            "give it after the --model it belongs to"
        )
        target = _followed(opts, given_models, after, refusal)
        if id(target) in chosen:
            raise ConfigError(f"--mmproj {path}: that model has a --mmproj already (one projector a model)")
        chosen.add(id(target))
        target.mmproj = os.path.abspath(path)


class _Refused(Exception):
    """A reason ``serve`` does not start: printed, and the exit status is 2."""


def _serve(args: argparse.Namespace) -> int:
    from .server import bind_socket

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        options = _checked_options(args)
        auth, policy = _guards(args)
        assembly = _assemble(args, options, auth, policy)
    except _Refused as exc:
        return _fail(str(exc))
    if args.config:
        _follow_config(args, assembly, auth)
    _print_models(assembly.registry)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        assembly.close()
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc}")
    port = sock.getsockname()[1]
    _run(args, assembly, sock, lambda: _print_banner(args, port, auth, policy))
    return 0


def _follow_config(args: argparse.Namespace, assembly: Any, auth: Any) -> None:
    """Reload the --config file on SIGHUP, ``POST /v1/admin/config/reload``
    and, with --watch-config, whenever it changes."""
    from .compose import follow_config

    settings = {**server_settings(args), "api_keys": len(auth.api_keys), "admin_keys": len(auth.admin_keys)}
    follow_config(
        assembly,
        args.config,
        lambda: _read_config(args),
        (args.config_loaded, args.model_defaults),
        settings,
        watch=args.watch_config,
    )


def _checked_options(args: argparse.Namespace) -> list[Any]:
    """The models to serve (see :func:`_model_options`), their --cache-dir
    folders checked now, not when the KV is written at the exit."""
    from .config import ConfigError
    from .engine.hostcache import folder_problem
    from .models.loading import GroupOptions
    from .pull.commands import PullFailed
    from .pull.store import StoreError

    if args.watch_config and not args.config:
        raise _Refused("--watch-config needs --config FILE (the file to watch)")
    try:
        options = _model_options(args)
    except (ConfigError, ModelNotFound, PullFailed, StoreError) as exc:
        raise _Refused(str(exc)) from None
    local = [o for g in options for o in ([opts for _, opts in g.replicas] if isinstance(g, GroupOptions) else [g])]
    for folder in {os.path.expanduser(d) for d in (getattr(o, "cache_dir", None) for o in local) if d}:
        problem = folder_problem(folder)  # found now, not when the KV is written at the exit
        if problem is not None:
            raise _Refused(f"--cache-dir {folder}: {problem}")
    return options


def _guards(args: argparse.Namespace) -> tuple[Any, Any]:
    """The API keys and the browser policy (refused: an open bind, a bad key file)."""
    from .access.auth import KeyFileError, OpenBind, check_bind, from_config
    from .access.guard import policy_from

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
        raise _Refused(str(exc)) from None
    return auth, policy


class _LoadDisplay:
    """What the terminal shows while the models load: a progress bar, then
    one summary per model."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def progress_for(self, spec: Any) -> Callable[[float], None]:
        self.started = time.perf_counter()
        return _progress_printer(os.path.basename(spec.path))

    def loaded(self, model: Any) -> None:
        info = model.info()
        took = time.perf_counter() - self.started
        if not model.capabilities.chat:
            what = "reranker" if model.capabilities.rerank else "embeddings only"
            print(
                f"  model {model.model_id}: {info['description']}, {what}, "
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
        if info.get("mmproj"):
            takes = [what for key, what in (("vision", "images"), ("audio", "sound")) if info["modalities"].get(key)]
            print(f"    projector {os.path.basename(info['mmproj'])}: takes {' and '.join(takes)}", file=sys.stderr)


def _assemble(args: argparse.Namespace, options: list[Any], auth: Any, policy: Any) -> Any:
    """The server, its models loaded (see :func:`compose.assemble`)."""
    from .compose import assemble
    from .engine.memory import MemoryRefused
    from .models.registry import RegistryError
    from .pull.store import StoreError
    from .serving.media import MediaPolicy
    from .sinks.otel import otel_wanted

    try:
        media = MediaPolicy.of(args.allow_media_urls or (), args.max_images)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    display = _LoadDisplay()
    responses = _response_store(args)
    try:
        return assemble(
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
            sse_keepalive=args.sse_keepalive,
            model_folders=args.models_dir or None,
            store_dir=(args.models_dir or [cache_dir()])[0],
            responses=responses,
            slot_save_path=args.slot_save_path,
            default_model=args.default_model,
            strict_model_names=bool(args.strict_model_names),
            media=media,
            max_rerank_documents=args.max_rerank_documents,
            remote_key_envs=args.remote_key_env,
            model_defaults=args.model_defaults,
            progress_for=display.progress_for,
            on_loaded=display.loaded,
        )
    except ImportError as exc:
        raise _Refused(f"tracing needs the otel extra (pip install 'turbospark[otel]'): {exc}") from None
    except OSError as exc:
        if args.event_log and getattr(exc, "filename", None) == args.event_log:
            raise _Refused(f"cannot open the event log {args.event_log}: {exc.strerror or exc}") from None
        raise _Refused(str(exc)) from None
    except (RegistryError, RuntimeError, ValueError, MemoryRefused, StoreError) as exc:
        raise _Refused(str(exc)) from None


def _response_store(args: argparse.Namespace) -> Any:
    """The response store (``--store on``, the default), opened now: a file
    that cannot be used is a refusal naming it."""
    from .state.db import StateError
    from .state.responses import ResponseStore, default_dir

    if args.store == "off":
        return None
    try:
        return ResponseStore(args.state_dir or default_dir(), ttl=args.store_ttl)
    except StateError as exc:
        raise _Refused(f"{exc} (--state-dir, or --store off)") from None


def _print_models(registry: Any) -> None:
    """The models the load summaries did not show: groups, remote ones, and
    those loaded on first use."""
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


def _print_banner(args: argparse.Namespace, port: int, auth: Any, policy: Any) -> None:
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"turbospark {__version__} listening on http://{host}:{port}", file=sys.stderr)
    address = f"http://{host}:{port}"
    print(f"  web page: {address}/   console: turbospark console --url {address}", file=sys.stderr)
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


def _run(args: argparse.Namespace, assembly: Any, sock: Any, started: Callable[[], None]) -> None:
    """Serve until a signal, then drain and close everything; ``started``
    (the banner) once connections are taken and a signal drains."""
    from .server import LiveUvicorn, uvicorn_config

    server = LiveUvicorn(
        uvicorn_config(
            assembly.app, send_timeout=args.send_timeout, body_timeout=args.body_timeout, drain=assembly.drain
        ),
        assembly.live,
        assembly.registry,
        assembly.drain,
        args.drain_timeout,
        config_file=assembly.state.config,
        on_started=started,
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


def _traces_label(args: argparse.Namespace) -> str:
    from .sinks.otel import otel_wanted

    if not otel_wanted(args.otlp_endpoint):
        return "off"
    return "OTLP " + (args.otlp_endpoint or "(OTEL_* environment)")


def _console(args: argparse.Namespace) -> int:
    from .views.console import run

    return run(args.url, args.api_key or os.environ.get("TURBOSPARK_API_KEY"))


def _report(args: argparse.Namespace) -> int:
    from .views.report import report

    if not os.path.isfile(args.events):
        return _fail(f"no such event log: {args.events}")
    return report(args.events, args.out, sys.stdout)


def _models(args: argparse.Namespace) -> int:
    """The store and the catalog, without loading any model."""
    from .pull.commands import models

    return models(args.models_dir)


def _pull(args: argparse.Namespace) -> int:
    from .pull.commands import pull

    return pull(args.reference, args.models_dir)


def _remove(args: argparse.Namespace) -> int:
    from .pull.commands import remove

    return remove(args.name, args.models_dir)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turbospark", description="Local LLM server on llama.cpp.")
    p.add_argument("--version", action="version", version=f"turbospark {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    commands: tuple[tuple[str, str, tuple[Option, ...], Callable[[argparse.Namespace], int]], ...] = (
        ("serve", "serve models over HTTP", SERVE, _serve),
        ("pull", "download a model into the store (Hugging Face, Ollama's registry, a URL, a package)", PULL, _pull),
        ("models", "list the pulled models and the packaged ones", MODELS, _models),
        ("rm", "remove a pulled model from the store", REMOVE, _remove),
        ("console", "live terminal view of a server's events", CONSOLE, _console),
        ("report", "summary and PNG plots of an --event-log file", REPORT, _report),
    )
    for name, help, options, func in commands:
        s = sub.add_parser(name, help=help)
        add_options(s, options)
        s.set_defaults(func=func)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
