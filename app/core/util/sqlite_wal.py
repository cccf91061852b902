"""Hearth's SQLite files (request records, the response cache): one way to open them.
Tested by tests/core/gateway/test_records.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

# the write-ahead log is checkpointed every this many pages and cut back to at most
# WAL_BYTES after: SQLite's default lets it grow to ~4 MB between checkpoints and keeps it at
# that size, which on a nearly full disk took the space a download needed (a record per
# request, each commit at least a page)
WAL_PAGES = 64
WAL_BYTES = 256 * 1024


def open_wal(
    path: Path, schema: Sequence[str], version: int, timeout: float = 5.0
) -> sqlite3.Connection:
    """A connection in WAL mode (autocommit, usable from any thread under the caller's lock)
    with ``schema`` in place: its statements run once, when the file's ``user_version`` is
    below ``version``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL: a commit survives the process being killed (it is in the OS's cache); only
    # a power cut may lose the last commits, never corrupt the file
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit={WAL_BYTES}")
    if conn.execute("PRAGMA user_version").fetchone()[0] < version:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            for stmt in schema:
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version={version}")
    return conn
