"""``hearth cache stats|clear``: the response cache, read and cleared in its SQLite
file directly (no server needed; a running one sees a clear at its next request), or in the
shared Redis when the settings' ``state.url`` names one (stats: the shared cache's; clear: the
shared cache and this machine's file, which a gateway serves from while Redis is away).
Tested by tests/e2e/cli/test_cache_cli.py and tests/redis_state/test_cache.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from app.cli.common import EXIT_OK, context, fail
from app.core.gateway.cache.replay import stats_object
from app.core.gateway.cache.store import CacheStore
from app.paths import AppPaths

T = TypeVar("T")


class _Unreachable(Exception):
    """The shared state named in the settings cannot be used (the message says why)."""


def on_shared(url: str, paths: AppPaths, act: Callable[[Any], T]) -> T:
    """``act(store)`` on the response cache in the shared Redis at ``url`` (over this machine's
    file). Raises _Unreachable with a plain message when Redis cannot be used."""
    from app.redis_state.cache import RedisCacheStore
    from app.redis_state.connection import SharedState, redact

    try:
        shared = SharedState(url)
    except ValueError as e:
        raise _Unreachable(f"settings: state.url: {e}") from None
    try:
        shared.sync.ping()
        shared.succeeded()
        local = CacheStore(paths.response_cache_db) if paths.response_cache_db.exists() else None
        store = RedisCacheStore(shared, local=local)
        try:
            return act(store)
        finally:
            store.close()
    except (redis.RedisError, OSError, sqlite3.Error) as e:
        raise _Unreachable(
            f"cannot reach the response cache in the shared state at {redact(url)}: {e}"
        ) from None
    finally:
        asyncio.run(shared.close())


def cmd_stats(args: argparse.Namespace) -> int:
    paths, store = context()
    settings = store.load()
    cfg = settings.cache
    counts: dict[str, int] = {}  # no file yet: an empty cache (nothing is created)
    if settings.state.url:
        try:
            counts = on_shared(settings.state.url, paths, lambda s: s.stats())
        except _Unreachable as e:
            return fail(str(e))
    elif paths.response_cache_db.exists():
        cache = CacheStore(paths.response_cache_db)
        try:
            counts = cache.stats()
        except (sqlite3.Error, OSError) as e:
            return fail(f"cannot read the response cache at {paths.response_cache_db}: {e}")
        finally:
            cache.close()
    out = stats_object(cfg.mode, cfg, counts)
    if args.json:
        print(json.dumps(out))
        return EXIT_OK
    looked_up = out["hits"] + out["semantic_hits"] + out["misses"]
    rate = (
        f" ({(out['hits'] + out['semantic_hits']) / looked_up:.0%} hit rate)" if looked_up else ""
    )
    print(f"mode\t{out['mode']}")
    print(f"entries\t{out['entries']} of {out['max_entries']} ({out['bytes']} bytes)")
    print(f"ttl\t{out['ttl_s']:g}s")
    print(f"hits\t{out['hits']} exact, {out['semantic_hits']} semantic{rate}")
    print(f"misses\t{out['misses']}")
    print(f"bypasses\t{out['bypasses']}")
    return EXIT_OK


def cmd_clear(args: argparse.Namespace) -> int:
    paths, store = context()
    url = store.load().state.url
    if url:
        try:
            n = on_shared(url, paths, lambda s: s.clear())
        except _Unreachable as e:
            return fail(str(e))
    else:
        cache = CacheStore(paths.response_cache_db)
        try:
            n = cache.clear()
        except (sqlite3.Error, OSError) as e:
            return fail(f"cannot clear the response cache at {paths.response_cache_db}: {e}")
        finally:
            cache.close()
    print(f"cleared {n} cached response{'' if n == 1 else 's'}")
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("cache", help="the response cache: stats, clear")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    s = csub.add_parser("stats", help="entries, hits and misses")
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")
    s.set_defaults(func=cmd_stats)
    c = csub.add_parser("clear", help="remove every cached response and reset the counts")
    c.set_defaults(func=cmd_clear)
