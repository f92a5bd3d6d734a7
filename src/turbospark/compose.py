"""The one composition root: ``turbospark serve`` (``cli._serve``) and the
embedding :class:`~turbospark.server.Server` both build a server here, so the
parts are made, wired and closed the same way; and a server started with a
config file follows it here (:class:`ConfigReloader`: SIGHUP,
``--watch-config`` and ``POST /v1/admin/config/reload`` re-read it and
apply the difference).

Order matters in one place: the sinks exist before the registry, so they see
every model attach; the app is built last, over what is already made, and
creates nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette

from . import __version__
from .access.auth import Auth
from .access.guard import BrowserPolicy
from .config import Config
from .models.loading import ModelArg, default_model_folders, load_spec, populate
from .models.presets import Presets, ReloadResult, preset_id
from .models.registry import STALL_TIMEOUT, ModelSpec, Registry, RegistryError
from .observe import Observer, combine
from .pull.puller import Puller
from .pull.specs import on_demand
from .pull.store import Store
from .serving.drain import Drain
from .serving.media import MediaPolicy
from .serving.state import DEFAULT_MAX_RERANK_DOCUMENTS, ServerState
from .sinks.live import LiveEvents
from .sinks.prometheus import PrometheusSink
from .state.responses import ResponseStore
from .web.app import build_app

log = logging.getLogger("turbospark.server")


@dataclass
class Assembly:
    """A built server: what the HTTP layer serves and what :meth:`close`
    releases."""

    registry: Registry
    observer: Observer | None
    metrics: PrometheusSink
    live: LiveEvents
    app: Starlette
    #: requests in flight; a graceful shutdown runs it (``server.LiveUvicorn``)
    drain: Drain
    #: what the handlers share (``app.state.turbospark``)
    state: ServerState
    #: sinks this assembly opened (event log, OpenTelemetry): closed by it
    sinks: list[Any] = field(default_factory=list)
    #: models this assembly loaded (a model object passed in stays the caller's)
    owned: list[Any] = field(default_factory=list)
    #: the model store's puller (``store_dir``), closed with it
    puller: Puller | None = None

    def close(self) -> None:
        """Close the models it loaded, at start or on demand since, then the
        sinks it opened (the event log is flushed last)."""
        _close_models(self.registry, {id(m) for m in self.owned})
        self.owned.clear()
        _close_sinks(self.sinks)
        self.sinks.clear()
        if self.puller is not None:
            self.puller.close()
            self.puller = None
        if self.state.responses is not None:
            self.state.responses.close()
            self.state.responses = None


def assemble(
    models: Iterable[ModelArg],
    *,
    auth: Auth,
    policy: BrowserPolicy,
    observers: Iterable[Observer | None] = (),
    event_log: str | None = None,
    event_log_max_bytes: int | None = None,
    tracing: bool = False,
    otlp_endpoint: str | None = None,
    max_resident: int = 0,
    stall_timeout: float = STALL_TIMEOUT,
    guardrails: bool = True,
    normalize_client_stamps: bool = True,
    sse_keepalive: float = 15.0,
    model_folders: Sequence[str] | None = None,
    remote_key_envs: Sequence[str] = (),
    model_defaults: dict[str, Any] | None = None,
    progress_for: Callable[[ModelSpec], Callable[[float], None] | None] | None = None,
    on_loaded: Callable[[Any], None] | None = None,
    store_dir: str | None = None,
    responses: ResponseStore | None = None,
    slot_save_path: str | None = None,
    default_model: str | None = None,
    strict_model_names: bool = False,
    media: MediaPolicy | None = None,
    max_rerank_documents: int | None = None,
) -> Assembly:
    """Open the sinks, register (and load) the models, build the app. Raises what
    loading raises (a bad model, no memory, a name clash; an event log that cannot be
    opened: ``OSError``; tracing without its extra: ``ImportError``; a model store that
    cannot be opened: ``StoreError``) after closing whatever it had opened (``responses``,
    the response store it is given and then owns, included). ``store_dir``: where pulled
    models live (None: none pulled). ``default_model``: the id of the model serving a name
    no model answers to (None: the first of ``models``; ``strict_model_names``: a 404).
    ``media``: media URLs and per request (``serving.media``); ``max_rerank_documents``."""
    try:
        sinks = _open_sinks(tracing, otlp_endpoint, event_log, event_log_max_bytes)
    except BaseException:
        _abandon(None, [], None, responses)
        raise
    metrics = PrometheusSink()  # /metrics: always on
    for sink in sinks:
        if hasattr(sink, "dropped"):  # the event log's own losses
            metrics.watch_event_log(sink)
    live = LiveEvents()  # /v1/events, /v1/stats, /dashboard: always on
    observer = combine([*observers, metrics, *sinks, live])
    registry = Registry(observer, loader=load_spec, max_resident=max_resident, stall_timeout=stall_timeout)
    registry.default, registry.strict_names = default_model, strict_model_names
    puller = None
    try:
        if store_dir is not None:
            puller = Puller(Store(store_dir), observer)
            registry.on_demand = on_demand(puller.store, model_defaults)
        owned = populate(registry, models, model_defaults, progress_for, on_loaded)
    except BaseException:
        _abandon(registry, sinks, puller, responses)
        raise
    metrics.watch(registry)
    state = ServerState(
        registry=registry,
        observer=observer,
        version=__version__,
        metrics=metrics,
        live=live,
        guardrails=guardrails,
        normalize_client_stamps=normalize_client_stamps,
        sse_keepalive=sse_keepalive,
        model_folders=tuple(model_folders) if model_folders is not None else default_model_folders(registry),
        remote_key_envs=tuple(remote_key_envs),
        model_defaults=dict(model_defaults or {}),
        puller=puller,
        responses=responses,
        slot_save_path=os.path.abspath(os.path.expanduser(slot_save_path)) if slot_save_path else None,
        media=media or MediaPolicy(),
        max_rerank_documents=max_rerank_documents or DEFAULT_MAX_RERANK_DOCUMENTS,
    )
    state.drain.on_cut(registry.stop_waiting)  # loads waiting for room end at the deadline
    app = build_app(state, auth, policy)
    return Assembly(registry, observer, metrics, live, app, state.drain, state, sinks, owned, puller)


def _open_sinks(
    tracing: bool, otlp_endpoint: str | None, event_log: str | None, event_log_max_bytes: int | None
) -> list[Any]:
    """The sinks that need opening: OpenTelemetry, the event log."""
    sinks: list[Any] = []
    try:
        if tracing:  # to ``otlp_endpoint``, else where the OTEL_* variables say
            from .sinks.otel import OtelSink

            sinks.append(OtelSink(endpoint=otlp_endpoint))
        if event_log:
            from .sinks.jsonl import JsonlSink

            sinks.append(JsonlSink(event_log, max_bytes=event_log_max_bytes))
    except BaseException:
        _close_sinks(sinks)
        raise
    return sinks


def _abandon(
    registry: Registry | None, sinks: list[Any], puller: Puller | None, responses: ResponseStore | None
) -> None:
    """Close what an assembly that failed had opened (or was given to own)."""
    if registry is not None:
        _close_models(registry, set())
    _close_sinks(sinks)
    if puller is not None:
        puller.close()
    if responses is not None:
        responses.close()


def _close_models(registry: Registry, owned: set[int]) -> None:
    """Close the models the registry loaded from a spec (at start or on
    demand) and those in ``owned`` (ids); a model object a caller passed in
    stays open."""
    for entry in registry.entries():
        # (attached remotes hold connections: always closed)
        remote = entry.model is not None and not entry.model.capabilities.resident
        if entry.model is not None and (entry.spec is not None or id(entry.model) in owned or remote):
            try:
                entry.model.close()
            except Exception:  # pragma: no cover - shutting down goes on
                log.exception("closing model %s failed", entry.id)
            entry.model = None


def _close_sinks(sinks: list[Any]) -> None:
    for sink in sinks:
        close = getattr(sink, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception:  # pragma: no cover - shutting down goes on
            log.exception("closing sink %r failed", sink)


#: how often ``--watch-config`` looks at the file, and how long a change
#: must hold before it is read (seconds)
WATCH_SECONDS = 1.0
SETTLE_SECONDS = 0.25

#: a reading of the config file: the file (its models with the command
#: line's flags applied) and the options a model attached later starts from
Reading = tuple[Config, dict[str, Any]]


class ConfigReloader:
    """The config file behind a running server: read again on SIGHUP
    (:meth:`hangup`), ``POST /v1/admin/config/reload`` and, with
    ``--watch-config``, when its modification time or size changes; each
    reading is applied as a difference (:class:`~turbospark.models.presets.Presets`).
    An invalid file changes nothing: its error is logged, returned and
    shown by ``GET /v1/admin/config``. ``[server]`` settings apply at a
    restart only: a change to one is reported, not applied."""

    def __init__(
        self,
        path: str,
        read: Callable[[], Reading],
        state: ServerState,
        first: Reading,
        settings: dict[str, Any],
        watch: bool = False,
    ) -> None:
        self.path, self.read, self.state, self.settings, self.watch = path, read, state, settings, watch
        self.config, _ = first
        self.presets = Presets(state.registry, self.config.models)
        #: the server settings the file gave at start (a change is reported)
        self.started_with = dict(self.config.server)
        self.loaded_at = time.time()
        self.last: ReloadResult | None = None
        self._stamp = _stamp(path)
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- triggers ----------------------------------------------------------------
    def start(self) -> None:
        """With the event loop (call on it): the watch begins, and SIGHUP may come."""
        self._loop = asyncio.get_running_loop()
        if self.watch:
            self._spawn(self._watch())

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def hangup(self) -> None:
        """SIGHUP (from the signal handler, any thread): reload on the loop."""
        if self._loop is None:
            log.warning("SIGHUP before the server started: the config file is not re-read")
            return
        self._loop.call_soon_threadsafe(lambda: self._spawn(self.reload("SIGHUP")))

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            stamp = _stamp(self.path)
            if stamp is None or stamp == self._stamp:
                continue
            await asyncio.sleep(SETTLE_SECONDS)  # (an editor may be writing it still)
            if _stamp(self.path) == stamp:
                await self.reload("watch")

    # -- the reload --------------------------------------------------------------
    async def reload(self, trigger: str) -> ReloadResult:
        """Read the file and apply it; one reload at a time."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self._stamp = _stamp(self.path)
            result = ReloadResult(trigger)
            try:
                config, defaults = await asyncio.to_thread(self.read)
                await self.presets.apply(config.models, result)
            except (ValueError, OSError) as exc:  # ConfigError, RegistryError: nothing was applied
                result.error = f"{self.path}: {exc}" if isinstance(exc, RegistryError) else str(exc)
                log.error("config reload (%s) refused, the models in force are kept: %s", trigger, result.error)
            else:
                self.config, self.loaded_at = config, result.at
                _follow_default(self.state.registry, config)
                self.state.model_defaults = defaults
                server = config.server
                keys = set(server) | set(self.started_with)
                result.restart_needed = sorted(k for k in keys if server.get(k) != self.started_with.get(k))
                _log_reload(result)
            self.last = result
            return result

    def describe(self) -> dict[str, Any]:
        """What is in force (``GET /v1/admin/config``): no secret in it."""
        registry = self.state.registry
        ours = self.presets.in_force()
        models = []
        for model_id, section in self.config.presets().items():
            entry = self.presets.entry(model_id)
            state = entry.state if entry is not None else "not served"
            if self.last is not None and model_id in self.last.failed:
                state = f"{state} (the last reload failed to load it: {self.last.failed[model_id]})"
            models.append({"id": model_id, "state": state, "preset": section})
        return {
            "file": self.path,
            "loaded_at": round(self.loaded_at, 3),
            "watch": self.watch,
            "last_reload": self.last.to_json() if self.last is not None else None,
            "server": self.settings,
            "defaults": dict(self.config.defaults),
            "models": models,
            # (given on the command line or attached through the admin API: a reload leaves them)
            "other_models": [e.id for e in registry.entries() if e.member_of is None and e.id not in ours],
        }


