"""Text charts for the console (Textual has no chart widget): Unicode
sparklines and stacked bars, as rich ``Text``. Pure functions of fold
records, so they are tested without a terminal."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from ..fold import RequestRecord
from .text import printable

TICKS = "▁▂▃▄▅▆▇█"
MODEL_COLORS = ("cyan", "green", "yellow", "magenta", "blue", "red")
PARTS = (("queued", "yellow"), ("prefill", "cyan"), ("decode", "green"), ("overhead", "magenta"))


def sparkline(values: Sequence[float], top: float | None = None) -> str:
    """One character per value, scaled to ``top`` (default: the largest)."""
    if not values:
        return ""
    top = top if top is not None else max(values)
    if top <= 0:
        return TICKS[0] * len(values)
    last = len(TICKS) - 1
    return "".join(TICKS[min(last, max(0, round(v / top * last)))] for v in values)


def rate_chart(records: Sequence[RequestRecord], width: int = 60) -> Text:
    """Decode tok/s of each request, one sparkline per model (the newest
    ``width`` requests that decoded), on one shared scale."""
    out = Text()
    rated = [r for r in records if r.usage.decode_tok_per_sec is not None]
    if not rated:
        return Text("no decoded requests yet", style="dim")
    top = max(r.usage.decode_tok_per_sec or 0.0 for r in rated)
    models: dict[str, list[float]] = {}
    for r in rated:
        models.setdefault(printable(r.model or "?"), []).append(r.usage.decode_tok_per_sec or 0.0)
    label_w = min(24, max(len(m) for m in models))
    for i, (model, rates) in enumerate(models.items()):
        color = MODEL_COLORS[i % len(MODEL_COLORS)]
        line = rates[-width:]
        out.append(f"{model[:label_w]:<{label_w}} ", style=color)
        out.append(sparkline(line, top), style=color)
        out.append(f"  last {line[-1]:.1f}  max {max(line):.1f} tok/s\n", style="dim")
    out.rstrip()
    return out


def time_chart(records: Sequence[RequestRecord], width: int = 50, rows: int = 8) -> Text:
    """Where the time went for the newest ``rows`` requests that generated:
    queued, prefill, decode and overhead (HTTP, templating) as one stacked
    bar each, on one scale."""
    done = [r for r in records if r.usage.generations > 0][-rows:]
    if not done:
        return Text("no generations yet", style="dim")
    parts = [
        (
            r,
            (
                r.queued_ms or 0.0,
                r.usage.request_seconds[1] * 1000.0,
                r.usage.request_seconds[2] * 1000.0,
                r.overhead_ms or 0.0,
            ),
        )
        for r in done
    ]
    top = max(sum(ms) for _, ms in parts) or 1.0
    out = Text()
    for name, color in PARTS:
        out.append("█ ", style=color)
        out.append(name + "  ", style="dim")
    out.append("\n")
    for r, ms in parts:
        out.append(f"#{r.id:<5}", style="dim")
        for part, (_, color) in zip(ms, PARTS):
            out.append("█" * round(part / top * width), style=color)
        out.append(f" {sum(ms):.0f} ms\n", style="dim")
    out.rstrip()
    return out
