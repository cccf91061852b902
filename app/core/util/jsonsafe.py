"""JSON decoding of untrusted text (a client's tool-call arguments, a model's output).

``json.loads`` raises RecursionError, not ValueError, on text nested deeper than Python's
recursion limit (``[[[[...`` 100,000 deep is 200 KB): callers that treat bad JSON as a
ValueError then fail with a 500. These wrappers make nesting over ``MAX_DEPTH`` bad JSON.
``fast_loads`` is ``json.loads``'s answer read by orjson where orjson gives the same one (every
request body and every chunk from an engine is parsed on the event loop).
Tested by tests/core/engine/test_scheduler.py, tests/core/inference/test_chat_template.py and
tests/core/util/test_jsonsafe.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

try:
    import orjson
except ImportError:  # the standard library alone gives the same answers, slower
    orjson = None  # type: ignore[assignment]

MAX_DEPTH = 128  # real tool arguments nest a handful of levels
_DECODER = json.JSONDecoder()
# orjson reads an integer past 64 bits as a float (json: an int); twenty digits in a row may be
# one, so such a text is read by json alone
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{20}")
_LONG_DIGITS_STR = re.compile(r"[0-9]{20}")


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


def fast_loads(data: bytes | str, **json_kwargs: Any) -> Any:
    """``json.loads(data, **json_kwargs)``: the same value, or the same error.

    orjson reads it when it can, and it is strict: whatever it refuses (NaN and Infinity, a
    number past a float's range, a lone surrogate, nesting past 1,024, a BOM, bad JSON) is read
    again by ``json.loads`` with ``json_kwargs`` (``parse_constant``...), whose answer or error
    it is. RecursionError is ``json.loads``'s, as without this function.
    """
    if orjson is not None:
        long_digits = _LONG_DIGITS_BYTES if isinstance(data, bytes) else _LONG_DIGITS_STR
        if long_digits.search(data) is None:  # type: ignore[arg-type]
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
    return json.loads(data, **json_kwargs)
