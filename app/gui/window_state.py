"""The main window as a product: where it reopens (``ui.window``), and what closing it does while
the server runs on a desktop with no tray (``ui.close_action``).
Tested by tests/gui/test_window_product.py."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from PySide6.QtCore import QEvent, QObject, QPoint, QRect, QSize
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QAbstractButton,
    QCheckBox,
    QMessageBox,
    QScrollArea,
    QStyle,
    QWidget,
)

from app.settings import WindowState

log = logging.getLogger(__name__)

MINIMUM_SIZE = QSize(820, 540)  # fits a 1024x600 screen; the Library and Server pages fit it
DEFAULT_SIZE = QSize(1180, 740)
# this much of the title bar on a screen counts as reachable (the mouse can drag it back)
_VISIBLE_WIDTH = 120
_TITLE_BAR = 30

BACKGROUND_TEXT = (
    "The server keeps answering at {url} with the window closed. To open the window again, "
    "run <b>hearth</b> again (or start Hearth from your applications menu); quit from its menu "
    "or with Ctrl+Q."
)


def restored_geometry(saved: WindowState, screens: Sequence[QRect], minimum: QSize) -> QRect | None:
    """The rectangle to reopen the window in, or None for the default placement.

    The saved size shrinks to fit the screen it was on (and never below ``minimum``); a
    position whose title bar would be off every screen (a monitor that was unplugged) is
    centred on the first screen instead."""
    if saved.width <= 0 or saved.height <= 0 or not screens:
        return None
    strip = QRect(saved.x, saved.y, saved.width, _TITLE_BAR)  # where the window is dragged from

    def shown(screen: QRect) -> int:
        part = screen & strip
        return part.width() * part.height() if not part.isEmpty() else 0

    home = max(screens, key=shown)
    part = home & strip
    reachable = part.width() >= _VISIBLE_WIDTH and part.height() >= _TITLE_BAR // 2
    screen = home if reachable else screens[0]
    size = QSize(
        max(minimum.width(), min(saved.width, screen.width())),
        max(minimum.height(), min(saved.height, screen.height())),
    )
    out = QRect(QPoint(saved.x, saved.y), size)
    if not reachable:
        out.moveCenter(screen.center())
    # keep it all on its screen where it fits (a saved size larger than a new, smaller screen)
    out.moveLeft(max(screen.left(), min(out.left(), screen.right() + 1 - out.width())))
    out.moveTop(max(screen.top(), min(out.top(), screen.bottom() + 1 - out.height())))
    return out


class PageScroller(QScrollArea):
    """Holds one page: the page fills the area, and only a window smaller than the page's
    minimum scrolls it (instead of squeezing its widgets over each other).

    Not ``widgetResizable``: that sizes a page with height-for-width content (a word-wrapped
    banner) to its preferred height, so a short window would scroll the whole page rather than
    let its splitters and tables shrink."""

    def __init__(self, page: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setWidget(page)
        page.installEventFilter(self)

    def eventFilter(self, watched: QObject, e: QEvent) -> bool:  # noqa: N802 - Qt override
        if watched is self.widget() and e.type() == QEvent.Type.LayoutRequest:
            self.fit_page()  # its minimum may have changed (a banner appeared)
        return False

    def resizeEvent(self, e: QResizeEvent) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(e)
        self.fit_page()

    def fit_page(self) -> None:
        page = self.widget()
        if page is None:
            return
        least = page.minimumSizeHint().expandedTo(page.minimumSize())
        bar = self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, self)
        w, h = self.width(), self.height()
        layout = page.layout()
        for _ in range(2):  # a scroll bar in one direction can make the other one needed
            if layout is not None and layout.hasHeightForWidth():
                # wrapped text needs more height when the page is narrow than its minimum
                # size says (a long Runtime report was squeezed): the least height at this
                # width, the tables and splitters still at their minimum
                least = least.expandedTo(
                    QSize(0, layout.totalMinimumHeightForWidth(max(w, least.width())))
                )
            need_v = least.height() > h
            need_h = least.width() > w
            w = self.width() - (bar if need_v else 0)
            h = self.height() - (bar if need_h else 0)
        page.resize(QSize(w, h).expandedTo(least))


class CloseDialog(QMessageBox):
    """ "Keep serving in the background" / "Quit" / Cancel, with "Don't ask again". Opened
    window-modal with ``open()`` (never ``exec()``), so the caller reacts to ``finished``."""

    def __init__(self, url: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setIcon(QMessageBox.Icon.Question)
        self.setWindowTitle("Close Hearth")
        self.setText("The server is running. Keep serving in the background?")
        self.setInformativeText(BACKGROUND_TEXT.format(url=url))
        self.background_button = self.addButton(
            "Keep serving in the background", QMessageBox.ButtonRole.AcceptRole
        )
        self.quit_button = self.addButton("Quit", QMessageBox.ButtonRole.DestructiveRole)
        self.cancel_button = self.addButton(QMessageBox.StandardButton.Cancel)
        self.setDefaultButton(self.background_button)
        self.setEscapeButton(self.cancel_button)
        self.remember_check = QCheckBox("Don't ask again")
        self.setCheckBox(self.remember_check)

    def choice(self) -> str:
        """``"background"``, ``"quit"`` or ``""`` (cancelled), from the button clicked."""
        clicked: QAbstractButton | None = self.clickedButton()
        if clicked is self.background_button:
            return "background"
        if clicked is self.quit_button:
            return "quit"
        return ""
