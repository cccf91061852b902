"""Request records through a real ``hearth serve``: killed with SIGKILL while it
writes them, it loses at most the requests in flight and those answered within the records'
hand-over window, and the database stays readable; ``hearth requests`` reads them with no server
running."""

from __future__ import annotations

import json
import sqlite3
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.hearthproc import Server, hearth, ls, wait_until

pytestmark = pytest.mark.model

LISTINGS = 200  # GET /v1/models answered before the kill (each is a record)
CHATS = 3  # and generations


class Client(threading.Thread):
    """Sends one request after another until the server goes away; counts whole answers."""

    def __init__(self, root: str, path: str, body: object = None) -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.done = root + path, body, 0

    def run(self) -> None:
        data = json.dumps(self.body).encode() if self.body is not None else None
        while True:
            req = urllib.request.Request(self.url, data=data)
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
            except (OSError, urllib.error.URLError):  # killed
                return
            self.done += 1


def committed(db: Path) -> tuple[int, int]:
    """How many listings and chats are recorded on disk."""
    if not db.exists():
        return (0, 0)
    conn = sqlite3.connect(db)
    try:
        q = "SELECT count(*) FROM requests WHERE route = ?"
        return tuple(  # type: ignore[return-value]
            conn.execute(q, (route,)).fetchone()[0]
            for route in ("/v1/models", "/v1/chat/completions")
        )
    except sqlite3.OperationalError:  # the table is not made yet
        return (0, 0)
    finally:
        conn.close()


def test_sigkill_while_writing_keeps_the_database_readable(
    tmp_path: Path, smollm2_path: Path
) -> None:
    home = tmp_path / "h"
    assert hearth(home, None, "import", str(smollm2_path)).returncode == 0
    mid = ls(home)[0]["id"]
    srv = Server(home, None)
    try:
        chat = {
            "model": mid,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "temperature": 0,
        }
        lister = Client(srv.root, "/v1/models")
        chatter = Client(srv.root, "/v1/chat/completions", chat)
        lister.start()
        chatter.start()
        wait_until(
            lambda: lister.done >= LISTINGS and chatter.done >= CHATS, "requests answered", 300
        )
        db = home / "data" / "requests.sqlite"
        # records are committed shortly after their answers: some of each are on disk first
        wait_until(lambda: min(committed(db)) >= 1, "records committed", 120)
        seen = committed(db)
        srv.kill9()  # both clients have a request in flight, their records being written
        lister.join(60)
        chatter.join(60)
    finally:
        srv.close()
    answered = lister.done + chatter.done

    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute("SELECT route, status, model FROM requests").fetchall()
    finally:
        conn.close()
    # answers are committed in batches shortly after they went out: the last batch and the two
    # in flight may or may not have been; nothing else is lost and nothing is made up
    assert len(rows) <= answered + 2
    assert min(committed(db)) >= 1 and sum(committed(db)) >= sum(seen)  # nothing committed is lost
    assert {r[0] for r in rows} == {"/v1/models", "/v1/chat/completions"}
    assert all(r[1] == 200 for r in rows)

    # no server runs now: the CLI reads the file itself
    r = hearth(home, None, "requests", "--json", "--limit", "1000", "--model", mid)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out and {x["route"] for x in out} == {"/v1/chat/completions"}
    assert all(x["answered_by"] == mid and x["completion_tokens"] > 0 for x in out)
    assert all(x["time"].endswith("Z") and x["ttft_ms"] > 0 for x in out)
    assert hearth(home, None, "requests", "--json", "--status", "4xx").stdout.strip() == "[]"
    r = hearth(home, None, "requests", "--limit", "2")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3  # a header and two rows
    r = hearth(home, None, "requests", "--status", "2x")
    assert r.returncode == 2 and "4xx" in r.stderr
