"""Folding the event stream into what the views show.

ONE fold for every view — the server's ``/v1/stats`` (which the dashboard
renders), the ``turbospark console`` and the offline ``turbospark report`` —
so no view computes its own numbers on the side: they all read the same
events (``ServerEvent.to_dict()`` shapes) through this module.

Where the numbers come from (REFERENCE §2):

- token counts and prefill/decode times from ``generated`` (engine truth);
  a request with a guardrail re-ask has several, and they add up;
- status, wall duration and error from ``requestFinished``. For a streamed
  request it fires when the stream STARTS, so such a request is still
  ``streaming`` until its ``generated`` arrives;
- queue wait only for NON-streamed requests: ``durationMs − prefill − decode``
  (for a stream ``durationMs`` is time-to-headers, so the subtraction means
  nothing).

The views' own traffic (``/v1/events``, ``/v1/stats``, ``/dashboard``) is
left out by default, so watching the server does not change what is watched
(the dashboard re-reads ``/v1/stats`` after events: counting those reads
would feed back into itself).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

#: Paths of the views themselves; see the module docstring.
VIEW_PATHS: frozenset[str] = frozenset({"/v1/events", "/v1/stats", "/dashboard"})


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


@dataclass
class RequestRecord:
    """Everything the events said about one request."""

    id: int
    at_ms: int | None = None
    method: str | None = None
    path: str | None = None
    requested: str | None = None
    served: str | None = None
    stream: bool | None = None
    status: int | None = None
    duration_ms: int | None = None
    error: str | None = None
    model: str | None = None  # the model that generated (from ``generated``)
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    reused_tokens: int = 0
    evicted: bool = False
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    generations: int = 0
    stop_reason: str | None = None
    queue_sampled: bool = False

    @property
    def state(self) -> str:
        if self.status is None:
            return "running"
        if self.stream and self.status < 400 and self.generations == 0:
            return "streaming"
        return "done"

    @property
    def queued_ms(self) -> float | None:
        """Queue wait, for a finished NON-streamed request that generated."""
        if self.stream or self.duration_ms is None or self.generations == 0:
            return None
        return max(0.0, self.duration_ms - (self.prefill_seconds + self.decode_seconds) * 1000.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "atMs": self.at_ms,
            "method": self.method,
            "path": self.path,
            "requested": self.requested,
            "served": self.served,
            "stream": self.stream,
            "state": self.state,
            "status": self.status,
            "durationMs": self.duration_ms,
            "error": self.error,
            "model": self.model,
            "promptTokens": self.prompt_tokens,
            "newTokens": self.new_tokens,
            "prefillMs": self.prefill_seconds * 1000.0,
            "decodeMs": self.decode_seconds * 1000.0,
            "queuedMs": self.queued_ms,
            "decodeTokPerSec": _ratio(self.new_tokens, self.decode_seconds),
            "reusedTokens": self.reused_tokens,
            "evicted": self.evicted,
            "draftedTokens": self.drafted_tokens,
            "acceptedTokens": self.accepted_tokens,
            "generations": self.generations,
            "stopReason": self.stop_reason,
        }


@dataclass
class ModelTotals:
    requests: int = 0  # requests routed to it
    generations: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    decode_seconds: float = 0.0
    prefill_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "generations": self.generations,
            "promptTokens": self.prompt_tokens,
            "newTokens": self.new_tokens,
            "decodeSeconds": self.decode_seconds,
            "prefillSeconds": self.prefill_seconds,
            "decodeTokPerSec": _ratio(self.new_tokens, self.decode_seconds),
        }


@dataclass
class Fold:
    """Consumes event dicts in order; :meth:`summary` is JSON-able.

    Aggregates cover every event fed; per-request records are bounded to the
    newest ``max_requests`` (None = unbounded, for offline reports) and the
    percentiles to the newest ``samples`` values. Not thread-safe: the owner
    serializes :meth:`feed` (the server feeds it under its ring's lock).
    """

    max_requests: int | None = 1000
    samples: int = 1000
    hide_paths: frozenset[str] = VIEW_PATHS

    events: int = 0
    dropped_events: int = 0  # "log gaps": events a view knows it missed
    requests: int = 0
    finished: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    reused_tokens: int = 0
    evictions: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    generations: int = 0
    models: list[str] = field(default_factory=list)
    per_model: dict[str, ModelTotals] = field(default_factory=dict)
    _records: "OrderedDict[int, RequestRecord]" = field(default_factory=OrderedDict)
    _open: set[int] = field(default_factory=set)
    _hidden: set[int] = field(default_factory=set)
    _prefill_ms: deque[float] = field(init=False)
    _queue_ms: deque[float] = field(init=False)

    def __post_init__(self) -> None:
        self._prefill_ms = deque(maxlen=self.samples)
        self._queue_ms = deque(maxlen=self.samples)

    # -- feeding ---------------------------------------------------------
    def feed_all(self, events: Iterable[Mapping[str, Any]]) -> "Fold":
        for e in events:
            self.feed(e)
        return self

    def feed(self, event: Mapping[str, Any]) -> int | None:
        """Fold one event; returns the request id it touched (None for a
        model or gap event, or a hidden request)."""
        kind = event.get("kind")
        if kind == "gap":
            self.dropped_events += int(event.get("missed", 0))
            return None
        self.events += 1
        if kind == "modelAttached":
            if event["model"] not in self.models:
                self.models.append(event["model"])
            return None
        if kind == "modelDetached":
            if event["model"] in self.models:
                self.models.remove(event["model"])
            return None
        rid = event.get("id")
        if rid is None or rid in self._hidden:
            if kind == "requestFinished":
                self._hidden.discard(rid)
            return None
        if kind == "requestStarted":
            if event.get("path") in self.hide_paths:
                self._hidden.add(rid)
                return None
            rec = self._record(rid)
            rec.at_ms, rec.method, rec.path = event.get("atMs"), event.get("method"), event.get("path")
            self.requests += 1
            self._open.add(rid)
        elif kind == "requestRouted":
            rec = self._record(rid)
            rec.requested, rec.served, rec.stream = event.get("requested"), event.get("served"), event.get("stream")
            self._model(rec.served).requests += 1
        elif kind == "generated":
            self._generated(self._record(rid), event)
        elif kind == "requestFinished":
            if rid not in self._records:
                return None  # its start was never seen (joined mid-stream): unknown request
            rec = self._records[rid]
            rec.status, rec.duration_ms, rec.error = event.get("status"), event.get("durationMs"), event.get("error")
            self.finished += 1
            self._open.discard(rid)
            if rec.status is not None and rec.status >= 400:
                self.errors += 1
            self._settle(rec)
        else:
            return None
        return rid

    def _record(self, rid: int) -> RequestRecord:
        rec = self._records.get(rid)
        if rec is None:
            rec = self._records[rid] = RequestRecord(id=rid)
            if self.max_requests is not None and len(self._records) > self.max_requests:
                old, _ = self._records.popitem(last=False)
                self._open.discard(old)
        return rec

    def _model(self, name: str | None) -> ModelTotals:
        key = name or "?"
        totals = self.per_model.get(key)
        if totals is None:
            totals = self.per_model[key] = ModelTotals()
        return totals

    def _generated(self, rec: RequestRecord, e: Mapping[str, Any]) -> None:
        prompt, new = int(e.get("promptTokens", 0)), int(e.get("newTokens", 0))
        prefill, decode = float(e.get("prefillSeconds", 0.0)), float(e.get("decodeSeconds", 0.0))
        reused = int(e.get("reusedPrefixTokens", 0))
        drafted, accepted = int(e.get("draftedTokens", 0)), int(e.get("acceptedTokens", 0))
        evicted = bool(e.get("sessionSlotEvicted", False))
        rec.model = e.get("model")
        rec.prompt_tokens += prompt
        rec.new_tokens += new
        rec.prefill_seconds += prefill
        rec.decode_seconds += decode
        rec.reused_tokens += reused
        rec.evicted = rec.evicted or evicted
        rec.drafted_tokens += drafted
        rec.accepted_tokens += accepted
        rec.generations += 1
        rec.stop_reason = e.get("stopReason")
        self.generations += 1
        self.prompt_tokens += prompt
        self.new_tokens += new
        self.prefill_seconds += prefill
        self.decode_seconds += decode
        self.reused_tokens += reused
        self.evictions += evicted
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self._prefill_ms.append(prefill * 1000.0)
        m = self._model(rec.model)
        m.generations += 1
        m.prompt_tokens += prompt
        m.new_tokens += new
        m.decode_seconds += decode
        m.prefill_seconds += prefill
        self._settle(rec)

    def _settle(self, rec: RequestRecord) -> None:
        """Take a non-streamed request's queue wait once it is known."""
        queued = rec.queued_ms
        if queued is not None and not rec.queue_sampled:
            rec.queue_sampled = True
            self._queue_ms.append(queued)

    # -- reading ---------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._open)

    @property
    def decode_tok_per_sec(self) -> float | None:
        return _ratio(self.new_tokens, self.decode_seconds)

    @property
    def reuse_ratio(self) -> float | None:
        return _ratio(self.reused_tokens, self.prompt_tokens)

    def record(self, rid: int) -> RequestRecord | None:
        return self._records.get(rid)

    def records(self) -> list[RequestRecord]:
        """Kept request records, oldest first."""
        return list(self._records.values())

    def summary(self, max_requests: int | None = None) -> dict[str, Any]:
        """Aggregates plus the newest ``max_requests`` records (all kept
        records when None), oldest first."""
        prefill = sorted(self._prefill_ms)
        queue = sorted(self._queue_ms)
        recs = self.records()
        if max_requests is not None:
            recs = recs[-max_requests:] if max_requests > 0 else []
        return {
            "events": self.events,
            "droppedEvents": self.dropped_events,
            "requests": self.requests,
            "inFlight": self.in_flight,
            "errors": self.errors,
            "generations": self.generations,
            "promptTokens": self.prompt_tokens,
            "newTokens": self.new_tokens,
            "prefillSeconds": self.prefill_seconds,
            "decodeSeconds": self.decode_seconds,
            "decodeTokPerSec": self.decode_tok_per_sec,
            "prefillMs": {"p50": percentile(prefill, 50), "p95": percentile(prefill, 95), "n": len(prefill)},
            "queueMs": {"p50": percentile(queue, 50), "p95": percentile(queue, 95), "n": len(queue)},
            "reusedTokens": self.reused_tokens,
            "prefixReuseRatio": self.reuse_ratio,
            "evictions": self.evictions,
            "draftedTokens": self.drafted_tokens,
            "acceptedTokens": self.accepted_tokens,
            "models": list(self.models),
            "perModel": {name: t.to_dict() for name, t in sorted(self.per_model.items())},
            "records": [r.to_dict() for r in recs],
        }
