"""Folding the event stream into what the views show.

ONE fold for every view — the server's ``/v1/stats`` (which the dashboard
renders), the ``turbospark console`` and the offline ``turbospark report`` —
so no view computes its own numbers on the side: they all read the same
events (``ServerEvent.to_dict()`` shapes) through this module.

Where the numbers come from (CONTRACT §2):

- a rerank's pairs, tokens and queue/compute times from ``ranked`` (its
  compute shown as its prefill: one pass over its pairs, nothing decoded);
- token counts and queue/prefill/decode times from ``generated`` (engine
  truth, each request's own wall-clock intervals), summed in a
  :class:`~turbospark.views.usage.Usage` (a guardrail re-ask is a second one);
  media (items, their tokens — inside the prompt tokens —, the items encoded
  rather than reused, encode time) from ``generated`` too;
- status, wall duration and error from ``requestFinished``, which ends every
  request when its response is really over, streams included; a request with
  status ≥ 400 or an ``error`` (a failed stream, a client that left) is an
  error;
- overhead = ``durationMs − 1000 × (queue + prefill + decode)``: HTTP,
  parsing and templating.

The views' own traffic (``/v1/events``, ``/v1/stats``, ``/dashboard``, the
web page's files under ``/app/``) is
left out by default, so watching the server does not change what is watched
(the dashboard re-reads ``/v1/stats`` after events: counting those reads
would feed back into itself).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .usage import Reranks, Usage

#: Paths of the views themselves; see the module docstring.
VIEW_PATHS: frozenset[str] = frozenset({"/v1/events", "/v1/stats", "/dashboard"})
#: ... and the web page's own files (its scripts and styles)
VIEW_PREFIXES: tuple[str, ...] = ("/app/",)


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _text(v: Any) -> bool:
    return isinstance(v, str)


#: per kind, the fields the fold reads and what each must be when present
#: (None is taken wherever the fold reads it with a default)
_FIELDS: dict[str, dict[str, Any]] = {
    "gap": {"missed": _int},
    "modelAttached": {"model": _text},
    "modelDetached": {"model": _text},
    "modelHealth": {"model": _text},
    "requestStarted": {"id": _int, "atMs": _number, "method": _text, "path": _text},
    "requestRouted": {
        "id": _int,
        "requested": _text,
        "served": _text,
        "stream": lambda v: isinstance(v, bool),
        "responseId": _text,
        "previousResponseId": _text,
    },
    "generated": {
        "id": _int,
        "model": _text,
        "stopReason": _text,
        **dict.fromkeys(("promptTokens", "newTokens", "reusedPrefixTokens", "draftedTokens", "acceptedTokens"), _int),
        **dict.fromkeys(("prefixMissAt", "choice"), _int),
        **dict.fromkeys(("mediaItems", "mediaTokens", "mediaEncoded"), _int),
        **dict.fromkeys(("queueSeconds", "prefillSeconds", "decodeSeconds", "mediaEncodeSeconds"), _number),
    },
    "ranked": {
        "id": _int,
        "model": _text,
        **dict.fromkeys(("pairs", "promptTokens", "steps", "truncated"), _int),
        **dict.fromkeys(("queueSeconds", "computeSeconds"), _number),
        "stopReason": _text,
    },
    "requestFinished": {"id": _int, "status": _int, "durationMs": _number, "error": _text},
    "modelPull": {
        "model": _text,
        "phase": _text,
        "atMs": _number,
        **dict.fromkeys(("completed", "total", "fetched"), _int),
        "seconds": _number,
        "reason": _text,
    },
}
#: read with ``event[...]``: must be there
_REQUIRED = {
    "modelAttached": ("model",),
    "modelDetached": ("model",),
    "modelHealth": ("model",),
    "modelPull": ("model", "phase"),
}


def well_formed(event: Any) -> bool:
    """``event`` is shaped as the server writes its kind (an unknown kind
    passes: the fold ignores it)."""
    if not isinstance(event, Mapping) or not isinstance(event.get("kind"), str):
        return False
    fields = _FIELDS.get(event["kind"], {})
    if any(name not in event for name in _REQUIRED.get(event["kind"], ())):
        return False
    return all(event.get(name) is None or check(event[name]) for name, check in fields.items())


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
    model: str | None = None  # the model that generated (from ``generated``) or reranked
    usage: Usage = field(default_factory=Usage)
    #: a rerank's pairs, tokens and times (from ``ranked``)
    rerank: Reranks = field(default_factory=Reranks)
    stop_reason: str | None = None
    #: a Responses API request's response id and the one it continues (from
    #: ``requestRouted``), and where that puts it (:meth:`Chains.place`): its
    #: chain's first response id, its turn in it (1 = the chain's first), and
    #: whether the fold saw the chain from its start (else both count from
    #: the earliest turn it saw)
    response_id: str | None = None
    previous_response_id: str | None = None
    chain: str | None = None
    turn: int | None = None
    chain_start_seen: bool | None = None

    @property
    def chain_text(self) -> str | None:
        """Where the request sits in its chain, for the views: ``turn 2 of
        chain resp_…`` (None for a request that made no response)."""
        if self.chain is None:
            return None
        unseen = "" if self.chain_start_seen else " (earlier turns not seen)"
        return f"turn {self.turn} of chain {self.chain}{unseen}"

    @property
    def state(self) -> str:
        return "running" if self.status is None else "done"

    @property
    def failed(self) -> bool:
        return self.status is not None and (self.status >= 400 or bool(self.error))

    @property
    def kind(self) -> str | None:
        """``rerank``, ``generate`` (it generated), or None (neither yet)."""
        return "rerank" if self.rerank.requests else "generate" if self.usage.generations else None

    @property
    def engine_seconds(self) -> tuple[float, float, float]:
        """Its own (queue, prefill, decode) seconds; a rerank's compute is
        its prefill (one pass over its pairs, nothing decoded)."""
        if self.rerank.requests:
            return self.rerank.queue_seconds, self.rerank.compute_seconds, 0.0
        return self.usage.request_seconds  # (its longest choice's when it had several)

    @property
    def queued_ms(self) -> float | None:
        """The engine's queue wait (submitted → admitted), once it generated or reranked."""
        return self.engine_seconds[0] * 1000.0 if self.kind is not None else None

    @property
    def overhead_ms(self) -> float | None:
        if self.rerank.requests:
            return self.rerank.overhead_ms(self.duration_ms)
        return self.usage.overhead_ms(self.duration_ms)

    def to_dict(self) -> dict[str, Any]:
        u = self.usage
        queue, prefill, decode = self.engine_seconds
        ranked = self.rerank.requests > 0
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
            "kind": self.kind,
            "promptTokens": self.rerank.tokens if ranked else u.prompt_tokens,
            "newTokens": u.new_tokens,
            "prefillMs": prefill * 1000.0,
            "decodeMs": decode * 1000.0,
            "queuedMs": self.queued_ms,
            "overheadMs": self.overhead_ms,
            "decodeTokPerSec": u.decode_tok_per_sec,
            "reusedTokens": u.reused_tokens,
            "prefixMissAt": u.prefix_miss_at,
            "evicted": bool(u.evictions),
            "draftedTokens": u.drafted_tokens,
            "acceptedTokens": u.accepted_tokens,
            **u.media_dict(),
            "generations": u.generations,
            "pairs": self.rerank.pairs if ranked else None,
            "pairsPerSec": self.rerank.pairs_per_sec,
            "stopReason": self.stop_reason,
            "responseId": self.response_id,
            "previousResponseId": self.previous_response_id,
            "chain": self.chain,
            "turn": self.turn,
            "chainStartSeen": self.chain_start_seen,
            "chainText": self.chain_text,
        }


