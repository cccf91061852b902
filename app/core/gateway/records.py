"""Request records: one row per HTTP request in a SQLite file in the data folder.

Written by one thread that owns the connection (requests only put records on a queue); WAL
mode, so readers (``hearth requests``, the GUI) never wait for the writer and a process killed
mid-write leaves the previous commits readable. Bounded: past ``max_rows`` the oldest go.
From the event loop, the records of the requests that end within HAND_OVER_S of each other reach
the writer as one batch (:meth:`RecordStore.append`): one thread wake and one commit for all of
them. An answer does not wait for its record: a hand-over per request cost a gateway 0.4-0.6 ms
of CPU and as much latency per request on one core (the writer thread's wake and its turns at
the GIL), a third of what it spends on a remote request. Tested by
tests/core/gateway/test_records.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import operator
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.core.util.sqlite_wal import open_wal

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEFAULT_MAX_ROWS = 100_000
BATCH = 512  # records one transaction writes at most (a bigger batch is written whole)
# records appended within this long of the first of a batch go to the writer together: a kill
# -9 loses at most the requests in flight and those that ended this long before it
HAND_OVER_S = 0.05
# how long an appended record's future waits for the commit before it is done anyway (a stuck
# disk; the loop itself never waits: the writer is a thread)
COMMIT_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What is known of one request when it ended. Times are in milliseconds; None = unknown or
    not applicable (no token produced, no model involved, a feature not in use)."""

    time: float  # when the request arrived (Unix seconds)
    route: str  # the matched route's pattern (/v1/models/{model_id}) or the path asked for
    protocol: str  # openai | anthropic | ollama | native
    model: str | None  # the model the client asked for
    answered_by: str | None  # the model that answered (an alias's target, auto's pick)
    provider: str | None  # "local", or the remote provider's name
    key: str | None  # the API key's name ("default": the single --api-key); None = no key
    stream: bool
    status: int
    error_code: str | None  # also set for a stream that failed after its 200 headers
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None  # arrival to the first generated token
    total_ms: float = 0.0
    tokens_per_second: float | None = None  # decode speed
    queue_ms: float | None = None  # waiting for a free sequence of the model
    load_ms: float | None = None  # waiting for the model to load (0: it was loaded)
    cache: str | None = None  # response cache result (hit|semantic|miss|bypass)
    trace_id: str | None = None  # OpenTelemetry trace id
    method: str = ""
    request_text: str | None = None  # content: only with records.log_content
    response_text: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The ``hearth requests --json`` row: no method, no content."""
        return {name: getattr(self, name) for name in JSON_FIELDS} | {"time": iso_utc(self.time)}


_FIELDS = tuple(f.name for f in fields(RequestRecord))
JSON_FIELDS = _FIELDS[: _FIELDS.index("trace_id") + 1]
_COLUMN_TYPES = {
    "time": "REAL NOT NULL",
    "route": "TEXT NOT NULL",
    "protocol": "TEXT NOT NULL",
    "stream": "INTEGER NOT NULL",
    "status": "INTEGER NOT NULL",
    "prompt_tokens": "INTEGER NOT NULL",
    "cached_tokens": "INTEGER NOT NULL",
    "completion_tokens": "INTEGER NOT NULL",
    "total_ms": "REAL NOT NULL",
    "method": "TEXT NOT NULL",
}
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    + ", ".join(f"{n} {_COLUMN_TYPES.get(n, '')}".strip() for n in _FIELDS)
    + ")",
    "CREATE INDEX IF NOT EXISTS requests_model ON requests (model)",
    "CREATE INDEX IF NOT EXISTS requests_status ON requests (status)",
)
# a record's values in column order; every field is a scalar, so no deep copy (astuple's)
_ROW = operator.attrgetter(*_FIELDS)
_INSERT = f"INSERT INTO requests ({', '.join(_FIELDS)}) VALUES ({', '.join('?' * len(_FIELDS))})"


def iso_utc(t: float) -> str:
    """``2026-12-01T23:04:05.123Z``."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def connect(path: Path, timeout: float = 5.0) -> sqlite3.Connection:
    """A connection in WAL mode with the schema in place (the writer and readers both)."""
    return open_wal(path, _SCHEMA, SCHEMA_VERSION, timeout)


