"""The options of the ``turbospark`` command, declared once: a table of
:class:`Option` rows from which the argparse parser, the config file's
``[server]`` merge and the model options a flag sets are all derived, so a
new option is one row.

A ``serve`` option is one of: a model option (``model``: the
:class:`~turbospark.engine.model.ModelOptions` field it sets on every local
model and on the defaults of one attached later; ``[defaults]`` and the
model sections give it in the file), a server setting (``server``: the
``[server]`` key that gives it when the flag is not, then ``fallback``; a
repeatable flag adds to the file's list), or neither (the models to serve,
``--verbose``; ``--mmproj`` and ``--rerank``, which belong to the ``--model``
they follow).
Every ``serve`` flag defaults to None ("not given"), so the file's value is
kept unless the flag says otherwise.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .models.watchdog import STALL_TIMEOUT
from .serving.drain import DEFAULT_DRAIN_SECONDS

DEFAULT_PARALLEL = 4
ON_OFF = ("on", "off")


def size(text: str) -> int:
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


def duration(text: str) -> float:
    """``30d``, ``12h``, ``15m``, ``90s`` or plain seconds (at least one second)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        n = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30d, 12h, 3600)") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least one second")
    return n


def seed(text: str) -> int | None:
    """llama-server's ``--seed``: 0 … 2³²−2, or -1 (its 2³²−1 too) for a random seed."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a seed: {text!r} (a whole number; -1: random)") from None
    if n in (-1, 0xFFFFFFFF):
        return None
    if not 0 <= n < 0xFFFFFFFF:
        raise argparse.ArgumentTypeError("a seed is 0 … 4294967294 (-1: random)")
    return n


def idle_seconds(text: str) -> float | None:
    """Seconds idle before a model is unloaded; a negative number (-1) never."""
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r} (-1: never)") from None
    return None if n < 0 else n


def tags(text: str) -> tuple[str, ...]:
    """``chat,fim,small``: each tag, stripped (empty ones dropped)."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _send_timeout() -> float:
    from .web.middleware import SEND_TIMEOUT  # (lazily: the command starts without the server's modules)

    return SEND_TIMEOUT


def _body_timeout() -> float:
    from .web.middleware import BODY_TIMEOUT

    return BODY_TIMEOUT


