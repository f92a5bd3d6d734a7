"""The Textual app behind ``turbospark console``.

Everything on screen comes from one :class:`~turbospark.views.fold.Fold` fed by
the server's ``/v1/events`` (through :class:`EventSource`), so it works the
same against a remote server. Events are folded as they arrive (pause only
freezes the screen, nothing is lost); the screen is redrawn at most four
times a second, touching only the rows whose requests changed. Model pulls
in progress get a bar under the header band; one that ended stays there for
:attr:`ConsoleApp.show_ended_s` after the console saw it end.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Footer, Static

from ..fold import Fold, PullRecord, RequestRecord
from .charts import pulls_text, rate_chart, time_chart
from .client import EventSource
from .text import plain, printable

COLUMNS = (
    ("id", "id"),
    ("status", "status"),
    ("method", "method"),
    ("path", "path"),
    ("requested → served", "route"),
    ("stream", "stream"),
    ("prompt", "prompt"),
    ("new", "new"),
    ("media", "media"),
    ("encoded", "encoded"),
    ("prefill ms", "prefill"),
    ("decode ms", "decode"),
    ("queued ms", "queued"),
    ("overhead ms", "overhead"),
    ("tok/s", "rate"),
    ("reused", "reused"),
    ("miss at", "miss"),
    ("evicted", "evicted"),
    ("turn", "turn"),
)
MAX_ROWS = 1000


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _models_text(f: Fold) -> Text:
    """The attached models; one whose last health report was not ``ok`` (a
    replica marked down, a stalled engine) in red, with that state."""
    out = Text()
    for i, name in enumerate(f.models):
        if i:
            out.append(", ")
        state = f.unwell.get(name)
        if state is None:
            out.append(printable(name), style="bold")
        else:
            out.append(printable(f"{name} {state[0]}"), style="bold red")
    return out if f.models else Text("–", style="bold")


def _media_band(f: Fold) -> list[tuple[str, Text | str, str]]:
    """The band's media entry, once any request had media."""
    u = f.usage
    if not u.media_items:
        return []
    return [("media", f"{u.media_items} ({u.media_tokens} tok, {u.media_encoded} encoded)", "")]


def _rerank_band(f: Fold) -> list[tuple[str, Text | str, str]]:
    """The band's rerank entry, once any request reranked."""
    r = f.rerank
    if not r.requests:
        return []
    return [("reranks", f"{r.requests} ({r.pairs} pairs, {_num(r.pairs_per_sec)} pairs/s)", "")]


def status_text(rec: RequestRecord) -> Text:
    if rec.status is None:
        return Text(rec.state, style="blue")
    style = "green" if rec.status < 400 else "yellow" if rec.status < 500 else "bold red"
    return Text(str(rec.status) + ("!" if rec.error and rec.status < 400 else ""), style=style)


def row_cells(rec: RequestRecord) -> list[Any]:
    """The table cells of one request, in :data:`COLUMNS` order."""
    gen = rec.usage.generations > 0
    ranked = rec.kind == "rerank"  # (its tokens are its pairs', its compute its prefill)
    route = "–" if rec.served is None else f"{rec.requested or '(none)'} → {rec.served}"
    rate = rec.usage.decode_tok_per_sec
    prompt = rec.rerank.tokens if ranked else rec.usage.prompt_tokens
    return [  # what a client chose is plain text (a str cell would be read as markup)
        str(rec.id),
        status_text(rec),
        plain(rec.method or "?"),
        plain(rec.path or "?"),
        plain(route),
        "–" if rec.stream is None else "yes" if rec.stream else "no",
        str(prompt) if gen or ranked else "–",
        str(rec.usage.new_tokens) if gen else f"{rec.rerank.pairs} pairs" if ranked else "–",
        *media_cells(rec),
        _num(rec.engine_seconds[1] * 1000.0) if gen or ranked else "–",
        _num(rec.engine_seconds[2] * 1000.0) if gen else "–",
        _num(rec.queued_ms),
        _num(rec.overhead_ms),
        _num(rate),
        str(rec.usage.reused_tokens) if gen else "–",
        str(rec.usage.prefix_miss_at) if gen and rec.usage.prefix_miss_at is not None else "–",
        ("yes" if rec.usage.evictions else "no") if gen else "–",
        _turn(rec),
    ]


