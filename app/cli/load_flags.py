"""CLI flags generated from the load option table (``app.core.engine.load_options.SPECS``).

Each option gets its table flag (``--ctx``, ``--parallel`` ...) with the table's help; a value out
of the table's range is a usage error (exit 2) before anything runs.
Tested by tests/core/engine/test_load_options.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from app.core.engine.load_options import OptionSpec, specs
from app.errors import InvalidRequest

_DEST = "load_option_"


def _parser_for(spec: OptionSpec) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value: Any = int(text) if spec.kind == "int" else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: {spec.name} must be {spec.describe_range()}"
            ) from None
        try:
            return spec.check(value)
        except InvalidRequest as e:
            raise argparse.ArgumentTypeError(f"{text!r}: {e.message}") from None

    parse.__name__ = spec.kind  # argparse names the type in its messages
    return parse


def add_load_flags(parser: argparse.ArgumentParser, *, title: str = "load options") -> None:
    """Add one flag per load option (only those given reach the load)."""
    group = parser.add_argument_group(title)
    for spec in specs():
        dest = _DEST + spec.name
        if spec.kind == "bool":
            group.add_argument(spec.flag, dest=dest, action="store_true", help=spec.help)
        elif spec.kind == "choice":
            group.add_argument(spec.flag, dest=dest, choices=spec.choices, help=spec.help)
        else:
            bounded = spec.minimum is not None or spec.maximum is not None
            group.add_argument(
                spec.flag,
                dest=dest,
                type=_parser_for(spec),
                metavar="N",
                help=spec.help + (f"; {spec.describe_range()}" if bounded else ""),
            )


def load_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line, by option name (a bool flag flips the default)."""
    out: dict[str, Any] = {}
    for spec in specs():
        v = getattr(args, _DEST + spec.name, None)
        if spec.kind == "bool":
            if v:
                out[spec.name] = not spec.default
        elif v is not None:
            out[spec.name] = v
    return out
