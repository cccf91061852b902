"""fast_loads answers what json.loads answers, value and error alike, on the texts where
orjson and the standard library part ways (app/core/util/jsonsafe.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from app.core.util.jsonsafe import fast_loads

SAME = [
    '{"a": 1, "a": 2}',  # the last duplicate wins
    "123456789012345678901234567890",  # past 64 bits: an int, not a float
    '{"seed": 18446744073709551616}',
    "[18446744073709551615, -9223372036854775808]",
    "1e400",  # past a float's range: inf
    "[NaN, Infinity, -Infinity]",  # not JSON, yet json.loads reads them
    "[-0.0, 5e-324, 1E2, 1.0000000000000002]",
    '"\\ud800"',  # a lone surrogate escape
    '"\\u00e9 \\ud83d\\ude00"',
    ' {"x": [true, false, null]} \n',
    "[" * 200 + "]" * 200,
]
BAD = ['{"a": 1,}', '"a\x01"', "", "[1, 2", "01"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("text", SAME)
@pytest.mark.parametrize("as_bytes", [False, True])
def test_the_same_value_as_json_loads(text: str, as_bytes: bool) -> None:
    data = text.encode("utf-8", "surrogatepass") if as_bytes else text
    assert _same(fast_loads(data), json.loads(data))


def test_a_bom_is_read_as_json_reads_it() -> None:
    data = b"\xef\xbb\xbf" + b'{"a": 1}'
    assert fast_loads(data) == json.loads(data) == {"a": 1}


@pytest.mark.parametrize("text", BAD)
def test_the_same_error_as_json_loads(text: str) -> None:
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    with pytest.raises(ValueError) as ours:
        fast_loads(text)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_nesting_past_both_limits_is_json_loads_own_error() -> None:
    text = "[" * 5000 + "]" * 5000  # past orjson's 1,024 levels and Python's recursion limit
    with pytest.raises(RecursionError):
        json.loads(text)
    with pytest.raises(RecursionError):
        fast_loads(text)


def test_json_options_apply_to_what_orjson_refuses() -> None:
    def refuse(name: str) -> Any:
        raise LookupError(name)

    assert fast_loads("[1.5]", parse_constant=refuse) == [1.5]
    with pytest.raises(LookupError, match="NaN"):
        fast_loads("[NaN]", parse_constant=refuse)
