"""Named keys in the shared state, against a real redis-server: keys.json imported once on first
use, every change bumps the version another gateway's store follows, no secret in Redis, last
uses written in one batch, the last keys seen kept (and changes refused) while Redis is gone,
and a Redis that lost its data given the keys back."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from app.core.gateway.keys import KeyStore, hash_secret
from app.errors import StateUnavailable
from app.redis_state.connection import SharedState
from app.redis_state.keys import SharedKeyStore


def _local(tmp_path: Path, name: str, **keys: str) -> Path:
    path = tmp_path / name / "keys.json"
    path.parent.mkdir(parents=True)
    store = KeyStore(path)
    for key_name, secret in keys.items():
        store.add(key_name, secret, rpm=5)
    return path


async def _until(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.05)


def test_local_keys_imported_once_and_changes_seen_by_another_gateway(
    redis_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        a_state, b_state = SharedState(redis_server.url), SharedState(redis_server.url)
        await a_state.start()
        await b_state.start()
        a = SharedKeyStore(a_state, _local(tmp_path, "a", alice="sk-alice"))
        b = SharedKeyStore(b_state, _local(tmp_path, "b", mallory="sk-mallory"))
        try:
            await a.start()  # the first gateway: its keys.json goes into the empty state
            await b.start()  # the second: the shared keys win, its own file is not imported
            assert set(a.all()) == set(b.all()) == {"alice"}
            assert "imported 1 named keys" in caplog.text
            stored = await a_state.aio.hget(a_state.key("keys"), "alice")
            assert "sk-alice" not in stored.decode()
            assert json.loads(stored)["hash"] == hash_secret("sk-alice")

            await asyncio.to_thread(a.add, "bob", "sk-bob", tpm=100)
            await _until(lambda: "bob" in b.all())
            assert b.match(hash_secret("sk-bob")) is not None
            assert await asyncio.to_thread(a.remove, "alice")
            await _until(lambda: "alice" not in b.all())
            assert not await asyncio.to_thread(a.remove, "alice")

            b.note_use("bob", 1234.5)
            assert await asyncio.to_thread(b.flush_uses) == 1
            await asyncio.to_thread(a.load)
            assert a.all()["bob"].last_used_at == 1234.5
        finally:
            for store in (a, b):
                await store.close()
            for state in (a_state, b_state):
                await state.close()

    asyncio.run(run())


def test_last_keys_kept_while_redis_is_gone_then_restored(
    redis_server: Any, tmp_path: Path
) -> None:
    async def run() -> None:
        state = SharedState(redis_server.url)
        await state.start()
        store = SharedKeyStore(state, _local(tmp_path, "a", alice="sk-alice"))
        try:
            await store.start()
            redis_server.kill()
            assert not await state.ping()
            assert store.match(hash_secret("sk-alice")) is not None  # the last keys seen
            with pytest.raises(StateUnavailable):
                await asyncio.to_thread(store.add, "bob", "sk-bob")
            store.note_use("alice", 99.0)
            assert await asyncio.to_thread(store.flush_uses) == 0  # kept for the next flush
            redis_server.start()  # empty: it kept nothing
            await _until(lambda: state.healthy)
            await _until(lambda: bool(redis_server_keys(state)))
            assert set(store.all()) == {"alice"}
            assert await asyncio.to_thread(store.flush_uses) == 1
        finally:
            await store.close()
            await state.close()

    def redis_server_keys(state: SharedState) -> dict[bytes, bytes]:
        return state.sync.hgetall(state.key("keys"))

    asyncio.run(run())
