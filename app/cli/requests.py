"""``hearth requests``: the request records, newest first, read from the database directly (no
server needed; a running one keeps writing meanwhile).
Tested by tests/e2e/test_request_records_kill.py."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from app.cli.common import EXIT_OK, EXIT_USAGE, context
from app.core.gateway.records import RequestRecord, iso_utc, read_records, status_range


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.0f}"


def _line(r: RequestRecord) -> str:
    tokens = (
        f"{r.prompt_tokens}/{r.completion_tokens}" if r.prompt_tokens or r.completion_tokens else ""
    )
    tps = "" if r.tokens_per_second is None else f"{r.tokens_per_second:.1f}"
    cells = (
        iso_utc(r.time),
        str(r.status),
        r.error_code or "",
        f"{r.method} {r.route}".strip(),
        r.answered_by or r.model or "",
        tokens,
        _ms(r.ttft_ms),
        _ms(r.total_ms),
        tps,
        r.key or "",
    )
    return "\t".join(cells)


HEADER = "time\tstatus\terror\troute\tmodel\ttokens in/out\tttft ms\ttotal ms\ttok/s\tkey"


def cmd_requests(args: argparse.Namespace) -> int:
    try:
        status = status_range(args.status) if args.status is not None else None
    except ValueError as e:
        print(f"hearth: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.limit < 1:
        print("hearth: error: --limit must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    paths, _ = context()
    rows = read_records(paths.requests_db, limit=args.limit, model=args.model, status=status)
    if args.json:
        out: list[dict[str, Any]] = [r.as_json() for r in rows]
        print(json.dumps(out))
        return EXIT_OK
    if rows:
        print(HEADER)
    for r in rows:
        print(_line(r))
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("requests", help="the server's request records, newest first")
    p.add_argument("--json", action="store_true", help="one JSON array on stdout")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (default 50)")
    p.add_argument(
        "--model", metavar="M", help="only requests that asked for or were answered by M"
    )
    p.add_argument("--status", metavar="S", help="only this status: a code (429) or a class (4xx)")
    p.set_defaults(func=cmd_requests)
