"""The one local store pulled models land in (``--models-dir``, default
under the user cache): files named by source (``hf/org/repo/file.gguf``,
``ollama/namespace/name/sha256-….gguf``, ``url/host/path/file.gguf``), partial
downloads and their locks under ``.partial/`` (never listed, never
attachable: hidden), and
an SQLite index (WAL) of what is installed. A row is written only after
every file of a model is in place and verified, so the index is the truth
about what can be loaded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1
INDEX = "index.sqlite3"
PARTIAL = ".partial"
_COLUMNS = (
    "name", "source", "reference", "files", "mmproj", "size", "digest", "architecture",
    "parameters", "context", "quant", "template", "params", "system", "pulled_at",
)  # fmt: skip


class StoreError(RuntimeError):
    """The store cannot be used (a newer or corrupt index, an unwritable folder)."""


class NoSpace(StoreError):
    """Not enough free disk for a download (the message has the numbers)."""


@dataclass
class Installed:
    """A model in the store: what ``turbospark models`` and ``/api/tags`` list."""

    name: str
    source: str
    reference: str
    #: store-relative paths; the first is the one llama.cpp opens (a split
    #: model's first part)
    files: list[str]
    mmproj: str | None = None
    size: int = 0
    #: ``sha256:<hex>`` of the (first) model file, as its source gave it
    digest: str = ""
    architecture: str = ""
    parameters: int = 0
    context: int = 0
    quant: str = ""
    #: the source's chat template, when it gave one (Ollama's Go template is kept, not run)
    template: str = ""
    #: presets the source gave (Ollama's params layer: temperature, num_ctx, stop ...)
    params: dict[str, Any] = field(default_factory=dict)
    system: str = ""
    pulled_at: float = field(default_factory=time.time)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


class Store:
    """Thread-safe (one connection, one lock; every call is short)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        try:
            os.makedirs(os.path.join(self.root, PARTIAL), exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the model store {self.root}: {exc.strerror or exc}") from None
        self._lock = threading.Lock()
        self._db = self._open(os.path.join(self.root, INDEX))
        #: the installed names, and the index files' (mtime, size) they were read at
        self._names: frozenset[str] = frozenset()
        self._stamp: list[tuple[int, int] | None] = []

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"{path} was written by a newer turbospark (schema {version}); upgrade to use it")
            if version == 0:
                cols = ", ".join(f"{c} {'TEXT PRIMARY KEY' if c == 'name' else ''}" for c in _COLUMNS)
                db.execute(f"CREATE TABLE IF NOT EXISTS models ({cols})")
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            return db
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"the model store's index {path} is unreadable: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- paths -------------------------------------------------------------
    def path(self, relative: str) -> str:
        """The absolute path of a store-relative one; never outside the store."""
        full = os.path.normpath(os.path.join(self.root, relative))
        if os.path.commonpath([full, self.root]) != self.root or full == self.root:
            raise StoreError(f"{relative!r} is not a path inside the model store")
        return full

    def partial(self, key: str) -> str:
        """Where a download of ``key`` (a digest, or a source) collects its bytes."""
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in key)
        if safe != key or len(key) > 100:  # (never two sources in one file)
            safe = f"{safe[-60:].lstrip('._-')}-{hashlib.sha256(key.encode()).hexdigest()[:24]}"
        return os.path.join(self.root, PARTIAL, safe + ".part")

    def ensure_space(self, needed: int) -> None:
        """Refuse, before any byte, a download the disk cannot hold."""
        free = shutil.disk_usage(self.root).free
        if needed > free:
            raise NoSpace(
                f"not enough disk space in the model store: the download needs {gib(needed)} more, {gib(free)} is free"
            )

    # -- the index -----------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @staticmethod
    def _row(row: tuple[Any, ...]) -> Installed:
        values = dict(zip(_COLUMNS, row, strict=True))
        values["files"] = json.loads(values["files"])
        values["params"] = json.loads(values["params"] or "{}")
        return Installed(**values)

    def add(self, model: Installed) -> None:
        """Record a model whose files are all in place (replacing one of the same name)."""
        for rel in model.files:
            if not os.path.isfile(self.path(rel)):
                raise StoreError(f"{rel} is not in the store")
        values = asdict(model)
        values["files"], values["params"] = json.dumps(model.files), json.dumps(model.params)
        marks = ", ".join("?" for _ in _COLUMNS)
        with self._tx() as db:
            db.execute(f"INSERT OR REPLACE INTO models VALUES ({marks})", [values[c] for c in _COLUMNS])

    def get(self, name: str) -> Installed | None:
        with self._lock:
            row = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM models WHERE name = ?", (name,)).fetchone()
        return self._row(row) if row else None

    def _known(self) -> frozenset[str]:
        """Every installed name, read again only when the index's files
        changed (another process's pull included): a name asked for that is
        none (clients send ``gpt-4o`` to a one-model server on every request)
        costs two ``stat`` calls, no query."""
        stamp: list[tuple[int, int] | None] = []
        for suffix in ("", "-wal"):
            try:
                st = os.stat(os.path.join(self.root, INDEX + suffix))
                stamp.append((st.st_mtime_ns, st.st_size))
            except OSError:
                stamp.append(None)
        if stamp != self._stamp:
            with self._lock:
                self._names = frozenset(r[0] for r in self._db.execute("SELECT name FROM models"))
            self._stamp = stamp
        return self._names

    def find(self, name: str) -> Installed | None:
        """By name, Ollama's ``:latest`` implied either way."""
        known = self._known()
        for candidate in (name, f"{name}:latest", name.removesuffix(":latest")):
            found = self.get(candidate) if candidate in known else None
            if found is not None:
                return found
        return None

    def models(self) -> list[Installed]:
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM models ORDER BY name").fetchall()
        return [self._row(r) for r in rows]

    def paths(self, model: Installed) -> list[str]:
        return [self.path(rel) for rel in model.files]

    def copy(self, source: str, target: str) -> Installed:
        """A second name for a model (Ollama's ``/api/copy``): the files are shared."""
        found = self.find(source)
        if found is None:
            raise KeyError(source)
        twin = Installed(**{**asdict(found), "name": target})
        self.add(twin)
        return twin

    def remove(self, name: str) -> Installed:
        """Forget a model; delete its files unless another name still uses them."""
        with self._tx() as db:
            row = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM models WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise KeyError(name)
            gone = self._row(row)
            db.execute("DELETE FROM models WHERE name = ?", (name,))
            used = set()
            for files, mmproj in db.execute("SELECT files, mmproj FROM models"):
                used.update([*json.loads(files), *([mmproj] if mmproj else [])])
        for rel in [*gone.files, *([gone.mmproj] if gone.mmproj else [])]:
            if rel not in used:
                try:
                    os.unlink(self.path(rel))
                except OSError:
                    pass
        return gone
