"""The floor under any aiohttp gateway: a bare pass-through proxy (aiohttp's server in front,
one kept aiohttp ClientSession behind) that forwards POST /v1/chat/completions and GET
/v1/models to one engine and copies the answer back, streamed or whole, with no checks,
routing, records or logs. tests/bench/gateway_overhead.py measures it beside Hearth (``floor``)
so the gap between Hearth and the framework's own cost is visible (not collected by pytest).

Run:  python tests/bench/passthrough_proxy.py ENGINE_BASE_URL [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import ClientSession, TCPConnector, web


def build(engine: str) -> web.Application:
    app = web.Application()
    sessions: list[ClientSession] = []

    async def start(_app: web.Application) -> None:
        sessions.append(ClientSession(connector=TCPConnector(limit=0)))

    async def stop(_app: web.Application) -> None:
        await sessions[0].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        url = engine + request.path.removeprefix("/v1")
        async with sessions[0].request(
            request.method, url, data=body, headers={"Content-Type": "application/json"}
        ) as up:
            ctype = up.headers.get("Content-Type", "application/json")
            if ctype.startswith("text/event-stream"):
                resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
            return web.Response(
                status=up.status, body=await up.read(), content_type="application/json"
            )

    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_get("/v1/models", forward)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


async def _main(engine: str, port: int) -> None:
    runner = web.AppRunner(build(engine.rstrip("/")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"http://127.0.0.1:{bound}/v1", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("engine")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    try:
        asyncio.run(_main(a.engine, a.port))
    except KeyboardInterrupt:
        sys.exit(0)
