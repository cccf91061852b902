"""Human-readable numbers for tables and labels.
Tested by tests/gui/test_pages.py and tests/gui/views/test_discover.py."""

from __future__ import annotations

from app.core.util.units import human_bytes

__all__ = ["grouped", "human_byte_range", "human_bytes", "human_count"]


def human_byte_range(lo: int, hi: int) -> str:
    """``(1.2 GiB, 7.7 GiB)`` -> ``"1.2–7.7 GiB"``; one number when both ends are equal."""
    a, b = human_bytes(lo), human_bytes(hi)
    if a == b:
        return a
    a_num, _, a_unit = a.partition(" ")
    b_num, _, b_unit = b.partition(" ")
    return f"{a_num}–{b}" if a_unit == b_unit else f"{a}–{b}"


def human_count(n: int | None) -> str:
    """Parameter counts the way model cards write them: ``134515008`` -> ``"135M"``."""
    if not n or n < 0:
        return ""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            value = n / div
            return f"{value:.0f}{suffix}" if value >= 100 else f"{value:.3g}{suffix}"
    return str(n)


def grouped(n: int | None) -> str:
    """``8192`` -> ``"8,192"``; empty for unknown."""
    return f"{n:,}" if n else ""
