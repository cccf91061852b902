"""The long-running commands: ``hearth serve`` (headless) and the desktop app.
Tested by tests/e2e/cli/test_cli.py, tests/e2e/test_serve_health.py,
tests/core/desktop/test_autostart.py and tests/gui/test_display.py."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from app.cli.common import EXIT_OK, EXIT_USAGE, context, fail, log
from app.cli.load_flags import add_load_flags, load_options_from_args
from app.compose import build_service, mcp_manager
from app.errors import HearthError


def cmd_serve(args: argparse.Namespace) -> int:
    from app.server.runner import ServerController

    paths, store = context()
    settings = store.load()
    api_key = args.api_key or os.environ.get("HEARTH_API_KEY") or None
    try:  # None: the settings' cache mode and shared state
        service = build_service(
            paths, settings, cache_mode=args.cache, state_url=args.state or settings.state.url
        )
    except ValueError as e:  # a URL that names no Redis server: a usage error
        fail(f"--state: {e}")
        return EXIT_USAGE
    controller = ServerController(service, store, paths)
    controller.set_api_key(api_key)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - Windows
                signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
        if service.shared is not None:  # before the first request; a Redis that is down now
            await service.shared.start()  # is not fatal: serving starts degraded
        try:
            url = await controller.start(
                args.host,
                args.port,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                starting=bool(args.model),
            )
        except HearthError as e:
            return fail(e.message)
        print(url, flush=True)
        rc = EXIT_OK
        try:
            for ref in args.model or []:
                model = await service.models.resolve(ref)
                lm = await service.models.load(model.id, load_options_from_args(args) or None)
                log.warning("model %s ready (context %d)", model.id, lm.context_length)
            controller.startup_done()
            await stop.wait()
        except HearthError as e:
            controller.startup_done(e.message)
            rc = fail(e.message)
        finally:
            await controller.stop("shutdown")
            await service.close()
        return rc

    return asyncio.run(main())


def cmd_gui(args: argparse.Namespace) -> int:
    from app.gui.display import EXIT_NO_DISPLAY, display_problem

    # before Qt starts: without a usable display it aborts the process with a misleading message
    problem = display_problem()
    if problem is not None:
        sys.stderr.write(problem)
        return EXIT_NO_DISPLAY

    from app.core.util.loop import LoopThread
    from app.gui.context import GuiContext
    from app.gui.launch import run_gui
    from app.server.runner import ServerController

    paths, store = context()
    settings = store.load()
    try:  # the desktop app's server joins a team's shared state too when state.url is set
        service = build_service(paths, settings, state_url=settings.state.url)
    except ValueError as e:
        log.warning("state.url: %s; serving on local state", e)
        service = build_service(paths, settings)
    loop = LoopThread().start()
    server = ServerController(service, store, paths)
    server.set_api_key(os.environ.get("HEARTH_API_KEY") or None)
    mcp = mcp_manager(paths, store)
    ctx = GuiContext(
        service=service, loop=loop, settings_store=store, paths=paths, server=server, mcp=mcp
    )
    try:
        return run_gui(ctx, background=getattr(args, "background", False))
    finally:
        try:
            loop.call(mcp.stop(), timeout=30)  # no MCP server process outlives the app
            loop.call(server.stop("quit"), timeout=15)
            loop.call(service.close(), timeout=30)
        finally:
            loop.stop()


def add_parsers(sub: Any) -> None:
    """serve (the desktop app is the command-less default)."""
    s = sub.add_parser("serve", help="run the server headless until SIGINT/SIGTERM")
    s.add_argument("--host", default=None, help="bind address (default from settings: 127.0.0.1)")
    s.add_argument(
        "--port",
        type=int,
        default=None,
        help="port (default from settings: 8421; 0 = any free port)",
    )
    s.add_argument(
        "--model",
        action="append",
        metavar="ID_OR_PATH",
        help="preload a model (repeatable); a GGUF path is imported",
    )
    s.add_argument("--api-key", default=None, help="require this bearer key (also HEARTH_API_KEY)")
    s.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="serve HTTPS with this PEM certificate (chain); needs --tls-key "
        "(default from settings: server.tls_cert)",
    )
    s.add_argument(
        "--tls-key",
        default=None,
        metavar="FILE",
        help="the certificate's unencrypted PEM private key (default from settings: server.tls_key)",
    )
    s.add_argument(
        "--cache",
        choices=("off", "exact", "semantic"),
        default=None,
        help="the response cache for this run (default from settings: cache.mode, off)",
    )
    s.add_argument(
        "--state",
        default=None,
        metavar="URL",
        help="share state (rate limits, named keys, the response cache, stored responses) "
        "with other gateways in this Redis (redis://HOST:PORT/DB, rediss:// for TLS, "
        "redis://:PASSWORD@HOST; default from settings: state.url, none)",
    )
    add_load_flags(s, title="load options (for the --model preloads)")
    s.set_defaults(func=cmd_serve)
