"""The remote client's connect timeout, on a real loopback socket that never accepts: its
accept queue is full, so the kernel drops further SYNs and a connect hangs (as a host that
silently drops packets makes it)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from app.core.gateway.providers.store import ProviderConfig
from app.core.requests import ChatRequest
from app.core.types import ChatMessage
from app.errors import ProviderTimeout
from app.runtimes.remote.client import RemoteEngine


@pytest.fixture
def black_hole() -> Iterator[int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue; none is ever accepted
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    try:
        yield port
    finally:
        for c in fillers:
            c.close()
        srv.close()


async def test_connect_timeout_is_a_retryable_provider_timeout(black_hole: int) -> None:
    cfg = ProviderConfig(
        "bh", f"http://127.0.0.1:{black_hole}/v1", connect_timeout=1.0, first_token_timeout=60
    )
    engine = RemoteEngine(cfg, "sk-secret-not-in-messages")
    try:
        t0 = time.monotonic()
        with pytest.raises(ProviderTimeout, match="connect timeout") as e:
            await engine.chat("x", ChatRequest("bh/x", (ChatMessage("user", "hi"),)))
        waited = time.monotonic() - t0
        assert 1.0 <= waited < 50  # the connect timeout, not the 60 s first-token one
        assert e.value.retryable and e.value.status == 504
        probe = await engine.probe()
        assert probe.state == "unreachable" and "sk-secret" not in (probe.error or "")
    finally:
        await engine.close()
