"""The JSONL event log (``turbospark serve --event-log FILE``).

``record`` only enqueues; a writer thread serializes and writes, so a slow
disk never stalls a request or the scheduler thread. The log never takes the
server down:

- the queue is bounded (:data:`MAX_QUEUE` events): past it the oldest waiting
  event is dropped, and counted;
- a write that fails (a full disk, a vanished mount) is logged once, counted,
  and its events are dropped; the writer keeps trying, and when the disk
  accepts again it logs that and carries on;
- wherever events were lost, the file gets a gap marker
  ``{"kind": "gap", "atMs": ..., "missed": N}`` before the next event, which
  the readers (``fold``, ``turbospark report``) count as dropped;
- with ``max_bytes`` (``--event-log-max-bytes``) a file that would grow past
  it is renamed to ``FILE.1`` (replacing the previous one) and a new one begun.

``errors`` and ``dropped`` are read by ``/metrics``
(``turbospark_event_log_errors_total``, ``turbospark_event_log_dropped_total``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time

import orjson

from ..observe import ServerEvent, now_ms

log = logging.getLogger("turbospark.sinks")

#: events waiting to be written before the oldest is dropped
MAX_QUEUE = 100_000
#: events written in one system call at most
BATCH = 512
#: after a failed write, how long before the next try (seconds)
RETRY_SECONDS = 1.0


class JsonlSink:
    def __init__(
        self,
        path: str,
        flush_every: float = 0.5,
        max_bytes: int | None = None,
        max_queue: int = MAX_QUEUE,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_queue = max(1, max_queue)
        #: failed writes, and events lost (dropped from a full queue or in a failed write)
        self.errors = 0
        self.dropped = 0
        self._queue: collections.deque[ServerEvent] = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._missed = 0  # lost since the last gap marker
        self._failing = False
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size
        # a partial line may end the file (a process killed mid-write, a full
        # disk): the first line written starts on a line of its own
        self._torn = not _ends_a_line(self.path, self._size)
        self._flush_every = flush_every
        self._thread = threading.Thread(target=self._run, name="turbospark-jsonl", daemon=True)
        self._thread.start()

    def _open(self) -> int:
        # (readable by its owner only: paths, model names and errors quoting
        # requests; a file an older version made 0644 too)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        with contextlib.suppress(OSError):  # (not ours to change: it stays as it is)
            os.fchmod(fd, 0o600)
        return fd

    # -- the observer --------------------------------------------------------
    def record(self, event: ServerEvent) -> None:
        with self._cond:
            if len(self._queue) >= self.max_queue:
                self._queue.popleft()
                self.dropped += 1
                self._missed += 1
            self._queue.append(event)
            if len(self._queue) >= BATCH:
                self._cond.notify()

    # -- the writer thread ---------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._stop:
                    self._cond.wait(self._flush_every)
                if not self._queue and self._stop:
                    return
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                missed = self._missed
            if not batch:  # a gap marker waits for the next event
                continue
            if not self._write(batch, missed) and not self._stop:
                time.sleep(RETRY_SECONDS)

    def _write(self, batch: list[ServerEvent], missed: int) -> bool:
        lines = []
        if missed:
            lines.append(orjson.dumps({"kind": "gap", "atMs": now_ms(), "missed": missed}))
        for event in batch:
            try:
                lines.append(orjson.dumps(event.to_dict()))
            except Exception:  # an event that cannot be written must not stop the writer
                log.exception("an event could not be serialized for the event log")
                with self._cond:
                    self.dropped += 1
                    self._missed += 1  # marked by the next write's gap line
        data = b"\n".join(lines) + b"\n"
        if self._torn:
            data = b"\n" + data
        written = 0
        try:
            if self._fd < 0:  # a failed rotation or reopen: try again
                self._fd = self._open()
                self._size = os.fstat(self._fd).st_size
            self._rotate_for(len(data))
            while written < len(data):
                n = os.write(self._fd, data[written:])
                if n <= 0:
                    raise OSError("the event log accepted no bytes")
                written += n
        except OSError as exc:
            if written:
                self._untear()
            with self._cond:
                self.errors += 1
                self.dropped += len(batch)
                self._missed += len(batch)
            if not self._failing:
                self._failing = True
                log.error("writing the event log %s failed (%s); events are dropped until it works", self.path, exc)
            return False
        self._torn = False
        self._size += len(data)
        with self._cond:
            self._missed -= missed
        if self._failing:
            self._failing = False
            log.warning("the event log %s is writable again (%d events were lost)", self.path, missed)
        return True

    def _untear(self) -> None:
        """Cut a partly written batch off the file, so every line stays
        whole; if that fails too, the next write starts on a new line."""
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            self._torn = True

    def _rotate_for(self, incoming: int) -> None:
        """Start a new file (the old one kept as ``FILE.1``) if this write
        would take the current one past ``max_bytes``."""
        if not self.max_bytes or self._size == 0 or self._size + incoming <= self.max_bytes:
            return
        os.close(self._fd)
        self._fd = -1
        try:
            os.replace(self.path, self.path + ".1")
        finally:
            self._fd = self._open()
            self._size = os.fstat(self._fd).st_size
        self._torn = False

    def close(self) -> None:
        """Write everything still queued, then close the file."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(30)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _ends_a_line(path: str, size: int) -> bool:
    """The file is empty or its last byte ends a line."""
    if not size:
        return True
    try:
        with open(path, "rb") as f:
            f.seek(size - 1)
            return f.read(1) == b"\n"
    except OSError:
        return True
