"""The request records store on real SQLite files: written by its own thread (a
request never waits for the disk), the records of one loop tick in one commit, bounded, read
newest first with filters."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from app.core.gateway.records import RecordStore, RequestRecord, read_records, status_range
from app.errors import ConfigError
from app.settings import settings_from_dict

DEADLINE = 60.0
JSON_KEYS = [
    "time", "route", "protocol", "model", "answered_by", "provider", "key", "stream", "status",
    "error_code", "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "total_ms",
    "tokens_per_second", "queue_ms", "load_ms", "cache", "trace_id",
]  # fmt: skip


def rec(i: int, **kw: object) -> RequestRecord:
    base = RequestRecord(
        time=1_700_000_000.0 + i,
        route="/v1/chat/completions",
        protocol="openai",
        model=f"m{i % 2}",
        answered_by=f"m{i % 2}",
        provider="local",
        key=None,
        stream=bool(i % 2),
        status=200,
        error_code=None,
        total_ms=float(i),
        method="POST",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_records_round_trip_newest_first_with_filters(tmp_path: Path) -> None:
    path = tmp_path / "data" / "requests.sqlite"
    store = RecordStore(path)
    statuses = [200, 429, 404, 200, 503, 401]
    for i, st in enumerate(statuses):
        store.add(rec(i, status=st, error_code=None if st == 200 else f"e{st}"))
    store.close()
    rows = read_records(path, limit=None)
    assert [r.status for r in rows] == statuses[::-1]
    assert rows[0] == rec(5, status=401, error_code="e401")  # every field as written
    assert [r.status for r in read_records(path, limit=None, status=status_range("4xx"))] == [
        401,
        404,
        429,
    ]
    assert [r.status for r in read_records(path, limit=None, status=status_range("429"))] == [429]
    assert [r.time for r in read_records(path, limit=2, model="m1")] == [
        1_700_000_005.0,
        1_700_000_003.0,
    ]
    assert read_records(tmp_path / "none.sqlite") == [] and not (tmp_path / "none.sqlite").exists()


def test_json_rows_have_exactly_the_contract_fields_and_iso_utc_time(tmp_path: Path) -> None:
    row = rec(0, ttft_ms=12.5, request_text="secret prompt").as_json()
    assert list(row) == JSON_KEYS
    assert row["time"] == "2023-11-14T22:13:20.000Z"
    assert "secret prompt" not in repr(row)


@pytest.mark.parametrize("bad", ["4x", "4xxx", "600x", "abc", "0xx", "42", "6xx", ""])
def test_status_filter_rejects_what_is_not_a_code_or_class(bad: str) -> None:
    with pytest.raises(ValueError):
        status_range(bad)


def test_past_max_rows_the_oldest_are_pruned(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = RecordStore(path, max_rows=5)
    for i in range(12):
        store.add(rec(i))
    store.close()
    assert [r.total_ms for r in read_records(path, limit=None)] == [11, 10, 9, 8, 7]
    store = RecordStore(path, max_rows=5)  # and across reopenings
    for i in range(12, 15):
        store.add(rec(i))
    store.close()
    assert [r.total_ms for r in read_records(path, limit=None)] == [14, 13, 12, 11, 10]


def test_adding_never_waits_for_the_disk(tmp_path: Path) -> None:
    """Another writer holds the database: ``add`` returns at once, the record is written once
    the lock is released."""
    path = tmp_path / "r.sqlite"
    store = RecordStore(path)
    store.add(rec(0)).result(DEADLINE)  # the schema exists
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock
    try:
        done = store.add(rec(1))
        assert not done.done()
        assert [r.total_ms for r in read_records(path, limit=None)] == [0]
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    done.result(DEADLINE)
    assert [r.total_ms for r in read_records(path, limit=None)] == [1, 0]
    store.close()


async def test_records_appended_within_the_hand_over_window_are_committed_together(
    tmp_path: Path,
) -> None:
    """Requests that end within HAND_OVER_S of each other, over many loop ticks: their records
    reach the writer as one batch, one transaction for all of them, and each waiter is done
    once it is on disk. The window is held open here by the store's own timer: nothing of the
    batch is written before it is handed over."""
    path = tmp_path / "r.sqlite"
    store = RecordStore(path)
    try:
        waiters = []
        for i in range(20):
            waiters.append(store.append(rec(i)))
            await asyncio.sleep(0)  # another loop tick
        assert not any(w.done() for w in waiters)
        await asyncio.gather(*waiters)
        assert store.commits == 1
        assert len(read_records(path, limit=None)) == 20
        await asyncio.gather(*(store.append(rec(i)) for i in range(20, 25)))  # the next batch
        assert store.commits == 2
        assert [r.total_ms for r in read_records(path, limit=2)] == [24, 23]
    finally:
        await asyncio.to_thread(store.close)


async def test_an_appended_record_is_written_even_if_its_waiter_goes_away(tmp_path: Path) -> None:
    """A request cancelled while it waits for its record's commit: the record is still written
    and the others of its batch are not disturbed."""
    path = tmp_path / "r.sqlite"
    store = RecordStore(path)
    await store.append(rec(0))  # the schema exists
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock: the batch cannot commit yet
    try:
        gone, kept = store.append(rec(1)), store.append(rec(2))
        gone.cancel()
        assert not kept.done()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await kept
    assert [r.total_ms for r in read_records(path, limit=None)] == [2, 1, 0]
    await asyncio.to_thread(store.close)


def test_the_database_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = RecordStore(path)
    store.add(rec(0)).result(DEADLINE)
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_the_write_ahead_log_stays_small(tmp_path: Path) -> None:
    """A record per request, each its own commit: SQLite's default let the log grow to ~4 MB
    and stay so, which on a nearly full disk took the space a download needed (seen: a 1.4 MB
    log made a pull on a 3 MiB disk fail its space check)."""
    from app.core.util.sqlite_wal import WAL_BYTES

    path = tmp_path / "r.sqlite"
    store = RecordStore(path)
    wal = path.with_name(path.name + "-wal")
    biggest = 0
    for i in range(600):
        store.add(rec(i, route="/v1/chat/completions?" + "x" * 300)).result(DEADLINE)
        biggest = max(biggest, wal.stat().st_size if wal.exists() else 0)
    store.close()
    assert biggest <= 2 * WAL_BYTES, biggest
    assert len(read_records(path, limit=None)) == 600


def test_records_settings_are_validated() -> None:
    s = settings_from_dict({"records": {"max_rows": 10, "log_content": True}})
    assert (s.records.max_rows, s.records.log_content, s.records.content_max_chars) == (
        10,
        True,
        4096,
    )
    assert settings_from_dict({}).records.max_rows == 100_000
    with pytest.raises(ConfigError):
        settings_from_dict({"records": {"max_rows": 0}})
    with pytest.raises(ConfigError):
        settings_from_dict({"records": {"log_content": "yes"}})


def test_a_database_that_cannot_be_opened_costs_no_request(tmp_path: Path) -> None:
    """The path is a folder: records are dropped (and logged), adds still finish at once."""
    store = RecordStore(tmp_path)
    store.add(rec(0)).result(DEADLINE)
    store.close()
    assert store.add(rec(1)).done()  # closed: nothing queued, nothing waits


async def test_appending_to_a_closed_store_waits_for_nothing(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "r.sqlite")
    waiter = store.append(rec(0))
    store.close()  # before the tick's batch was handed over: it is written all the same
    await waiter
    assert store.append(rec(1)).done()
    assert [r.total_ms for r in read_records(tmp_path / "r.sqlite", limit=None)] == [0]
