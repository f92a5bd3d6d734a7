"""One SQLite file (WAL) used from one worker thread: every read and write
is a function run there, in order, so concurrent requests never lose a row
and the event loop never waits on the disk. The file holds every tenant's
prompts: its folder is made 0700 and the file, its ``-wal`` and ``-shm``
0600, whatever the umask (a file an older version made 0644 is tightened)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sqlite3
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")


#: what SQLite writes beside the file in WAL mode
SIDE_FILES = ("-wal", "-shm")


class StateError(RuntimeError):
    """The state file cannot be used (the message names it)."""


def private_folder(folder: str) -> None:
    """``folder``, made 0700 when it is made here (one that exists is the
    operator's, left as it is)."""
    if os.path.isdir(folder):
        return
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # (makedirs' mode is cut by the umask)


def private_file(path: str, create: bool = True) -> None:
    """``path`` readable by its owner only: made 0600 (``create``), or
    tightened when it exists and is ours. By path, never by opening it once
    SQLite has: closing a descriptor would drop the connection's locks."""
    if create:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if mode & 0o077:
        with contextlib.suppress(OSError):  # (not ours to change: it stays as it is)
            os.chmod(path, 0o600)


class Database:
    """``schema`` is run once on a new file; ``version`` is its
    ``user_version``. An older file is brought up to it by ``migrations``
    (the script that takes version N to N + 1, by N), each in one
    transaction; a newer or unknown one is refused (no silent reset)."""

    def __init__(self, path: str, schema: str, version: int, migrations: Mapping[int, str] | None = None) -> None:
        self.path = path
        self._migrations = dict(migrations or {})
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
            private_folder(folder)
            if not os.access(folder, os.W_OK):
                raise StateError(f"the state folder {folder} is not writable (--state-dir)")
            private_file(self.path)  # (SQLite gives -wal and -shm the file's own mode)
            db = sqlite3.connect(self.path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            for side in SIDE_FILES:  # (left by an older version: tightened too)
                private_file(self.path + side, create=False)
            found = db.execute("PRAGMA user_version").fetchone()[0]
            if found == 0 and not db.execute("SELECT name FROM sqlite_master").fetchall():
                db.executescript(schema)
                db.execute(f"PRAGMA user_version={version}")
                found = version
            while 0 < found < version and found in self._migrations:
                db.executescript(f"BEGIN; {self._migrations[found]}; PRAGMA user_version={found + 1}; COMMIT;")
                found += 1
            if found != version:
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
