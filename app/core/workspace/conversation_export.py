"""A conversation written out: Markdown (the selected path) and JSON (the whole tree).

JSON shape (``"format": "hearth.conversation/1"``)::

    {"format": "hearth.conversation/1", "id": str, "title": str,
     "created": ISO-8601 UTC, "updated": ISO-8601 UTC, "model": str | null,
     "system_prompt": str, "params": {...}, "selected": message id | null,
     "messages": [{"id", "parent_id" (null for a first message), "role", "content",
                   "reasoning", "created" (ISO-8601 UTC), "model", "extras"}, ...]}

``messages`` is in creation order, so siblings (branches) keep their order. A user message's
``extras.images`` lists the images it carried, as references, not bytes: ``file`` (the image's
file in the data folder's ``chat-images/``, named by the SHA-256 of its bytes), ``sha256``,
``name``, ``width``, ``height``, ``bytes``. Markdown names each image under its message.
Tested by tests/core/workspace/test_chat_images.py and tests/core/workspace/test_conversations.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.core.workspace.chat_images import image_refs
from app.core.workspace.conversations import Conversation, Message
from app.errors import InvalidRequest

FORMAT = "hearth.conversation/1"
_ROLE_NAMES = {"user": "You", "assistant": "Assistant", "tool": "Tool", "system": "System"}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _from_iso(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def to_json(conv: Conversation) -> dict[str, Any]:
    """The whole tree in the ``hearth.conversation/1`` shape (json.dumps-able)."""
    return {
        "format": FORMAT,
        "id": conv.id,
        "title": conv.title,
        "created": _iso(conv.created),
        "updated": _iso(conv.updated),
        "model": conv.model,
        "system_prompt": conv.system_prompt,
        "params": conv.params,
        "selected": conv.selected,
        "messages": [_message_json(m) for m in conv.messages()],
    }


def _message_json(m: Message) -> dict[str, Any]:
    return {
        "id": m.id,
        "parent_id": m.parent_id,
        "role": m.role,
        "content": m.content,
        "reasoning": m.reasoning,
        "created": _iso(m.created),
        "model": m.model,
        "extras": m.extras,
    }


def from_json(data: dict[str, Any]) -> Conversation:
    """A conversation from ``to_json``'s shape (an import; a new id is the caller's choice).

    Raises:
        InvalidRequest: not a ``hearth.conversation/1`` document, or a parent that is missing.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidRequest(f"not a {FORMAT} document")
    try:
        conv = Conversation(
            id=str(data["id"]),
            title=str(data.get("title", "")),
            title_set=True,
            created=_from_iso(data["created"]),
            updated=_from_iso(data["updated"]),
            model=data.get("model"),
            system_prompt=str(data.get("system_prompt", "")),
            params=dict(data.get("params") or {}),
        )
        for m in data["messages"]:
            conv.add(
                m["parent_id"],
                str(m["role"]),
                str(m["content"]),
                reasoning=str(m.get("reasoning", "")),
                model=m.get("model"),
                extras=dict(m.get("extras") or {}),
                created=_from_iso(m["created"]),
                id=str(m["id"]),
            )
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidRequest(f"a malformed {FORMAT} document: {e}") from e
    conv.updated = _from_iso(data["updated"])
    sel = data.get("selected")
    if isinstance(sel, str) and sel in conv:
        conv.select(sel)
    return conv


def to_markdown(conv: Conversation, *, thinking: bool = True) -> str:
    """The selected path as Markdown: the title, the model and system prompt, then each
    message under a heading. A message's reasoning is a collapsed ``<details>`` block above
    its text (``thinking=False`` leaves it out)."""
    out = [f"# {conv.title or 'Untitled conversation'}", ""]
    meta = [f"- Date: {_iso(conv.created)}"]
    if conv.model:
        meta.append(f"- Model: {conv.model}")
    out += meta + [""]
    if conv.system_prompt:
        out += ["## System prompt", "", conv.system_prompt, ""]
    for m in conv.path():
        name = _ROLE_NAMES.get(m.role, m.role.title())
        if m.role == "assistant" and m.model:
            name += f" · {m.model}"
        out += [f"## {name}", ""]
        if thinking and m.reasoning:
            out += [
                "<details>",
                "<summary>Thinking</summary>",
                "",
                m.reasoning.strip(),
                "",
                "</details>",
                "",
            ]
        out += [m.content, ""]
        for ref in image_refs(m.extras):
            size = f", {ref.get('width')}×{ref.get('height')}" if ref.get("width") else ""
            out += [f"*[image: {ref.get('name') or ref['file']}{size} · {ref['file']}]*", ""]
    return "\n".join(out).rstrip() + "\n"