class AfterModel(argparse.Action):
    """A per-model flag (``--mmproj FILE``): each value kept with how many
    ``--model`` flags came before it, so it belongs to the ``--model`` it
    follows (0: none came before; then it is the one model's served)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        given = [*(getattr(namespace, self.dest, None) or []), (len(getattr(namespace, "model", None) or []), values)]
        setattr(namespace, self.dest, given)


ActionClass = type[argparse.Action]


@dataclass(frozen=True)
class Option:
    """One command-line option (argparse's arguments), and where its value
    goes besides the parsed arguments."""

    flags: tuple[str, ...]
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    #: ``append`` (repeatable), ``store_true`` or an argparse action (:class:`AfterModel`); None: one value
    action: str | ActionClass | None = None
    #: argparse's ``nargs`` (``?``: the value may be left out)
    nargs: str | None = None
    #: argparse's default (a ``serve`` option has none: None is "not given")
    default: Any = None
    #: the model option it sets
    model: str | None = None
    #: the model's sampling default it sets (a key of ``ModelOptions.sampling``)
    sampling: str | None = None
    #: for a choice that sets a boolean model option: the choice meaning True
    true_choice: str | None = None
    #: a ``store_true`` flag that turns its model option off (sets it to None)
    clears: bool = False
    #: the model option's value when neither the flag nor the file gives one
    model_default: Any = None
    #: the ``[server]`` key that gives it when the flag is not given
    server: str | None = None
    #: its value when neither the flag nor the file gives one (a function:
    #: called then)
    fallback: Any = None

    @property
    def dest(self) -> str:
        return self.flags[0].lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        given = {
            "action": self.action,
            "nargs": self.nargs,
            "type": self.type,
            "choices": self.choices,
            "default": self.default,
            "metavar": self.metavar,
            "help": self.help,
        }
        kwargs = {k: v for k, v in given.items() if v is not None}
        if self.server is not None:  # (a store_true flag too: None is "not given", the file decides)
            kwargs["default"] = self.default
        parser.add_argument(*self.flags, **kwargs)


def _model(flag: str, help: str, **kw: Any) -> Option:
    """A flag that sets the model option of its own name."""
    return Option((flag,), help, model=flag.removeprefix("--").replace("-", "_"), **kw)


def _server(flag: str, help: str, key: str | None = None, **kw: Any) -> Option:
    """A flag the ``[server]`` key ``key`` (default: its own name) gives too."""
    return Option((flag,), help, server=key or flag.removeprefix("--").replace("-", "_"), **kw)


SERVE: tuple[Option, ...] = (
    Option(
        ("--model", "-m"),
        "GGUF path, packaged model name, or a model to pull first: org/repo:QUANT, ollama:name[:tag] (repeatable)",
        action="append",
    ),
    Option(
        ("--mmproj",),
        "a multimodal projector GGUF (images, sound) for the --model it follows (given before any --model: "
        "for the one model served); a pulled model brings its own",
        action=AfterModel,
        metavar="FILE",
    ),
    Option(
        ("--no-mmproj",),
        "load no projector: pulled models' own, --mmproj and the config file's are left off (text only)",
        action="store_true",
        model="mmproj",
        clears=True,
    ),
    Option(
        ("--rerank",),
        "a reranker (/v1/rerank, /v2/rerank) served beside the --model ones: a GGUF path or a model to pull "
        "(repeatable); without FILE, the --model it follows is one (a GGUF whose pooling is rank is one anyway)",
        action=AfterModel,
        nargs="?",
        metavar="FILE",
    ),
    Option(("--config",), "turbospark.toml with server settings and models", metavar="FILE"),
    _server(
        "--strict-model-names",
        "answer 404 to a model name no model answers to (default: the default model serves it: the "
        "first --model, a config section's default = true, else its first section)",
        action="store_true",
        fallback=False,
    ),
    Option(("--alias",), "another name a model answers to (repeatable)", action="append", metavar="[MODEL_ID=]NAME"),
    Option(
        ("--seed", "-s"),
        "the seed of requests that set none (llama-server's), so a streamed and a whole answer agree "
        "(default -1: a random one each)",
        type=seed,
        sampling="seed",
        metavar="N",
    ),
    _server("--host", "address to listen on (default 127.0.0.1)", fallback="127.0.0.1"),
    _server("--port", "port (default 8080; 0 = any free port)", type=int, fallback=8080),
    _model("--ctx", "context per request in tokens (default 4096; 0 = the model's)", type=int, model_default=4096),
    _model("--threads", "CPU threads (default: all cores)", type=int),
    _model(
        "--parallel",
        f"sequences decoded together in one batch (default {DEFAULT_PARALLEL})",
        type=int,
        model_default=DEFAULT_PARALLEL,
    ),
    _model("--session-slots", "conversations whose KV stays resident (>= parallel; default = parallel)", type=int),
    _model("--prefix-reuse", "reuse KV prefixes (default on)", choices=ON_OFF, true_choice="on"),
    _model(
        "--speculative",
        "prompt-lookup speculative decoding, exact (default ngram)",
        choices=("ngram", "off"),
        true_choice="ngram",
    ),
    _model(
        "--draft-max",
        "most tokens drafted per step (default 16; fewer are verified when this machine's step costs say so)",
        type=int,
    ),
    _model("--max-queue", "most requests waiting for a sequence (0 = unbounded); full -> 503", type=int),
    _model(
        "--cache-type",
        "KV cache element type: f16 (default, exact) or quantised q8_0 / q4_0 (less memory, "
        "slightly different logits; see the README for the figures)",
        choices=("f16", "q8_0", "q4_0"),
    ),
    _model(
        "--cache-dir",
        "keep the host-memory KV tier in DIR across restarts (written at shutdown, read at load), "
        "so returning conversations and shared system prompts start warm",
        metavar="DIR",
    ),
    _model(
        "--flash-attn",
        "flash attention (default auto: on where the backend has it for the model)",
        choices=("auto", "on", "off"),
    ),
    _model(
        "--batch", "tokens per llama_decode call (n_batch = n_ubatch; default 512, tuned by bench/prefill.py)", type=int
    ),
    _model(
        "--prefill-chunk",
        "most prompt tokens one request feeds per step while others decode, so they never wait long "
        "(default 256; with nobody decoding, prompts share the whole --batch)",
        type=int,
    ),
    _model(
        "--cache-ram",
        "host memory for the KV of conversations evicted from their slots, restored when they "
        "return (default: a quarter of the available memory, at most 4096; 0 = off)",
        type=int,
        metavar="MIB",
    ),
    Option(
        ("--keep-alive", "--sleep-idle-seconds"),
        "unload a model after this long idle (llama-server's sleep: /props says is_sleeping, and /health, "
        "/props, /models and /metrics leave it asleep); it reloads on the next request (-1: never, the default)",
        type=idle_seconds,
        model="keep_alive",
        metavar="SECONDS",
    ),
    Option(
        ("--tags",),
        "tags the model lists carry (llama-server's; informational, comma-separated)",
        type=tags,
        model="tags",
        metavar="TAG,...",
    ),
    _server(
        "--max-resident",
        "most models in memory at once; least recently used is unloaded (0 = no cap)",
        type=int,
        fallback=0,
    ),
    _server(
        "--slot-save-path",
        "folder where POST /slots/{id}?action=save|restore keeps slot files (llama-server's; default: refused)",
        metavar="DIR",
    ),
    _server("--api-key", "require this API key (repeatable; or TURBOSPARK_API_KEY)", "api_keys", action="append"),
    _server(
        "--admin-key", "a separate key for /v1/admin routes (or TURBOSPARK_ADMIN_KEY)", "admin_keys", action="append"
    ),
    _server(
        "--api-key-file",
        "read API keys from FILE, one a line (keeps them out of the process list)",
        action="append",
        metavar="FILE",
    ),
    _server(
        "--allowed-host",
        "a Host name to answer besides loopback names and the bound address "
        "(repeatable; '*' = any; guards against DNS rebinding)",
        "allowed_hosts",
        action="append",
        metavar="NAME",
    ),
    _server(
        "--cors-origin",
        "a web origin whose pages may call the API, e.g. http://localhost:3000 "
        "(repeatable; '*' = any; default: only the server's own pages)",
        "cors_origins",
        action="append",
        metavar="ORIGIN",
    ),
    _server(
        "--max-body",
        "largest request body, e.g. 32M (default 32 MiB); larger ones get 413",
        type=size,
        metavar="BYTES",
    ),
    _server(
        "--allow-media-urls",
        "fetch the images a request names by an http(s) URL, from these hosts only (comma-separated or "
        "repeated: images.example.com, *.example.com, host:port, '*' = any public host); never from "
        "loopback or private addresses, except an IP address named here (default: no URL is fetched: a 400)",
        "allow_media_urls",
        action="append",
        metavar="HOST[,HOST...]",
    ),
    _server(
        "--max-images",
        "the most images and sounds one request may carry (default 16); more are a 400",
        type=int,
        metavar="N",
        fallback=16,
    ),
    _server(
        "--max-rerank-documents",
        "the most documents one rerank request may carry (default 1000); more are a 400",
        type=int,
        metavar="N",
        fallback=1000,
    ),
    _server(
        "--models-dir",
        "the model store pulled models land in (the first one; default: the user cache's "
        "turbospark/models); admin attach may load GGUF files from any (repeatable; default: the "
        "store and the folders of the models given at start)",
        "models_dirs",
        action="append",
        metavar="DIR",
    ),
    _server(
        "--remote-key-env",
        "an environment variable an attach body may name in api_key_env (repeatable; besides "
        "those the configured remote models name): the key in it is sent to the body's base_url",
        "remote_key_envs",
        action="append",
        metavar="NAME",
    ),
    _server(
        "--guardrails",
        "validate tool calls against their schemas and re-ask once (default on)",
        choices=ON_OFF,
        fallback="on",
    ),
    _server(
        "--normalize-client-stamps",
        "take known per-session client stamps (Claude Code's attribution header) out of prompts, "
        "so they do not end prefix reuse (default on)",
        choices=ON_OFF,
        fallback="on",
    ),
    _server("--event-log", "append every event to FILE as JSON lines", metavar="FILE"),
    _server(
        "--state-dir",
        "where stored responses and conversations are kept (responses.sqlite3; default: the user's "
        "state folder, ~/.local/state/turbospark)",
        metavar="DIR",
    ),
    _server(
        "--store",
        "keep Responses API responses and conversations (previous_response_id, background, GET "
        "/v1/responses/{id}); off keeps nothing (default on)",
        choices=ON_OFF,
        fallback="on",
    ),
    _server(
        "--store-ttl",
        "how long a stored response or conversation is kept, e.g. 30d, 12h or seconds (default 30d)",
        type=duration,
        metavar="DURATION",
        fallback=30 * 86400.0,
    ),
    _server(
        "--event-log-max-bytes",
        "rotate the event log past this size, e.g. 100M (one rotated file, FILE.1, is kept)",
        type=size,
        metavar="BYTES",
    ),
    _server(
        "--send-timeout",
        "drop a client that reads nothing of its response for this long, cancelling its generation (default 60)",
        type=float,
        metavar="SECONDS",
        fallback=_send_timeout,
    ),
    _server(
        "--body-timeout",
        "answer 408 when a request body stops arriving for this long (default 30)",
        type=float,
        metavar="SECONDS",
        fallback=_body_timeout,
    ),
    _server(
        "--sse-keepalive",
        "send a stream's keep-alive (Anthropic's ping, an SSE comment line elsewhere) after this long "
        "with nothing to send, e.g. while a long prompt prefills (default 15; 0: never)",
        type=float,
        metavar="SECONDS",
        fallback=15.0,
    ),
    _server(
        "--stall-timeout",
        "flag a model whose engine makes no step for this long while requests wait: /health "
        "answers 503 degraded, a modelHealth event and a log line (default 60)",
        type=float,
        metavar="SECONDS",
        fallback=STALL_TIMEOUT,
    ),
    _server(
        "--drain-timeout",
        "on SIGTERM/SIGINT, how long requests in flight may finish before they are ended "
        "with an error (default 30; new requests get 503 meanwhile; a second signal exits at once)",
        type=float,
        metavar="SECONDS",
        fallback=DEFAULT_DRAIN_SECONDS,
    ),
    _server(
        "--metrics-auth",
        "GET /metrics needs the API key when keys are set (default on)",
        choices=ON_OFF,
        fallback="on",
    ),
    _server(
        "--otlp-endpoint",
        "export one OpenTelemetry span per request over OTLP/HTTP to URL "
        "(or set OTEL_EXPORTER_OTLP_ENDPOINT; needs turbospark[otel])",
        metavar="URL",
    ),
    Option(
        ("--watch-config",),
        "re-read the --config file whenever it changes (checked every second), as SIGHUP and "
        "POST /v1/admin/config/reload do: models added, removed and reloaded, requests in flight kept",
        action="store_true",
    ),
    Option(("--verbose", "-v"), action="store_true"),
)

CONSOLE: tuple[Option, ...] = (
    Option(("--url",), "the server (default http://127.0.0.1:8080)", default="http://127.0.0.1:8080"),
    Option(("--api-key",), "its API key (or TURBOSPARK_API_KEY)"),
)

_STORE = Option(
    ("--models-dir",),
    "the model store (default: the user cache's turbospark/models)",
    action="append",
    metavar="DIR",
)
PULL: tuple[Option, ...] = (
    Option(("reference",), "org/repo[:QUANT], hf.co/org/repo:QUANT, org/repo/file.gguf, ollama:name[:tag], "
           "a packaged name or an https URL of a .gguf file", metavar="MODEL"),
    _STORE,
)  # fmt: skip
MODELS: tuple[Option, ...] = (_STORE,)
REMOVE: tuple[Option, ...] = (Option(("name",), "a pulled model's name (see turbospark models)"), _STORE)

REPORT: tuple[Option, ...] = (
    Option(("events",), "a file written by serve --event-log", metavar="EVENTS.jsonl"),
    Option(
        ("--out",), "where the PNG plots go (default ./turbospark-report)", default="turbospark-report", metavar="DIR"
    ),
)


def add_options(parser: argparse.ArgumentParser, options: Iterable[Option]) -> None:
    for option in options:
        option.add_to(parser)


def model_defaults() -> dict[str, Any]:
    """The model options the command line sets when neither a flag nor the
    file does (the file's ``[defaults]`` go over them)."""
    return {o.model: o.model_default for o in SERVE if o.model is not None and o.model_default is not None}


def model_values(args: argparse.Namespace) -> dict[str, Any]:
    """The model options the flags given set (a choice meaning on or off as
    a boolean)."""
    out: dict[str, Any] = {}
    for o in SERVE:
        value = getattr(args, o.dest)
        if o.clears:
            if value:
                out[str(o.model)] = None
        elif o.model is not None and value is not None:
            out[o.model] = value == o.true_choice if o.true_choice is not None else value
        elif o.sampling is not None and value is not None:
            out.setdefault("sampling", {})[o.sampling] = value
    return out


def with_values(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Model options ``base`` with the flags' ``given`` over them (the
    sampling defaults merged key by key)."""
    out = {**base, **given}
    if "sampling" in given:
        out["sampling"] = {**(base.get("sampling") or {}), **given["sampling"]}
    return out


def apply_values(options: Any, given: dict[str, Any]) -> None:
    """Set the flags' model options on a model's options (its sampling
    defaults merged key by key)."""
    for attr, value in given.items():
        if attr == "sampling":
            value = {**options.sampling, **value}
        setattr(options, attr, value)


def merge_server(args: argparse.Namespace, server: dict[str, Any]) -> None:
    """The server settings of the flags not given, from the file's
    ``[server]`` section or else the fallbacks (a boolean in the file is
    ``on``/``off``); a repeatable flag's values go before the file's."""
    for o in SERVE:
        if o.server is None:
            continue
        given = getattr(args, o.dest)
        if o.action == "append":
            more = server.get(o.server, [])
            setattr(args, o.dest, list(given or []) + (list(more) if isinstance(more, list) else [more]))
        elif given is None:
            value = server[o.server] if o.server in server else o.fallback
            if callable(value):
                value = value()
            if o.choices == ON_OFF and isinstance(value, bool):
                value = "on" if value else "off"
            setattr(args, o.dest, value)


#: server settings that are secrets: shown only as how many there are
SECRET_SETTINGS = ("api_keys", "admin_keys")


def server_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The server settings in force once :func:`merge_server` has run, by
    their ``[server]`` key (``GET /v1/admin/config``): never a key, only how
    many are given."""
    out: dict[str, Any] = {}
    for o in SERVE:
        if o.server is not None:
            value = getattr(args, o.dest)
            out[o.server] = len(value or []) if o.server in SECRET_SETTINGS else value
    return out
