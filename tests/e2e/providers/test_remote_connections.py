"""A real `hearth serve` in front of an engine that answers at once (tests/support/instant_engine.py,
on a loop of its own in this process) keeps its connection to the engine: sequential chats,
streamed and whole, reach the engine over far fewer TCP connections than there were chats (a
connection per chat would cost the gateway a TCP handshake, and the engine a socket, each time)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from app.core.util.loop import LoopThread
from tests.e2e.engines import http_request
from tests.e2e.providers.providers_front import cli, wait_ready
from tests.e2e.serveproc import ServeProc, start_serve
from tests.support.instant_engine import Stats, serve

CHATS = 30


@dataclass
class Rig:
    front: ServeProc
    stats: Stats


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    loop = LoopThread("instant-engine").start()
    server, url, stats = loop.call(serve(), 30)
    home = tmp_path_factory.mktemp("instant-front")
    r = cli(home, "providers", "add", "inst", url, "--kind", "vllm")
    assert r.returncode == 0, r.stderr
    front = start_serve(home)
    try:
        wait_ready(front, "inst")
        yield Rig(front, stats)
    finally:
        front.stop()
        loop.call(_close(server), 30)
        loop.stop()


async def _close(server: asyncio.Server) -> None:
    server.close()
    await server.wait_closed()


@pytest.mark.parametrize("stream", [False, True])
def test_sequential_chats_share_a_connection_to_the_engine(rig: Rig, stream: bool) -> None:
    body = {
        "model": "inst/instant",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "stream": stream,
    }
    connections, chats = rig.stats.connections, rig.stats.chats
    for _ in range(CHATS):
        r = http_request(rig.front.root + "/v1/chat/completions", "POST", body, timeout=60)
        assert r.status == 200, r.body
        assert b"[DONE]" in r.raw if stream else r.body["choices"][0]["message"]["content"]
    assert rig.stats.chats - chats == CHATS
    # a probe running beside a chat, or a pause past the idle keep-alive on a loaded machine,
    # may open another; one per chat is what this guards against
    assert rig.stats.connections - connections <= 3
