"""The light/dark theme (``ui.theme``) and colours chosen by the palette's lightness, so what the
pages draw themselves stays readable in dark mode.
Tested by tests/gui/test_theme.py, tests/gui/test_window_product.py and
tests/gui/views/chat/test_transcript.py."""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QLabel

log = logging.getLogger(__name__)

_state: dict[str, QPalette] = {}  # "system": the palette the desktop gave us, before any theme


class ThemeSignals(QObject):
    """``changed`` after ``apply_theme``: widgets with colours of their own re-pick them (Qt
    does not tell a widget whose style sheet set its colours that the app palette changed)."""

    changed = Signal()


_signals: list[ThemeSignals] = []


def theme_signals() -> ThemeSignals:
    if not _signals:
        _signals.append(ThemeSignals())
    return _signals[0]


def is_dark(palette: QPalette | None = None) -> bool:
    """Whether text is drawn light on dark (the application palette unless one is given)."""
    pal = palette if palette is not None else QGuiApplication.palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < 128


def pick(light: str, dark: str) -> str:
    """The colour for the current palette: ``light`` on light themes, ``dark`` on dark ones."""
    return dark if is_dark() else light


def dark_palette() -> QPalette:
    pal = QPalette()
    roles = QPalette.ColorRole
    for role, color in (
        (roles.Window, "#2b2b2b"),
        (roles.WindowText, "#e8e8e8"),
        (roles.Base, "#1f1f1f"),
        (roles.AlternateBase, "#333333"),
        (roles.ToolTipBase, "#3a3a3a"),
        (roles.ToolTipText, "#e8e8e8"),
        (roles.PlaceholderText, "#9a9a9a"),
        (roles.Text, "#e8e8e8"),
        (roles.Button, "#353535"),
        (roles.ButtonText, "#e8e8e8"),
        (roles.BrightText, "#ff6b6b"),
        (roles.Light, "#4a4a4a"),
        (roles.Midlight, "#3e3e3e"),
        (roles.Mid, "#5a5a5a"),
        (roles.Dark, "#191919"),
        (roles.Shadow, "#000000"),
        (roles.Highlight, "#3d7fd6"),
        (roles.HighlightedText, "#ffffff"),
        (roles.Link, "#8ab4f8"),
        (roles.LinkVisited, "#c58af9"),
    ):
        pal.setColor(role, QColor(color))
    disabled = QPalette.ColorGroup.Disabled
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        pal.setColor(disabled, role, QColor("#7a7a7a"))
    return pal


def apply_theme(theme: str) -> None:
    """``"system"`` (the desktop's palette), ``"light"`` or ``"dark"``, at once, app-wide."""
    qapp = QApplication.instance()
    if not isinstance(qapp, QApplication):
        return
    system = _state.setdefault("system", QPalette(qapp.palette()))
    if theme == "dark":
        pal = dark_palette()
    elif theme == "light":
        pal = qapp.style().standardPalette()
        if is_dark(pal):  # a style whose own palette is dark: Fusion's is light
            pal = QPalette(QColor("#efefef"))
    else:
        pal = system
    log.debug("theme %s", theme)
    qapp.setPalette(pal)
    recolor_links(qapp)
    theme_signals().changed.emit()


def recolor_links(qapp: QApplication) -> None:
    """Re-set the text of every label showing a link: Qt colours a rich-text link from the
    palette when the text is set, so a theme change would leave the old theme's link colour
    (dark blue on near-black)."""
    # only the windows on screen (the theme is changed from one): walking every widget met one
    # mid-destruction and crashed
    for top in qapp.topLevelWidgets():
        if not top.isVisible():
            continue
        for w in top.findChildren(QLabel):
            if "<a " in w.text():
                text = w.text()
                w.setText("")  # setText ignores the same text: clear it first
                w.setText(text)
