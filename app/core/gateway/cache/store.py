"""The response cache's storage: one SQLite file in the data folder.

WAL mode, so ``hearth cache stats`` / ``hearth cache clear`` read and write it while a server
runs, and the server sees a clear at its next lookup (every lookup is a fresh read). Callers run
these methods off the event loop (``asyncio.to_thread``); one lock serializes the connection.
Bounded: past ``max_entries`` the least recently used entries go; an entry older than ``ttl_s``
is never served and is pruned at the next write.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import struct
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from app.core.types import Delta, PromptToken, Timings, TokenLogprob, ToolCallDelta, Usage
from app.core.util.sqlite_wal import open_wal

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
COUNTERS = ("hits", "semantic_hits", "misses", "bypasses")
CACHE_MODES = ("off", "exact", "semantic")
CACHE_SCOPES = ("key", "shared")  # answers kept per API key (default), or one pool for all
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, skey TEXT, model TEXT NOT NULL, "
    "created REAL NOT NULL, used REAL NOT NULL, payload TEXT NOT NULL, vector BLOB)",
    "CREATE INDEX IF NOT EXISTS entries_skey ON entries (skey)",
    "CREATE INDEX IF NOT EXISTS entries_used ON entries (used)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The ``cache`` settings: mode off | exact | semantic, the bounds, semantic matching, and
    whether answers are kept per API key (scope key | shared)."""

    mode: str = "off"
    max_entries: int = 1000
    ttl_s: float = 3600.0
    semantic_threshold: float = 0.9
    embedding_model: str = ""  # a library id (or alias); "" = semantic mode acts as exact
    scope: str = "key"  # key: a key never gets another key's answer; shared: every key does


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """A stored answer: the model that answered and each choice's deltas, in order (the last
    of each is its final delta)."""

    model: str
    choices: tuple[tuple[Delta, ...], ...]


# -- the deltas as JSON ------------------------------------------------------------------------
def encode(answer: CachedAnswer) -> str:
    return json.dumps(
        {"model": answer.model, "choices": [[asdict(d) for d in ch] for ch in answer.choices]},
        separators=(",", ":"),
    )


def _delta(raw: dict[str, Any]) -> Delta:
    usage = Usage(**raw["usage"]) if raw.get("usage") else None
    timings = Timings(**raw["timings"]) if raw.get("timings") else None
    logprobs = tuple(
        TokenLogprob(
            lp["token"],
            lp["logprob"],
            tuple(lp["bytes"]),
            tuple((t, p, tuple(b)) for t, p, b in lp["top"]),
        )
        for lp in raw.get("logprobs", ())
    )
    calls = tuple(ToolCallDelta(**c) for c in raw.get("tool_calls", ()))
    prompt = tuple(
        PromptToken(
            t["id"],
            t["logprob"],
            t["rank"],
            tuple((a, lp) for a, lp in t["top"]),
            t["text"],
            tuple(t["top_text"]),
        )
        for t in raw.get("prompt", ())
    )
    nested = ("usage", "timings", "logprobs", "tool_calls", "prompt")
    return Delta(
        **{k: v for k, v in raw.items() if k not in nested},
        usage=usage,
        timings=timings,
        logprobs=logprobs,
        tool_calls=calls,
        prompt=prompt,
    )


def decode(text: str) -> CachedAnswer:
    raw = json.loads(text)
    return CachedAnswer(raw["model"], tuple(tuple(_delta(d) for d in ch) for ch in raw["choices"]))


def pack_vector(v: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(v)}f", *v)