@dataclass
class ModelTotals:
    requests: int = 0  # requests routed to it
    usage: Usage = field(default_factory=Usage)
    rerank: Reranks = field(default_factory=Reranks)

    def to_dict(self) -> dict[str, Any]:
        u = self.usage
        queue, prefill, decode = u.request_seconds  # (a request's own: its longest choice's when it had several)
        return {
            "requests": self.requests,
            "generations": u.generations,
            "promptTokens": u.prompt_tokens,
            "newTokens": u.new_tokens,
            "decodeSeconds": u.decode_seconds,
            "prefillSeconds": u.prefill_seconds,
            "queueSeconds": u.queue_seconds,
            "decodeTokPerSec": u.decode_tok_per_sec,
            **u.media_dict(),
            **self.rerank.to_dict(),
        }


#: ended pulls kept (the newest), for the views to show a while
PULLS_KEPT = 5


@dataclass
class PullRecord:
    """One model pull as its ``modelPull`` events told it: ``state`` is
    ``pulling`` until a ``finished`` or ``failed`` one."""

    model: str
    state: str = "pulling"
    completed: int = 0
    total: int = 0
    fetched: int = 0
    started_ms: float | None = None  # of the first event seen (its ``started``, unless joined mid-pull)
    at_ms: float | None = None  # of the last
    seconds: float | None = None
    reason: str | None = None
    _first_fetched: int = 0  # ``fetched`` at the first event seen

    def update(self, e: Mapping[str, Any]) -> None:
        phase = e.get("phase")
        if self.at_ms is None:
            self.started_ms, self._first_fetched = e.get("atMs"), int(e.get("fetched") or 0)
        self.at_ms = e.get("atMs", self.at_ms)
        self.completed, self.total = int(e.get("completed") or 0), int(e.get("total") or 0)
        self.fetched = int(e.get("fetched") or 0)
        if phase in ("finished", "failed"):
            self.state, self.seconds, self.reason = phase, e.get("seconds"), e.get("reason")

    @property
    def bytes_per_sec(self) -> float | None:
        """Network bytes a second: over the whole pull once it finished,
        else since the first event seen."""
        if self.state == "finished" and self.seconds:
            return self.fetched / self.seconds
        if self.started_ms is None or self.at_ms is None or self.at_ms <= self.started_ms:
            return None
        return (self.fetched - self._first_fetched) / ((self.at_ms - self.started_ms) / 1000.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "state": self.state,
            "completed": self.completed,
            "total": self.total,
            "fetched": self.fetched,
            "bytesPerSec": self.bytes_per_sec,
            "seconds": self.seconds,
            "reason": self.reason,
            "startedMs": self.started_ms,
            "atMs": self.at_ms,
        }


