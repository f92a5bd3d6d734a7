"""``turbospark report EVENTS.jsonl [--out DIR]``: the offline view of an
``--event-log`` file. Folds it with :mod:`turbospark.views.fold` (the same fold as
the console and the dashboard), prints the summary and writes PNG plots.

matplotlib is an optional extra (``turbospark[report]``) imported only here,
with the Agg backend, so ``serve`` never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import IO, Any

import orjson

from .fold import Fold, RequestRecord

PLOTS = ("decode_rate.png", "time_breakdown.png", "prefix_reuse.png")


def read_events(path: str) -> Iterator[Any]:
    """Events from a JSONL log. A line that is not JSON (a torn last line:
    the server was killed mid-write) comes as None, which the fold counts as
    malformed and skips, rather than failing the whole report."""
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:
                yield None


def fold_file(path: str) -> Fold:
    return Fold(max_requests=None, samples=1_000_000).feed_all(read_events(path))


def _n(value: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def summary_lines(fold: Fold) -> list[str]:
    """The printed summary: one ``name  value`` line each, from the fold."""
    s = fold.summary(max_requests=0)
    rows = [
        ("events", str(s["events"])),
        ("requests", str(s["requests"])),
        ("errors", str(s["errors"])),
        ("in flight at end", str(s["inFlight"])),
        ("generations", str(s["generations"])),
        ("prompt tokens", str(s["promptTokens"])),
        ("new tokens", str(s["newTokens"])),
        ("decode tok/s", _n(s["decodeTokPerSec"], "{:.2f}")),
        ("prefill p50 ms", _n(s["prefillMs"]["p50"], "{:.2f}")),
        ("prefill p95 ms", _n(s["prefillMs"]["p95"], "{:.2f}")),
        ("queue p50 ms", _n(s["queueMs"]["p50"], "{:.2f}")),
        ("queue p95 ms", _n(s["queueMs"]["p95"], "{:.2f}")),
        ("overhead p50 ms", _n(s["overheadMs"]["p50"], "{:.2f}")),
        ("overhead p95 ms", _n(s["overheadMs"]["p95"], "{:.2f}")),
        ("reused prefix tokens", str(s["reusedTokens"])),
        ("prefix reuse ratio", _n(s["prefixReuseRatio"], "{:.4f}")),
        ("slot evictions", str(s["evictions"])),
        ("drafted tokens", str(s["draftedTokens"])),
        ("accepted tokens", str(s["acceptedTokens"])),
        ("media items", str(s["mediaItems"])),
        ("media tokens in prompt", str(s["mediaTokens"])),
        ("media encoded", str(s["mediaEncoded"])),
        ("media encode ms", _n(s["mediaEncodeMs"], "{:.2f}")),
        ("log gaps", str(s["droppedEvents"])),
        ("server runs", str(fold.runs)),
        ("unfinished (run ended)", str(fold.unfinished)),
        ("lines not read as events", str(fold.malformed)),
        ("models attached at end", ", ".join(s["models"]) or "–"),
    ]
    lines = [f"{name:<24}{value}" for name, value in rows]
    if s["perModel"]:
        lines.append("")
        lines.append(f"{'model':<24}{'requests':>9}{'prompt':>9}{'new':>9}{'decode tok/s':>14}")
        for name, m in s["perModel"].items():
            lines.append(
                f"{name:<24}{m['requests']:>9}{m['promptTokens']:>9}{m['newTokens']:>9}"
                f"{_n(m['decodeTokPerSec'], '{:.2f}'):>14}"
            )
    return lines


def _times(records: list[RequestRecord]) -> tuple[int, list[float]]:
    """Seconds since the first request, per record (records without a start
    time are placed at 0)."""
    starts = [r.at_ms for r in records if r.at_ms is not None]
    t0 = min(starts) if starts else 0
    return t0, [((r.at_ms or t0) - t0) / 1000.0 for r in records]


def write_plots(fold: Fold, out_dir: str) -> list[str]:
    """The three PNGs; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    generated = [r for r in fold.records() if r.usage.generations > 0]
    _, xs = _times(generated)
    paths = [os.path.join(out_dir, name) for name in PLOTS]

    # 1. decode rate over time, one series per model
    fig, ax = plt.subplots(figsize=(8, 4))
    by_model: dict[str, tuple[list[float], list[float]]] = {}
    for r, x in zip(generated, xs):
        if r.usage.decode_tok_per_sec is not None:
            pts = by_model.setdefault(r.model or r.served or "?", ([], []))
            pts[0].append(x)
            pts[1].append(r.usage.decode_tok_per_sec)
    for model, (mx, my) in by_model.items():
        ax.plot(mx, my, marker="o", label=model)
    ax.set(title="decode rate per request", xlabel="request start (s)", ylabel="tok/s")
    if by_model:
        ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0])
    plt.close(fig)

    # 2. where the time went, per request
    fig, ax = plt.subplots(figsize=(8, 4))
    ids = [str(r.id) for r in generated]
    bottom = [0.0] * len(generated)
    for label, part in (
        ("queued", [r.queued_ms or 0.0 for r in generated]),
        ("prefill", [r.usage.request_seconds[1] * 1000.0 for r in generated]),
        ("decode", [r.usage.request_seconds[2] * 1000.0 for r in generated]),
        ("overhead (HTTP, templating)", [r.overhead_ms or 0.0 for r in generated]),
    ):
        ax.bar(ids, part, bottom=bottom, label=label)
        bottom = [b + p for b, p in zip(bottom, part)]
    ax.set(title="time breakdown per request", xlabel="request id", ylabel="ms")
    if len(ids) > 30:
        ax.set_xticks([])
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[1])
    plt.close(fig)

    # 3. prefix reuse over time: per request and cumulative
    fig, ax = plt.subplots(figsize=(8, 4))
    per, cum, reused, prompt = [], [], 0, 0
    for r in generated:
        per.append(r.usage.reused_tokens / r.usage.prompt_tokens if r.usage.prompt_tokens else 0.0)
        reused += r.usage.reused_tokens
        prompt += r.usage.prompt_tokens
        cum.append(reused / prompt if prompt else 0.0)
    ax.scatter(xs, per, s=12, label="per request")
    ax.plot(xs, cum, color="black", label="cumulative")
    ax.set(title="prefix reuse (reused / prompt tokens)", xlabel="request start (s)", ylabel="ratio", ylim=(0, 1.05))
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[2])
    plt.close(fig)
    return paths


def report(path: str, out_dir: str, out: IO[str]) -> int:
    fold = fold_file(path)
    print(f"turbospark report: {path}", file=out)
    for line in summary_lines(fold):
        print(line, file=out)
    try:
        paths = write_plots(fold, out_dir)
    except ImportError:
        print("\nplots need matplotlib: pip install 'turbospark[report]'", file=out)
        return 1
    print("", file=out)
    for p in paths:
        print(f"wrote {p}", file=out)
    return 0
