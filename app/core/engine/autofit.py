"""Auto-fit context: the largest context that fits the memory budget free at load.

A load whose context is 0 ("auto", the default) gets the model's trained context, capped by
``load.max_auto_context`` in settings, or, when that would not fit the budget free at load time
(idle models count as free: the load evicts them), the largest multiple of ``STEP`` tokens that
does. An explicit context always wins. The choice
comes with a sentence saying why, which the Load dialog, ``hearth load`` and the log show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from app.core.types import LoadOptions
from app.core.util.units import human_bytes

DEFAULT_MAX_AUTO_CONTEXT = 32768
STEP = 1024  # auto contexts below the top are multiples of this
FLOOR = 2048  # the least auto picks (or the trained length, when smaller)
_HUGE = 1 << 30  # asks an estimate for the trained length: it clamps the context to it


@dataclass(frozen=True, slots=True)
class ContextChoice:
    """What auto-fit chose: the options to load with, and why (one sentence)."""

    options: LoadOptions
    reason: str
    auto: bool  # False: the context was explicit


def _fmt(n: int) -> str:
    return f"{n:,}"


def choose_context(
    options: LoadOptions,
    *,
    estimate: Callable[[LoadOptions], tuple[int, int]],
    free_bytes: int,
    cap: int = DEFAULT_MAX_AUTO_CONTEXT,
) -> ContextChoice:
    """Resolve ``options.context_length`` 0 to a number.

    Args:
        estimate: options -> (the context the estimate used, bytes it needs); the context it
            reports is clamped to the model's trained length.
        free_bytes: the memory budget this load can use (budget minus what models that stay
            use: busy and pinned ones; idle ones are evicted for it).
        cap: ``load.max_auto_context``.
    """
    if options.context_length:
        return ContextChoice(options, f"set explicitly ({_fmt(options.context_length)})", False)
    cap = max(256, cap)
    trained, _ = estimate(replace(options, context_length=_HUGE))
    top = min(trained, cap)
    why_top = (
        f"the model's trained length ({_fmt(trained)})"
        if top == trained
        else f"the cap for auto contexts in Settings ({_fmt(cap)}; trained: {_fmt(trained)})"
    )

    def need(n: int) -> int:
        return estimate(replace(options, context_length=n))[1]

    top_need = need(top)
    if top_need <= free_bytes:
        return ContextChoice(replace(options, context_length=top), f"auto: {why_top}", True)
    floor = min(FLOOR, top)
    lo, hi = floor // STEP, (top - 1) // STEP  # candidates: multiples of STEP below top
    best = 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if mid * STEP >= floor and need(mid * STEP) <= free_bytes:
            best, lo = mid * STEP, mid + 1
        else:
            hi = mid - 1
    if best:
        return ContextChoice(
            replace(options, context_length=best),
            f"auto: the most that fits the {human_bytes(free_bytes)} of the memory budget this load "
            f"can use ({_fmt(top)}, {why_top.split(' (')[0]}, would need {human_bytes(top_need)})",
            True,
        )
    return ContextChoice(
        replace(options, context_length=floor),
        f"auto: the smallest auto context ({_fmt(floor)}); even it needs more than the "
        f"{human_bytes(free_bytes)} of the memory budget this load can use",
        True,
    )
