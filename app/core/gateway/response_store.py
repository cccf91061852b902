"""Stored Responses: what ``POST /v1/responses`` kept (``store``, on by default, as OpenAI), so
that a later request continues it by ``previous_response_id`` and ``GET``/``DELETE
/v1/responses/{id}`` read or remove it.

One SQLite file in the data folder (0600, its folder 0700), in WAL mode, so a restart of
``hearth serve`` finds what was kept. Each entry belongs to the caller's partition (the key's response-cache
partition, "" without a key): any other partition sees nothing, as if the id did not exist.
Bounded by age (``responses.max_age_days``) and size (``responses.max_bytes``): past either,
the oldest entries go first. The entries are the wire's JSON, opaque here: the Responses
adapter builds and reads them.
Tested by tests/core/gateway/test_response_store.py.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.core.util.sqlite_wal import open_wal

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, partition TEXT NOT NULL, "
    "created REAL NOT NULL, size INTEGER NOT NULL, payload TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS responses_created ON responses (created)",
)
DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class ResponseStoreConfig:
    """The ``responses`` settings: how long a stored response is kept, and how many bytes all
    of them may take (past either, the oldest go first)."""

    max_age_days: float = 30.0
    max_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One kept response.

    Attributes:
        id: the response's id (``resp_...``).
        response: the response object as it was sent.
        input: the conversation's items before this response's output (each with an id): the
            response it continued, its input and output, then this request's input.
    """

    id: str
    response: dict[str, Any]
    input: list[dict[str, Any]] = field(default_factory=list)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """Every item through this response's output: what a continuation of it prepends."""
        return [*self.input, *self.response.get("output", [])]


class ResponseStorage(Protocol):
    """Where kept responses live: this SQLite store, or the shared Redis one
    (app/redis_state/responses.py) that several gateways read."""

    def put(self, partition: str, entry: StoredResponse) -> None: ...

    def get(self, partition: str, response_id: str) -> StoredResponse | None: ...

    def delete(self, partition: str, response_id: str) -> bool: ...

    def close(self) -> None: ...


class ResponseStore:
    """The kept responses. Every method is a short SQLite statement under one lock; they are
    called on the service loop (a write before ``response.completed`` is sent, so the next
    request that continues it always finds it)."""

    def __init__(
        self,
        path: Path,
        config: Callable[[], ResponseStoreConfig] = ResponseStoreConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            # created 0600 before SQLite opens it, in a 0700 folder (its -wal and -shm files
            # too): prompts and answers are the caller's
            self.path.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self.path.parent, 0o700)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            os.chmod(self.path, 0o600)
            self._conn = open_wal(self.path, _SCHEMA, SCHEMA_VERSION)
        return self._conn

    def put(self, partition: str, entry: StoredResponse) -> None:
        """Keep ``entry`` for ``partition``, then evict past the bounds (oldest first). An
        entry larger than the whole size bound is not kept."""
        payload = json.dumps(
            {"response": entry.response, "input": entry.input},
            separators=(",", ":"),
        )
        size = len(payload.encode())
        cfg = self._config()
        if size > cfg.max_bytes:
            log.warning(
                "response %s (%d bytes) is over responses.max_bytes; not kept", entry.id, size
            )
            return
        with self._lock:
            conn = self._db()
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "INSERT OR REPLACE INTO responses (id, partition, created, size, payload) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (entry.id, partition, self._clock(), size, payload),
                )
                self._evict(conn, cfg)

    def _evict(self, conn: sqlite3.Connection, cfg: ResponseStoreConfig) -> None:
        conn.execute(
            "DELETE FROM responses WHERE created < ?", (self._clock() - cfg.max_age_days * DAY_S,)
        )
        total = conn.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
        if total <= cfg.max_bytes:
            return
        over = total - cfg.max_bytes
        doomed: list[str] = []
        for rid, size in conn.execute("SELECT id, size FROM responses ORDER BY created, rowid"):
            doomed.append(rid)
            over -= size
            if over <= 0:
                break
        conn.executemany("DELETE FROM responses WHERE id = ?", [(r,) for r in doomed])

    def get(self, partition: str, response_id: str) -> StoredResponse | None:
        """The entry ``response_id`` if ``partition`` kept it and it has not expired."""
        max_age = self._config().max_age_days * DAY_S
        with self._lock:
            row = (
                self._db()
                .execute(
                    "SELECT payload FROM responses WHERE id = ? AND partition = ? AND created >= ?",
                    (response_id, partition, self._clock() - max_age),
                )
                .fetchone()
            )
        if row is None:
            return None
        raw = json.loads(row[0])
        return StoredResponse(response_id, raw["response"], raw["input"])

    def delete(self, partition: str, response_id: str) -> bool:
        """Remove ``response_id`` if ``partition`` kept it; whether it did."""
        with self._lock:
            conn = self._db()
            cur = conn.execute(
                "DELETE FROM responses WHERE id = ? AND partition = ?", (response_id, partition)
            )
        return cur.rowcount > 0

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
