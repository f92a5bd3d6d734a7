"""Prometheus metrics (``GET /metrics``), fed only by events.

Names follow vLLM's metrics with a ``turbospark_`` prefix, so dashboards
built for one read the other. Every counter and histogram moves on an event
and nothing else; the only numbers read at scrape time are the engine's
*state* (sequences running and waiting now), which no event describes.

Each sink owns its ``CollectorRegistry`` (never the process-global one), so
several servers in one process keep separate numbers. llama-server's own
series (``llamacpp:*``) follow turbospark's in the exposition
(:mod:`.llamacpp`): the same events, and the engines' step counts.

Timing semantics, all from events:

* queue / prefill / decode: ``generated``'s engine-measured wall-clock
  intervals of the request (submitted → admitted → first token → last token);
* time to first token, *measured from arrival*: the receipt of the request's
  first ``generated`` minus its ``decodeSeconds`` (first → last token) minus
  the receipt of ``requestStarted``. ``generated`` carries no TTFT field on
  purpose;
* media encode: ``generated``'s ``mediaEncodeSeconds``, observed only for
  a generation that encoded media (a prefix that held them is no encode);
* a rerank's queue and compute seconds, pairs and tokens: ``ranked``;
* end-to-end latency and errors at ``requestFinished``, which ends every
  request when its response is really over (streams included): a request
  with status ≥ 400 or an ``error`` (a failed stream keeps its 200, a client
  that left is ``client disconnected``) counts in
  ``turbospark_request_errors_total``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..observe import (
    Generated,
    ModelAttached,
    ModelDetached,
    ModelHealth,
    ModelPull,
    Ranked,
    RequestFinished,
    RequestRouted,
    RequestStarted,
    ServerEvent,
)
from .llamacpp import LlamaServerMetrics
from .paths import UNMATCHED, RouteTemplates, default_templates, method_label

if TYPE_CHECKING:
    from ..core.backend import Backend
    from ..models.registry import Registry

#: Latency buckets (seconds), close to vLLM's: sub-10 ms for a tiny model on
#: a fast machine up to many minutes for a long generation on a CPU.
LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
#: Requests whose ``requestFinished`` has not come yet are remembered up to
#: this many (oldest forgotten first).
MAX_OPEN = 10_000


@dataclass(slots=True)
class _Open:
    """What the sink remembers about a request until its turn is over."""

    t0: float  # receipt of requestStarted (perf_counter)
    path: str
    method: str
    model: str | None = None
    generations: int = 0


class PrometheusSink:
    """An observer whose state is a set of Prometheus metrics.

    ``record`` does O(1) work under one short lock; it never blocks on I/O.
    """

    def __init__(self, templates: RouteTemplates | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._templates = templates
        self._lock = threading.Lock()
        self._open: OrderedDict[int, _Open] = OrderedDict()
        self._loaded: set[str] = set()
        self._load_collector: EngineLoadCollector | None = None
        self._replica_collector: ReplicaCollector | None = None
        #: llama-server's own series (``llamacpp:*``), and the models they read
        self.llamacpp = LlamaServerMetrics()
        self._models: Registry | None = None
        r = self.registry
        self._declare_request_counters(r)
        self._declare_token_counters(r)
        self._declare_latency_histograms(r)
        self._declare_media_metrics(r)
        self._declare_rerank_metrics(r)
        self.models_loaded = Gauge(
            "turbospark_models_loaded", "Models resident (modelAttached minus modelDetached).", registry=r
        )

    def _declare_request_counters(self, r: CollectorRegistry) -> None:
        """Requests by route and status, errors, completed generations."""
        self.requests = Counter(
            "turbospark_requests",
            "HTTP requests by route template, method and status.",
            ["path", "method", "status"],
            registry=r,
        )
        self.request_errors = Counter(
            "turbospark_request_errors",
            "Requests that ended in an error: status >= 400, a stream that failed after its headers, "
            "or a client that disconnected.",
            ["path", "method", "kind"],
            registry=r,
        )
        self.request_success = Counter(
            "turbospark_request_success",
            "Completed generations by stop reason.",
            ["model", "finished_reason"],
            registry=r,
        )

    def _declare_token_counters(self, r: CollectorRegistry) -> None:
        """Tokens (prompt, cached, generated, drafted, accepted), evictions, replicas down."""
        self.prompt_tokens = Counter(
            "turbospark_prompt_tokens", "Prompt tokens processed (reused prefix included).", ["model"], registry=r
        )
        self.prompt_tokens_cached = Counter(
            "turbospark_prompt_tokens_cached",
            "Prompt tokens taken from a slot's KV instead of prefilled.",
            ["model"],
            registry=r,
        )
        self.generation_tokens = Counter(
            "turbospark_generation_tokens", "Tokens sampled (the end-of-turn token included).", ["model"], registry=r
        )
        self.evictions = Counter(
            "turbospark_session_slot_evictions",
            "Generations that evicted another conversation's slot.",
            ["model"],
            registry=r,
        )
        self.replica_down = Counter(
            "turbospark_replica_down",
            "Times a replica (model id@replica) was taken out of routing (a failed health check or a request "
            "it failed before its first token), or a remote model outside any group got no answer to a request.",
            ["model"],
            registry=r,
        )
        self.drafted = Counter(
            "turbospark_spec_decode_num_draft_tokens", "Speculative tokens drafted.", ["model"], registry=r
        )
        self.accepted = Counter(
            "turbospark_spec_decode_num_accepted_tokens", "Speculative tokens accepted.", ["model"], registry=r
        )
        self.pulled_bytes = Counter(
            "turbospark_model_pull_bytes", "Bytes model pulls fetched over the network.", registry=r
        )
        self.pulls = Counter(
            "turbospark_model_pulls", "Model pulls that ended, by outcome (finished, failed).", ["outcome"], registry=r
        )

    def _declare_latency_histograms(self, r: CollectorRegistry) -> None:
        """Per-request latencies: end to end, queue, prefill, decode, time to first token."""
        self.e2e = Histogram(
            "turbospark_e2e_request_latency_seconds",
            "Arrival to the end of the response, for requests that generated or reranked.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "turbospark_request_queue_time_seconds",
            "Submitted to admitted into a sequence, per generation (engine wall clock).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prefill = Histogram(
            "turbospark_request_prefill_time_seconds",
            "Engine prefill seconds per generation.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.decode = Histogram(
            "turbospark_request_decode_time_seconds",
            "Engine decode seconds per generation.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "turbospark_time_to_first_token_from_arrival_seconds",
            "Request arrival to the first sampled token: receipt of the first generated - its "
            "decodeSeconds - receipt of requestStarted.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def _declare_media_metrics(self, r: CollectorRegistry) -> None:
        """Images and sounds in prompts: items, their tokens, encodes and encode time."""
        self.media_items = Counter(
            "turbospark_media_items", "Media items (images, sounds) in generations' prompts.", ["model"], registry=r
        )
        self.media_tokens = Counter(
            "turbospark_media_tokens",
            "Prompt tokens that media items took (counted in turbospark_prompt_tokens too).",
            ["model"],
            registry=r,
        )
        self.media_encoded = Counter(
            "turbospark_media_encoded",
            "Media items the projector encoded (the others came with a reused prefix's KV).",
            ["model"],
            registry=r,
        )
        self.media_encode = Histogram(
            "turbospark_media_encode_time_seconds",
            "Projector seconds per generation that encoded media (within its prefill time).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def _declare_rerank_metrics(self, r: CollectorRegistry) -> None:
        """Reranks: requests, (query, document) pairs, their tokens, queue and compute time."""
        self.reranks = Counter("turbospark_rerank_requests", "Rerank requests scored.", ["model"], registry=r)
        self.rerank_pairs = Counter(
            "turbospark_rerank_pairs", "(query, document) pairs reranks scored.", ["model"], registry=r
        )
        self.rerank_tokens = Counter(
            "turbospark_rerank_tokens", "Tokens of the pairs reranks scored.", ["model"], registry=r
        )
        self.rerank_queue = Histogram(
            "turbospark_rerank_queue_time_seconds",
            "Submitted to the first engine step, per rerank.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rerank_compute = Histogram(
            "turbospark_rerank_compute_time_seconds",
            "The first engine step to the end of the last, per rerank.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    # -- wiring ----------------------------------------------------------------
    def watch(self, models: Registry) -> None:
        """Report requests running/waiting of ``models`` (a ``Registry``) at
        scrape time. Rebinding replaces the previous source."""
        with self._lock:
            if self._load_collector is not None:
                self.registry.unregister(self._load_collector)
            if self._replica_collector is not None:
                self.registry.unregister(self._replica_collector)
            self._load_collector = EngineLoadCollector(models)
            self.registry.register(self._load_collector)
            self._replica_collector = ReplicaCollector(models)
            self.registry.register(self._replica_collector)
            self._models = models
        for model in models.models():  # (loaded before: later loads come as modelAttached)
            self._follow(model)

    def _follow(self, model: Backend | None) -> None:
        """Follow a model's engine steps for ``llamacpp:n_decode_total`` and friends."""
        control = model.slot_control() if model is not None else None
        if control is not None:
            self.llamacpp.engine(control.counts)

    def watch_event_log(self, sink: Any) -> None:
        """Report the event log's failed writes and lost events (``sink``: a
        ``JsonlSink``) at scrape time."""
        self.registry.register(EventLogCollector(sink))

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition (turbospark's series, then llama-server's)
        and its content type."""
        models = self._models.models() if self._models is not None else []
        return generate_latest(self.registry) + self.llamacpp.exposition(models), CONTENT_TYPE_LATEST

    def _template(self, path: str) -> str:
        if self._templates is None:
            self._templates = default_templates()
        return self._templates.of(path)

    # -- the observer ------------------------------------------------------------
    def record(self, event: ServerEvent) -> None:
        now = time.perf_counter()
        if isinstance(event, RequestStarted):
            entry = _Open(now, self._template(event.path), method_label(event.method))
            with self._lock:
                self._open[event.id] = entry
                while len(self._open) > MAX_OPEN:
                    self._open.popitem(last=False)
        elif isinstance(event, RequestRouted):
            with self._lock:
                o = self._open.get(event.id)
                if o is not None:
                    o.model = event.served
        elif isinstance(event, Generated):
            self._generated(event, now)
            self.llamacpp.generated(event)
        elif isinstance(event, Ranked):
            self._ranked(event)
        elif isinstance(event, RequestFinished):
            self._finished(event)
        elif isinstance(event, ModelPull):
            if event.phase in ("finished", "failed"):
                self.pulled_bytes.inc(event.fetched)
                self.pulls.labels(event.phase).inc()
        elif isinstance(event, ModelHealth):
            if event.state == "down":  # a replica taken out of routing, a lone remote model unanswering
                self.replica_down.labels(event.model).inc()
        elif isinstance(event, (ModelAttached, ModelDetached)):
            if isinstance(event, ModelAttached) and self._models is not None:
                known = self._models.lookup(event.model)
                self._follow(known.model if known is not None else None)
            with self._lock:
                if isinstance(event, ModelAttached):
                    self._loaded.add(event.model)
                else:
                    self._loaded.discard(event.model)
                self.models_loaded.set(len(self._loaded))

    def _generated(self, g: Generated, now: float) -> None:
        m = g.model
        self.prompt_tokens.labels(m).inc(g.prompt_tokens)
        self.prompt_tokens_cached.labels(m).inc(g.reused_prefix_tokens)
        self.generation_tokens.labels(m).inc(g.new_tokens)
        self.request_success.labels(m, g.stop_reason).inc()
        self.prefill.labels(m).observe(g.prefill_seconds)
        self.decode.labels(m).observe(g.decode_seconds)
        if g.session_slot_evicted:
            self.evictions.labels(m).inc()
        if g.drafted_tokens:
            self.drafted.labels(m).inc(g.drafted_tokens)
            self.accepted.labels(m).inc(g.accepted_tokens)
        self.queue_time.labels(m).observe(g.queue_seconds)
        if g.media_items:
            self.media_items.labels(m).inc(g.media_items)
            self.media_tokens.labels(m).inc(g.media_tokens)
            self.media_encoded.labels(m).inc(g.media_encoded)
            if g.media_encoded:
                self.media_encode.labels(m).observe(g.media_encode_seconds)
        with self._lock:
            o = self._open.get(g.id)
            if o is None:
                return
            first = o.generations == 0
            o.generations += 1
            o.model = m  # label e2e like the tokens: by the model that generated
        if first:
            self.ttft.labels(m).observe(max(0.0, now - g.decode_seconds - o.t0))

    def _ranked(self, k: Ranked) -> None:
        m = k.model
        self.reranks.labels(m).inc()
        self.rerank_pairs.labels(m).inc(k.pairs)
        self.rerank_tokens.labels(m).inc(k.prompt_tokens)
        self.rerank_queue.labels(m).observe(k.queue_seconds)
        self.rerank_compute.labels(m).observe(k.compute_seconds)
        with self._lock:
            o = self._open.get(k.id)
            if o is not None:  # (its end-to-end latency is observed as a generation's)
                o.generations += 1
                o.model = m

    def _finished(self, f: RequestFinished) -> None:
        with self._lock:
            o = self._open.pop(f.id, None)
        path, method = (o.path, o.method) if o is not None else (UNMATCHED, "other")
        self.requests.labels(path, method, str(f.status)).inc()
        if f.error == "client disconnected":  # its 499 too: the client's leaving, whenever it left
            self.request_errors.labels(path, method, "disconnected").inc()
        elif f.status >= 400:
            self.request_errors.labels(path, method, "status").inc()
        elif f.error:
            self.request_errors.labels(path, method, "stream").inc()
        if o is not None and o.generations and o.model is not None:
            self.e2e.labels(o.model).observe(f.duration_ms / 1000.0)


class EngineLoadCollector:
    """Sequences running and waiting per resident model, read at scrape time
    from the schedulers (state, not a number computed from events)."""

    def __init__(self, models: Registry) -> None:
        self.models = models

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        running = GaugeMetricFamily(
            "turbospark_num_requests_running", "Sequences in the engine's batch now.", labels=["model"]
        )
        waiting = GaugeMetricFamily(
            "turbospark_num_requests_waiting", "Requests queued for a sequence now.", labels=["model"]
        )
        for model in self.models.models():
            try:
                state = model.load()
            except Exception:  # a model closing under the scrape
                continue
            name = model.model_id
            running.add_metric([name], float(state.get("running", 0)))
            waiting.add_metric([name], float(state.get("waiting", 0)))
        return [running, waiting]


class ReplicaCollector:
    """Each replica group's replicas: up or down, and requests in flight,
    read at scrape time from the router (state now). What each replica
    served is in the per-model counters (``model="id@replica"``) and how
    often it went down in ``turbospark_replica_down_total``, from events."""

    def __init__(self, models: Registry) -> None:
        self.models = models

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        up = GaugeMetricFamily(
            "turbospark_replica_up",
            "1 while a replica of a group is routed to, 0 while it is down (health check or failed request).",
            labels=["model", "replica"],
        )
        in_flight = GaugeMetricFamily(
            "turbospark_replica_in_flight", "Requests a replica of a group is serving now.", labels=["model", "replica"]
        )
        for entry in self.models.entries():
            group = entry.group
            if group is None:
                continue
            for r in group.replicas:
                up.add_metric([group.id, r.name], 1.0 if r.up else 0.0)
                in_flight.add_metric([group.id, r.name], float(r.in_flight))
        return [up, in_flight]


class EventLogCollector:
    """The event log's own troubles, read at scrape time from the writer: a
    write that failed loses events no other sink would miss."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        errors = CounterMetricFamily(
            "turbospark_event_log_errors", "Writes to the event log that failed (a full disk, ...)."
        )
        errors.add_metric([], float(self.sink.errors))
        dropped = CounterMetricFamily(
            "turbospark_event_log_dropped", "Events the event log lost (failed writes, a full queue)."
        )
        dropped.add_metric([], float(self.sink.dropped))
        return [errors, dropped]
