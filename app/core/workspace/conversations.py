"""Saved conversations: a tree of messages per conversation, in one SQLite file.

Siblings (messages with the same parent) are branches, in creation order: regenerating an
answer adds an assistant sibling, editing a message adds a user sibling. A conversation
remembers its selected leaf; the path root..leaf is what is shown and sent to the model.

The store writes a conversation in ONE transaction (WAL mode): a process killed mid-save leaves
the old version or the new one, never a mix. Only the rows that changed since the store last
wrote or read that conversation are written, so saving after each streamed chunk batch of a
long conversation stays cheap.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app.core.util.sqlite_wal import open_wal
from app.errors import ConfigError, NotFound

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
TITLE_CHARS = 60
UNDO_SECONDS = 30.0  # a deleted conversation can be brought back this long (then purged)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS conversations (id TEXT PRIMARY KEY, title TEXT NOT NULL, "
    "title_set INTEGER NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, model TEXT, "
    "system_prompt TEXT NOT NULL, params TEXT NOT NULL, selected TEXT, "
    "message_count INTEGER NOT NULL, deleted REAL)",
    "CREATE TABLE IF NOT EXISTS messages (conversation_id TEXT NOT NULL, id TEXT NOT NULL, "
    "seq INTEGER NOT NULL, parent_id TEXT, role TEXT NOT NULL, content TEXT NOT NULL, "
    "reasoning TEXT NOT NULL, created REAL NOT NULL, model TEXT, extras TEXT NOT NULL, "
    "PRIMARY KEY (conversation_id, id))",
    "CREATE INDEX IF NOT EXISTS conversations_updated ON conversations (updated)",
)
_CONV_COLS = (
    "id, title, title_set, created, updated, model, system_prompt, params, selected, message_count"
)
_MSG_COLS = "id, seq, parent_id, role, content, reasoning, created, model, extras"


@dataclass(slots=True)
class Message:
    """One message of the tree. ``extras`` (JSON) carries what the other parts add:
    attachments, chunks_used, tool_calls, tool_results, stats, finish_reason."""

    id: str
    parent_id: str | None
    role: str  # user | assistant | tool
    content: str  # markdown
    reasoning: str = ""
    created: float = 0.0
    model: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    seq: int = 0  # creation order within the conversation (orders siblings)


def make_title(text: str) -> str:
    """A title from a message: its words on one line, at most ``TITLE_CHARS`` characters."""
    words = " ".join(text.split())
    if len(words) <= TITLE_CHARS:
        return words
    return words[: TITLE_CHARS - 1].rstrip() + "…"


def new_id() -> str:
    return uuid.uuid4().hex


class Conversation:
    """A conversation: its settings and a tree of messages with one selected leaf."""

    def __init__(
        self,
        *,
        id: str | None = None,
        title: str = "",
        title_set: bool = False,
        created: float | None = None,
        updated: float | None = None,
        model: str | None = None,
        system_prompt: str = "",
        params: dict[str, Any] | None = None,
    ) -> None:
        now = time.time()
        self.id = id or new_id()
        self.title = title
        self.title_set = title_set  # renamed by the user: the first message no longer names it
        self.created = now if created is None else created
        self.updated = self.created if updated is None else updated
        self.model = model
        self.system_prompt = system_prompt
        self.params: dict[str, Any] = dict(params or {})
        self.selected: str | None = None
        self._messages: dict[str, Message] = {}
        self._children: dict[str | None, list[str]] = {None: []}
        self._choice: dict[str | None, str] = {}  # per parent: the child last on the selection
        self._seq = 0

    # -- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._messages)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._messages

    def get(self, msg_id: str) -> Message:
        try:
            return self._messages[msg_id]
        except KeyError:
            raise NotFound(f"no message {msg_id!r} in conversation {self.id}") from None

    def messages(self) -> list[Message]:
        """Every message, in creation order."""
        return sorted(self._messages.values(), key=lambda m: m.seq)

    def children(self, msg_id: str | None) -> list[Message]:
        """The children of ``msg_id`` (None: the first messages) in creation order."""
        return [self._messages[c] for c in self._children.get(msg_id, [])]

    def path(self, leaf: str | None = None) -> list[Message]:
        """The messages root..``leaf`` (default: the selected leaf)."""
        cur = self.selected if leaf is None else leaf
        out: list[Message] = []
        while cur is not None:
            m = self.get(cur)
            out.append(m)
            cur = m.parent_id
        out.reverse()
        return out

    def branch(self, msg_id: str) -> tuple[int, int]:
        """(i, n): ``msg_id`` is the i-th (1-based) of its n siblings (the "‹ 2/3 ›" switcher)."""
        sibs = self._children[self.get(msg_id).parent_id]
        return sibs.index(msg_id) + 1, len(sibs)

    # -- changing --------------------------------------------------------------------------------
    def add(
        self,
        parent_id: str | None,
        role: str,
        content: str,
        *,
        reasoning: str = "",
        model: str | None = None,
        extras: dict[str, Any] | None = None,
        created: float | None = None,
        id: str | None = None,
    ) -> Message:
        """Add a message under ``parent_id`` (None: a first message); it becomes the selected
        leaf. The first user message names an unnamed conversation."""
        if parent_id is not None:
            self.get(parent_id)
        now = time.time() if created is None else created
        self._seq += 1
        m = Message(
            id or new_id(),
            parent_id,
            role,
            content,
            reasoning,
            now,
            model,
            dict(extras or {}),
            self._seq,
        )
        self._insert(m)
        self._select_path(m.id)
        if role == "user" and not self.title_set and not self.title:
            self.title = make_title(content)
        self.touch(now)
        return m

    def update(
        self,
        msg_id: str,
        *,
        content: str | None = None,
        reasoning: str | None = None,
        extras: dict[str, Any] | None = None,
    ) -> Message:
        """Change a message in place (a streamed answer growing, its stats at the end)."""
        m = self.get(msg_id)
        if content is not None:
            m.content = content
        if reasoning is not None:
            m.reasoning = reasoning
        if extras is not None:
            m.extras = dict(extras)
        self.touch()
        return m

    def select(self, msg_id: str | None) -> str | None:
        """Select ``msg_id``'s branch: the selected leaf becomes the leaf last selected under
        it (else the latest one). Returns the new selected leaf."""
        if msg_id is None:
            kids = self._children[None]
            if not kids:
                self.selected = None
                return None
            msg_id = self._choice.get(None, kids[-1])
        cur = self.get(msg_id).id
        while self._children.get(cur):
            kids = self._children[cur]
            cur = self._choice.get(cur, kids[-1])
        self._select_path(cur)
        return cur

    def switch_branch(self, msg_id: str, step: int) -> str | None:
        """Select the sibling ``step`` (-1 or +1) away from ``msg_id``; None at either end."""
        sibs = self._children[self.get(msg_id).parent_id]
        j = sibs.index(msg_id) + step
        if not 0 <= j < len(sibs):
            return None
        self.select(sibs[j])
        return sibs[j]

    def delete_message(self, msg_id: str) -> None:
        """Delete ``msg_id`` and its subtree; a selection inside it moves to a sibling (the one
        before, else the one after) or else to the parent."""
        m = self.get(msg_id)
        on_path = msg_id in {x.id for x in self.path()} if self.selected else False
        stack = [msg_id]
        while stack:
            cur = stack.pop()
            stack.extend(self._children.pop(cur, []))
            self._choice.pop(cur, None)
            del self._messages[cur]
        sibs = self._children[m.parent_id]
        i = sibs.index(msg_id)
        sibs.remove(msg_id)
        if self._choice.get(m.parent_id) == msg_id:
            del self._choice[m.parent_id]
        if on_path:
            if sibs:
                self.select(sibs[max(0, i - 1)])
            elif m.parent_id is not None:
                self._select_path(m.parent_id)
            else:
                self.selected = None
        self.touch()

    def touch(self, now: float | None = None) -> None:
        self.updated = time.time() if now is None else max(now, self.updated)

    def copy(self, *, id: str | None = None, title: str | None = None) -> Conversation:
        """A copy with its own id (messages keep theirs: ids are per conversation)."""
        c = Conversation(
            id=id or new_id(),
            title=self.title if title is None else title,
            title_set=self.title_set if title is None else True,
            created=time.time(),
            model=self.model,
            system_prompt=self.system_prompt,
            params=json.loads(json.dumps(self.params)),
        )
        for m in self.messages():
            c._insert(replace(m, extras=json.loads(json.dumps(m.extras))))
        c._seq = self._seq
        c._choice = dict(self._choice)
        c.selected = self.selected
        return c

    # -- internals -------------------------------------------------------------------------------
    def _insert(self, m: Message) -> None:
        self._messages[m.id] = m
        self._children.setdefault(m.parent_id, []).append(m.id)
        self._seq = max(self._seq, m.seq)

    def _select_path(self, leaf: str) -> None:
        self.selected = leaf
        for m in self.path(leaf):
            self._choice[m.parent_id] = m.id


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    """A row of the sidebar."""

    id: str
    title: str
    updated: float
    model: str | None
    message_count: int


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class ConversationStore:
    """Conversations in ``conversations.sqlite`` (WAL). Usable from any thread (one lock).

    Search is a ``LIKE`` scan over titles and message text (case-insensitive for ASCII): no
    index to keep in step, and fast enough for a person's chat history.
    """

    def __init__(self, path: Path, *, undo_seconds: float = UNDO_SECONDS) -> None:
        self.path = path
        self.undo_seconds = undo_seconds
        self._lock = threading.Lock()
        self._conn = open_wal(path, _SCHEMA, SCHEMA_VERSION)
        found = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if found != SCHEMA_VERSION:  # written by a newer Hearth: do not guess at its shape
            self._conn.close()
            raise ConfigError(
                f"{path} has schema version {found}; this Hearth reads {SCHEMA_VERSION}"
            )
        # per conversation, the rows as last written or read: save writes only what differs
        self._known: dict[str, dict[str, tuple[Any, ...]]] = {}
        self.purge_deleted()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- reading ---------------------------------------------------------------------------------
    def list(self, query: str = "") -> list[ConversationSummary]:
        """Conversations newest first; with ``query``, those whose title or any message
        contains it."""
        sql = "SELECT id, title, updated, model, message_count FROM conversations c "
        sql += "WHERE deleted IS NULL"
        args: list[Any] = []
        if query.strip():
            sql += (
                " AND (title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE "
                "m.conversation_id = c.id AND (m.content LIKE ? ESCAPE '\\' "
                "OR m.reasoning LIKE ? ESCAPE '\\')))"
            )
            args += [_like(query.strip())] * 3
        sql += " ORDER BY updated DESC, rowid DESC"
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
        return [ConversationSummary(*r) for r in rows]

    def load(self, conv_id: str) -> Conversation:
        """The conversation ``conv_id`` (NotFound if there is none, or it was deleted)."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                row = self._conn.execute(
                    f"SELECT {_CONV_COLS} FROM conversations WHERE id = ? AND deleted IS NULL",
                    (conv_id,),
                ).fetchone()
                msgs = self._conn.execute(
                    f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? ORDER BY seq",
                    (conv_id,),
                ).fetchall()
            finally:
                self._conn.execute("COMMIT")
        if row is None:
            raise NotFound(f"no conversation {conv_id!r}")
        cid, title, title_set, created, updated, model, system, params, selected, _ = row
        conv = Conversation(
            id=cid,
            title=title,
            title_set=bool(title_set),
            created=created,
            updated=updated,
            model=model,
            system_prompt=system,
            params=json.loads(params),
        )
        known: dict[str, tuple[Any, ...]] = {}
        for mid, seq, parent, role, content, reasoning, mcreated, mmodel, extras in msgs:
            conv._insert(
                Message(
                    mid, parent, role, content, reasoning, mcreated, mmodel, json.loads(extras), seq
                )
            )
            known[mid] = (cid, mid, seq, parent, role, content, reasoning, mcreated, mmodel, extras)
        if selected is not None and selected in conv:
            conv._select_path(selected)
        else:
            conv.select(None)
        with self._lock:
            self._known[cid] = known
        return conv

    def extras_values(self, key: str) -> tuple[Any, ...]:
        """``extras[key]`` of every stored message that has it, deleted conversations still in
        their undo window included (what the image cleanup keeps)."""
        pattern = _like(json.dumps(key))
        with self._lock:
            rows = self._conn.execute(
                "SELECT extras FROM messages WHERE extras LIKE ? ESCAPE '\\'", (pattern,)
            ).fetchall()
        out = []
        for (raw,) in rows:
            extras = json.loads(raw)
            if isinstance(extras, dict) and key in extras:
                out.append(extras[key])
        return tuple(out)

    # -- writing ---------------------------------------------------------------------------------
    def save(self, conv: Conversation) -> None:
        """Write ``conv`` in one transaction (created or replaced; undeletes it)."""
        rows = {
            m.id: (
                conv.id,
                m.id,
                m.seq,
                m.parent_id,
                m.role,
                m.content,
                m.reasoning,
                m.created,
                m.model,
                json.dumps(m.extras, ensure_ascii=False, sort_keys=True),
            )
            for m in conv._messages.values()
        }
        head = (
            conv.id,
            conv.title,
            int(conv.title_set),
            conv.created,
            conv.updated,
            conv.model,
            conv.system_prompt,
            json.dumps(conv.params, sort_keys=True),
            conv.selected,
            len(rows),
        )
        with self._lock:
            known = self._known.get(conv.id)
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute(
                    f"INSERT OR REPLACE INTO conversations ({_CONV_COLS}, deleted) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                    head,
                )
                if known is None:  # not written or read here: replace every row
                    c.execute("DELETE FROM messages WHERE conversation_id = ?", (conv.id,))
                    changed = list(rows.values())
                else:
                    gone = [(conv.id, mid) for mid in known if mid not in rows]
                    c.executemany("DELETE FROM messages WHERE conversation_id = ? AND id = ?", gone)
                    changed = [r for mid, r in rows.items() if known.get(mid) != r]
                c.executemany(
                    f"INSERT OR REPLACE INTO messages (conversation_id, {_MSG_COLS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    changed,
                )
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                self._known.pop(conv.id, None)  # unsure what is there now: rewrite it all next
                raise
            self._known[conv.id] = rows

    def rename(self, conv_id: str, title: str) -> None:
        """Give ``conv_id`` the user's title (its first message no longer names it)."""
        title = " ".join(title.split())
        with self._lock:
            cur = self._conn.execute(
                "UPDATE conversations SET title = ?, title_set = 1 WHERE id = ?",
                (title, conv_id),
            )
        if cur.rowcount == 0:
            raise NotFound(f"no conversation {conv_id!r}")

    def delete(self, conv_id: str, *, now: float | None = None) -> None:
        """Delete ``conv_id``: hidden at once, kept ``undo_seconds`` for ``undelete``."""
        t = time.time() if now is None else now
        with self._lock:
            cur = self._conn.execute(
                "UPDATE conversations SET deleted = ? WHERE id = ? AND deleted IS NULL",
                (t, conv_id),
            )
        if cur.rowcount == 0:
            raise NotFound(f"no conversation {conv_id!r}")

    def undelete(self, conv_id: str) -> None:
        """Bring back a conversation deleted less than ``undo_seconds`` ago."""
        with self._lock:
            cur = self._conn.execute(
                "UPDATE conversations SET deleted = NULL WHERE id = ? AND deleted IS NOT NULL",
                (conv_id,),
            )
        if cur.rowcount == 0:
            raise NotFound(f"no deleted conversation {conv_id!r} (the undo window has passed)")

    def purge_deleted(self, *, now: float | None = None) -> int:
        """Remove for good the conversations deleted over ``undo_seconds`` ago; how many."""
        cutoff = (time.time() if now is None else now) - self.undo_seconds
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                ids = [
                    r[0]
                    for r in c.execute(
                        "SELECT id FROM conversations WHERE deleted IS NOT NULL AND deleted <= ?",
                        (cutoff,),
                    )
                ]
                c.executemany("DELETE FROM messages WHERE conversation_id = ?", [(i,) for i in ids])
                c.executemany("DELETE FROM conversations WHERE id = ?", [(i,) for i in ids])
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
            for i in ids:
                self._known.pop(i, None)
        return len(ids)

    def duplicate(self, conv_id: str) -> Conversation:
        """A saved copy of ``conv_id`` named "TITLE (copy)"; returned."""
        src = self.load(conv_id)
        dup = src.copy(title=f"{src.title} (copy)" if src.title else "(copy)")
        dup.title_set = src.title_set
        self.save(dup)
        return dup
