"""An MCP tool result as the text of a tool message: text as is, structured content as JSON
(when the text does not already carry it), images, audio and resources as a short note.
Tested by tests/core/workspace/mcp/test_manager.py."""

from __future__ import annotations

import json
from typing import Any

MAX_RESULT_CHARS = 32_000  # a tool that returns a whole web page must not fill the context


def result_text(result: Any) -> str:
    """The content of a ``CallToolResult`` (duck-typed: ``content``, ``structured_content``)."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            mime = getattr(block, "mime_type", "") or kind
            size = len(getattr(block, "data", "") or "") * 3 // 4  # base64 to bytes
            parts.append(f"[{kind} ({mime}, about {size} bytes) returned; not shown to the model]")
        elif kind == "resource_link":
            parts.append(f"[resource: {getattr(block, 'uri', '')}]")
        elif kind == "resource":
            res = getattr(block, "resource", None)
            text = getattr(res, "text", None)
            parts.append(
                text if isinstance(text, str) else f"[resource: {getattr(res, 'uri', '')}]"
            )
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        dumped = json.dumps(structured, ensure_ascii=False)
        # the SDK also sends a structured result as text: say it once
        if not parts or not any(_same_json(p, structured) for p in parts):
            parts.append(dumped)
    text = "\n".join(parts) if parts else "(the tool returned nothing)"
    if len(text) > MAX_RESULT_CHARS:
        text = (
            text[:MAX_RESULT_CHARS] + f"\n[... cut: {len(text) - MAX_RESULT_CHARS} more characters]"
        )
    return text


def _same_json(text: str, value: Any) -> bool:
    try:
        parsed = json.loads(text)
    except ValueError:
        return False
    return bool(parsed == value or (isinstance(value, dict) and value.get("result") == parsed))
