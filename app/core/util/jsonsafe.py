"""JSON decoding of untrusted text (a client's tool-call arguments, a model's output).

``json.loads`` raises RecursionError, not ValueError, on text nested deeper than Python's
recursion limit (``[[[[...`` 100,000 deep is 200 KB): callers that treat bad JSON as a
ValueError then fail with a 500. These wrappers make nesting over ``MAX_DEPTH`` bad JSON.
Tested by tests/core/engine/test_scheduler.py and tests/core/inference/test_chat_template.py.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 128  # real tool arguments nest a handful of levels
_DECODER = json.JSONDecoder()


def _too_deep(text: str, start: int = 0) -> bool:
    """Whether brackets nest deeper than MAX_DEPTH (strings skipped); cheap when shallow."""
    if text.count("[", start) + text.count("{", start) <= MAX_DEPTH:
        return False
    depth = 0
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif c in "]}":
            depth -= 1
        i += 1
    return False


def loads(text: str) -> Any:
    """``json.loads``; nesting deeper than MAX_DEPTH raises ValueError like any bad JSON."""
    if _too_deep(text):
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None


def raw_decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """``JSONDecoder.raw_decode`` with the same depth bound."""
    if _too_deep(text, pos):
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
