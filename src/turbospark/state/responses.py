"""Stored responses and conversations (issue 37): a response keeps its input
items and its whole response object (output items, usage, status, error,
model, instructions, metadata, timestamps) under its tenant; a chain is
followed by ``previous_id`` back to its root; a conversation is an ordered
list of items. An id of another tenant is not found, as an unknown one."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from .conversations import ConversationStore
from .db import Database

VERSION = 1
SCHEMA = """
CREATE TABLE responses (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    status TEXT NOT NULL,
    previous_id TEXT,
    root_id TEXT NOT NULL,
    conversation_id TEXT,
    body TEXT NOT NULL,
    input TEXT NOT NULL
);
CREATE INDEX responses_expiry ON responses (expires_at);
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    metadata TEXT NOT NULL
);
CREATE TABLE conversation_items (
    conversation_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (conversation_id, position)
);
CREATE INDEX conversation_item_ids ON conversation_items (conversation_id, id);
"""
#: the longest chain followed (a loop or a runaway chain ends here)
MAX_CHAIN = 10_000
#: statuses of a run that has not ended
OPEN = ("queued", "in_progress")
DAY = 86_400.0


FILE = "responses.sqlite3"


def default_dir() -> str:
    """``$XDG_STATE_HOME/turbospark``, else ``~/.local/state/turbospark``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "turbospark")


@dataclass
class Stored:
    id: str
    tenant: str
    status: str
    previous_id: str | None
    root_id: str
    conversation_id: str | None
    body: dict[str, Any]
    input: list[dict[str, Any]]


_COLS = "id, tenant, status, previous_id, root_id, conversation_id, body, input"


def _stored(row: tuple[Any, ...]) -> Stored:
    rid, tenant, status, previous, root, conversation, body, items = row
    return Stored(rid, tenant, status, previous, root, conversation, json.loads(body), json.loads(items))


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class ResponseStore:
    """``folder``: where its SQLite file is (``--state-dir``); ``ttl``:
    seconds a response or a conversation is kept after it was written.
    Raises :class:`~.db.StateError` naming the file when it cannot be used."""

    def __init__(self, folder: str, ttl: float = 30 * DAY) -> None:
        path = os.path.join(os.path.abspath(os.path.expanduser(folder)), FILE)
        self.ttl = ttl
        self.db = Database(path, SCHEMA, VERSION)
        #: conversations, in the same file
        self.conversations = ConversationStore(self.db, ttl)
        self._expired_at = 0.0
        self.db.run_now(self._recover)

    @property
    def path(self) -> str:
        return self.db.path

    def close(self) -> None:
        self.db.close()

    # -- start-up -------------------------------------------------------------
    def _recover(self, db: sqlite3.Connection) -> int:
        """Runs cut by a crash are ``incomplete`` (their last state kept); expired rows go."""
        cut = db.execute(f"SELECT id, body FROM responses WHERE status IN {OPEN}").fetchall()
        for rid, body in cut:
            obj = json.loads(body)
            obj["status"] = "incomplete"
            obj["incomplete_details"] = {"reason": "interrupted"}
            db.execute("UPDATE responses SET status = 'incomplete', body = ? WHERE id = ?", (_dumps(obj), rid))
        self._expire(db)
        return len(cut)

    def _expire(self, db: sqlite3.Connection) -> None:
        now = time.time()
        self._expired_at = now
        db.execute("DELETE FROM responses WHERE expires_at < ?", (now,))
        gone = [r[0] for r in db.execute("SELECT id FROM conversations WHERE expires_at < ?", (now,))]
        for cid in gone:
            db.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (cid,))
            db.execute("DELETE FROM conversations WHERE id = ?", (cid,))

    def _maybe_expire(self, db: sqlite3.Connection) -> None:
        if time.time() - self._expired_at > 60:
            self._expire(db)

    # -- responses ----------------------------------------------------------------
    async def put(self, stored: Stored) -> None:
        """Write (or overwrite) a response: at its start, and at its end."""

        def write(db: sqlite3.Connection) -> None:
            self._maybe_expire(db)
            now = time.time()
            db.execute(
                "INSERT INTO responses (id, tenant, created_at, expires_at, status, previous_id, root_id, "
                "conversation_id, body, input) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE "
                "SET status = excluded.status, body = excluded.body",
                (
                    stored.id, stored.tenant, now, now + self.ttl, stored.status, stored.previous_id,
                    stored.root_id, stored.conversation_id, _dumps(stored.body), _dumps(stored.input),
                ),
            )  # fmt: skip

        await self.db.run(write)

    async def get(self, rid: str, tenant: str) -> Stored | None:
        def read(db: sqlite3.Connection) -> Stored | None:
            row = db.execute(f"SELECT {_COLS} FROM responses WHERE id = ? AND tenant = ?", (rid, tenant)).fetchone()
            return _stored(row) if row else None

        return await self.db.run(read)

    async def delete(self, rid: str, tenant: str) -> bool:
        def drop(db: sqlite3.Connection) -> bool:
            return db.execute("DELETE FROM responses WHERE id = ? AND tenant = ?", (rid, tenant)).rowcount > 0

        return await self.db.run(drop)

    async def chain(self, rid: str, tenant: str) -> list[Stored] | None:
        """The responses from the chain's root to ``rid``, oldest first; None
        when ``rid`` is not this tenant's. A response deleted in the middle
        ends the chain there (what came before it is no longer kept)."""

        def walk(db: sqlite3.Connection) -> list[Stored] | None:
            out: list[Stored] = []
            current: str | None = rid
            while current is not None and len(out) < MAX_CHAIN:
                row = db.execute(
                    f"SELECT {_COLS} FROM responses WHERE id = ? AND tenant = ?", (current, tenant)
                ).fetchone()
                if row is None:
                    break
                out.append(_stored(row))
                current = out[-1].previous_id
            return list(reversed(out)) if out else None

        return await self.db.run(walk)