def media_cells(rec: RequestRecord) -> tuple[str, str]:
    """A request's media: items and their tokens (inside its prompt
    tokens), then the items the projector encoded (the rest came with a
    reused prefix) and the milliseconds that took; ``–`` without media."""
    u = rec.usage
    if not u.media_items:
        return "–", "–"
    return f"{u.media_items} · {u.media_tokens} tok", f"{u.media_encoded} · {u.media_encode_ms:.1f} ms"


def _turn(rec: RequestRecord) -> str:
    """A Responses API request's turn in its chain (``+``: counted from the
    earliest turn seen)."""
    if rec.turn is None:
        return "–"
    return f"{rec.turn}" + ("" if rec.chain_start_seen else "+")


def details_text(rec: RequestRecord) -> Text:
    out = Text()
    out.append(f"request {rec.id}\n", style="bold")
    if rec.chain_text is not None:  # (a response id is the server's, never a client's)
        out.append(f"{printable(rec.response_id)}: {printable(rec.chain_text)}\n", style="bold cyan")
    for key, value in rec.to_dict().items():
        if key in ("id", "chainText") or value is None or (key.startswith("media") and not rec.usage.media_items):
            continue
        if isinstance(value, float):
            value = f"{value:.2f}"
        out.append(f"{key:<16} ", style="dim")
        out.append(f"{printable(value)}\n", style="red" if key == "error" else "")
    out.rstrip()
    return out


