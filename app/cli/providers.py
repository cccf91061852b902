"""Remote engines: ``hearth providers add|ls|test|rm``. They edit the providers files directly
(under their lock), so they work with or without a server; a running one picks a change up
within a second. ``ls`` and ``test`` ask the engines themselves (one probe each, side by side).
Tested by tests/e2e/providers/test_remote_providers.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from app.cli import groups
from app.cli.alias import _stores
from app.cli.common import EXIT_OK, context, fail, log
from app.compose import provider_store
from app.core.gateway.providers import manage
from app.core.gateway.providers.pool import ProviderStatus
from app.core.gateway.providers.store import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    KINDS,
    ProviderConfig,
    check,
)
from app.runtimes.remote.client import RemoteEngine


def cmd_add(args: argparse.Namespace) -> int:
    paths, _ = context()
    store = provider_store(paths)
    aliases, library = _stores()
    key = sys.stdin.readline().strip() if args.api_key == "-" else args.api_key
    cfg = check(
        ProviderConfig(
            name=args.name,
            url=args.url,
            kind=args.kind or "openai",
            prefix=args.prefix or "",
            connect_timeout=args.connect_timeout,
            first_token_timeout=args.first_token_timeout,
            idle_timeout=args.idle_timeout,
            follow_redirects=args.follow_redirects,
        )
    )
    if args.kind is None:
        cfg, why = asyncio.run(_detect(cfg, key))
        if why:
            log.warning("%s; pass --kind to choose", why)
    ids = [m.id for m in library.list()]
    cfg = store.add(cfg, key, lambda p: manage.prefix_clash(p, ids, aliases.all()))
    print(f"{cfg.name}\t{cfg.kind}\t{cfg.url}\t{cfg.prefix}")
    return EXIT_OK


async def _detect(cfg: ProviderConfig, key: str | None) -> tuple[ProviderConfig, str | None]:
    engine = RemoteEngine(cfg, key)
    try:
        return await manage.detect(cfg, engine)
    finally:
        await engine.close()


async def _statuses(store: Any) -> list[ProviderStatus]:
    async def one(cfg: ProviderConfig) -> ProviderStatus:
        engine = RemoteEngine(cfg, store.key(cfg.name))
        try:
            p = await engine.probe()
        finally:
            await engine.close()
        models = tuple(cfg.prefix + m.id for m in p.models) if p.state == "ready" else ()
        return ProviderStatus(
            cfg.name, cfg.url, cfg.kind, cfg.prefix, p.state, models, p.latency_ms, p.error
        )

    return list(await asyncio.gather(*(one(c) for c in store.all().values())))


def cmd_ls(args: argparse.Namespace) -> int:
    paths, _ = context()
    statuses = asyncio.run(_statuses(provider_store(paths)))
    if args.json:
        print(json.dumps([s.as_json() for s in statuses]))
        return EXIT_OK
    for s in statuses:
        latency = f"{s.latency_ms:.0f} ms" if s.latency_ms is not None else "-"
        extra = f"\t{s.error}" if s.error else ""
        print(f"{s.name}\t{s.kind}\t{s.url}\t{s.state}\t{len(s.models)} models\t{latency}{extra}")
    return EXIT_OK


def cmd_test(args: argparse.Namespace) -> int:
    paths, _ = context()
    store = provider_store(paths)
    cfg = store.get(args.name)
    if cfg is None:
        return fail(f"no provider '{args.name}'")

    async def run() -> manage.ProviderTest:
        engine = RemoteEngine(cfg, store.key(cfg.name))
        try:
            return await manage.test(cfg, engine)
        finally:
            await engine.close()

    result = asyncio.run(run())
    if args.json:
        print(json.dumps(result.as_json()))
    else:
        for s in result.steps:
            print(f"{'ok ' if s.ok else 'FAIL'}\t{s.name}\t{s.detail}")
    if not result.ok:
        return fail(f"provider '{cfg.name}' failed the test: {result.reason}")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    paths, _ = context()
    store = provider_store(paths)
    cfg = store.get(args.name)
    if cfg is None or not store.remove(args.name):
        return fail(f"no provider '{args.name}'")
    aliases, _ = _stores()
    users = sorted({a for a, ts in aliases.all().items() for t in ts if t.startswith(cfg.prefix)})
    if users:
        log.warning("aliases still naming %s models: %s", cfg.prefix, ", ".join(users))
    members = groups.naming(paths, cfg)
    if members:
        log.warning("groups still naming %s: %s", cfg.name, ", ".join(members))
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """providers add / ls / test / rm (and group / ungroup / groups)."""
    p = sub.add_parser("providers", help="remote engines (vLLM, Ollama, another Hearth...)")
    psub = p.add_subparsers(dest="providers_command", metavar="ACTION", required=True)
    s = psub.add_parser("add", help="add (or replace) a remote engine")
    s.add_argument("name", help="[a-z0-9-]+")
    s.add_argument("url", help="the engine's OpenAI base URL, e.g. http://10.0.0.5:8000/v1")
    s.add_argument(
        "--api-key",
        help="sent as a Bearer token (kept in provider_keys.json, 0600); '-' reads it from stdin",
    )
    s.add_argument("--kind", choices=KINDS, help="default: detected from the engine's answers")
    s.add_argument("--prefix", help="what its model ids start with (default NAME/)")
    s.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT, metavar="S")
    s.add_argument(
        "--first-token-timeout", type=float, default=DEFAULT_FIRST_TOKEN_TIMEOUT, metavar="S"
    )
    s.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT, metavar="S")
    s.add_argument(
        "--follow-redirects",
        action="store_true",
        help="follow the engine's redirects (default: a redirect answers 502, never followed)",
    )
    s.set_defaults(func=cmd_add)
    s = psub.add_parser("ls", help="list providers with their state (each is probed now)")
    s.add_argument("--json", action="store_true", help="one JSON array on stdout")
    s.set_defaults(func=cmd_ls)
    s = psub.add_parser("test", help="health, model list and a 1-token chat; exit 1 on failure")
    s.add_argument("name")
    s.add_argument("--json", action="store_true", help="the steps as one JSON object")
    s.set_defaults(func=cmd_test)
    s = psub.add_parser("rm", help="remove a provider (and its key)")
    s.add_argument("name")
    s.set_defaults(func=cmd_rm)
    groups.add_parsers(psub)
