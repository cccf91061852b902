"""A stream whose client closed the connection before the server's loop saw it go: the next write
raises aiohttp's "Cannot write to closing transport", which was answered as our 500 (an
"unhandled error" in the log, the record's status 500). FrameWriter turns it into ClientGone,
which the middleware records as the client going away (499, ``cancelled``)."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web
from aiohttp.test_utils import TestServer

from app.server.protocols.base import Frame
from app.server.streaming import ClientGone, FrameWriter


async def test_a_write_after_the_client_closed_raises_client_gone() -> None:
    outcome: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    async def handler(request: web.Request) -> web.StreamResponse:
        writer = FrameWriter(request, "sse")
        await writer.start()
        await writer.write([Frame({"n": 0})])
        for _ in range(1000):  # until the server's side of the connection sees the close
            if request.transport is None or request.transport.is_closing():
                break
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:  # aiohttp's cancel for the close: this write is
                asyncio.current_task().uncancel()  # type: ignore[union-attr] # the one that
                break  # came first, as it can when the stream's delta was already due
        try:
            await writer.write([Frame({"n": 1})])
        except BaseException as e:  # noqa: BLE001 - the test's result
            outcome.set_result(e)
            raise
        outcome.set_result(None)
        return await writer.close()

    app = web.Application()
    app.router.add_get("/s", handler)
    async with TestServer(app, host="127.0.0.1") as server:
        loop = asyncio.get_running_loop()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await loop.run_in_executor(None, sock.recv, 4096)
        assert first.startswith(b"HTTP/1.1 200")
        sock.close()
        got = await asyncio.wait_for(outcome, 20)
    assert isinstance(got, ClientGone), got
    assert isinstance(got, ConnectionResetError)  # aiohttp ignores it: no "unhandled" log