class RecordStore:
    """Appends records without waiting for the disk; one writer thread commits them.

    ``add`` (any thread) returns a future done once the record is committed (or could not be);
    ``append`` (the event loop) gathers a loop tick's records into one batch: one wake of the
    writer, one transaction and one wake of the loop for all of them, rather than a thread
    round trip per record. ``commits`` counts the transactions written.
    """

    def __init__(self, path: Path, *, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        self.path = path
        self.max_rows = max(1, max_rows)
        self.commits = 0
        # SimpleQueue: its put is C without a Condition to notify; each item is a batch and
        # what to call once it is committed
        self._queue: queue.SimpleQueue[tuple[list[RequestRecord], Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        # this loop tick's batch (append): its records and the futures waiting on its commit;
        # the lock: close() may run on another thread
        self._lock = threading.Lock()
        self._pending: list[RequestRecord] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._thread = threading.Thread(target=self._run, name="hearth-records", daemon=True)
        self._thread.start()

    def add(self, record: RequestRecord) -> concurrent.futures.Future[None]:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._closed:
            done.set_result(None)
            return done
        self._queue.put(([record], lambda: done.set_result(None)))
        return done

    def append(self, record: RequestRecord) -> asyncio.Future[None]:
        """From the event loop: queue ``record`` with the others appended within HAND_OVER_S
        of the batch's first. The future is done once their batch is committed (or could not
        be), or COMMIT_WAIT_S after the hand-over; cancelling it leaves the batch alone."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._closed:
                done.set_result(None)
                return done
            first = not self._waiters
            self._pending.append(record)
            self._waiters.append(done)
        if first:
            loop.call_later(HAND_OVER_S, self._hand_over, loop)
        return done

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the writer."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            # a tick's batch not handed over yet is written too (its waiters are let go then)
            records, self._pending = self._pending, []
        if records:
            self._queue.put((records, lambda: None))
        self._queue.put(None)
        self._thread.join(timeout)

    # -- the event loop's side -------------------------------------------------------------------
    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            records, waiters = self._pending, self._waiters
            self._pending, self._waiters = [], []
        if not records:  # closed meanwhile: close() queued them
            _release(waiters)
            return
        timer = loop.call_later(COMMIT_WAIT_S, _release, waiters)

        def committed() -> None:  # on the writer thread: one wake of the loop for the batch
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_committed, timer, waiters)

        self._queue.put((records, committed))

    # -- the writer thread -------------------------------------------------------------------
    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            conn = connect(self.path)
        except (sqlite3.Error, OSError):
            log.exception(
                "cannot open the request records at %s; requests go unrecorded", self.path
            )
        stop = False
        while not stop:
            batches: list[tuple[list[RequestRecord], Callable[[], None]]] = []
            count = 0
            item = self._queue.get()
            while item is not None:
                batches.append(item)
                count += len(item[0])
                if count >= BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            stop = item is None
            if batches and conn is not None:
                self._write(conn, [r for records, _ in batches for r in records])
            for _, done in batches:
                done()
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _write(self, conn: sqlite3.Connection, records: list[RequestRecord]) -> None:
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(_INSERT, [_ROW(r) for r in records])
                # ids only grow (AUTOINCREMENT), so the newest max_rows are the last ids
                conn.execute(
                    "DELETE FROM requests WHERE id <= (SELECT max(id) FROM requests) - ?",
                    (self.max_rows,),
                )
            self.commits += 1
        except sqlite3.OperationalError as e:  # a full disk, I/O: the machine's state, not a bug
            log.warning("could not write %d request records to %s: %s", len(records), self.path, e)
        except sqlite3.Error:
            log.exception("could not write %d request records to %s", len(records), self.path)


def _committed(timer: asyncio.TimerHandle, waiters: list[asyncio.Future[None]]) -> None:
    timer.cancel()
    _release(waiters)


def _release(waiters: list[asyncio.Future[None]]) -> None:
    for w in waiters:
        if not w.done():  # cancelled (its request went away), or released by the timer
            w.set_result(None)


# -- reading -----------------------------------------------------------------------------------
def status_range(spec: str) -> tuple[int, int]:
    """``429`` -> (429, 429); ``4xx`` -> (400, 499).

    Raises:
        ValueError: neither a three-digit code nor a class like ``5xx``.
    """
    s = spec.strip().lower()
    if len(s) == 3 and s[0] in "12345" and s[1:] == "xx":
        low = int(s[0]) * 100
        return low, low + 99
    if len(s) == 3 and s.isdigit() and s[0] != "0":
        return int(s), int(s)
    raise ValueError(f"status must be a code like 429 or a class like 4xx, not {spec!r}")


def read_records(
    path: Path,
    *,
    limit: int | None = 50,
    model: str | None = None,
    status: tuple[int, int] | None = None,
) -> list[RequestRecord]:
    """The newest records first; ``model`` matches the asked-for or the answering model.
    No file yet: no records (nothing is created)."""
    return [r for _, r in query_records(path, limit=limit, model=model, status=status)]


def query_records(
    path: Path,
    *,
    limit: int | None = 50,
    model: str | None = None,
    status: tuple[int, int] | None = None,
    route: str | None = None,
    after_id: int | None = None,
) -> list[tuple[int, RequestRecord]]:
    """``(id, record)`` pairs, newest first: the one filter ``hearth requests`` and the GUI's
    log share. ``route``: the route contains it (any case); ``after_id``: only records newer
    than that one (ids only grow, so a reader polling with its newest id misses none and sees
    none twice)."""
    if not path.exists():
        return []
    where: list[str] = []
    args: list[Any] = []
    if model is not None:
        where.append("(model = ? OR answered_by = ?)")
        args += [model, model]
    if status is not None:
        where.append("status BETWEEN ? AND ?")
        args += list(status)
    if route:
        where.append("instr(lower(route), lower(?)) > 0")
        args.append(route)
    if after_id is not None:
        where.append("id > ?")
        args.append(after_id)
    sql = f"SELECT id, {', '.join(_FIELDS)} FROM requests"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    conn = connect(path)
    try:
        rows = conn.execute(sql, args).fetchall()
    finally:
        conn.close()
    return [(row[0], _record(row[1:])) for row in rows]


def _record(row: tuple[Any, ...]) -> RequestRecord:
    values = dict(zip(_FIELDS, row, strict=True))
    values["stream"] = bool(values["stream"])
    return RequestRecord(**values)
