"""Text charts for the console (Textual has no chart widget): Unicode
sparklines, stacked bars and pull progress bars, as rich ``Text``. Pure
functions of fold records, so they are tested without a terminal."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from ..fold import PullRecord, RequestRecord
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
    """Where the time went for the newest ``rows`` requests that generated
    or reranked: queued, prefill (a rerank's compute), decode and overhead
    (HTTP, templating) as one stacked bar each, on one scale."""
    done = [r for r in records if r.kind is not None][-rows:]
    if not done:
        return Text("no generations yet", style="dim")
    parts = [
        (
            r,
            (
                r.queued_ms or 0.0,
                r.engine_seconds[1] * 1000.0,
                r.engine_seconds[2] * 1000.0,
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


PULL_STYLES = {"pulling": ("pulling", "cyan"), "finished": ("pulled", "green"), "failed": ("failed", "bold red")}


def size_text(n: float) -> str:
    """Bytes as people read them (binary units, as ``turbospark pull``)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def pull_percent(p: PullRecord) -> int | None:
    """Whole percent done, rounded down (100 only once it all came); None
    while the size is not known (a finished pull of no told size: 100)."""
    if p.total <= 0:
        return 100 if p.state == "finished" else None
    return min(100, p.completed * 100 // p.total)


def pull_bar(p: PullRecord, width: int = 30) -> Text:
    """One pull: state, model, a bar of bytes done over the total, the
    percentage, the sizes and the rate; a failed one with its reason."""
    label, color = PULL_STYLES.get(p.state, (p.state, "yellow"))
    pct = pull_percent(p)
    done = 0 if pct is None else round(pct / 100 * width)
    out = Text()
    out.append(f"{label:<8}", style=color)
    out.append(printable(p.model), style="bold")
    out.append("  ")
    out.append("█" * done, style=color)
    out.append("░" * (width - done), style="dim")
    out.append(f" {'–' if pct is None else pct:>3}%  ", style="bold")
    sizes = size_text(p.completed) + (f" / {size_text(p.total)}" if p.total else "")
    out.append(sizes, style="")
    rate = p.bytes_per_sec
    if p.state == "finished" and p.seconds is not None:
        out.append(f" in {p.seconds:.1f} s", style="dim")
    if rate is not None:
        out.append(f"  {size_text(rate)}/s", style="dim")
    if p.state == "failed":
        out.append(f"  {printable(p.reason or 'failed')}", style="red")
    return out


def pulls_text(pulls: Sequence[PullRecord], width: int = 30) -> Text:
    """The pulls to show, one line each (empty: no line at all)."""
    out = Text()
    for i, p in enumerate(pulls):
        if i:
            out.append("\n")
        out.append(pull_bar(p, width))
    return out