@dataclass
class Pulls:
    """The pulls in progress (by model, in the order they started) and the
    newest :data:`PULLS_KEPT` that ended."""

    active: dict[str, PullRecord] = field(default_factory=dict)
    ended: deque[PullRecord] = field(default_factory=lambda: deque(maxlen=PULLS_KEPT))

    def feed(self, e: Mapping[str, Any]) -> None:
        model, phase = e["model"], e["phase"]
        rec = self.active.get(model)
        if rec is None or phase == "started":  # (joined mid-pull: from its first event seen)
            rec = self.active[model] = PullRecord(model)
        rec.update(e)
        if rec.state != "pulling":
            del self.active[model]
            self.ended.append(rec)

    def copy(self) -> Pulls:
        return Pulls({m: replace(r) for m, r in self.active.items()}, deque(map(replace, self.ended), PULLS_KEPT))

    def records(self) -> list[PullRecord]:
        """In progress (oldest first), then ended (oldest first)."""
        return [*self.active.values(), *self.ended]


#: response ids whose place in a chain a live fold remembers (the newest)
RESPONSES_KEPT = 10_000


@dataclass
class Chains:
    """Responses API chains as the fold saw them: each response id's chain
    (the first response id) and turn, found by following previous ids
    through the requests seen. A chain whose start was never seen (the view
    joined late, or the response it continues is older than what is kept)
    starts at the earliest turn seen. Bounded to the newest ``kept`` ids
    (None = unbounded); server runs do not reset it (stored responses
    outlive a restart)."""

    kept: int | None = RESPONSES_KEPT
    #: response id -> (chain's first id, turn, chain start seen)
    _places: OrderedDict[str, tuple[str, int, bool]] = field(default_factory=OrderedDict)

    def place(self, rec: RequestRecord) -> None:
        """Set ``rec``'s chain and turn from its response ids, and remember it."""
        rid, prev = rec.response_id, rec.previous_response_id
        if rid is None:
            return
        if prev is None:
            place = (rid, 1, True)
        elif prev in self._places:
            chain, turn, whole = self._places[prev]
            place = (chain, turn + 1, whole)
        else:
            place = (rid, 1, False)
        rec.chain, rec.turn, rec.chain_start_seen = place
        self._places[rid] = place
        self._places.move_to_end(rid)
        if self.kept is not None and len(self._places) > self.kept:
            self._places.popitem(last=False)


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
    hide_prefixes: tuple[str, ...] = VIEW_PREFIXES

    events: int = 0
    dropped_events: int = 0  # "log gaps": events a view knows it missed
    malformed: int = 0  # lines that were not events as the server writes them
    #: server runs in what was fed (a log appended to by several runs: ids
    #: start again at 1), and requests a run's end left unfinished
    runs: int = 1
    unfinished: int = 0
    _last_started: int = 0
    requests: int = 0
    finished: int = 0
    errors: int = 0
    usage: Usage = field(default_factory=Usage)
    rerank: Reranks = field(default_factory=Reranks)
    models: list[str] = field(default_factory=list)
    #: models whose last health report was not ``ok`` (a replica marked
    #: down, a stalled engine): name -> (state, reason)
    unwell: dict[str, tuple[str, str]] = field(default_factory=dict)
    per_model: dict[str, ModelTotals] = field(default_factory=dict)
    pulls: Pulls = field(default_factory=Pulls)
    chains: Chains = field(default_factory=Chains)
    _records: OrderedDict[int, RequestRecord] = field(default_factory=OrderedDict)
    _open: set[int] = field(default_factory=set)
    #: earlier server runs' records (kept only without ``max_requests``)
    _past: list[RequestRecord] = field(default_factory=list)
    _hidden: set[int] = field(default_factory=set)
    _prefill_ms: deque[float] = field(init=False)
    _queue_ms: deque[float] = field(init=False)
    _overhead_ms: deque[float] = field(init=False)

    def __post_init__(self) -> None:
        self._prefill_ms = deque(maxlen=self.samples)
        self._queue_ms = deque(maxlen=self.samples)
        self._overhead_ms = deque(maxlen=self.samples)
        if self.max_requests is None:  # (an offline fold keeps every chain too)
            self.chains.kept = None

    def fresh(self) -> Fold:
        """An empty fold that knows the models this one knows, and their
        states, and the pulls (for a view that missed those events)."""
        return Fold(models=list(self.models), unwell=dict(self.unwell), pulls=self.pulls.copy())

    # -- feeding ---------------------------------------------------------
    def feed_all(self, events: Iterable[Mapping[str, Any]]) -> Fold:
        for e in events:
            self.feed(e)
        return self

    def feed(self, event: Mapping[str, Any], trusted: bool = False) -> int | None:
        """Fold one event; returns the request id it touched (None for a
        model or gap event, or a hidden request). Anything not shaped as the
        server writes events (a log edited or damaged, a stream from something
        else) is counted in ``malformed`` and left out, never folded in part;
        ``trusted``: the server's own events as it makes them (its live views,
        on the event path), which need no check."""
        if not trusted and not well_formed(event):
            self.malformed += 1
            return None
        kind = event.get("kind")
        if kind == "requestStarted":
            if event["id"] <= self._last_started:
                self._next_run()
            self._last_started = event["id"]
        if kind == "gap":
            self.dropped_events += int(event.get("missed", 0))
            return None
        self.events += 1
        if kind == "modelAttached":
            if event["model"] not in self.models:
                self.models.append(event["model"])
            self.unwell.pop(event["model"], None)  # attached (again): no report yet
            return None
        if kind == "modelDetached":
            if event["model"] in self.models:
                self.models.remove(event["model"])
            self.unwell.pop(event["model"], None)
            return None
        if kind == "modelHealth":
            if event.get("state") == "ok":
                self.unwell.pop(event["model"], None)
            else:
                self.unwell[event["model"]] = (str(event.get("state")), str(event.get("reason") or ""))
            return None
        if kind == "modelPull":
            self.pulls.feed(event)
            return None
        rid: int | None = event.get("id")
        if rid is None or rid in self._hidden:
            if kind == "requestFinished":
                self._hidden.discard(rid)
            return None
        if kind == "requestStarted":
            path = str(event.get("path"))
            if path in self.hide_paths or path.startswith(self.hide_prefixes):
                self._hidden.add(rid)
                return None
            rec = self._record(rid)
            rec.at_ms, rec.method, rec.path = event.get("atMs"), event.get("method"), event.get("path")
            self.requests += 1
            self._open.add(rid)
        elif kind == "requestRouted":
            rec = self._record(rid)
            rec.requested, rec.served, rec.stream = event.get("requested"), event.get("served"), event.get("stream")
            rec.response_id, rec.previous_response_id = event.get("responseId"), event.get("previousResponseId")
            self.chains.place(rec)
            self._model(rec.served).requests += 1
        elif kind == "generated":
            self._generated(self._record(rid), event)
        elif kind == "ranked":
            rec = self._record(rid)
            rec.model, rec.stop_reason = event.get("model"), event.get("stopReason")
            for acc in (rec.rerank, self.rerank, self._model(rec.model).rerank):
                acc.add(event)
        elif kind == "requestFinished":
            if rid not in self._records:
                return None  # its start was never seen (joined mid-stream): unknown request
            rec = self._records[rid]
            rec.status, rec.duration_ms, rec.error = event.get("status"), event.get("durationMs"), event.get("error")
            self.finished += 1
            self._open.discard(rid)
            if rec.failed:
                self.errors += 1
            if rec.overhead_ms is not None:
                self._overhead_ms.append(rec.overhead_ms)
        else:
            return None
        return rid

    def _next_run(self) -> None:
        """Request ids went back: a new server run (one process mints them
        in order). What the last one left open never finished (it was
        killed); its records go, so the new run's same ids are new requests."""
        for rid in self._open:
            rec = self._records[rid]
            rec.error = rec.error or "unfinished: the server stopped first"
            self.errors += 1
            self.unfinished += 1
        if self.max_requests is None:  # (an offline fold keeps every record: the report plots them)
            self._past.extend(self._records.values())
        self._records.clear()
        self._open.clear()
        self._hidden.clear()
        self.runs += 1

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
        rec.model = e.get("model")
        rec.stop_reason = e.get("stopReason")
        for usage in (rec.usage, self.usage, self._model(rec.model).usage):
            usage.add(e)
        self._prefill_ms.append(float(e.get("prefillSeconds", 0.0)) * 1000.0)
        self._queue_ms.append(float(e.get("queueSeconds", 0.0)) * 1000.0)

    # -- reading ---------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._open)

    def record(self, rid: int) -> RequestRecord | None:
        return self._records.get(rid)

    def records(self) -> list[RequestRecord]:
        """Kept request records, oldest first (earlier server runs' first)."""
        return [*self._past, *self._records.values()]

    def summary(self, max_requests: int | None = None) -> dict[str, Any]:
        """Aggregates plus the newest ``max_requests`` records (all kept
        records when None), oldest first."""
        prefill = sorted(self._prefill_ms)
        queue = sorted(self._queue_ms)
        overhead = sorted(self._overhead_ms)
        u = self.usage
        recs = self.records()
        if max_requests is not None:
            recs = recs[-max_requests:] if max_requests > 0 else []
        return {
            "events": self.events,
            "droppedEvents": self.dropped_events,
            "requests": self.requests,
            "inFlight": self.in_flight,
            "errors": self.errors,
            "generations": u.generations,
            "promptTokens": u.prompt_tokens,
            "newTokens": u.new_tokens,
            "queueSeconds": u.queue_seconds,
            "prefillSeconds": u.prefill_seconds,
            "decodeSeconds": u.decode_seconds,
            "decodeTokPerSec": u.decode_tok_per_sec,
            "prefillMs": {"p50": percentile(prefill, 50), "p95": percentile(prefill, 95), "n": len(prefill)},
            "queueMs": {"p50": percentile(queue, 50), "p95": percentile(queue, 95), "n": len(queue)},
            "overheadMs": {"p50": percentile(overhead, 50), "p95": percentile(overhead, 95), "n": len(overhead)},
            "reusedTokens": u.reused_tokens,
            "prefixReuseRatio": u.reuse_ratio,
            "evictions": u.evictions,
            "draftedTokens": u.drafted_tokens,
            "acceptedTokens": u.accepted_tokens,
            **u.media_dict(),
            **self.rerank.to_dict(),
            "models": list(self.models),
            "modelStates": {m: {"state": st, "reason": why} for m, (st, why) in self.unwell.items()},
            "perModel": {name: t.to_dict() for name, t in sorted(self.per_model.items())},
            "pulls": [p.to_dict() for p in self.pulls.records()],
            "records": [r.to_dict() for r in recs],
        }
