"""Saved conversations: the message tree, the SQLite store, exports."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.workspace.conversation_export import FORMAT, from_json, to_json, to_markdown
from app.core.workspace.conversations import (
    SCHEMA_VERSION,
    TITLE_CHARS,
    Conversation,
    ConversationStore,
)
from app.errors import ConfigError, NotFound


def contents(conv: Conversation) -> list[str]:
    return [m.content for m in conv.path()]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    s = ConversationStore(tmp_path / "conversations.sqlite")
    yield s
    s.close()


def three_answers() -> tuple[Conversation, list[str]]:
    """Q, then three answers to it (two regenerations)."""
    c = Conversation(model="m", system_prompt="Be brief.", params={"temperature": 0.2})
    q = c.add(None, "user", "What is 2+2?")
    ids = [c.add(q.id, "assistant", f"answer {i}").id for i in range(3)]
    return c, ids


def test_the_tree_branches_and_the_switcher_moves_between_siblings() -> None:
    c, (a0, a1, a2) = three_answers()
    assert c.selected == a2 and contents(c) == ["What is 2+2?", "answer 2"]
    assert [c.branch(a) for a in (a0, a1, a2)] == [(1, 3), (2, 3), (3, 3)]
    assert c.switch_branch(a2, +1) is None  # at the end already
    assert c.switch_branch(a2, -1) == a1 and contents(c)[-1] == "answer 1"
    assert c.switch_branch(a1, -1) == a0 and c.selected == a0
    assert c.switch_branch(a0, -1) is None and c.selected == a0
    assert [m.id for m in c.children(c.path()[0].id)] == [a0, a1, a2]
    assert c.children(None)[0].content == "What is 2+2?"


def test_select_goes_to_the_leaf_last_selected_under_a_message() -> None:
    c = Conversation()
    q = c.add(None, "user", "q")
    a = c.add(q.id, "assistant", "a")
    f1 = c.add(a.id, "user", "follow 1")
    r1 = c.add(f1.id, "assistant", "reply 1")
    f2 = c.add(a.id, "user", "follow 2")  # an edited follow-up: a sibling of f1
    r2 = c.add(f2.id, "assistant", "reply 2")
    b = c.add(q.id, "assistant", "b")  # a regenerated first answer
    assert c.selected == b.id
    assert c.select(a.id) == r2.id  # the leaf last selected under a, not the first one
    c.switch_branch(f2.id, -1)
    assert c.selected == r1.id
    c.select(b.id)
    assert c.select(a.id) == r1.id  # remembered: r1 was the last one selected under a
    assert contents(c) == ["q", "a", "follow 1", "reply 1"]


def test_delete_message_removes_its_subtree_and_moves_the_selection() -> None:
    c, (a0, a1, a2) = three_answers()
    follow = c.add(a2, "user", "more")
    c.delete_message(a2)  # the selected path went through it
    assert follow.id not in c and a2 not in c and len(c) == 3
    assert c.selected == a1  # the sibling before
    c.delete_message(a0)  # not on the path: the selection stays
    assert c.selected == a1 and c.branch(a1) == (1, 1)
    c.delete_message(a1)  # the last sibling: the parent is selected
    assert contents(c) == ["What is 2+2?"]
    c.delete_message(c.selected or "")
    assert c.selected is None and len(c) == 0 and c.path() == []


def test_the_first_user_message_names_the_conversation() -> None:
    c = Conversation()
    c.add(None, "user", "  Explain\nthe   difference between " + "very " * 30 + "long words")
    assert len(c.title) == TITLE_CHARS and c.title.endswith("…")
    assert c.title.startswith("Explain the difference between very")
    c.add(None, "user", "Another first message")  # an edit of it: the title stays
    assert c.title.startswith("Explain")


def test_save_and_load_restores_the_tree_settings_and_selection(
    store: ConversationStore, tmp_path: Path
) -> None:
    c, (a0, a1, _) = three_answers()
    c.update(a1, reasoning="thinking hard", extras={"finish_reason": "stop", "stats": {"n": 3}})
    c.select(a1)
    store.save(c)
    other = ConversationStore(tmp_path / "conversations.sqlite")  # a fresh reader: from disk
    try:
        back = other.load(c.id)
    finally:
        other.close()
    assert (back.model, back.system_prompt, back.params) == ("m", "Be brief.", {"temperature": 0.2})
    assert back.selected == a1 and back.title == "What is 2+2?"
    assert [m.content for m in back.messages()] == [m.content for m in c.messages()]
    got = back.get(a1)
    assert got.reasoning == "thinking hard" and got.extras["stats"] == {"n": 3}
    assert back.branch(a0) == (1, 3)
    with pytest.raises(NotFound):
        store.load("nope")


def test_a_second_save_writes_only_the_changed_rows_and_deletions(
    store: ConversationStore, tmp_path: Path
) -> None:
    c, (a0, a1, a2) = three_answers()
    store.save(c)
    c.update(a2, content="answer 2, longer")
    c.delete_message(a0)
    n = c.add(a2, "user", "next")
    store.save(c)
    raw = sqlite3.connect(tmp_path / "conversations.sqlite")
    rows = dict(raw.execute("SELECT id, content FROM messages").fetchall())
    raw.close()
    assert rows == {
        c.path()[0].id: "What is 2+2?",
        a1: "answer 1",
        a2: "answer 2, longer",
        n.id: "next",
    }


def test_list_is_newest_first_and_search_finds_titles_and_message_text(
    store: ConversationStore,
) -> None:
    old = Conversation(model="a", created=1000.0)
    old.add(None, "user", "Paris trip plans", created=1000.0)
    old.add(old.selected, "assistant", "Visit the Louvre 100% early_on", created=1001.0)
    new = Conversation(model="b", created=2000.0)
    new.add(None, "user", "Rust lifetimes", created=2000.0)
    store.save(old)
    store.save(new)
    listed = store.list()
    assert [s.id for s in listed] == [new.id, old.id]
    assert (listed[1].title, listed[1].model, listed[1].message_count) == (
        "Paris trip plans",
        "a",
        2,
    )
    assert [s.id for s in store.list("louvre")] == [old.id]  # message text, any case
    assert [s.id for s in store.list("RUST")] == [new.id]  # title
    assert [s.id for s in store.list("100%")] == [old.id]
    assert store.list("lo_vre") == []  # _ is a character, not a wildcard
    assert store.list("nothing like this") == []


def test_delete_hides_at_once_and_undo_brings_it_back_within_the_window(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "c.sqlite", undo_seconds=30)
    try:
        c, _ = three_answers()
        store.save(c)
        store.delete(c.id, now=1000.0)
        assert store.list() == [] and store.list("2+2") == []
        with pytest.raises(NotFound):
            store.load(c.id)
        store.undelete(c.id)
        assert [s.id for s in store.list()] == [c.id]
        store.delete(c.id, now=1000.0)
        assert store.purge_deleted(now=1029.0) == 0  # still in the window
        assert store.purge_deleted(now=1031.0) == 1
        with pytest.raises(NotFound):
            store.undelete(c.id)
        raw = sqlite3.connect(tmp_path / "c.sqlite")
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
        raw.close()
    finally:
        store.close()


def test_a_deleted_conversation_is_purged_when_the_store_opens_after_the_window(
    tmp_path: Path,
) -> None:
    store = ConversationStore(tmp_path / "c.sqlite", undo_seconds=30)
    c, _ = three_answers()
    store.save(c)
    store.delete(c.id, now=time.time() - 60)
    store.close()
    store = ConversationStore(tmp_path / "c.sqlite", undo_seconds=30)
    try:
        with pytest.raises(NotFound):
            store.undelete(c.id)
    finally:
        store.close()


def test_rename_and_duplicate(store: ConversationStore) -> None:
    c, (a0, _, _) = three_answers()
    store.save(c)
    store.rename(c.id, "  Arithmetic \n")
    dup = store.duplicate(c.id)
    assert dup.id != c.id and dup.title == "Arithmetic (copy)"
    loaded = store.load(dup.id)
    assert [m.id for m in loaded.messages()] == [m.id for m in c.messages()]
    assert loaded.selected == c.selected and loaded.model == "m"
    # the two are independent
    loaded.delete_message(a0)
    store.save(loaded)
    assert len(store.load(c.id)) == 4 and len(store.load(dup.id)) == 3
    assert {s.title for s in store.list()} == {"Arithmetic", "Arithmetic (copy)"}
    with pytest.raises(NotFound):
        store.rename("nope", "x")


def test_json_export_is_the_whole_tree_and_reads_back() -> None:
    c, (a0, a1, a2) = three_answers()
    c.update(a1, reasoning="hmm", extras={"finish_reason": "stop"})
    c.select(a1)
    data = json.loads(json.dumps(to_json(c)))
    assert data["format"] == FORMAT == "hearth.conversation/1"
    assert set(data) == {
        "format",
        "id",
        "title",
        "created",
        "updated",
        "model",
        "system_prompt",
        "params",
        "selected",
        "messages",
    }
    assert data["selected"] == a1 and data["params"] == {"temperature": 0.2}
    assert [m["id"] for m in data["messages"]][1:] == [a0, a1, a2]
    assert set(data["messages"][0]) == {
        "id",
        "parent_id",
        "role",
        "content",
        "reasoning",
        "created",
        "model",
        "extras",
    }
    assert data["messages"][0]["parent_id"] is None and data["created"].endswith("Z")
    back = from_json(data)
    assert back.selected == a1 and back.branch(a1) == (2, 3)
    assert back.get(a1).extras == {"finish_reason": "stop"}


def test_markdown_export_is_the_selected_path_with_thinking_collapsed() -> None:
    c, (a0, a1, _) = three_answers()
    c.update(a0, reasoning="two and two")
    c.get(a0).model = "smol"
    c.select(a0)
    md = to_markdown(c)
    assert md.startswith("# What is 2+2?\n")
    assert "## System prompt\n\nBe brief." in md
    assert "## You\n\nWhat is 2+2?" in md
    assert "## Assistant · smol\n\n<details>\n<summary>Thinking</summary>\n\ntwo and two" in md
    assert "answer 0" in md and "answer 1" not in md and "answer 2" not in md
    assert "two and two" not in to_markdown(c, thinking=False)


def test_the_schema_version_is_set_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite"
    ConversationStore(db).close()
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 1
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(ConfigError, match="schema version 2"):
        ConversationStore(db)


def test_saving_a_500_message_tree(store: ConversationStore) -> None:
    """Printed, not asserted: a first save, then a save per streamed chunk batch."""
    c = Conversation(model="m")
    parent = None
    for i in range(500):
        role = "user" if i % 2 == 0 else "assistant"
        parent = c.add(parent, role, f"message {i} " + "lorem ipsum " * 60).id
    t0 = time.perf_counter()
    store.save(c)
    first = time.perf_counter() - t0
    leaf = c.add(parent, "assistant", "")
    times = []
    for k in range(20):  # the answer growing, saved after each chunk batch
        c.update(leaf.id, content="streamed " * (k + 1))
        t0 = time.perf_counter()
        store.save(c)
        times.append(time.perf_counter() - t0)
    assert len(store.load(c.id)) == 501
    print(
        f"\n500-message save: first {first * 1000:.1f} ms, "
        f"then per chunk batch {sorted(times)[len(times) // 2] * 1000:.2f} ms (median)"
    )
