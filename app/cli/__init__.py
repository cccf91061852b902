"""The front door: no subcommand opens the desktop app; subcommands script the same core.

Exit codes: 0 success, 1 failure, 2 usage error. Results go to stdout, logs to stderr. One small
module per command group: serve.py (serve, the app), models.py (library and loaded models),
hub.py (the Hugging Face Hub), transcribe.py (speech to text); load_flags.py turns the load option table into flags.
"""

from __future__ import annotations

import argparse
import sys

from app import __version__
from app.cli import (
    alias,
    cache,
    connect,
    doctor,
    hub,
    keys,
    models,
    providers,
    requests,
    serve,
    transcribe,
)
from app.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, fail, setup_logging
from app.compose import build_service
from app.errors import HearthError

__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "build_parser", "build_service", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hearth",
        description="Run open LLMs locally; serve them over an OpenAI-compatible API.",
    )
    p.add_argument("--version", action="version", version=f"hearth {__version__}")
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging on stderr (-vv for debug)"
    )
    p.add_argument(
        "--background",
        action="store_true",
        help="open the desktop app hidden in the tray (what start at login runs)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parsers(sub)
    models.add_parsers(sub)
    hub.add_parsers(sub)
    alias.add_parsers(sub)
    providers.add_parsers(sub)
    keys.add_parsers(sub)
    doctor.add_parsers(sub)
    requests.add_parsers(sub)
    connect.add_parsers(sub)
    cache.add_parsers(sub)
    transcribe.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(connect.exec_argv(sys.argv[1:] if argv is None else argv))
    setup_logging(args.verbose)
    func = getattr(args, "func", serve.cmd_gui)
    try:
        return func(args)
    except HearthError as e:
        return fail(e.message)
    except KeyboardInterrupt:
        return 130
