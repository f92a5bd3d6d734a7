"""One SQLite file (WAL) used from one worker thread: every read and write
is a function run there, in order, so concurrent requests never lose a row
and the event loop never waits on the disk."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class StateError(RuntimeError):
    """The state file cannot be used (the message names it)."""


class Database:
    """``schema`` is run once on a new file; ``version`` is its
    ``user_version``: an older file is refused as a newer one is (no silent
    reset, no migration yet: this is the first version)."""

    def __init__(self, path: str, schema: str, version: int) -> None:
        self.path = path
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="turbospark-state")
        self._db: sqlite3.Connection | None = None
        try:
            self._pool.submit(self._open, schema, version).result()
        except BaseException:
            self._pool.shutdown(wait=False)
            raise

    def _open(self, schema: str, version: int) -> None:
        folder = os.path.dirname(self.path) or "."
        try:
            os.makedirs(folder, exist_ok=True)
            if not os.access(folder, os.W_OK):
                raise StateError(f"the state folder {folder} is not writable (--state-dir)")
            db = sqlite3.connect(self.path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            found = db.execute("PRAGMA user_version").fetchone()[0]
            if found == 0 and not db.execute("SELECT name FROM sqlite_master").fetchall():
                db.executescript(schema)
                db.execute(f"PRAGMA user_version={version}")
            elif found != version:
                newer = "a newer" if found > version else "an unknown"
                raise StateError(
                    f"{self.path} was written by {newer} turbospark (schema {found}, this one reads {version})"
                )
        except sqlite3.DatabaseError as exc:
            raise StateError(f"the state file {self.path} cannot be used: {exc}") from None
        except OSError as exc:
            raise StateError(f"the state file {self.path} cannot be created: {exc.strerror or exc}") from None
        self._db = db

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        assert self._db is not None
        try:
            self._db.execute("BEGIN IMMEDIATE")
            out = fn(self._db)
            self._db.execute("COMMIT")
            return out
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` in one transaction on the worker thread."""
        return await asyncio.wrap_future(self._pool.submit(self._run, fn))

    def run_now(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """The same, from a thread that may block (start-up, tests)."""
        return self._pool.submit(self._run, fn).result()

    def close(self) -> None:
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        self._pool.submit(shut).result()
        self._pool.shutdown(wait=True)
