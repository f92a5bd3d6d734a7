"""llama-server's own Prometheus series (``llamacpp:*``), written beside
turbospark's in ``/metrics`` with llama-server's names, types, help texts
and meanings (its ``--metrics``), so a Grafana dashboard made for
llama-server reads this server unchanged. They are summed over the server's
models (llama-server serves one) and carry no labels, as llama-server's.

From ``generated`` events (every generation, a remote model's too):

* ``prompt_tokens_total``, ``prompt_seconds_total``: prompt tokens prefilled
  (those a slot's KV did not already hold) and the prefill seconds;
  ``prompt_tokens_cached_total``: the tokens reused from a KV instead;
* ``tokens_predicted_total``, ``tokens_predicted_seconds_total``: tokens
  sampled, and the seconds from each generation's first token to its last;
* ``prompt_tokens_seconds``, ``predicted_tokens_seconds``: the rates over
  the window since the previous scrape (a scrape starts a new one, as
  llama-server's does): prompt tokens per prefill second, and decode steps
  per decode second, a generation's steps being its tokens but the first
  (which comes from the prompt's last batch), as llama-server counts them;
* ``n_tokens_max``: the longest sequence (prompt and output) so far;
* ``spec_decode_num_draft_tokens_total`` and ``..._accepted_tokens_total``.

Read at scrape time from the engines (``StepCounts``, kept once a model has
unloaded: a counter never goes back): ``n_decode_total`` (``llama_decode``
calls over token batches), ``n_busy_slots_per_decode`` (the sequences
running at each, on average) and ``spec_decode_num_drafts_total`` (steps
that verified drafts); and the state now: ``requests_processing`` (sequences
running) and ``requests_deferred`` (requests waiting for one).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..engine.types import StepCounts
from ..observe import Generated


@dataclass(slots=True)
class _Bucket:
    """Tokens, the steps that made them, and their seconds."""

    count: int = 0
    steps: int = 0
    seconds: float = 0.0

    def add(self, count: int, steps: int, seconds: float) -> None:
        self.count += count
        self.steps += steps
        self.seconds += seconds

    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


#: (name, help) of llama-server's counters, then of its gauges, in its order
COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    (
        "n_decode_total",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    ),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)


class LlamaServerMetrics:
    """The ``llamacpp:*`` series: fed by ``generated`` events and the
    engines' step counts, written by :meth:`exposition`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt, self.predict = _Bucket(), _Bucket()
        #: the same since the previous scrape (the rates' window)
        self.prompt_window, self.predict_window = _Bucket(), _Bucket()
        self.cached = 0
        self.tokens_max = 0
        self.drafted = self.accepted = 0
        #: the engines seen (live, or stopped since the last scrape), by identity
        self._engines: dict[int, StepCounts] = {}
        #: what the engines that have stopped had counted
        self._retired = StepCounts()

    def generated(self, g: Generated) -> None:
        processed = max(0, g.prompt_tokens - g.reused_prefix_tokens)
        steps = max(0, g.new_tokens - 1)
        with self._lock:
            for bucket in (self.prompt, self.prompt_window):
                bucket.add(processed, processed, g.prefill_seconds)
            for bucket in (self.predict, self.predict_window):
                bucket.add(g.new_tokens, steps, g.decode_seconds)
            self.cached += g.reused_prefix_tokens
            self.tokens_max = max(self.tokens_max, g.prompt_tokens + g.new_tokens)
            self.drafted += g.drafted_tokens
            self.accepted += g.accepted_tokens

    def engine(self, counts: StepCounts) -> None:
        """Follow an engine's step counts (a model loaded). One that has
        stopped is taken no more (its counts are in the retired total once
        it was followed)."""
        with self._lock:
            if not counts.closed:
                self._engines.setdefault(id(counts), counts)

    def _steps(self) -> StepCounts:
        """Every engine's counts summed; those of stopped engines folded
        into the retired total (their counts no longer change)."""
        total = StepCounts()
        with self._lock:
            for key, counts in list(self._engines.items()):
                if counts.closed:
                    retired = self._retired
                    retired.decodes += counts.decodes
                    retired.busy += counts.busy
                    retired.draft_steps += counts.draft_steps
                    del self._engines[key]
            for counts in [self._retired, *self._engines.values()]:
                total.decodes += counts.decodes
                total.busy += counts.busy
                total.draft_steps += counts.draft_steps
        return total

    def exposition(self, models: Iterable[Any]) -> bytes:
        """llama-server's text for the series (``models``: the backends
        resident now), starting a new window for the rates."""
        running = waiting = 0
        for model in models:
            control = model.slot_control()
            if control is None:
                continue
            self.engine(control.counts)
            try:
                state = model.load()
            except Exception:  # noqa: BLE001 - a model closing under the scrape
                continue
            running += int(state.get("running", 0))
            waiting += int(state.get("waiting", 0))
        steps = self._steps()
        with self._lock:
            counters = (
                self.prompt.count,
                self.cached,
                self.prompt.seconds,
                self.predict.count,
                self.predict.seconds,
                steps.decodes,
                self.tokens_max,
                self.drafted,
                self.accepted,
                steps.draft_steps,
            )
            gauges = (
                self.prompt_window.rate(),
                self.predict_window.rate(),
                running,
                waiting,
                steps.busy / max(steps.decodes, 1),
            )
            self.prompt_window, self.predict_window = _Bucket(), _Bucket()
        lines: list[str] = []
        for kind, names, values in (("counter", COUNTERS, counters), ("gauge", GAUGES, gauges)):
            for (name, help_text), value in zip(names, values):
                lines += [
                    f"# HELP llamacpp:{name} {help_text}",
                    f"# TYPE llamacpp:{name} {kind}",
                    f"llamacpp:{name} {_number(value)}",
                ]
        return ("\n".join(lines) + "\n").encode()


def _number(value: float) -> str:
    """A sample value as Prometheus' text format writes it."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
