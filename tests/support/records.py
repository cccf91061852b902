"""Reading a real server's request records from a test. A record is committed in a batch
shortly after its answer went out (the store's hand-over window), so a test waits for the
record it expects instead of reading once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core.gateway.records import RequestRecord, read_records

DEADLINE = 60.0


def records_once(db: Path, count: int, **filters: Any) -> list[RequestRecord]:
    """``read_records(db, limit=None, **filters)`` once there are at least ``count``."""
    deadline = time.monotonic() + DEADLINE
    while True:
        rows = read_records(db, limit=None, **filters) if db.exists() else []
        if len(rows) >= count:
            return rows
        assert time.monotonic() < deadline, f"only {len(rows)} records, not {count}"
        time.sleep(0.02)


def newest_record(db: Path, **match: Any) -> RequestRecord:
    """The newest record once its fields equal ``match`` (e.g. ``status=401``)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        rows = read_records(db, limit=1) if db.exists() else []
        if rows and all(getattr(rows[0], k) == v for k, v in match.items()):
            return rows[0]
        newest = rows[0] if rows else None
        assert time.monotonic() < deadline, f"the newest record is {newest}, not {match}"
        time.sleep(0.02)


def records_since(db: Path, since: float, count: int, **filters: Any) -> list[RequestRecord]:
    """The records of requests that arrived at ``since`` (``time.time()``) or later, newest
    first, once there are at least ``count``."""
    deadline = time.monotonic() + DEADLINE
    while True:
        rows = read_records(db, limit=None, **filters) if db.exists() else []
        rows = [r for r in rows if r.time >= since]
        if len(rows) >= count:
            return rows
        assert time.monotonic() < deadline, f"only {len(rows)} records since {since}, not {count}"
        time.sleep(0.02)


def records_with(db: Path, wanted: Callable[[RequestRecord], bool]) -> list[RequestRecord]:
    """All records, newest first, once one of them is ``wanted``."""
    deadline = time.monotonic() + DEADLINE
    while True:
        rows = read_records(db, limit=None) if db.exists() else []
        if any(wanted(r) for r in rows):
            return rows
        assert time.monotonic() < deadline, f"no such record among {len(rows)}"
        time.sleep(0.02)
