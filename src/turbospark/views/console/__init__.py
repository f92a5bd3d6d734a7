"""``turbospark console``: a terminal view of a (possibly remote) server,
fed only by its ``/v1/events`` stream and folded with :mod:`turbospark.views.fold`."""

from __future__ import annotations


def run(url: str, api_key: str | None = None) -> int:
    from .app import ConsoleApp  # textual is imported only when the console runs

    ConsoleApp(url, api_key).run()
    return 0
