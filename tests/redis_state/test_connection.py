"""The shared state's connection: ok against a real redis-server, degraded (with why and a
count) when it is killed, ok again by itself when it is back, the password never shown."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.redis_state.connection import SharedState, check_url, redact


def test_urls_checked_and_passwords_redacted() -> None:
    assert check_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert check_url("rediss://h:6380/2")
    assert check_url("valkey://h:6379")
    for bad in ("http://h:6379", "redis://", "redis://h/x"):
        with pytest.raises(ValueError):
            check_url(bad)
    assert redact("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("redis://u:s3cret@h:6379/0") == "redis://u:***@h:6379/0"
    assert "s3cret" not in redact("rediss://u:s3cret@h/1")


async def _until(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.05)


def test_degraded_while_killed_then_ok_again(redis_server) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        changes: list[bool] = []
        state = SharedState(redis_server.url, on_change=changes.append)
        await state.start()
        try:
            assert state.usable and state.status()["state"] == "ok"
            await state.aio.set(state.key("probe"), "1")
            redis_server.kill()
            assert not await state.ping()
            st = state.status()
            assert st["state"] == "degraded" and st["error"] and state.errors >= 1
            assert not state.usable
            redis_server.start()  # the same port
            await _until(lambda: state.healthy)
            assert state.status()["state"] == "ok" and "error" not in state.status()
            assert changes[:3] == [True, False, True]
        finally:
            await state.close()

    asyncio.run(run())


def test_password_in_the_url(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.support.redis_server import RedisServer

    server = RedisServer(tmp_path / "r", password="pw-1").start()
    try:

        async def run() -> None:
            good = SharedState(server.url)
            bad = SharedState(server.url.replace("pw-1", "wrong"))
            try:
                assert await good.ping()
                assert not await bad.ping()
                assert "pw-1" not in str(good.status()) and "wrong" not in str(bad.status())
            finally:
                await good.close()
                await bad.close()

        asyncio.run(run())
    finally:
        server.close()


def test_started_again_after_close(redis_server) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        state = SharedState(redis_server.url)
        await state.start()
        await state.close()
        assert not state.usable
        await state.start()  # a server stopped and started again in the desktop app
        try:
            assert state.usable
            await state.aio.set(state.key("again"), "1")
            assert state.sync.get(state.key("again")) == b"1"
        finally:
            await state.close()

    asyncio.run(run())
