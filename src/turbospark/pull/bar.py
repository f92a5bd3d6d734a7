"""A pull as a terminal shows it: a bar with bytes, rate and time left on a
terminal; a plain line per 10 % (and each step) when the output is a file
or a pipe."""

from __future__ import annotations

import time
from typing import TextIO

from .puller import PullUpdate
from .store import gib


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class Bar:
    def __init__(self, out: TextIO, tty: bool | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self._file = ""
        self._since = (0.0, 0)  # when the file's bytes started arriving, and how many were there
        self._tenth = -1
        self._open = False  # a bar line is on the screen

    def __call__(self, update: PullUpdate) -> None:
        if not update.digest:
            self._end_line()
            self.out.write(update.status + "\n")
            self.out.flush()
            return
        if update.digest != self._file:
            self._end_line()
            self._file, self._tenth = update.digest, -1
            self._since = (time.monotonic(), update.completed)
        self._show(update)

    def _end_line(self) -> None:
        if self._open:
            self.out.write("\n")
            self._open = False

    def _show(self, u: PullUpdate) -> None:
        frac = min(u.completed / u.total, 1.0) if u.total else 0.0
        took = time.monotonic() - self._since[0]
        rate = (u.completed - self._since[1]) / took if took > 0.2 else 0.0
        left = f"{_duration((u.total - u.completed) / rate)} left" if rate > 0 and u.total else ""
        numbers = f"{gib(u.completed)} / {gib(u.total)}" + (f"  {gib(int(rate))}/s  {left}" if rate else "")
        if self.tty:
            bar = "#" * int(frac * 30) + "-" * (30 - int(frac * 30))
            self.out.write(f"\r{u.status} [{bar}] {frac * 100:5.1f}%  {numbers}\033[K")
            self._open = True
        else:
            tenth = int(frac * 10)
            if tenth == self._tenth:
                return
            self._tenth = tenth
            self.out.write(f"{u.status} {tenth * 10:3d}%  {numbers}\n")
        self.out.flush()
