"""``turbospark serve | models``."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from typing import Any

from . import __version__
from .catalog import CATALOG, DEFAULT_MODEL, ModelNotFound, resolve_model


def _progress_printer(label: str):
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


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import build_app
    from .engine.model import LlamaChatModel, ModelOptions
    from .observe import combine
    from .registry import Registry, RegistryError
    from .sinks.jsonl import JsonlSink

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    specs = args.model or [DEFAULT_MODEL]
    resolved: list[tuple[str, str | None]] = []
    try:
        for spec in specs:
            resolved.append(resolve_model(spec))
    except ModelNotFound as exc:
        print(f"turbospark: {exc}", file=sys.stderr)
        return 2

    sinks: list[Any] = []
    if args.event_log:
        sinks.append(JsonlSink(args.event_log))
    observer = combine(sinks)
    registry = Registry(observer)
    models: list[Any] = []
    try:
        for path, default_id in resolved:
            opts = ModelOptions(
                path=path,
                id=default_id,
                ctx=args.ctx,
                threads=args.threads,
                parallel=args.parallel,
                session_slots=args.session_slots,
                prefix_reuse=args.prefix_reuse == "on",
            )
            t0 = time.perf_counter()
            model = LlamaChatModel(opts, _progress_printer(os.path.basename(path)))
            models.append(model)
            registry.attach(model)
            info = model.info()
            print(
                f"  model {model.model_id}: {info['description']}, context {model.max_context}, "
                f"{info['parallel']} parallel / {info['session_slots']} slots, "
                f"threads {model.ctx.threads}, loaded in {time.perf_counter() - t0:.1f}s",
                file=sys.stderr,
            )
    except (RegistryError, RuntimeError, FileNotFoundError, ValueError) as exc:
        print(f"turbospark: {exc}", file=sys.stderr)
        for m in models:
            m.close()
        return 2

    app = build_app(registry, observer)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"turbospark: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"turbospark {__version__} listening on http://{host}:{sock.getsockname()[1]}", file=sys.stderr)
    print("  OpenAI: /v1/chat/completions   events: " + (args.event_log or "(no --event-log)"), file=sys.stderr)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # pragma: no cover - uvicorn normally handles it
        pass
    finally:
        print("turbospark: shutting down", file=sys.stderr)
        for m in models:
            m.close()
        for s in sinks:
            s.close()
    return 0


def _models(args: argparse.Namespace) -> int:
    for name, entry in sorted(CATALOG.items()):
        path = entry.locate()
        state = "installed" if path else "not installed"
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"{name:<22} {state:<14} {entry.description}{default}")
        if not path:
            print(f"{'':<22} get it with: {entry.pip}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turbospark", description="Local LLM server on llama.cpp.")
    p.add_argument("--version", action="version", version=f"turbospark {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve models over HTTP")
    s.add_argument("--model", "-m", action="append", help="GGUF path or packaged model name (repeatable)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--ctx", type=int, default=4096, help="context length in tokens (0 = the model's)")
    s.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    s.add_argument("--parallel", type=int, default=1, help="sequences decoded together")
    s.add_argument("--session-slots", type=int, default=0, help="conversations kept resident (>= parallel)")
    s.add_argument("--prefix-reuse", choices=["on", "off"], default="on")
    s.add_argument("--event-log", metavar="FILE", help="append every event to FILE as JSON lines")
    s.add_argument("--verbose", "-v", action="store_true")
    s.set_defaults(func=_serve)

    m = sub.add_parser("models", help="list the packaged models and whether they are installed")
    m.set_defaults(func=_models)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
