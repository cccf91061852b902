"""Aliases and fallback chains: ``hearth alias set|rm|ls``. They edit the aliases file directly
(under its lock), so they work with or without a server; a running one sees the change within a
second (its FileCache stats the file).
Tested by tests/server/gateway/test_gateway.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from app.cli.common import EXIT_OK, context, fail, log
from app.compose import provider_store
from app.core.gateway import AliasStore
from app.core.library.index import ModelLibrary
from app.errors import ModelNotFound


def _stores() -> tuple[AliasStore, ModelLibrary]:
    paths, store = context()
    settings = store.load()
    models_dir = Path(settings.models_dir) if settings.models_dir else paths.models
    return AliasStore(paths.aliases_file), ModelLibrary(paths.library_file, models_dir)


def _is_model(library: ModelLibrary) -> Any:
    """A local id, or a remote ``PREFIX/id`` of a configured provider."""
    paths, _ = context()
    prefixes = [c.prefix for c in provider_store(paths).all().values()]

    def is_model(model_id: str) -> bool:
        if any(model_id.startswith(p) and len(model_id) > len(p) for p in prefixes):
            return True
        try:
            library.get(model_id)
        except ModelNotFound:
            return False
        return True

    return is_model


def cmd_set(args: argparse.Namespace) -> int:
    aliases, library = _stores()
    targets = aliases.set(args.alias, args.targets, _is_model(library))
    print(f"{args.alias} -> {', '.join(targets)}")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    aliases, _ = _stores()
    if not aliases.remove(args.alias):
        return fail(f"no alias '{args.alias}'")
    users = aliases.users_of(args.alias)
    if users:
        log.warning("still pointing at '%s': %s", args.alias, ", ".join(users))
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    aliases, _ = _stores()
    items = aliases.all()
    if args.json:
        print(json.dumps([{"alias": a, "targets": list(ts)} for a, ts in items.items()]))
        return EXIT_OK
    for a, ts in items.items():
        print(f"{a}\t{', '.join(ts)}")
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """alias set / rm / ls."""
    p = sub.add_parser("alias", help="model aliases and fallback chains")
    asub = p.add_subparsers(dest="alias_command", metavar="ACTION", required=True)
    s = asub.add_parser(
        "set", help="make ALIAS stand for TARGET (several: an ordered fallback chain)"
    )
    s.add_argument("alias")
    s.add_argument("targets", nargs="+", metavar="TARGET", help="a model id or another alias")
    s.set_defaults(func=cmd_set)
    s = asub.add_parser("rm", help="remove an alias")
    s.add_argument("alias")
    s.set_defaults(func=cmd_rm)
    s = asub.add_parser("ls", help="list aliases and their targets")
    s.add_argument("--json", action="store_true", help="one JSON array on stdout")
    s.set_defaults(func=cmd_ls)
