"""The conversation sidebar: list, search, open/new, the context menu, delete+undo."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.workspace.conversations import Conversation, ConversationStore
from app.gui.views.chat.conversation_list import ConversationList


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    s = ConversationStore(tmp_path / "conversations.sqlite")
    for i, (q, a) in enumerate(
        [("Paris trip", "See the Louvre"), ("Rust lifetimes", "Borrowing"), ("Soup", "Leeks")]
    ):
        c = Conversation(model=f"model-{i}", created=1_700_000_000.0 + i)
        c.add(None, "user", q, created=1_700_000_000.0 + i)
        c.add(c.selected, "assistant", a, created=1_700_000_000.0 + i)
        s.save(c)
    yield s
    s.close()


def titles(w: ConversationList) -> list[str]:
    return [w.list_widget.item(i).text().split("\n")[0] for i in range(w.list_widget.count())]


def test_lists_newest_first_with_date_and_model_and_searches(
    qtbot: QtBot, store: ConversationStore
) -> None:
    w = ConversationList(store)
    qtbot.addWidget(w)
    assert titles(w) == ["Soup", "Rust lifetimes", "Paris trip"]
    day = datetime.fromtimestamp(1_700_000_002.0).strftime("%Y-%m-%d")  # not today: the day
    assert w.list_widget.item(0).text().split("\n")[1] == f"{day} · model-2"
    qtbot.keyClicks(w.search_edit, "louvre")  # found in a message, not the title
    assert titles(w) == ["Paris trip"]
    w.search_edit.setText("nothing")
    assert titles(w) == [] and w.empty_label.isVisibleTo(w) and w.empty_label.text() == "No match."
    w.search_edit.clear()
    assert len(titles(w)) == 3 and not w.empty_label.isVisibleTo(w)


def test_clicking_opens_and_new_chat_asks_for_one(qtbot: QtBot, store: ConversationStore) -> None:
    w = ConversationList(store)
    qtbot.addWidget(w)
    w.show()
    item = w.list_widget.item(1)
    with qtbot.waitSignal(w.conversation_opened) as opened:
        rect = w.list_widget.visualItemRect(item)
        qtbot.mouseClick(w.list_widget.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert opened.args == [item.data(Qt.ItemDataRole.UserRole)]
    with qtbot.waitSignal(w.new_chat_requested):
        qtbot.mouseClick(w.new_button, Qt.MouseButton.LeftButton)


def test_delete_then_undo_from_the_bar(qtbot: QtBot, store: ConversationStore) -> None:
    w = ConversationList(store)
    qtbot.addWidget(w)
    conv_id = w.ids()[1]
    menu = w.context_menu(conv_id)
    assert [a.text() for a in menu.actions()] == [
        "Rename…",
        "Duplicate",
        "Export Markdown…",
        "Export JSON…",
        "Delete",
    ]
    with qtbot.waitSignal(w.conversation_deleted):
        menu.actions()[4].trigger()
    assert titles(w) == ["Soup", "Paris trip"] and w.undo_bar.isVisibleTo(w)
    assert w.undo_label.text() == "Deleted “Rust lifetimes”"
    assert [s.title for s in store.list()] == ["Soup", "Paris trip"]  # gone from the store too
    with qtbot.waitSignal(w.conversation_restored):
        qtbot.mouseClick(w.undo_button, Qt.MouseButton.LeftButton)
    assert titles(w) == ["Soup", "Rust lifetimes", "Paris trip"] and not w.undo_bar.isVisibleTo(w)
    # the bar goes on its own; then the delete stands
    w.undo_ms = 1
    w.delete(conv_id)
    qtbot.waitUntil(lambda: not w.undo_bar.isVisibleTo(w), timeout=5000)
    assert titles(w) == ["Soup", "Paris trip"]


def test_rename_duplicate_and_exports(
    qtbot: QtBot, store: ConversationStore, tmp_path: Path
) -> None:
    w = ConversationList(store)
    qtbot.addWidget(w)
    conv_id = w.ids()[2]
    w.rename(conv_id, "Holiday")
    assert titles(w)[2] == "Holiday"
    menu = w.context_menu(conv_id)
    menu.actions()[1].trigger()  # Duplicate
    assert sorted(titles(w)) == ["Holiday", "Holiday (copy)", "Rust lifetimes", "Soup"]
    w.export_markdown(conv_id, tmp_path / "h.md")
    md = (tmp_path / "h.md").read_text(encoding="utf-8")
    assert md.startswith("# Holiday\n") and "See the Louvre" in md
    w.export_json(conv_id, tmp_path / "h.json")
    data = json.loads((tmp_path / "h.json").read_text(encoding="utf-8"))
    assert data["format"] == "hearth.conversation/1" and len(data["messages"]) == 2
    errors: list[str] = []
    w.failed.connect(errors.append)
    w.export_json(conv_id, tmp_path / "no" / "such" / "dir.json")
    assert errors and "Could not write" in errors[0]
