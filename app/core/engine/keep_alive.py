"""Keep-alive durations as the APIs spell them: seconds, "5m", "1h30m", "-1" (never).
Tested by tests/core/engine/test_autofit.py and tests/core/engine/test_scheduler.py."""

from __future__ import annotations

import re
from typing import Any

from app.errors import InvalidRequest


def parse_keep_alive(value: Any, *, param: str = "keep_alive") -> float | None:
    """Seconds from a TTL / Ollama keep_alive: numbers are seconds; "5m", "1h30m", "10s", "-1".

    Returns None for "never unload" (any negative value).

    Raises:
        InvalidRequest: not a number or duration.
    """
    if isinstance(value, bool):
        raise InvalidRequest(
            f"'{param}' must be a number of seconds or a duration like \"5m\"", param=param
        )
    if isinstance(value, int | float):
        secs = float(value)
    elif isinstance(value, str):
        s = value.strip().lower()
        try:
            secs = float(s)
        except ValueError:
            m = re.fullmatch(r"(-?)((?:\d+(?:\.\d+)?(?:ms|h|m|s))+)", s)
            if not m:
                raise InvalidRequest(
                    f"'{param}' must be a number of seconds or a duration like \"5m\"", param=param
                ) from None
            unit = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
            secs = sum(
                float(n) * unit[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", m.group(2))
            )
            if m.group(1):
                secs = -secs
    else:
        raise InvalidRequest(
            f"'{param}' must be a number of seconds or a duration like \"5m\"", param=param
        )
    if secs != secs or secs in (float("inf"), float("-inf")):
        raise InvalidRequest(f"'{param}' must be finite", param=param)
    return None if secs < 0 else secs
