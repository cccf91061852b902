"""Markdown shown as it streams: frozen blocks in bounded QTextBrowser segments, the open tail
re-rendered (coalesced by a timer) in a box of its own, each box as tall as its content.
Tested by tests/gui/views/chat/test_transcript.py."""

from __future__ import annotations

import logging

from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCursor, QTextDocument
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QVBoxLayout, QWidget

from app.gui.theme import is_dark
from app.gui.views.chat.markdown_render import (
    COPY_SCHEME,
    IncrementalMarkdown,
    MarkdownRenderer,
    safe_link,
)

log = logging.getLogger(__name__)

RENDER_INTERVAL_MS = 33  # re-render the open tail at most ~30 times a second
SEGMENT_HTML = 16_000  # frozen HTML per QTextBrowser: a freeze re-sets one bounded segment


class AutoHeightBrowser(QTextBrowser):
    """A read-only rich-text box as tall as its content (no scroll bar of its own); opens
    http/https/mailto links in the browser and hands ``copy:N`` links to ``copy_requested``."""

    copy_requested = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)  # every link goes through _on_self_anchor_clicked
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._on_doc_size_changed)
        self.anchorClicked.connect(self._on_self_anchor_clicked)
        self.setFixedHeight(self._content_height())

    def _content_height(self) -> int:
        return int(self.document().size().height() + 0.999) + 2 * self.frameWidth()

    def _on_doc_size_changed(self, _size: object) -> None:
        self.setFixedHeight(self._content_height())

    def resizeEvent(self, e: object) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(e)  # type: ignore[arg-type]
        width = self.viewport().width()
        if self.document().textWidth() != width:  # a new height alone: no relayout of it all
            self.document().setTextWidth(width)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(super().sizeHint().width(), self._content_height())

    def _on_self_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            if url.path().isdigit():
                self.copy_requested.emit(int(url.path()))
        elif safe_link(url.toString()):
            QDesktopServices.openUrl(url)
        else:
            log.info("not opening a %s link from a model's answer", url.scheme() or "relative")


class MarkdownBody(QWidget):
    """A message's rendered markdown: frozen blocks in bounded segments, the open tail in a
    box of its own re-rendered (coalesced by a timer) as text streams in."""

    code_copied = Signal()  # a code block's Copy link put its code on the clipboard

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(0)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self._on_timer_timeout)
        self._dirty = False
        self.renders = 0  # tail re-renders: the timer keeps these to ~30 a second
        self.html_chars = 0  # HTML handed to Qt: flat per append, like the parse work
        self._reset("")

    def _reset(self, text: str) -> None:
        for seg in getattr(self, "_segments", []) + [getattr(self, "_tail", None)]:
            if seg is not None:
                self._lay.removeWidget(seg)
                seg.deleteLater()
        self._inc = IncrementalMarkdown(MarkdownRenderer(dark=is_dark()))
        self._segments: list[AutoHeightBrowser] = []
        self._segment_html: list[str] = []
        self._tail = self._new_segment()
        self._tail_html = ""
        if text:
            self._inc.append(text)
            self.render_now(final=True)
        else:
            self._tail.hide()

    def _new_segment(self) -> AutoHeightBrowser:
        seg = AutoHeightBrowser(self)
        seg.copy_requested.connect(self._on_segment_copy_requested)
        self._lay.addWidget(seg)
        return seg

    @property
    def incremental(self) -> IncrementalMarkdown:
        return self._inc

    @property
    def markdown(self) -> str:
        return self._inc.markdown

    def documents(self) -> list[QTextDocument]:
        """The documents shown, top to bottom (frozen segments, then the tail)."""
        return [s.document() for s in (*self._segments, self._tail)]

    def browsers(self) -> list[AutoHeightBrowser]:
        return [*self._segments, self._tail]

    def append(self, text: str) -> None:
        """Add streamed text; shown at once when nothing was rendered in the last interval,
        else at the timer's next tick (appends in between are coalesced)."""
        self._inc.append(text)
        if self._timer.isActive():
            self._dirty = True
        else:
            self.render_now()
            self._timer.start()

    def set_text(self, text: str) -> None:
        self._timer.stop()
        self._dirty = False
        self._reset(text)

    def flush(self) -> None:
        """Render what is pending now (the answer ended)."""
        self._timer.stop()
        self.render_now(final=True)  # (also highlights a code block left open)

    def render_now(self, *, final: bool = False) -> None:
        self._dirty = False
        self.renders += 1
        up = self._inc.update(final=final)
        for piece in up.frozen:
            if not self._segments or len(self._segment_html[-1]) + len(piece) > SEGMENT_HTML:
                self._lay.removeWidget(self._tail)
                self._segments.append(self._new_segment())
                self._segment_html.append("")
                self._lay.addWidget(self._tail)
            self._segment_html[-1] += piece
            self._segments[-1].setHtml(self._segment_html[-1])
            self.html_chars += len(self._segment_html[-1])
        if up.appended is not None and self._tail_html and not self._tail.isHidden():
            # an open code block growing: add the new text at its end, not the whole block again
            if up.appended:
                cur = QTextCursor(self._tail.document())
                cur.movePosition(QTextCursor.MoveOperation.End)
                cur.insertText(up.appended)
                self.html_chars += len(up.appended)
            self._tail_html = up.tail
        elif up.tail != self._tail_html:  # (a token inside a word often changes nothing shown)
            self._tail_html = up.tail
            self._tail.setHtml(up.tail.rstrip("\n"))  # Qt shows a trailing newline as a space
            self.html_chars += len(up.tail)
            self._tail.setVisible(bool(up.tail))

    def restyle(self) -> None:
        """Render again with the code style of the palette now in use (light or dark)."""
        if self._inc.renderer.dark != is_dark():
            pending = self._timer.isActive()
            self.set_text(self._inc.markdown)
            if pending:  # still streaming: keep coalescing from here
                self._timer.start()

    def plain_text(self) -> str:
        return "\n".join(d.toPlainText() for d in self.documents() if not d.isEmpty()).strip()

    def _on_timer_timeout(self) -> None:
        if self._dirty:
            self.render_now()
            self._timer.start()

    def _on_segment_copy_requested(self, n: int) -> None:
        codes = self._inc.codes
        if 0 <= n < len(codes):
            QGuiApplication.clipboard().setText(codes[n])
            self.code_copied.emit()
