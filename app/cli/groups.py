"""Replica groups: ``hearth providers group|ungroup|groups``. They edit ``groups.json``
directly (under its lock), so they work with or without a server; a running one picks a change
up within a second. ``groups`` asks the server running here for its view (each member's
circuit state and requests in flight, ``GET /api/v1/providers/groups``); with none running,
it checks each member's engine now (one health check each, side by side): ready or
unreachable.
Tested by tests/e2e/cli/test_groups_cli.py."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from app.cli.alias import _stores
from app.cli.common import EXIT_OK, api, api_key, context, fail, find_server
from app.compose import group_store, provider_store
from app.core.gateway.groups.router import default_health_path
from app.core.gateway.groups.store import (
    STRATEGIES,
    GroupConfig,
    GroupStore,
    member_targets,
    owner,
)
from app.core.gateway.providers.store import ProviderStore
from app.errors import HearthError, InvalidRequest
from app.runtimes.remote.client import RemoteEngine


def cmd_group(args: argparse.Namespace) -> int:
    paths, _ = context()
    providers = provider_store(paths)
    aliases, library = _stores()
    base = GroupConfig(args.name, tuple(args.members))
    cfg = GroupConfig(
        args.name,
        tuple(args.members),
        strategy=args.strategy or base.strategy,
        prefix_tokens=args.prefix_tokens if args.prefix_tokens is not None else base.prefix_tokens,
        health_interval_s=_or(args.health_interval, base.health_interval_s),
        health_timeout_s=_or(args.health_timeout, base.health_timeout_s),
        health_path=args.health_path or "",
        cooldown_s=_or(args.cooldown, base.cooldown_s),
        failures_to_open=(
            args.failures_to_open if args.failures_to_open is not None else base.failures_to_open
        ),
    )

    def taken(name: str) -> str | None:
        if library.has(name):
            return f"the library model '{name}'"
        if name in aliases.all(fresh=True):
            return f"the alias '{name}'"
        return None

    try:
        saved = group_store(paths).set(cfg, providers.all(fresh=True), taken)
    except InvalidRequest as e:
        return fail(e.message)
    print(f"{saved.name}\t{saved.strategy}\t{' '.join(saved.members)}")
    return EXIT_OK


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def naming(paths: Any, provider: Any) -> list[str]:
    """The groups with a member on ``provider`` (its name, or a target under its prefix)."""
    return [
        g.name
        for g in group_store(paths).all(fresh=True).values()
        if any(m == provider.name or m.startswith(provider.prefix) for m in g.members)
    ]


def cmd_ungroup(args: argparse.Namespace) -> int:
    paths, _ = context()
    if not group_store(paths).remove(args.name):
        return fail(f"no group '{args.name}'")
    return EXIT_OK


async def _listing(groups: GroupStore, providers: ProviderStore) -> list[dict[str, Any]]:
    configs = providers.all()

    async def state(name: str, cfg: GroupConfig) -> tuple[str, str | None]:
        p = configs.get(name)
        if p is None:
            return "unknown", "no such provider"
        engine = RemoteEngine(p, providers.key(name))
        try:
            path = cfg.health_path or default_health_path(p.kind)
            answer = await engine.check(path, cfg.health_timeout_s)
        finally:
            await engine.close()
        if 200 <= answer.status < 300:
            return "ready", None
        return "unreachable", f"HTTP {answer.status}" if answer.status else str(answer.body)

    out = []
    for cfg in groups.all().values():
        targets = member_targets(cfg, lambda n: configs[n].prefix if n in configs else None)
        owners = [owner(t, configs) for t in targets]
        found = await asyncio.gather(*(state(o or "", cfg) for o in owners))
        item = cfg.as_json()
        item["members"] = [
            {"member": m, "target": t, "provider": o, "state": s, "in_flight": None, "error": e}
            for m, t, o, (s, e) in zip(cfg.members, targets, owners, found, strict=True)
        ]
        out.append(item)
    return out


def _from_server(paths: Any, args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The running server's view (its circuits and requests in flight), or None when no
    server runs here or it does not answer (then each engine is checked from here)."""
    root = find_server(paths, None)
    if root is None:
        return None
    try:
        got = api(root, "GET", "/api/v1/providers/groups", None, api_key(args))
    except (HearthError, OSError):
        return None
    groups = got.get("groups") if isinstance(got, dict) else None
    return groups if isinstance(groups, list) else None


def cmd_groups(args: argparse.Namespace) -> int:
    paths, _ = context()
    listing = _from_server(paths, args)
    if listing is None:
        listing = asyncio.run(_listing(group_store(paths), provider_store(paths)))
    if args.json:
        print(json.dumps(listing))
        return EXIT_OK
    for g in listing:
        print(f"{g['name']}\t{g['strategy']}")
        for m in g["members"]:
            why = f"\t{m['error']}" if m["error"] else ""
            print(f"  {m['target']}\t{m['state']}{why}")
    return EXIT_OK


def add_parsers(psub: Any) -> None:
    """providers group / ungroup / groups."""
    s = psub.add_parser("group", help="create (or replace) a replica group")
    s.add_argument("name", help="the model id clients name")
    s.add_argument(
        "members",
        nargs="+",
        metavar="MEMBER",
        help="PREFIX/remote-id, or a provider NAME (its PREFIX + the group's name)",
    )
    s.add_argument("--strategy", choices=STRATEGIES, help="default: least-busy")
    s.add_argument("--prefix-tokens", type=int, metavar="N", help="prefix strategy (default 256)")
    s.add_argument("--health-interval", type=float, metavar="S", help="default 5")
    s.add_argument("--health-timeout", type=float, metavar="S", help="default 2")
    s.add_argument("--health-path", metavar="P", help="default /health (or /v1/models)")
    s.add_argument("--cooldown", type=float, metavar="S", help="an open circuit's (default 15)")
    s.add_argument(
        "--failures-to-open",
        type=int,
        metavar="N",
        help="failures in a row that open a member's circuit (default 2)",
    )
    s.set_defaults(func=cmd_group)
    s = psub.add_parser("ungroup", help="remove a replica group")
    s.add_argument("name")
    s.set_defaults(func=cmd_ungroup)
    s = psub.add_parser(
        "groups",
        help="list groups and each member's state (the running server's, else checked now)",
    )
    s.add_argument("--json", action="store_true", help="one JSON array on stdout")
    s.add_argument("--api-key", help="the running server's admin key (default $HEARTH_API_KEY)")
    s.set_defaults(func=cmd_groups)