def unpack_vector(b: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(b) // 4}f", b))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b) or not a:
        return -1.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else -1.0


# -- the store ---------------------------------------------------------------------------------
class AnswerStore(Protocol):
    """What the replay layer needs of a store: this machine's SQLite file
    (:class:`CacheStore`) or one several gateways share. Every method blocks: call it off the
    loop. ``get`` and ``nearest`` count their own hits; ``count`` counts the rest."""

    def get(self, key: str, now: float, ttl_s: float) -> CachedAnswer | None: ...

    def nearest(
        self, skey: str, vector: Sequence[float], threshold: float, now: float, ttl_s: float
    ) -> tuple[CachedAnswer, float] | None: ...

    def put(
        self,
        key: str,
        answer: CachedAnswer,
        now: float,
        *,
        max_entries: int,
        ttl_s: float,
        skey: str | None = None,
        vector: Sequence[float] | None = None,
    ) -> None: ...

    def count(self, counter: str) -> None: ...

    def clear(self) -> int: ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


def connect(path: Path, timeout: float = 5.0) -> sqlite3.Connection:
    """A WAL connection with the schema in place (the server and the CLI both)."""
    return open_wal(path, _SCHEMA, SCHEMA_VERSION, timeout)


class CacheStore:
    """The entries and the hit/miss counters. Every method blocks: call it off the loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect(self.path)
        return self._conn

    def count(self, counter: str) -> None:
        with self._lock:
            self._bump(self._db(), counter)

    @staticmethod
    def _bump(conn: sqlite3.Connection, counter: str) -> None:
        conn.execute(
            "INSERT INTO counters (name, value) VALUES (?, 1) "
            "ON CONFLICT(name) DO UPDATE SET value = value + 1",
            (counter,),
        )

    def get(self, key: str, now: float, ttl_s: float) -> CachedAnswer | None:
        """The entry under ``key`` if younger than ``ttl_s`` (counted a hit, its use noted)."""
        with self._lock:
            conn = self._db()
            row = conn.execute(
                "SELECT payload FROM entries WHERE key = ? AND created > ?", (key, now - ttl_s)
            ).fetchone()
            if row is None:
                return None
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE entries SET used = ? WHERE key = ?", (now, key))
                self._bump(conn, "hits")
        return decode(row[0])

    def nearest(
        self, skey: str, vector: Sequence[float], threshold: float, now: float, ttl_s: float
    ) -> tuple[CachedAnswer, float] | None:
        """The live entry under ``skey`` whose vector is closest to ``vector``, if its cosine
        is at least ``threshold`` (counted a semantic hit)."""
        with self._lock:
            conn = self._db()
            rows = conn.execute(
                "SELECT key, payload, vector FROM entries "
                "WHERE skey = ? AND vector IS NOT NULL AND created > ?",
                (skey, now - ttl_s),
            ).fetchall()
            best: tuple[str, str, float] | None = None
            for key, payload, blob in rows:
                score = cosine(vector, unpack_vector(blob))
                if score >= threshold and (best is None or score > best[2]):
                    best = (key, payload, score)
            if best is None:
                return None
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE entries SET used = ? WHERE key = ?", (now, best[0]))
                self._bump(conn, "semantic_hits")
        return decode(best[1]), best[2]

    def put(
        self,
        key: str,
        answer: CachedAnswer,
        now: float,
        *,
        max_entries: int,
        ttl_s: float,
        skey: str | None = None,
        vector: Sequence[float] | None = None,
    ) -> None:
        """Store (or replace) an entry, then prune the expired and the least recently used."""
        blob = pack_vector(vector) if vector else None
        with self._lock:
            conn = self._db()
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "INSERT OR REPLACE INTO entries (key, skey, model, created, used, payload, "
                    "vector) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, skey, answer.model, now, now, encode(answer), blob),
                )
                conn.execute("DELETE FROM entries WHERE created <= ?", (now - ttl_s,))
                conn.execute(
                    "DELETE FROM entries WHERE key IN (SELECT key FROM entries "
                    "ORDER BY used DESC, rowid DESC LIMIT -1 OFFSET ?)",
                    (max(1, max_entries),),
                )

    def clear(self) -> int:
        """Remove every entry and reset the counters. Returns the entries removed."""
        with self._lock:
            conn = self._db()
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                n = conn.execute("DELETE FROM entries").rowcount
                conn.execute("DELETE FROM counters")
        return max(n, 0)

    def stats(self) -> dict[str, int]:
        """``entries``, ``bytes`` (the stored answers' size) and each counter."""
        with self._lock:
            conn = self._db()
            entries, size = conn.execute(
                "SELECT count(*), coalesce(sum(length(payload) + coalesce(length(vector), 0)), 0) "
                "FROM entries"
            ).fetchone()
            counters = dict(conn.execute("SELECT name, value FROM counters").fetchall())
        return {"entries": entries, "bytes": size} | {c: counters.get(c, 0) for c in COUNTERS}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
