"""A whole call block of one family's format parsed at once (``<|python_tag|>`` calls, and
callers that have a finished block rather than a stream).
Tested by tests/core/inference/tools/test_parser.py and tests/core/inference/test_reasoning.py."""

from __future__ import annotations

import json
import re
from typing import Any

from app.core.util import jsonsafe


def typed_value(v: str) -> Any:
    """A parameter's text as the JSON value it spells, else as a string."""
    try:
        return jsonsafe.loads(v)
    except ValueError:
        return v


def _args(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _json_calls(obj: Any) -> list[tuple[str, str]]:
    items = obj if isinstance(obj, list) else [obj]
    out = []
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("name"), str):
            raise ValueError("not a call")
        args = it.get("arguments", it.get("parameters", {}))
        out.append((it["name"], _args(args)))
    return out


def parse_block(family: str, block: str) -> list[tuple[str, str]]:
    """(name, arguments JSON) for each call in one block of ``family``'s format."""
    b = block.strip()
    if family in ("hermes", "mistral", "llama3"):
        if family == "llama3" and not b.startswith(("{", "[")):
            # <|python_tag|>name.call(key="value") is the built-in tool form; keep JSON only
            m = re.fullmatch(r"([\w.]+)\((.*)\)", b, re.S)
            if not m:
                raise ValueError("unrecognized llama3 call")
            kwargs = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', m.group(2)))
            return [(m.group(1), json.dumps(kwargs))]
        calls: list[tuple[str, str]] = []
        pos = 0
        while pos < len(b):  # several objects may follow each other (llama3 parallel calls)
            obj, end = jsonsafe.raw_decode(b, pos)
            calls.extend(_json_calls(obj))
            pos = end
            while pos < len(b) and b[pos] in " \n\t;,":
                pos += 1
        return calls
    if family == "qwen3coder":
        m = re.search(r"<function=([^>\s]+)>(.*?)</function>", b, re.S)
        if not m:
            raise ValueError("no function")
        params = {}
        for k, v in re.findall(r"<parameter=([^>\s]+)>(.*?)</parameter>", m.group(2), re.S):
            params[k] = typed_value(v.strip("\n"))
        return [(m.group(1), json.dumps(params, ensure_ascii=False))]
    if family == "harmony":
        m = re.match(r"([\w.-]+)\s*(?:<\|constrain\|>\s*json)?\s*<\|message\|>(.*)", b, re.S)
        if not m:
            raise ValueError("no harmony call")
        return [(m.group(1), _args(jsonsafe.loads(m.group(2))))]
    if family == "deepseek":
        m = re.match(r"(?:function)?<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*?)\n```", b, re.S)
        if not m:
            raise ValueError("no deepseek call")
        return [(m.group(1).strip(), _args(jsonsafe.loads(m.group(2))))]
    raise ValueError(f"unknown family {family}")
