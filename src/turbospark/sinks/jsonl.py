"""The JSONL event log (``turbospark serve --event-log FILE``).

``record`` only enqueues; a writer thread serializes and writes, so a slow
disk never stalls a request or the scheduler thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import IO

import orjson

from ..observe import ServerEvent

log = logging.getLogger("turbospark.sinks")

_STOP = object()


class JsonlSink:
    def __init__(self, path: str, flush_every: float = 0.5) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._file: IO[bytes] = open(path, "ab")
        self._flush_every = flush_every
        self._thread = threading.Thread(target=self._run, name="turbospark-jsonl", daemon=True)
        self._thread.start()

    def record(self, event: ServerEvent) -> None:
        self._queue.put(event)

    def _run(self) -> None:
        f = self._file
        while True:
            try:
                item = self._queue.get(timeout=self._flush_every)
            except queue.Empty:
                f.flush()
                continue
            if item is _STOP:
                break
            try:
                f.write(orjson.dumps(item.to_dict()) + b"\n")  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover - a bad disk must not kill the thread
                log.exception("event log write failed")
        f.flush()

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(5)
        self._file.close()
