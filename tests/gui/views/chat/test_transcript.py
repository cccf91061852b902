"""The Chat transcript's message widgets (offscreen, no model): markdown rendered as it streams
(real tables, highlighted code with a working Copy link), coalesced renders, thinking collapsed,
links that open only on the web, per-message actions, and following the stream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QGuiApplication,
    QTextCursor,
    QTextDocument,
    QTextTable,
)
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.gui.views.chat.markdown_view import AutoHeightBrowser
from app.gui.views.chat.transcript import MessageView, Transcript
from tests.gui.helpers import contrast

CODE = 'def greet(name):\n    # say hello\n    return f"Hello, {name}!"  # 42\n'
ANSWER = (
    "Here is a **table**:\n\n| Lang | Year |\n|------|-----:|\n| Python | 1991 |\n| C | 1972 |\n\n"
    f"And code:\n\n```python\n{CODE}```\n\nDone.\n"
)


@pytest.fixture
def transcript(qtbot: QtBot) -> Iterator[Transcript]:
    t = Transcript()
    qtbot.addWidget(t)
    t.resize(700, 500)
    t.show()
    qtbot.waitExposed(t)
    yield t


def tables(doc: QTextDocument) -> list[QTextTable]:
    return [f for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable)]


def anchor_position(doc: QTextDocument, href: str) -> int | None:
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().anchorHref() == href:
                return frag.position()
            it += 1
        block = block.next()
    return None


def code_colours(doc: QTextDocument, code_line: str) -> set[str]:
    """The foreground colours used on the block showing ``code_line``."""
    block = doc.find(code_line).block()
    colours = set()
    it = block.begin()
    while not it.atEnd():
        colours.add(it.fragment().charFormat().foreground().color().name())
        it += 1
    return colours


def click_anchor(qtbot: QtBot, browser: AutoHeightBrowser, href: str) -> None:
    """Click the link ``href`` where it is drawn, once the layout has placed it."""
    QApplication.processEvents()
    qtbot.waitUntil(lambda: browser.isVisible() and browser.height() > 10, timeout=5_000)
    doc = browser.document()
    at = anchor_position(doc, href)
    assert at is not None
    cur = QTextCursor(doc)
    cur.setPosition(at + 1)
    pos = browser.cursorRect(cur).center()
    qtbot.mouseClick(browser.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def stream(view: MessageView, text: str, size: int = 3) -> None:
    for i in range(0, len(text), size):
        view.append_text(text[i : i + size])


def test_a_streamed_table_and_code_block_render_with_a_working_copy_link(
    transcript: Transcript, qtbot: QtBot
) -> None:
    view = transcript.add_message("a1", "assistant", header="Assistant · m")
    stream(view, ANSWER)
    view.finish()
    docs = view.body.documents()
    found = [t for d in docs for t in tables(d)]
    assert len(found) == 1  # a real table, two columns, header and two rows
    table = found[0]
    assert (table.rows(), table.columns()) == (3, 2)
    cell = table.cellAt(1, 0).firstCursorPosition()
    cell.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
    assert cell.selectedText() == "Python"
    shown = view.body.plain_text()
    assert "**" not in shown and "```" not in shown and "table" in shown
    # the code block: highlighted in several colours
    code_doc = next(d for d in docs if not d.find("def greet").isNull())
    assert len(code_colours(code_doc, "def greet")) >= 3
    # its Copy link, clicked, puts the raw code on the clipboard
    QGuiApplication.clipboard().clear()
    browser = next(b for b in view.body.browsers() if b.document() is code_doc)
    click_anchor(qtbot, browser, "copy:0")
    qtbot.waitUntil(lambda: QGuiApplication.clipboard().text() == CODE, timeout=5_000)
    assert view.markdown() == ANSWER


def test_appends_are_coalesced_and_the_last_is_flushed_on_finish(
    transcript: Transcript, qtbot: QtBot
) -> None:
    view = transcript.add_message("a1", "assistant", header="Assistant")
    body = view.body
    view.append_text("Hello")  # nothing shown lately: rendered at once
    assert body.renders == 1 and body.plain_text() == "Hello"
    for _ in range(50):
        view.append_text(" world")
    assert body.renders == 1  # coalesced until the timer ticks
    qtbot.waitUntil(lambda: body.renders == 2, timeout=5_000)
    assert body.plain_text().count("world") == 50
    view.append_text(" **end**")
    view.finish()  # the answer ended: no waiting for the timer
    assert body.plain_text().endswith("world end")
    n = body.renders
    QApplication.processEvents()
    qtbot.wait(100)  # (a stray tick would render again)
    assert body.renders == n


def test_thinking_is_collapsed_apart_and_toggles(transcript: Transcript, qtbot: QtBot) -> None:
    view = transcript.add_message("a1", "assistant", "The answer.", header="A", reasoning="Hmm, ")
    view.append_reasoning("let me think")
    assert view.thinking_button.text() == "Thinking (4 words)"
    assert view.reasoning_view.isHidden()
    assert view.reasoning_view.toPlainText() == "Hmm, let me think"
    assert "let me think" not in view.body.plain_text()
    qtbot.mouseClick(view.thinking_button, Qt.MouseButton.LeftButton)
    assert view.reasoning_view.isVisible() and view.thinking_expanded
    qtbot.mouseClick(view.thinking_button, Qt.MouseButton.LeftButton)
    assert view.reasoning_view.isHidden()
    plain = transcript.add_message("a2", "assistant", "x", header="B")
    assert plain.thinking_button.isHidden()  # no thinking, no toggle


class UrlRecorder(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    @Slot(QUrl)
    def handle(self, url: QUrl) -> None:
        self.urls.append(url.toString())


def test_links_open_only_on_the_web(transcript: Transcript, qtbot: QtBot) -> None:
    rec = UrlRecorder()
    schemes = ("https", "javascript", "file", "data")
    for s in schemes:
        QDesktopServices.setUrlHandler(s, rec, "handle")
    try:
        view = transcript.add_message(
            "a1", "assistant", "[site](https://example.org/x)", header="A"
        )
        browser: AutoHeightBrowser = view.body.browsers()[-1]
        click_anchor(qtbot, browser, "https://example.org/x")
        qtbot.waitUntil(lambda: rec.urls == ["https://example.org/x"], timeout=5_000)
        # a link of any other kind is never handed to the desktop, whatever made it
        for url in ("javascript:alert(1)", "file:///etc/passwd", "data:text/html,x"):
            browser.anchorClicked.emit(QUrl(url))
        QApplication.processEvents()
        assert rec.urls == ["https://example.org/x"]
    finally:
        for s in schemes:
            QDesktopServices.unsetUrlHandler(s)


def test_per_message_actions(transcript: Transcript, qtbot: QtBot) -> None:
    user = transcript.add_message("u1", "user", "Tell me *more*", header="You")
    answer = transcript.add_message("a1", "assistant", "Some **more**.", header="Assistant")
    assert user.edit_button.isVisibleTo(user) and not user.regenerate_button.isVisibleTo(user)
    assert answer.regenerate_button.isVisibleTo(answer) and not answer.edit_button.isVisibleTo(
        answer
    )
    # Copy: the whole message's markdown
    qtbot.mouseClick(answer.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "Some **more**."
    with qtbot.waitSignal(transcript.regenerate_requested) as regen:
        qtbot.mouseClick(answer.regenerate_button, Qt.MouseButton.LeftButton)
    assert regen.args == ["a1"]
    with qtbot.waitSignal(transcript.delete_requested) as deleted:
        qtbot.mouseClick(user.delete_button, Qt.MouseButton.LeftButton)
    assert deleted.args == ["u1"]
    assert transcript.ids() == ["u1", "a1"]  # the owner decides; the transcript waits
    # Edit: an inline editor with the text, then Resend
    qtbot.mouseClick(user.edit_button, Qt.MouseButton.LeftButton)
    assert user.edit_box.isVisible() and user.body.isHidden()
    assert user.editor.toPlainText() == "Tell me *more*"
    user.editor.setPlainText("Tell me less")
    with qtbot.waitSignal(transcript.edit_submitted) as edited:
        qtbot.mouseClick(user.resend_button, Qt.MouseButton.LeftButton)
    assert edited.args == ["u1", "Tell me less"]
    assert user.edit_box.isHidden() and user.body.isVisible()
    # off while an answer streams
    transcript.set_actions_enabled(False)
    assert not answer.regenerate_button.isEnabled() and not user.edit_button.isEnabled()
    assert answer.copy_button.isEnabled()
    transcript.set_actions_enabled(True)
    assert answer.regenerate_button.isEnabled()


def test_the_branch_switcher_shows_only_with_siblings(transcript: Transcript, qtbot: QtBot) -> None:
    one = transcript.add_message("a1", "assistant", "x", header="A", branch=(1, 1))
    assert one.branch_label.isHidden() and one.prev_button.isHidden()
    two = transcript.add_message("a2", "assistant", "y", header="A", branch=(2, 3))
    assert two.branch_label.isVisible() and two.branch_label.text() == "2/3"
    with qtbot.waitSignal(transcript.branch_requested) as back:
        qtbot.mouseClick(two.prev_button, Qt.MouseButton.LeftButton)
    assert back.args == ["a2", -1]
    with qtbot.waitSignal(transcript.branch_requested) as on:
        qtbot.mouseClick(two.next_button, Qt.MouseButton.LeftButton)
    assert on.args == ["a2", 1]
    two.set_branch((3, 3))
    assert two.prev_button.isEnabled() and not two.next_button.isEnabled()
    transcript.set_actions_enabled(False)
    transcript.set_actions_enabled(True)
    assert not two.next_button.isEnabled()  # re-enabling keeps the ends of the range


def test_remove_from_drops_that_message_and_those_below(transcript: Transcript) -> None:
    for i in range(4):
        transcript.add_message(f"m{i}", "user" if i % 2 == 0 else "assistant", f"t{i}", header="H")
    with pytest.raises(ValueError):
        transcript.add_message("m1", "user", header="H")
    transcript.remove("m0")
    assert transcript.ids() == ["m1", "m2", "m3"]
    transcript.remove_from("m2")
    assert transcript.ids() == ["m1"] and transcript.message("m2") is None
    assert "t1" in transcript.plain_text() and "t3" not in transcript.plain_text()
    transcript.clear()
    assert transcript.plain_text() == "" and transcript.placeholder.isVisibleTo(transcript)


def test_the_transcript_follows_the_stream_unless_scrolled_up(
    transcript: Transcript, qtbot: QtBot
) -> None:
    bar = transcript.verticalScrollBar()
    view = transcript.add_message("a0", "assistant", header="A")
    for i in range(30):
        view.append_text(f"Line {i}\n\n")
    view.finish()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5_000)
    bar.setValue(0)  # the user scrolls up to read
    assert not transcript.follow
    top = bar.maximum()
    more = transcript.add_message("a1", "assistant", "more\n\n" * 20, header="A")
    qtbot.waitUntil(lambda: bar.maximum() > top, timeout=5_000)
    assert bar.value() == 0
    bar.setValue(bar.maximum())  # back at the bottom: following again
    assert transcript.follow
    top = bar.maximum()
    more.append_text("\n\n".join(f"tail {i}" for i in range(20)))
    qtbot.waitUntil(lambda: bar.maximum() > top and bar.value() == bar.maximum(), timeout=5_000)
    bar.setValue(0)
    transcript.scroll_to_end()  # what sending a message does
    assert transcript.follow and bar.value() == bar.maximum()


def test_a_theme_change_restyles_shown_messages(transcript: Transcript) -> None:
    from app.gui.theme import apply_theme, is_dark

    view = transcript.add_message("a1", "assistant", "```python\nimport os\n```\n", header="A")

    def code_background() -> str:
        doc = next(d for d in view.body.documents() if not d.find("import").isNull())
        return doc.find("import").blockFormat().background().color().name()

    apply_theme("light")
    try:
        assert not is_dark()
        view.restyle()
        light = code_background()
        apply_theme("dark")
        dark = code_background()
        assert QColor(dark).lightness() < 100 < QColor(light).lightness()
        assert view.markdown() == "```python\nimport os\n```\n"
    finally:
        apply_theme("system")


def test_adding_messages_opens_no_window_of_its_own(transcript: Transcript, qtbot: QtBot) -> None:
    """Every part of a message has a parent before it is shown: a parentless widget shown
    would open as a window and take the focus from the main window (Esc would stop nothing)."""
    transcript.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is transcript, timeout=5_000)
    transcript.add_message("u1", "user", "hi", header="You", notice="n")
    view = transcript.add_message(
        "a1", "assistant", "**x**", header="A", reasoning="r", branch=(1, 2), notice="s"
    )
    view.set_caption("slow")
    view.set_text("y")
    transcript.add_notice("a notice", "error")
    QApplication.processEvents()
    assert QApplication.activeWindow() is transcript
    assert len(view.body.browsers()) == 1  # set_text replaced the body's boxes, none left over


def test_qt_work_per_render_stays_flat_on_a_long_answer(transcript: Transcript) -> None:
    """HTML handed to Qt per render: the frozen blocks are set once (in bounded segments), so
    late renders of a long answer cost what early ones did."""
    view = transcript.add_message("a1", "assistant", header="A")
    body = view.body
    para = "The dragon kneads the dough, waits, and bakes it. " * 6 + "\n\n"
    per_render: list[int] = []
    for i in range(400):  # ~24k words
        before = body.html_chars
        view.append_text(f"**{i}.** " + para)
        body.render_now()  # as the timer would, once per paragraph here
        per_render.append(body.html_chars - before)
    first, last = sum(per_render[:100]), sum(per_render[-100:])
    assert last <= 1.5 * first
    assert len(body.browsers()) > 3  # frozen HTML went into several bounded segments
    assert body.plain_text().count("The dragon kneads") == 400 * 6


def test_a_long_open_code_block_streams_with_flat_work_and_shows_what_a_full_render_would(
    transcript: Transcript,
) -> None:
    """While a code block is still open, each render adds only the new code to its box (no
    parse, no setHtml of the whole block): the work per appended line stays flat, and what the
    box shows is what setting the block's whole HTML shows. Closing it highlights it once."""
    view = transcript.add_message("a1", "assistant", header="A")
    body = view.body
    view.append_text("Here it is:\n\n```python\n")
    body.render_now()
    per_line: list[tuple[int, int]] = []  # (HTML/text handed to Qt, characters parsed)
    for i in range(1500):
        before = (body.html_chars, body.incremental.parsed_chars)
        view.append_text(f"    total += values[{i}] * {i}  # line {i}\n")
        body.render_now()
        per_line.append((body.html_chars - before[0], body.incremental.parsed_chars - before[1]))
        if i in (3, 700, 1499):  # the box shows what the whole block's HTML would
            tail = body.browsers()[-1]
            fresh = QTextDocument()
            fresh.setHtml(body.incremental.html.split("</p>\n", 1)[-1])
            assert tail.document().toPlainText().rstrip().endswith(fresh.toPlainText().rstrip())
            last = tail.document().lastBlock()
            assert last.text() == f"    total += values[{i}] * {i}  # line {i}"
            # the added lines keep the code format set with the block's HTML (font, background)
            first = tail.document().find("total += values[0] ").block()
            font = first.begin().fragment().charFormat().fontFamilies()
            assert font and last.begin().fragment().charFormat().fontFamilies() == font
            assert last.blockFormat().background() == first.blockFormat().background()
    first = [sum(x) for x in zip(*per_line[:200], strict=True)]
    late = [sum(x) for x in zip(*per_line[-200:], strict=True)]
    assert late[0] <= 1.5 * first[0] and late[1] <= 1.5 * first[1], (first, late)
    assert late[0] < 20_000  # not the whole block (~60 KB by then) per line
    view.append_text("```\n\nDone.")
    view.finish()
    codes = body.incremental.codes
    assert len(codes) == 1 and codes[0].count("total += values") == 1500
    assert body.plain_text().endswith("Done.")
    line = "    total += values[1499] * 1499  # line 1499"
    doc = next(d for d in body.documents() if not d.find(line).isNull())
    assert len(code_colours(doc, line)) >= 3  # highlighted once closed


