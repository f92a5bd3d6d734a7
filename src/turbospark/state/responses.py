"""Stored responses and conversations (issue 37): a response keeps its input
items and its whole response object (output items, usage, status, error,
model, instructions, metadata, timestamps) under its tenant; a chain is
followed by ``previous_id`` back to its root; a conversation is an ordered
list of items. An id of another tenant is not found, as an unknown one; an
expired one neither, on every read, whenever the clean-up last ran."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .conversations import ConversationStore
from .db import Database

VERSION = 3
#: a background run's stream events, as they were sent (``sequence_number`` from 0)
EVENTS = """
CREATE TABLE response_events (
    response_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (response_id, seq)
)"""
#: conversations listed by their last use (an item added), not their creation
USED = """
ALTER TABLE conversations ADD COLUMN used_at REAL NOT NULL DEFAULT 0;
UPDATE conversations SET used_at = created_at;
CREATE INDEX conversations_used ON conversations (tenant, used_at)"""
#: the script that brings a file of version N to N + 1, by N
MIGRATIONS = {1: EVENTS, 2: USED}
#: the tables of version 2 (a new file gets them, then every later script)
V2 = (
    EVENTS
    + """;
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
CREATE INDEX conversation_item_ids ON conversation_items (conversation_id, id)
"""
)
SCHEMA = V2 + ";" + USED
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
    Raises :class:`~.db.StateError` naming the file when it cannot be used.
    ``clock``: the time now (seconds since the epoch), every expiry's."""

    def __init__(self, folder: str, ttl: float = 30 * DAY, clock: Callable[[], float] = time.time) -> None:
        path = os.path.join(os.path.abspath(os.path.expanduser(folder)), FILE)
        self.ttl = ttl
        self.clock = clock
        self.db = Database(path, SCHEMA, VERSION, MIGRATIONS)
        #: conversations, in the same file (and on the same clock)
        self.conversations = ConversationStore(self.db, ttl, lambda: self.clock())
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
        """The clean-up: expired rows deleted (reads never see them anyway)."""
        now = self.clock()
        self._expired_at = now
        db.execute("DELETE FROM responses WHERE expires_at < ?", (now,))
        db.execute("DELETE FROM response_events WHERE response_id NOT IN (SELECT id FROM responses)")
        gone = [r[0] for r in db.execute("SELECT id FROM conversations WHERE expires_at < ?", (now,))]
        for cid in gone:
            db.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (cid,))
            db.execute("DELETE FROM conversations WHERE id = ?", (cid,))

    def _maybe_expire(self, db: sqlite3.Connection) -> None:
        if self.clock() - self._expired_at > 60:
            self._expire(db)

    # -- responses ----------------------------------------------------------------
    async def put(self, stored: Stored) -> None:
        """Write (or overwrite) a response: at its start, and at its end."""

        def write(db: sqlite3.Connection) -> None:
            self._maybe_expire(db)
            now = self.clock()
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

    def _row(self, db: sqlite3.Connection, rid: str, tenant: str) -> Stored | None:
        """Response ``rid`` of ``tenant`` while it is kept (None: unknown, another's or expired)."""
        row = db.execute(
            f"SELECT {_COLS} FROM responses WHERE id = ? AND tenant = ? AND expires_at >= ?",
            (rid, tenant, self.clock()),
        ).fetchone()
        return _stored(row) if row else None

    async def get(self, rid: str, tenant: str) -> Stored | None:
        return await self.db.run(lambda db: self._row(db, rid, tenant))

    async def delete(self, rid: str, tenant: str) -> bool:
        def drop(db: sqlite3.Connection) -> bool:
            gone = db.execute(
                "DELETE FROM responses WHERE id = ? AND tenant = ? AND expires_at >= ?", (rid, tenant, self.clock())
            )
            if gone.rowcount > 0:  # (another tenant's id: nothing of it touched)
                db.execute("DELETE FROM response_events WHERE response_id = ?", (rid,))
            return gone.rowcount > 0

        return await self.db.run(drop)

    async def chain(self, rid: str, tenant: str) -> list[Stored] | None:
        """The responses from the chain's root to ``rid``, oldest first; None
        when ``rid`` is not this tenant's (or expired). A response deleted or
        expired in the middle ends the chain there (what came before it is no longer kept)."""

        def walk(db: sqlite3.Connection) -> list[Stored] | None:
            out: list[Stored] = []
            current: str | None = rid
            while current is not None and len(out) < MAX_CHAIN:
                found = self._row(db, current, tenant)
                if found is None:
                    break
                out.append(found)
                current = found.previous_id
            return list(reversed(out)) if out else None

        return await self.db.run(walk)

    # -- items and events -----------------------------------------------------
    async def item(self, item_id: str, tenant: str) -> dict[str, Any] | None:
        """The kept item ``item_id`` of ``tenant`` (an ``item_reference``):
        from a response's input or output, or a conversation, the newest
        where several hold it; None: none of this tenant's kept ones."""
        needle = '"id":' + _dumps(item_id)  # (a cheap filter before the JSON is read)

        def find(db: sqlite3.Connection) -> dict[str, Any] | None:
            now, found = self.clock(), None
            for column, source in (("r.input", "r.input"), ("r.body", "r.body, '$.output'")):
                row = db.execute(
                    f"SELECT j.value, r.created_at FROM responses r, json_each({source}) j WHERE r.tenant = ? "
                    f"AND r.expires_at >= ? AND instr({column}, ?) > 0 "
                    "AND json_extract(j.value, '$.id') = ? ORDER BY r.created_at DESC LIMIT 1",
                    (tenant, now, needle, item_id),
                ).fetchone()
                if row is not None and (found is None or row[1] > found[1]):
                    found = row
            if found is None:
                found = db.execute(
                    "SELECT i.item, c.created_at, c.id FROM conversation_items i JOIN conversations c "
                    "ON c.id = i.conversation_id WHERE i.id = ? AND c.tenant = ? AND c.expires_at >= ? "
                    "ORDER BY c.created_at DESC, i.position DESC LIMIT 1",
                    (item_id, tenant, now),
                ).fetchone()
                if found is not None:  # (a use: the conversation is kept another ttl)
                    db.execute("UPDATE conversations SET expires_at = ? WHERE id = ?", (now + self.ttl, found[2]))
            return json.loads(found[0]) if found is not None else None

        return await self.db.run(find)

    async def add_events(self, rid: str, first: int, events: list[bytes]) -> None:
        """A run's stream events ``first``, ``first + 1`` ... kept as they were sent."""

        def write(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT OR REPLACE INTO response_events (response_id, seq, event) VALUES (?, ?, ?)",
                [(rid, first + n, event) for n, event in enumerate(events)],
            )

        if events:
            await self.db.run(write)

    async def events(self, rid: str, tenant: str) -> tuple[Stored | None, list[bytes]]:
        """The response and the stream events it keeps, in order (none: it
        was not a background run)."""

        def read(db: sqlite3.Connection) -> tuple[Stored | None, list[bytes]]:
            found = self._row(db, rid, tenant)
            if found is None:
                return None, []
            rows = db.execute("SELECT event FROM response_events WHERE response_id = ? ORDER BY seq", (rid,)).fetchall()
            return found, [bytes(row[0]) for row in rows]

        return await self.db.run(read)
