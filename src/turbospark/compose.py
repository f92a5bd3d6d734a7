"""The one composition root: ``turbospark serve`` (``cli._serve``) and the
embedding :class:`~turbospark.server.Server` both build a server here, so the
parts are made, wired and closed the same way.

Order matters in one place: the sinks exist before the registry, so they see
every model attach; the app is built last, over what is already made, and
creates nothing itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette

from . import __version__
from .access.auth import Auth
from .access.guard import BrowserPolicy
from .models.loading import ModelArg, default_model_folders, load_spec, populate
from .models.registry import STALL_TIMEOUT, ModelSpec, Registry
from .observe import Observer, combine
from .pull.puller import Puller
from .pull.specs import on_demand
from .pull.store import Store
from .serving.drain import Drain
from .serving.state import ServerState
from .sinks.live import LiveEvents
from .sinks.prometheus import PrometheusSink
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
    model_folders: Sequence[str] | None = None,
    remote_key_envs: Sequence[str] = (),
    model_defaults: dict[str, Any] | None = None,
    progress_for: Callable[[ModelSpec], Callable[[float], None] | None] | None = None,
    on_loaded: Callable[[Any], None] | None = None,
    store_dir: str | None = None,
) -> Assembly:
    """Open the sinks, register (and load) the models, build the app.
    Raises what loading raises (a bad model, no memory, a name clash; an
    event log that cannot be opened: ``OSError``; tracing without its extra:
    ``ImportError``; a model store that cannot be opened: ``StoreError``)
    after closing whatever it had opened. ``store_dir``: where pulled models
    live (None: this server pulls nothing)."""
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
    metrics = PrometheusSink()  # /metrics: always on
    for sink in sinks:
        if hasattr(sink, "dropped"):  # the event log's own losses
            metrics.watch_event_log(sink)
    live = LiveEvents()  # /v1/events, /v1/stats, /dashboard: always on
    observer = combine([*observers, metrics, *sinks, live])
    registry = Registry(observer, loader=load_spec, max_resident=max_resident, stall_timeout=stall_timeout)
    puller = None
    try:
        if store_dir is not None:
            puller = Puller(Store(store_dir), observer)
            registry.on_demand = on_demand(puller.store, model_defaults)
        owned = populate(registry, models, model_defaults, progress_for, on_loaded)
    except BaseException:
        _close_models(registry, set())
        _close_sinks(sinks)
        if puller is not None:
            puller.close()
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
        model_folders=tuple(model_folders) if model_folders is not None else default_model_folders(registry),
        remote_key_envs=tuple(remote_key_envs),
        model_defaults=dict(model_defaults or {}),
        puller=puller,
    )
    state.drain.on_cut(registry.stop_waiting)  # loads waiting for room end at the deadline
    app = build_app(state, auth, policy)
    return Assembly(registry, observer, metrics, live, app, state.drain, sinks, owned, puller)


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
