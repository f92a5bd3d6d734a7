"""The server's state: everything a handler needs, made once by
``compose.assemble`` and kept on ``app.state.turbospark``. No HTTP types."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..models.presets import ReloadResult
from ..models.registry import Registry
from ..observe import Observer, RequestIds
from .background import BackgroundRuns
from .drain import Drain
from .media import MediaPolicy

#: the most documents one rerank request may carry unless ``--max-rerank-documents`` says otherwise
DEFAULT_MAX_RERANK_DOCUMENTS = 1000

if TYPE_CHECKING:
    from ..pull.puller import Puller
    from ..sinks.live import LiveEvents
    from ..state.responses import ResponseStore


class ConfigControl(Protocol):
    """The config file behind a server started with one
    (``compose.ConfigReloader``): ``GET /v1/admin/config`` and
    ``POST /v1/admin/config/reload``."""

    def describe(self) -> dict[str, Any]:
        """What is in force: the file, when it was loaded, the last reload,
        the server settings and each model's preset (no secret)."""
        ...

    async def reload(self, trigger: str) -> ReloadResult:
        """Read the file again and apply it (an invalid one: ``error``, nothing changed)."""
        ...


@dataclass
class ServerState:
    """Everything a handler needs; lives on ``app.state.turbospark``."""

    registry: Registry
    observer: Observer | None = None
    #: the live event feed behind /v1/events and /v1/stats (``sinks.live``)
    live: LiveEvents | None = None
    ids: RequestIds = field(default_factory=RequestIds)
    started_at: float = field(default_factory=time.time)
    version: str = "0"
    #: tool-call guardrails (validate, re-ask once) unless a request says otherwise
    guardrails: bool = True
    #: take known per-session client stamps out of prompts (``dialects/stamps.py``)
    normalize_client_stamps: bool = True
    #: seconds a stream may say nothing before it sends its dialect's
    #: keep-alive (``--sse-keepalive``; 0: never)
    sse_keepalive: float = 15.0
    #: the server's PrometheusSink (``GET /metrics``)
    metrics: Any = None
    #: folders admin attach may load GGUF files from (``--models-dir``)
    model_folders: tuple[str, ...] = ()
    #: environment variables an attach body may name in ``api_key_env``
    #: (``--remote-key-env``), besides those the configured models name
    remote_key_envs: tuple[str, ...] = ()
    #: the options an attached model starts from (the server's own defaults)
    model_defaults: dict[str, Any] = field(default_factory=dict)
    #: fills the model store (``/api/pull``, attach with ``pull``); None: no store
    puller: Puller | None = None
    #: stored responses and conversations (``--state-dir``); None: ``--store off``
    responses: ResponseStore | None = None
    #: where llama-server's slot save/restore keeps its files
    #: (``--slot-save-path``); None: those actions are refused
    slot_save_path: str | None = None
    #: requests in flight, and whether new ones are taken (graceful shutdown)
    drain: Drain = field(default_factory=Drain)
    #: background responses running, by response id (``background: true``)
    background: BackgroundRuns = field(default_factory=BackgroundRuns)
    #: the config file, when the server was started with one (None: without)
    config: ConfigControl | None = None
    #: media URLs fetched (``--allow-media-urls``) and media per request (``--max-images``)
    media: MediaPolicy = field(default_factory=MediaPolicy)
    #: the most documents one rerank request may carry (``--max-rerank-documents``)
    max_rerank_documents: int = DEFAULT_MAX_RERANK_DOCUMENTS
