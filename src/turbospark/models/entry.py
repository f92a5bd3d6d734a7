"""One model as the registry holds it: how to (re)load it (:class:`ModelSpec`),
its entry (:class:`Entry`: names, the loaded model, leases, keep-alive and
health), a request's route to it (:class:`Route`), and the errors that
routing and registration raise. No HTTP types in here.

A model is an :class:`Entry`: its names, how to (re)load it (a spec, when the
registry may load it on demand) and, while resident, the loaded model. Each
request holds a lease on the entry it was routed to; a detached or idle model
is unloaded only once its leases are gone.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.backend import Backend
from .replicas import Replica, ReplicaSet

Capability = Literal["chat", "embeddings", "rerank"]
Kind = Literal["chat", "embedding", "rerank"]


class RoutingError(Exception):
    """A request no known model can take; carries its HTTP meaning."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = "model",
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after


class RegistryError(ValueError):
    """A configuration the registry refuses (duplicate id or alias)."""


@dataclass
class ModelSpec:
    """How the registry (re)loads a model on demand."""

    id: str
    aliases: tuple[str, ...] = ()
    kind: Kind = "chat"
    #: opaque to the registry; handed to the loader
    options: Any = None
    #: seconds idle before the model is unloaded (None: stays resident)
    keep_alive: float | None = None
    path: str = ""
    #: what is known before loading (a pulled model's architecture, size,
    #: quant ...): shown by the listings until the load tells more
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Entry:
    id: str
    aliases: tuple[str, ...]
    kind: Kind
    spec: ModelSpec | None = None
    model: Backend | None = None
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    detached: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    _loading: asyncio.Future[Any] | None = None
    #: the last engine failure (or failed reload) while it is not healed
    failure: str | None = None
    #: consecutive failures, and when the next reload may be tried
    failures: int = 0
    retry_at: float = 0.0
    #: since when the resident model has run without failing
    healthy_since: float = field(default_factory=time.monotonic)
    #: the watchdog's finding: no engine step for the stall timeout
    stalled: bool = False
    stall_reason: str = ""
    #: a replica group's routing state (the group's own entry has no model)
    group: ReplicaSet | None = None
    #: a group member: its place in the group
    replica: Replica | None = None
    member_of: str | None = None
    #: a remote model outside any group (no health checks): why its last
    #: request got no answer, as last reported (``modelHealth``)
    unreachable: str | None = None
    #: the keep-alive in force (seconds idle before unloading; None: stays
    #: resident): the last request's own (Ollama's ``keep_alive``), else
    #: the operator's (``spec.keep_alive``); every request resets it
    keep_alive: float | None = None

    def __post_init__(self) -> None:
        if self.spec is not None:
            self.keep_alive = self.spec.keep_alive

    def expires_in(self, now: float) -> float | None:
        """Seconds until the idle unload (None: never): counted from the
        last use, or a whole keep-alive while a request holds it."""
        if self.keep_alive is None or self.spec is None:
            return None
        if self.leases:
            return self.keep_alive
        return max(0.0, self.keep_alive - (now - self.last_used))

    @property
    def problem(self) -> str | None:
        """What is wrong with it now, for ``/health`` (None: nothing)."""
        if self.state == "failed":
            return self.failure
        if self.state == "down":
            if self.unreachable:
                return self.unreachable
            return self.replica.reason if self.replica is not None else "every replica is down"
        return self.stall_reason if self.stalled else None

    @property
    def state(self) -> str:
        """``failed``, ``stalled``, ``loaded`` or ``unloaded``; a replica
        (or a group with no replica up) may be ``down``, and a remote model
        whose last request got no answer."""
        if self.group is not None:
            return "loaded" if any(r.up for r in self.group.replicas) else "down"
        if (self.replica is not None and not self.replica.up) or self.unreachable:
            return "down"
        if self.failure is not None and self.model is None:
            return "failed"
        if self.stalled:
            return "stalled"
        return "loaded" if self.model is not None else "unloaded"

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def capable(self, capability: Capability) -> bool:
        if self.group is not None:
            return any(r.entry.capable(capability) for r in self.group.replicas)
        if self.model is not None:
            caps = self.model.capabilities
            return {"chat": caps.chat, "embeddings": caps.embeddings, "rerank": caps.rerank}[capability]
        if capability == "chat":
            return self.kind == "chat"
        if capability == "rerank":
            return self.kind == "rerank"
        return self.kind != "rerank"  # llama.cpp models embed, chat models too; a reranker does not

    def modalities(self) -> dict[str, bool]:
        """What it takes besides text, ``{"vision": …, "audio": …}``: a
        loaded model's capabilities; else what its last load said, or its
        projector's header before any load (``info["modalities"]``). A
        group takes what every replica takes."""
        if self.group is not None:
            each = [r.entry.modalities() for r in self.group.replicas]
            return {k: all(m[k] for m in each) for k in ("vision", "audio")}
        if self.model is not None:
            caps = self.model.capabilities
            return {"vision": caps.vision, "audio": caps.audio}
        known = self.info.get("modalities") or {}
        return {"vision": bool(known.get("vision")), "audio": bool(known.get("audio"))}


@dataclass
class Route:
    entry: Entry
    requested: str | None
    served: str
    #: seconds this request spent loading the model (0: it was resident)
    load_seconds: float = 0.0
    #: the group and replica it was routed to, when ``requested`` names a group
    group: ReplicaSet | None = None
    replica: Replica | None = None

    @property
    def model(self) -> Backend | None:
        return self.entry.model

    @property
    def fell_back(self) -> bool:
        return self.requested is not None and self.requested != self.served


def info_of(model: Backend) -> dict[str, Any]:
    """A loaded model's facts for the views (cached on its entry at load)."""
    try:
        return dict(model.info())
    except Exception:  # a model whose info() fails still routes
        return {"id": model.model_id, "aliases": list(model.aliases)}


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