def test_a_message_shows_when_it_was_written(transcript: Transcript) -> None:
    import time

    now = transcript.add_message("n", "user", "hi", header="You")
    assert (
        now.header_label.text() == f"You  ·  {time.strftime('%H:%M', time.localtime(now.created))}"
    )
    then = time.mktime((2025, 3, 4, 9, 30, 0, 0, 0, -1))
    old = transcript.add_message("o", "user", "hi", header="You", created=then)
    assert old.created == then and old.header_label.text() == "You  ·  2025-03-04 09:30"


def test_copy_says_copied_for_a_moment_on_the_message_and_on_a_code_block(
    transcript: Transcript, qtbot: QtBot
) -> None:
    view = transcript.add_message("a1", "assistant", header="Assistant · m")
    stream(view, ANSWER)
    view.finish()
    QGuiApplication.clipboard().clear()
    qtbot.mouseClick(view.copy_button, Qt.MouseButton.LeftButton)
    assert view.copy_button.text() == "Copied"
    assert QGuiApplication.clipboard().text() == ANSWER
    qtbot.waitUntil(lambda: view.copy_button.text() == "Copy", timeout=10_000)
    code_doc = next(d for d in view.body.documents() if not d.find("def greet").isNull())
    browser = next(b for b in view.body.browsers() if b.document() is code_doc)
    click_anchor(qtbot, browser, "copy:0")
    qtbot.waitUntil(lambda: QGuiApplication.clipboard().text() == CODE, timeout=5_000)
    assert view.copy_button.text() == "Copied code"
    qtbot.waitUntil(lambda: view.copy_button.text() == "Copy", timeout=10_000)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_messages_read_as_a_conversation_with_avatars_tints_and_room(
    transcript: Transcript, qtbot: QtBot, theme: str
) -> None:
    from app.gui.theme import apply_theme
    from app.gui.views.chat.transcript import bubble_color, kind_color, text_color

    apply_theme(theme)
    try:
        user = transcript.add_message("u1", "user", "Hello", header="You")
        answer = transcript.add_message("a1", "assistant", "Hi there", header="Assistant · m")
        # each turn says who wrote it: an avatar with the role's letter in the role's colour
        assert (user.avatar.text(), answer.avatar.text()) == ("Y", "A")
        assert user.avatar.isVisible() and answer.avatar.isVisible()
        assert kind_color("user") in user.avatar.styleSheet()
        # the two roles sit on different tints, with room between and inside the messages
        assert bubble_color("user") != bubble_color("assistant")
        assert bubble_color("user") in user.styleSheet()
        QApplication.processEvents()
        gap = answer.geometry().top() - user.geometry().bottom()
        assert gap >= 12
        margins = user.layout().contentsMargins()
        assert min(margins.left(), margins.top()) >= 8
        # text on the tints keeps WCAG AA contrast (4.5:1)
        for role in ("user", "assistant"):
            bg = QColor(bubble_color(role))
            assert contrast(QColor(text_color()), bg) >= 4.5
            assert contrast(QColor(kind_color(role)), bg) >= 4.5
            assert contrast(QColor(kind_color("meta")), bg) >= 4.5
    finally:
        apply_theme("light")