class ConsoleApp(App[None]):
    TITLE = "turbospark console"
    CSS = """
    #band { height: auto; padding: 0 1; background: $panel; }
    #pulls { height: auto; padding: 0 1; background: $panel; display: none; }
    #main { height: 1fr; }
    #requests { width: 3fr; }
    #details { width: 1fr; min-width: 30; padding: 0 1; border-left: solid $panel-lighten-2; }
    #charts { height: 12; border-top: solid $panel-lighten-2; }
    #rates, #times { width: 1fr; padding: 0 1; }
    """
    BINDINGS = [
        Binding("e", "toggle_errors", "errors only"),
        Binding("m", "next_model", "model filter"),
        Binding("p", "toggle_pause", "pause"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, url: str, api_key: str | None = None) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.fold = Fold(max_requests=MAX_ROWS)
        self.source = EventSource(self.url, api_key, on_state=self._set_state)
        self.state = "connecting"
        self.errors_only = False
        self.model_filter: str | None = None
        self.paused = False
        self.selected: int | None = None
        self._touched: set[int] = set()
        self._dirty = True
        self._rebuild = True
        #: how long a pull that ended stays on screen (seconds)
        self.show_ended_s = 30.0
        #: when this console first showed each ended pull, by (model, atMs)
        self._ended_seen: dict[tuple[str, float | None], float] = {}
        #: when the console first showed the oldest ended pull still shown (None: none is)
        self._ended_since: float | None = None

    # -- layout ----------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="band")
        yield Static(id="pulls")
        with Horizontal(id="main"):
            yield DataTable(id="requests", cursor_type="row", zebra_stripes=True)
            yield Static("select a request", id="details")
        with Horizontal(id="charts"):
            yield Static(id="rates")
            yield Static(id="times")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#requests", DataTable)
        for label, key in COLUMNS:
            table.add_column(label, key=key)
        self.run_worker(self._consume(), exclusive=True, name="events")
        self.set_interval(0.25, self._flush)
        self._flush()

    # -- feeding ---------------------------------------------------------
    async def _consume(self) -> None:
        async for event in self.source.events():
            runs = self.fold.runs
            rid = self.fold.feed(event)
            if self.fold.runs != runs:  # the server restarted: its ids start again
                self._rebuild = True
            if rid is not None:
                self._touched.add(rid)
            self._dirty = True

    def _set_state(self, state: str) -> None:
        self.state = state
        self._dirty = True

    # -- filters ---------------------------------------------------------
    def passes(self, rec: RequestRecord) -> bool:
        if self.errors_only and (rec.status is None or rec.status < 400):
            return False
        if self.model_filter is not None and self.model_filter not in (rec.served, rec.model):
            return False
        return True

    def action_toggle_errors(self) -> None:
        self.errors_only = not self.errors_only
        self._rebuild = self._dirty = True
        self._flush()

    def action_next_model(self) -> None:
        names = list(dict.fromkeys([*self.fold.models, *self.fold.per_model]))
        choices: list[str | None] = [None, *names]
        at = choices.index(self.model_filter) if self.model_filter in choices else 0
        self.model_filter = choices[(at + 1) % len(choices)]
        self._rebuild = self._dirty = True
        self._flush()

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self._dirty = True
        self._flush(force=True)

    def on_data_table_row_highlighted(self, message: DataTable.RowHighlighted) -> None:
        key = message.row_key.value
        self.selected = int(key) if key is not None else None
        self._show_details()

    # -- drawing ---------------------------------------------------------
    def _flush(self, force: bool = False) -> None:
        if not self._dirty or (self.paused and not force):
            if self.paused:
                self._draw_band()
            elif self._ended_since is not None and time.monotonic() >= self._ended_since + self.show_ended_s:
                self._draw_pulls()  # an ended pull's time on screen ran out
            return
        self._dirty = False
        self._draw_band()
        if self.paused:
            return
        self._draw_pulls()
        self._draw_table()
        records = [r for r in self.fold.records() if self.passes(r)]
        width = max(20, self.size.width // 2 - 30)
        self.query_one("#rates", Static).update(rate_chart(records, width=width))
        self.query_one("#times", Static).update(time_chart(records, width=width, rows=9))
        self._show_details()

    def _draw_band(self) -> None:
        f = self.fold
        state = "paused" if self.paused else self.state
        style = "green" if state == "live" else "blue" if state == "paused" else "yellow"
        filters = []
        if self.errors_only:
            filters.append("errors only")
        if self.model_filter:
            filters.append(f"model {printable(self.model_filter)}")
        band = Text()
        entries: list[tuple[str, Text | str, str]] = [
            ("state", state, style),
            ("address", self.url, ""),
            ("models", _models_text(f), ""),
            ("requests", str(f.requests), ""),
            ("in flight", str(f.in_flight), ""),
            ("errors", str(f.errors), "red" if f.errors else ""),
            ("decode tok/s", _num(f.usage.decode_tok_per_sec), ""),
            ("prefix reuse", "–" if f.usage.reuse_ratio is None else f"{f.usage.reuse_ratio:.0%}", ""),
            ("evictions", str(f.usage.evictions), ""),
            *_media_band(f),
            *_rerank_band(f),
            ("log gaps", str(f.dropped_events), "yellow" if f.dropped_events else ""),
        ]
        for label, value, vstyle in entries:
            band.append(f"{label} ", style="dim")
            if isinstance(value, Text):
                band.append(value)
            else:
                band.append(value, style=vstyle or "bold")
            band.append("   ")
        if filters:
            band.append("filter: " + ", ".join(filters), style="magenta")
        self.query_one("#band", Static).update(band)

    def shown_pulls(self) -> list[PullRecord]:
        """The pulls in progress, and those that ended less than
        :attr:`show_ended_s` ago (by this console's clock: the server's may
        be another machine's)."""
        now = time.monotonic()
        ended, since = [], []
        for p in self.fold.pulls.ended:
            seen = self._ended_seen.setdefault((p.model, p.at_ms), now)
            if now < seen + self.show_ended_s:
                ended.append(p)
                since.append(seen)
        self._ended_since = min(since, default=None)
        return [*self.fold.pulls.active.values(), *ended]

    def _draw_pulls(self) -> None:
        pulls = self.shown_pulls()
        widget = self.query_one("#pulls", Static)
        widget.display = bool(pulls)
        widget.update(pulls_text(pulls, width=max(10, min(40, self.size.width // 4))))
        kept = {(p.model, p.at_ms) for p in self.fold.pulls.ended}
        self._ended_seen = {k: v for k, v in self._ended_seen.items() if k in kept}

    def _draw_table(self) -> None:
        table = self.query_one("#requests", DataTable)
        if self._rebuild:
            self._rebuild = False
            self._touched.clear()
            table.clear()
            for rec in self.fold.records():
                if self.passes(rec):
                    table.add_row(*row_cells(rec), key=str(rec.id))
            return
        touched, self._touched = sorted(self._touched), set()
        for rid in touched:
            found = self.fold.record(rid)
            key = str(rid)
            present = key in table.rows
            if found is None or not self.passes(found):
                if present:
                    table.remove_row(key)
                continue
            cells = row_cells(found)
            if present:
                for (_, column), value in zip(COLUMNS, cells):
                    table.update_cell(key, column, value)
            else:
                table.add_row(*cells, key=key)
        while table.row_count > MAX_ROWS:
            table.remove_row(next(iter(table.rows)))

    def _show_details(self) -> None:
        rec = self.fold.record(self.selected) if self.selected is not None else None
        if rec is not None:
            self.query_one("#details", Static).update(details_text(rec))
