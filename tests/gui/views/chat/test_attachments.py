"""Files on the Chat page: a file dropped onto the page becomes a chip (name, size,
remove), a binary one is refused with the reason, a long paste becomes an attachment; a send
with a big file retrieves its chunks with the real MiniLM embedder and the notice under the
answer names them; with no embedding model the message is not sent and says the fix.

The chat model is the scripted engine over the real worker (one token per character, so the
test reads the exact prompt it got); the embedder is the real llama.cpp runtime on MiniLM.
Retrieval on SmolLM2 itself is tests/runtimes/llama/test_retrieval_real.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.core.types import LoadOptions, LocalModel, Runtime
from app.core.workspace.conversations import ConversationStore
from app.core.workspace.retrieval import NO_EMBEDDER_FIX
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.views.chat.attachments import LONG_PASTE_CHARS
from app.gui.views.chat.page import ChatPage
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.gui.helpers import SLOW
from tests.support.fakes import FakeModel, FakeRuntime
from tests.support.gguf_files import write_model

FACT = "The vault password is tangerine."


class SplitRuntime:
    """GGUF embedders on llama.cpp (MiniLM), every other GGUF on the scripted engine."""

    name = "split"
    formats = ("gguf",)

    def __init__(self, probe_file: Path) -> None:
        self.fake = FakeRuntime(delay=0.0, pieces=("It", " is", " tangerine", "."))
        self.llama = LlamaCppRuntime(probe_file=probe_file)

    def available(self) -> bool:
        return True

    def load(self, model: LocalModel, options: LoadOptions) -> Any:
        if model.extra.get("embedding"):
            return self.llama.load(model, options)
        return self.fake.load(model, options)


@pytest.fixture
def split(probe_file: Path) -> SplitRuntime:
    return SplitRuntime(probe_file)


@pytest.fixture
def gui_runtimes(split: SplitRuntime) -> dict[str, Runtime]:
    return {"gguf": cast(Runtime, split)}


@pytest.fixture
def page(qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge, tmp_path: Path) -> ChatPage:
    store = ConversationStore(tmp_path / "conversations.sqlite")  # turns are saved
    p = ChatPage(gui_ctx.service, bridge, conversations=store)
    qtbot.addWidget(p)
    p.show()
    return p


def drop(target: Any, *paths: Path) -> None:
    """A drag of ``paths`` entering ``target``, then the drop (as a file manager's drag)."""
    mime = _files_mime(*paths)
    enter = QDragEnterEvent(
        QPoint(5, 5),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(target, enter)
    assert enter.isAccepted()  # the page takes file drags
    e = QDropEvent(
        QPointF(5, 5),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(target, e)


def big_file(tmp_path: Path) -> Path:
    lines = ["calm.", "ok.", "quiet.", "fine.", "same."] * 160  # 800 lines: 4 chunks
    lines[555] = FACT
    p = tmp_path / "logbook.txt"
    p.write_text("\n".join(lines))
    return p


def test_drop_paste_and_remove_make_and_unmake_chips(
    page: ChatPage, qtbot: QtBot, tmp_path: Path
) -> None:
    bar = page.attachments
    (tmp_path / "notes.md").write_text("# Notes\n\nshort")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    shown = page.transcript.add_notice("a message in the transcript")
    drop(shown, tmp_path / "notes.md")  # onto a message: it reaches the page's handler
    # (Qt shows a widget added to a shown layout at its next event-loop turn)
    qtbot.waitUntil(lambda: len(bar.chips) == 1 and bar.chips[0].isVisible(), timeout=10_000)
    chip = bar.chips[0]
    assert chip.label.text() == "notes.md · 14 B"
    drop(page, tmp_path / "photo.png")  # onto the page itself
    qtbot.waitUntil(lambda: bar.error_label.isVisible(), timeout=10_000)
    # a .png goes down the image path: these bytes are no image it can read
    assert "photo.png: unsupported image format" in bar.error_label.text()
    assert len(bar.chips) == 1 and bar.image_chips == []
    # a long paste into the prompt box is an attachment; a short one is prompt text
    mime = QMimeData()
    mime.setText("x" * (LONG_PASTE_CHARS + 1))
    assert bar.paste(mime) and [c.attachment.name for c in bar.chips] == [
        "notes.md",
        "pasted-1.txt",
    ]
    short = QMimeData()
    short.setText("hello")
    assert not bar.paste(short)
    # a file copied in a file manager and pasted into the prompt box is attached
    (tmp_path / "more.txt").write_text("more")
    QApplication.clipboard().setMimeData(_files_mime(tmp_path / "more.txt"))
    qtbot.keyClick(page.prompt_edit, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: len(bar.chips) == 3, timeout=10_000)
    assert bar.chips[2].attachment.name == "more.txt" and page.prompt_edit.toPlainText() == ""
    # the context menu's Paste (the box's paste slot) takes the same path
    (tmp_path / "menu.txt").write_text("from the menu")
    QApplication.clipboard().setMimeData(_files_mime(tmp_path / "menu.txt"))
    page.prompt_edit.paste()
    qtbot.waitUntil(lambda: len(bar.chips) == 4, timeout=10_000)
    assert bar.chips[3].attachment.name == "menu.txt" and page.prompt_edit.toPlainText() == ""
    qtbot.mouseClick(bar.chips[3].remove_button, Qt.MouseButton.LeftButton)
    drop(page, tmp_path / "notes.md")  # the same file again: attached once
    qtbot.waitUntil(lambda: not bar.busy, timeout=10_000)
    assert len(bar.chips) == 3
    qtbot.mouseClick(chip.remove_button, Qt.MouseButton.LeftButton)
    assert [c.attachment.name for c in bar.chips] == ["pasted-1.txt", "more.txt"]
    page.clear()
    assert bar.chips == []


def _files_mime(*paths: Path) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


def _ready(page: ChatPage, qtbot: QtBot, model_id: str) -> None:
    page.refresh_models()
    qtbot.waitUntil(lambda: page.model_combo.findData(model_id) >= 0, timeout=10_000)
    page.select_model(model_id)
    page.max_tokens_spin.setValue(16)


def test_send_retrieves_chunks_and_the_notice_names_them(
    page: ChatPage,
    qtbot: QtBot,
    gui_ctx: GuiContext,
    split: SplitRuntime,
    tmp_path: Path,
    embedding_gguf: Path,
) -> None:
    service = gui_ctx.service
    chat, _ = service.models.import_path(write_model(tmp_path / "Tiny-Q8_0.gguf"))  # context 2048
    embedder, _ = service.models.import_path(embedding_gguf)
    _ready(page, qtbot, chat.id)
    drop(page.prompt_edit.viewport(), big_file(tmp_path))
    qtbot.waitUntil(lambda: len(page.attachments.chips) == 1, timeout=10_000)
    extras: list[dict] = []
    page.attachments.extras_recorded.connect(extras.append)
    progress: list[str] = []
    page.attachments.progress_streamed.connect(progress.append)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        assert page.send("What is the vault password?")
    assert done.args[0] == "stop"
    # the bar said how far reading the file was while it was embedded, then cleared the line
    n = page.attachments.retriever.embedded_chunks  # the file's chunks, each embedded once
    assert n > 1 and progress[0] == f"Reading logbook.txt with {embedder.id}: 0/{n} parts"
    assert progress[-1].endswith(f": {n}/{n} parts") and page.attachments.status_label.text() == ""
    used = extras[0]["chunks_used"]
    best = max(used, key=lambda u: u["score"])
    notice = f"logbook.txt chunk {best['chunk']}"
    # the line under the answer names every chunk used, the best one among them
    answer_view = page.transcript.messages()[-1]
    said = [ln for ln in answer_view.notice.split("\n") if ln.startswith("Used: ")]
    labels = [f"logbook.txt chunk {u['chunk']}" for u in used]
    assert said == ["Used: " + ", ".join(labels)] and notice in labels
    assert "tokens" in answer_view.notice.split("\n")[0]  # under the stats line
    assert extras[0]["attachments"] == [
        {
            "name": "logbook.txt",
            "kind": "text",
            "chars": len(big_file(tmp_path).read_text()),
            "whole": False,
        }
    ]
    # the model got the chunk with the fact, labelled, before the question
    fake = cast(FakeModel, split.fake.models[-1])
    prompt = "".join(chr(t - 10) for t in fake.submitted[-1].prompt_tokens if t >= 10)
    assert f"=== {notice} ===" in prompt and FACT in prompt
    assert prompt.index(FACT) < prompt.rindex("What is the vault password?")
    # the history keeps what the user typed; the files stay attached for the next question
    assert page.history[0].content == "What is the vault password?"
    assert len(page.attachments.chips) == 1
    # the saved question carries its files and the chunks used (known after the turn began)
    assert page.session is not None and page.session.conversation is not None
    conv = page.session.store.load(page.session.conversation.id)
    question = conv.path()[0]
    assert question.role == "user" and question.extras["chunks_used"] == used
    assert question.extras["attachments"] == extras[0]["attachments"]


def test_a_big_file_without_an_embedding_model_is_not_sent(
    page: ChatPage, qtbot: QtBot, gui_ctx: GuiContext, split: SplitRuntime, tmp_path: Path
) -> None:
    chat, _ = gui_ctx.service.models.import_path(write_model(tmp_path / "Tiny-Q8_0.gguf"))
    _ready(page, qtbot, chat.id)
    page.attachments.add_paths([big_file(tmp_path)])
    qtbot.waitUntil(lambda: len(page.attachments.chips) == 1, timeout=10_000)
    page.prompt_edit.setPlainText("What is the vault password?")
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        page._on_send_button_clicked()  # what the Send button does
    assert done.args[0] == "error"
    text = page.transcript.plain_text()
    assert "logbook.txt does not fit the model's context" in text and NO_EMBEDDER_FIX in text
    assert page.history == []  # not sent: nothing generated
    assert all(not m.submitted for m in split.fake.models)
    assert page.prompt_edit.toPlainText() == "What is the vault password?"  # to send again


def test_the_page_reads_the_settings_and_cache_folder_it_is_given(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge, tmp_path: Path
) -> None:
    """The window passes its own settings store and cache folder (the composition root's),
    not ones the page would make from the default paths."""
    from app.settings import ChatSettings, SettingsStore

    store = SettingsStore(tmp_path / "elsewhere" / "settings.json")
    store.update(chat=ChatSettings(embedding_model="my-embedder"))
    p = ChatPage(gui_ctx.service, bridge, settings=store, cache_root=tmp_path / "cache")
    qtbot.addWidget(p)
    r = p.attachments.retriever
    assert r.embedding_model() == "my-embedder"
    store.update(chat=ChatSettings(embedding_model="other"))
    assert r.embedding_model() == "other"  # read live
    assert r.cache.folder == tmp_path / "cache" / "attachment-vectors"
