"""Named API keys: ``hearth keys add|ls|rm``. They edit keys.json directly (under its lock), so
they work with or without a server; a running one sees a change at its next request. With
shared state (``state.url`` in the settings, or ``--state URL``) they edit the keys in Redis
instead, which every gateway of the team sees within a second or so."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from app.cli.common import EXIT_OK, context, fail
from app.core.gateway.keys import KeyStore
from app.errors import InvalidRequest
from app.settings import generate_key


def _store(args: argparse.Namespace) -> KeyStore:
    paths, settings = context()
    url = getattr(args, "state", None) or settings.load().state.url
    if not url:
        return KeyStore(paths.keys_file)
    from app.redis_state.connection import SharedState
    from app.redis_state.keys import SharedKeyStore

    try:
        store = SharedKeyStore(SharedState(url), paths.keys_file)
    except ValueError as e:
        raise InvalidRequest(f"--state: {e}", param="state") from None
    store.load()  # StateUnavailable (a clear error) when Redis does not answer
    return store


def cmd_add(args: argparse.Namespace) -> int:
    secret = generate_key()
    _store(args).add(
        args.name, secret, rpm=args.rpm, tpm=args.tpm, models=args.models or (), admin=args.admin
    )
    print(secret)  # alone on stdout, this once: only its hash is kept
    return EXIT_OK


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else "-"


def cmd_ls(args: argparse.Namespace) -> int:
    keys = list(_store(args).all().values())
    if args.json:
        print(json.dumps([k.public() for k in keys]))
        return EXIT_OK
    for k in keys:
        models = ",".join(k.models) or "*"
        role = "admin" if k.admin else "user"
        print(
            f"{k.name}\t{role}\trpm={k.rpm or '-'}\ttpm={k.tpm or '-'}\t{models}"
            f"\tcreated {_when(k.created_at)}\tlast used {_when(k.last_used_at)}"
        )
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    if not _store(args).remove(args.name):
        return fail(f"no key '{args.name}'")
    return EXIT_OK


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be 0 or more (0 = no limit)")
    return n


def _state_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        default=None,
        metavar="URL",
        help="the keys shared in this Redis (default from settings: state.url; off: keys.json)",
    )


def add_parsers(sub: Any) -> None:
    """keys add / ls / rm."""
    p = sub.add_parser("keys", help="named API keys for the server (limits, models, roles)")
    ksub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    s = ksub.add_parser("add", help="create a key; prints it once (only its hash is stored)")
    s.add_argument("name", help="letters, digits, '.', '_', '-'")
    s.add_argument("--rpm", type=_count, default=0, metavar="N", help="requests per minute")
    s.add_argument("--tpm", type=_count, default=0, metavar="N", help="tokens per minute")
    s.add_argument(
        "--models", nargs="+", metavar="PATTERN", help="only models matching these (fnmatch)"
    )
    s.add_argument("--admin", action="store_true", help="may use the management routes")
    _state_flag(s)
    s.set_defaults(func=cmd_add)
    s = ksub.add_parser("ls", help="list keys (never their secrets)")
    s.add_argument("--json", action="store_true", help="one JSON array on stdout")
    _state_flag(s)
    s.set_defaults(func=cmd_ls)
    s = ksub.add_parser("rm", help="remove a key (a running server refuses it at once)")
    s.add_argument("name")
    _state_flag(s)
    s.set_defaults(func=cmd_rm)
