"""The Help menu and the About dialog: version, license, where the docs are, and the data,
models and logs folders (each opens in the file manager).
Tested by tests/gui/test_about.py."""

from __future__ import annotations

import html
import platform
from pathlib import Path

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QIcon
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QMainWindow, QMenu, QVBoxLayout

from app import __version__
from app.paths import AppPaths

ASSETS = Path(__file__).resolve().parents[1] / "assets"
LICENSE = "MIT"
# the docs and README sit beside the package in a source checkout; a bundle may leave them out
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def app_icon() -> QIcon:
    """The flame icon (SVG, with a PNG fallback where the SVG plugin is missing)."""
    icon = QIcon(str(ASSETS / "hearth.svg"))
    if icon.pixmap(32, 32).isNull():
        icon = QIcon(str(ASSETS / "hearth.png"))
    return icon


def doc_links() -> list[tuple[str, Path]]:
    """The documentation on this machine: (label, path), those that exist."""
    found = [
        ("Documentation folder", SOURCE_ROOT / "docs"),
        ("Desktop app guide", SOURCE_ROOT / "docs" / "desktop.md"),
        ("README", SOURCE_ROOT / "README.md"),
    ]
    return [(label, p) for label, p in found if p.exists()]


def folder_links(paths: AppPaths) -> list[tuple[str, Path]]:
    return [("Data", paths.data), ("Models", paths.models), ("Logs", paths.logs)]


class AboutDialog(QDialog):
    """What this Hearth is, and links that open its folders and docs."""

    def __init__(self, paths: AppPaths, parent: QMainWindow | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About Hearth")
        self.opened: list[str] = []  # the links opened from here (tests read it)

        def link(label: str, p: Path) -> str:
            url = QUrl.fromLocalFile(str(p)).toString()
            return f"{label}: <a href='{html.escape(url, quote=True)}'>{html.escape(str(p))}</a>"

        docs = doc_links()
        lines = [
            f"<h3>Hearth {html.escape(__version__)}</h3>",
            "<p>Run open LLMs on your own machine and serve them through local OpenAI, "
            "Anthropic and Ollama compatible APIs.</p>",
            f"<p>License: {LICENSE}. Python {platform.python_version()}, "
            f"PySide6 {pyside_version}.</p>",
            "<p><b>Folders</b><br>"
            + "<br>".join(link(label, p) for label, p in folder_links(paths))
            + "</p>",
        ]
        if docs:
            lines.append(
                "<p><b>Documentation</b><br>"
                + "<br>".join(link(label, p) for label, p in docs)
                + "</p>"
            )
        else:
            lines.append("<p>Documentation: the docs/ folder of Hearth's source.</p>")
        self.text = QLabel("".join(lines))
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextBrowserInteraction  # links reachable with Tab and Enter
        )
        self.text.linkActivated.connect(self._on_text_link_activated)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addWidget(buttons)

    def _on_text_link_activated(self, url: str) -> None:
        self.opened.append(url)
        QDesktopServices.openUrl(QUrl(url))


def add_help_menu(window: QMainWindow, paths: AppPaths) -> QAction:
    """A Help menu (Alt+H) with About Hearth (F1 opens it too); returns the About action."""
    menu: QMenu = window.menuBar().addMenu("&Help")
    about = QAction("&About Hearth", window)
    about.setShortcut("F1")
    about.setMenuRole(QAction.MenuRole.AboutRole)
    about.triggered.connect(lambda: show_about(window, paths))
    menu.addAction(about)
    return about


def show_about(window: QMainWindow, paths: AppPaths) -> AboutDialog:
    dialog = AboutDialog(paths, window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.open()
    return dialog
