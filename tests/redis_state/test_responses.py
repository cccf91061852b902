"""Stored Responses in a real redis-server shared by two stores (two gateways): one keeps, the
other finds; partitions stay apart; the size bound evicts the oldest across both; a killed
Redis falls back to the local SQLite store, and the state says degraded."""

from __future__ import annotations

from pathlib import Path

from app.core.gateway.response_store import ResponseStore, ResponseStoreConfig, StoredResponse
from app.redis_state.connection import SharedState
from app.redis_state.responses import SharedResponseStore


def entry(rid: str, text: str = "hi") -> StoredResponse:
    user = {"id": "msg_u" + rid, "type": "message", "role": "user", "content": text}
    answer = {"id": "msg_a" + rid, "type": "message", "role": "assistant", "content": []}
    return StoredResponse(rid, {"id": rid, "object": "response", "output": [answer]}, [user])


def _gateway(url: str, folder: Path, cfg: ResponseStoreConfig) -> SharedResponseStore:
    shared = SharedState(url)
    assert shared.check()
    return SharedResponseStore(shared, ResponseStore(folder / "r.sqlite", lambda: cfg), lambda: cfg)


def test_kept_through_one_found_through_the_other(redis_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = ResponseStoreConfig()
    a = _gateway(redis_server.url, tmp_path / "a", cfg)
    b = _gateway(redis_server.url, tmp_path / "b", cfg)
    a.put("key-a", entry("resp_1"))
    got = b.get("key-a", "resp_1")
    assert got is not None and [i["id"] for i in got.conversation] == ["msg_uresp_1", "msg_aresp_1"]
    assert b.get("key-b", "resp_1") is None and b.get("", "resp_1") is None
    assert not b.delete("key-b", "resp_1")
    assert b.delete("key-a", "resp_1")
    assert a.get("key-a", "resp_1") is None
    assert a.local.get("key-a", "resp_1") is None  # nothing was written locally


def test_the_size_bound_evicts_the_oldest_across_gateways(redis_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = ResponseStoreConfig(max_bytes=10_000)
    a = _gateway(redis_server.url, tmp_path / "a", cfg)
    b = _gateway(redis_server.url, tmp_path / "b", cfg)
    for i in range(30):  # about 500 bytes each: 30 of them cannot all stay
        (a if i % 2 else b).put("k", entry(f"resp_{i}", "x" * 400))
    kept = [i for i in range(30) if a.get("k", f"resp_{i}") is not None]
    assert kept and kept == list(range(30 - len(kept), 30))  # the newest stayed, oldest went
    assert 10 <= len(kept) < 30
    total = int(a.shared.sync.get(a.shared.key("resp-bytes")) or 0)
    assert 0 < total <= 10_000


def test_redis_gone_falls_back_to_the_local_store(redis_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a = _gateway(redis_server.url, tmp_path / "a", ResponseStoreConfig())
    a.put("k", entry("resp_shared"))
    redis_server.kill()
    a.put("k", entry("resp_local"))  # the failing call degrades the state; kept locally
    assert a.shared.status()["state"] == "degraded"
    assert a.get("k", "resp_local") is not None
    assert a.local.get("k", "resp_local") is not None
    redis_server.start()
    assert a.shared.check()
    assert a.get("k", "resp_local") is not None  # still found: Redis lacks it, the local has it
