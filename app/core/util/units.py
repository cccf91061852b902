"""Byte sizes as people read them (one formatter for the core's messages and the GUI).
Tested by tests/core/engine/test_autofit.py and tests/gui/views/library/test_memory.py."""

from __future__ import annotations


def human_bytes(n: int | None) -> str:
    """``98362432`` -> ``"93.8 MiB"``; binary units because that is what file managers show."""
    if n is None or n < 0:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # unreachable; keeps type checkers calm
