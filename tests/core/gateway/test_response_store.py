"""The stored Responses' store on real SQLite files: each key's partition sees only its own,
the age and size bounds evict the oldest first, a new store over the same file (a restart)
finds what was kept, and its file is the owner's alone."""

from __future__ import annotations

import stat
from pathlib import Path

from app.core.gateway.response_store import ResponseStore, ResponseStoreConfig, StoredResponse


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def entry(rid: str, text: str = "hi") -> StoredResponse:
    user = {"id": "msg_u" + rid, "type": "message", "role": "user", "content": text}
    answer = {"id": "msg_a" + rid, "type": "message", "role": "assistant", "content": []}
    return StoredResponse(rid, {"id": rid, "object": "response", "output": [answer]}, [user])


def test_kept_for_its_partition_only(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite")
    store.put("key-a", entry("resp_1"))
    got = store.get("key-a", "resp_1")
    assert got is not None and got.response["id"] == "resp_1"
    assert [i["id"] for i in got.conversation] == ["msg_uresp_1", "msg_aresp_1"]
    assert store.get("key-b", "resp_1") is None
    assert store.get("", "resp_1") is None
    assert not store.delete("key-b", "resp_1")  # another key cannot remove it either
    assert store.delete("key-a", "resp_1")
    assert store.get("key-a", "resp_1") is None


def test_a_new_store_over_the_same_file_finds_it(tmp_path: Path) -> None:
    path = tmp_path / "responses" / "r.sqlite"
    first = ResponseStore(path)
    first.put("", entry("resp_1", "remember me"))
    first.close()
    again = ResponseStore(path).get("", "resp_1")
    assert again is not None and again.input[0]["content"] == "remember me"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700  # the WAL beside it too


def test_past_max_age_it_is_gone(tmp_path: Path) -> None:
    clock = Clock()
    store = ResponseStore(tmp_path / "r.sqlite", lambda: ResponseStoreConfig(max_age_days=1), clock)
    store.put("", entry("resp_old"))
    clock.now += 86400 - 1
    assert store.get("", "resp_old") is not None
    clock.now += 2
    assert store.get("", "resp_old") is None
    store.put("", entry("resp_new"))  # a write prunes what expired
    rows = store._db().execute("SELECT id FROM responses").fetchall()
    assert rows == [("resp_new",)]


def test_past_max_bytes_the_oldest_go_first(tmp_path: Path) -> None:
    clock = Clock()
    size = len(
        '{"response":{"id":"resp_0","object":"response","output":[{"id":"msg_aresp_0","type":'
        '"message","role":"assistant","content":[]}]},"input":[{"id":"msg_uresp_0","type":'
        '"message","role":"user","content":"hi"}]}'
    )
    cfg = ResponseStoreConfig(max_bytes=3 * size)
    store = ResponseStore(tmp_path / "r.sqlite", lambda: cfg, clock)
    for i in range(5):
        store.put("", entry(f"resp_{i}"))
        clock.now += 1
    kept = [i for i in range(5) if store.get("", f"resp_{i}") is not None]
    assert kept == [2, 3, 4]


def test_an_entry_over_the_whole_bound_is_not_kept(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite", lambda: ResponseStoreConfig(max_bytes=500))
    store.put("", entry("resp_small", ""))
    store.put("", entry("resp_big", "x" * 1000))
    assert store.get("", "resp_big") is None
    assert store.get("", "resp_small") is not None  # and it evicted nothing to try
