"""A failing model's reload backoff: a model whose engine died (or whose
reload failed) is reloaded by the next request that wants it, after a backoff
that doubles with each consecutive failure (1 s … 60 s); after
:data:`MAX_FAILURES` in a row it stays failed until attached again, and one
that runs :data:`HEALTHY_AFTER` seconds without failing is healthy again."""

from __future__ import annotations

import logging
import time

from .entry import Entry, RoutingError

log = logging.getLogger("turbospark.registry")

#: consecutive engine failures (or failed reloads) after which a model is
#: no longer reloaded by requests
MAX_FAILURES = 5
#: the longest wait between reloads of a failing model (seconds)
MAX_BACKOFF = 60.0
#: a reloaded model that runs this long without failing is healthy again
HEALTHY_AFTER = 60.0


def note_failure(entry: Entry, why: str) -> None:
    """One more failure in a row: the next reload waits the longer."""
    entry.failure = why
    entry.failures += 1
    backoff = min(MAX_BACKOFF, 2.0 ** (entry.failures - 1))
    entry.retry_at = time.monotonic() + backoff
    log.error("%s failed (%d in a row): %s; reloaded on demand after %.0f s", entry.id, entry.failures, why, backoff)


def refuse_reload(entry: Entry) -> None:
    """Refuse (503) a reload of a failed model while it backs off, or
    once it has failed :data:`MAX_FAILURES` times in a row."""
    if entry.failures >= MAX_FAILURES:
        raise RoutingError(
            503,
            f"model {entry.id!r} failed {entry.failures} times in a row ({entry.failure}); "
            "it is not reloaded again until it is attached anew",
            "model_failed",
        )
    wait = entry.retry_at - time.monotonic()
    if wait > 0:
        raise RoutingError(
            503,
            f"model {entry.id!r} failed ({entry.failure}); it is reloaded in {wait:.0f} s",
            "model_failed",
            retry_after=max(1, round(wait)),
        )


def forgive(entry: Entry, now: float) -> None:
    """Forget the failures of a model that has run well for a while."""
    if entry.failures and now - entry.healthy_since >= HEALTHY_AFTER:
        entry.failures = 0
