"""Conversations (issue 37): an ordered list of items under its tenant, in
the response store's SQLite file. A turn of ``/v1/responses`` naming one
reads its items before its own input and appends its input and output
items when it ends; clients add, read and delete items directly too. Each
use keeps a conversation another ``ttl``. An id of another tenant is not
found, as an unknown one; an expired one neither, on every route, whenever
the clean-up last ran. Its last use is when an item was last added (a
turn, or items posted): the tenant's list is newest use first."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .db import Database


@dataclass
class Conversation:
    id: str
    created_at: float
    metadata: dict[str, str]

    def public(self) -> dict[str, Any]:
        """OpenAI's conversation object."""
        return {"id": self.id, "object": "conversation", "created_at": int(self.created_at), "metadata": self.metadata}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def new_conversation_id() -> str:
    return "conv_" + uuid.uuid4().hex


class ConversationStore:
    """``db``: the response store's database; ``ttl``: seconds a conversation
    is kept after its last use (read or written); ``clock``: the time now."""

    def __init__(self, db: Database, ttl: float, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.ttl = ttl
        self.clock = clock

    def _touch(self, db: sqlite3.Connection, cid: str, tenant: str) -> Conversation | None:
        """The live conversation, kept another ``ttl`` (None: not this tenant's, or expired)."""
        now = self.clock()
        row = db.execute(
            "SELECT created_at, metadata FROM conversations WHERE id = ? AND tenant = ? AND expires_at >= ?",
            (cid, tenant, now),
        ).fetchone()
        if row is None:
            return None
        db.execute("UPDATE conversations SET expires_at = ? WHERE id = ?", (now + self.ttl, cid))
        return Conversation(cid, row[0], json.loads(row[1]))

    def _append(self, db: sqlite3.Connection, cid: str, items: list[dict[str, Any]]) -> None:
        """``items`` at its end; when there are any, a use: it moves to the top of the list."""
        if items:
            db.execute("UPDATE conversations SET used_at = ? WHERE id = ?", (self.clock(), cid))
        last = db.execute("SELECT MAX(position) FROM conversation_items WHERE conversation_id = ?", (cid,)).fetchone()
        start = (last[0] if last[0] is not None else -1) + 1
        db.executemany(
            "INSERT INTO conversation_items (conversation_id, position, id, item) VALUES (?, ?, ?, ?)",
            [(cid, start + n, str(item.get("id")), _dumps(item)) for n, item in enumerate(items)],
        )

    async def create(self, tenant: str, metadata: dict[str, str], items: list[dict[str, Any]]) -> Conversation:
        """A new conversation holding ``items`` (each with its id)."""
        made = Conversation(new_conversation_id(), self.clock(), metadata)

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO conversations (id, tenant, created_at, expires_at, metadata, used_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (made.id, tenant, made.created_at, made.created_at + self.ttl, _dumps(metadata), made.created_at),
            )
            self._append(db, made.id, items)

        await self.db.run(write)
        return made

    async def listing(
        self, tenant: str, limit: int, after: str | None = None, search: str | None = None
    ) -> tuple[list[Conversation], bool] | None:
        """The tenant's live conversations, the last used first (an item
        added; then by id), from the one after ``after`` (where it is now:
        one used while a client pages moves to the top); ``search``: only
        those whose ``title`` (metadata) holds it, in any case. None:
        ``after`` is none of them. Listing is no use: it keeps nothing longer."""

        def read(db: sqlite3.Connection) -> tuple[list[Conversation], bool] | None:
            now = self.clock()
            where, args = "tenant = ? AND expires_at >= ?", [tenant, now]
            if after is not None:
                row = db.execute(f"SELECT used_at FROM conversations WHERE id = ? AND {where}", (after, *args))
                start = row.fetchone()
                if start is None:
                    return None
                where += " AND (used_at < ? OR (used_at = ? AND id < ?))"
                args += [start[0], start[0], after]
            rows = db.execute(
                f"SELECT id, created_at, metadata FROM conversations WHERE {where} ORDER BY used_at DESC, id DESC",
                args,
            )
            wanted = search.casefold() if search else None
            found: list[Conversation] = []
            for cid, created_at, raw in rows:
                metadata = json.loads(raw)
                if wanted is not None and wanted not in str(metadata.get("title", "")).casefold():
                    continue
                if len(found) == limit:
                    return found, True
                found.append(Conversation(cid, created_at, metadata))
            return found, False

        return await self.db.run(read)

    async def get(self, cid: str, tenant: str) -> Conversation | None:
        return await self.db.run(lambda db: self._touch(db, cid, tenant))

    async def update(self, cid: str, tenant: str, metadata: dict[str, str]) -> Conversation | None:
        """Its metadata replaced."""

        def write(db: sqlite3.Connection) -> Conversation | None:
            found = self._touch(db, cid, tenant)
            if found is not None:
                db.execute("UPDATE conversations SET metadata = ? WHERE id = ?", (_dumps(metadata), cid))
                found.metadata = metadata
            return found

        return await self.db.run(write)

    async def delete(self, cid: str, tenant: str) -> bool:
        """The conversation and its items gone (responses made in it stay)."""

        def drop(db: sqlite3.Connection) -> bool:
            if self._touch(db, cid, tenant) is None:
                return False
            db.execute("DELETE FROM conversations WHERE id = ?", (cid,))
            db.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (cid,))
            return True

        return await self.db.run(drop)

    async def items(self, cid: str, tenant: str) -> list[dict[str, Any]] | None:
        """Its items, oldest first (None: no such conversation)."""

        def read(db: sqlite3.Connection) -> list[dict[str, Any]] | None:
            if self._touch(db, cid, tenant) is None:
                return None
            rows = db.execute(
                "SELECT item FROM conversation_items WHERE conversation_id = ? ORDER BY position", (cid,)
            ).fetchall()
            return [json.loads(row[0]) for row in rows]

        return await self.db.run(read)

    async def append(self, cid: str, tenant: str, items: list[dict[str, Any]]) -> bool:
        """``items`` added at its end (False: no such conversation)."""

        def write(db: sqlite3.Connection) -> bool:
            if self._touch(db, cid, tenant) is None:
                return False
            self._append(db, cid, items)
            return True

        return await self.db.run(write)

    async def item(self, cid: str, tenant: str, item_id: str) -> tuple[Conversation | None, dict[str, Any] | None]:
        """The conversation and its item ``item_id`` (either None: not found)."""

        def read(db: sqlite3.Connection) -> tuple[Conversation | None, dict[str, Any] | None]:
            found = self._touch(db, cid, tenant)
            if found is None:
                return None, None
            row = db.execute(
                "SELECT item FROM conversation_items WHERE conversation_id = ? AND id = ? ORDER BY position LIMIT 1",
                (cid, item_id),
            ).fetchone()
            return found, json.loads(row[0]) if row else None

        return await self.db.run(read)

    async def delete_item(self, cid: str, tenant: str, item_id: str) -> tuple[Conversation | None, bool]:
        """The conversation, and whether it had the item (now gone)."""

        def drop(db: sqlite3.Connection) -> tuple[Conversation | None, bool]:
            found = self._touch(db, cid, tenant)
            if found is None:
                return None, False
            gone = db.execute(
                "DELETE FROM conversation_items WHERE conversation_id = ? AND id = ?", (cid, item_id)
            ).rowcount
            return found, gone > 0

        return await self.db.run(drop)
