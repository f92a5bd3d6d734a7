"""The one place turbospark reports what it is doing.

A request's facts come from two places because neither can see the other's:
the ASGI middleware knows method, path, status and wall duration for EVERY
request (404s, 401s and rejected bodies included) but nothing about tokens;
the generation path knows tokens and timings but nothing about HTTP. So a
request yields ``requestStarted``/``requestFinished`` from the middleware and
``requestRouted``/``generated`` from the handler and the generation core (a
rerank's ``ranked`` from its handler), all
tied together by one id the middleware mints.

Token counts come off the engine's :class:`RawDecodeResult`, never off a count
of streamed chunks (special tokens render empty, partial UTF-8 is withheld,
reasoning goes elsewhere: a chunk count is wrong by a varying amount).

Sinks (JSONL, SSE, Prometheus, ...) live in their own modules and consume
these events; nothing else computes metrics on the side.

One concept a module: ``events`` (the schema and request ids), ``observers``
(how events travel, and the per-request reporter), ``memory`` (observers that
keep events in memory).
"""

from .events import (
    Generated,
    ModelAttached,
    ModelDetached,
    ModelHealth,
    ModelPull,
    Ranked,
    RequestFinished,
    RequestId,
    RequestIds,
    RequestRouted,
    RequestStarted,
    ServerEvent,
    now_ms,
)
from .memory import Drained, ListObserver, RingObserver
from .observers import (
    NO_REPORTER,
    TRACE_HEADERS,
    FanOut,
    Observer,
    Reporter,
    combine,
    record,
    request_tenant,
    trace_context,
)

__all__ = [
    "NO_REPORTER",
    "TRACE_HEADERS",
    "Drained",
    "FanOut",
    "Generated",
    "ListObserver",
    "ModelAttached",
    "ModelDetached",
    "ModelHealth",
    "ModelPull",
    "Observer",
    "Ranked",
    "Reporter",
    "RequestFinished",
    "RequestId",
    "RequestIds",
    "RequestRouted",
    "RequestStarted",
    "RingObserver",
    "ServerEvent",
    "combine",
    "now_ms",
    "record",
    "request_tenant",
    "trace_context",
]