def follow_config(
    assembly: Assembly,
    path: str,
    read: Callable[[], Reading],
    first: Reading,
    settings: dict[str, Any],
    watch: bool = False,
) -> ConfigReloader:
    """Make ``path`` the assembled server's config file (the models it gave
    are ``first``'s): reloadable from then on."""
    reloader = ConfigReloader(path, read, assembly.state, first, settings, watch)
    assembly.state.config = reloader
    return reloader


def _follow_default(registry: Registry, config: Config) -> None:
    """A reloaded file's default model: the section that says ``default =
    true``; else the one in force stays, unless it is gone (then the first
    section)."""
    if config.default is not None:
        registry.default = config.default
    elif (registry.default is None or registry.lookup(registry.default) is None) and config.models:
        registry.default = preset_id(config.models[0])


def _stamp(path: str) -> tuple[int, int, int] | None:
    """What tells a changed file (None: there is none now)."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return st.st_mtime_ns, st.st_size, st.st_ino
    return None


def _log_reload(result: ReloadResult) -> None:
    done = (("added", result.added), ("removed", result.removed), ("reloaded", result.reloaded))
    parts = [f"{what} {', '.join(ids)}" for what, ids in done if ids]
    log.info("config reloaded (%s): %s", result.trigger, "; ".join(parts) or "no model changed")
    for model_id, why in result.failed.items():
        log.error("config reload: model %s: %s", model_id, why)
    if result.restart_needed:
        log.warning("config reload: [server] %s changed: applies at a restart", ", ".join(result.restart_needed))
