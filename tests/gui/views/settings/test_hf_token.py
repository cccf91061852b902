"""The Hugging Face token on the Settings page: written to its own 0600 file, never shown back,
cleared with one button, and used for gated downloads at once."""

from __future__ import annotations

import stat

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractButton, QLabel, QLineEdit
from pytestqt.qtbot import QtBot

from app.gui.main_window import MainWindow
from app.gui.views.settings.page import SettingsPage
from tests.gui.conftest import GATED_REPO
from tests.gui.helpers import show_settings
from tests.support.fakehub import TOKEN

TIMEOUT = 20_000


def shown_texts(page: SettingsPage) -> list[str]:
    out = [w.text() for w in page.findChildren(QLineEdit)]
    out += [w.text() for w in page.findChildren(QLabel)]
    out += [w.text() for w in page.findChildren(QAbstractButton)]
    out.append(page.banner.text())
    return out


def test_setting_the_token_writes_a_private_file_and_never_shows_it(
    window: MainWindow, qtbot: QtBot
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    qtbot.waitUntil(lambda: page.token_set is not None, timeout=TIMEOUT)
    assert page.token_status_label.text() == "Not set"
    assert not page.clear_token_button.isEnabled()
    token_file = window._ctx.paths.hf_token_file
    assert not token_file.exists()

    secret = "hf_secretTokenValue123"
    assert page.token_edit.echoMode() == QLineEdit.EchoMode.Password
    qtbot.keyClicks(page.token_edit, secret)
    with qtbot.waitSignal(page.token_changed, timeout=TIMEOUT):
        qtbot.mouseClick(page.save_token_button, Qt.MouseButton.LeftButton)
    assert token_file.read_text().strip() == secret
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert page.token_status_label.text() == "Set" and page.clear_token_button.isEnabled()
    assert all(secret not in t for t in shown_texts(page))

    # a fresh page reads the state but not the value
    again = SettingsPage(window._ctx.settings_store, window._bridge, tokens=page._tokens)
    qtbot.addWidget(again)
    qtbot.waitUntil(lambda: again.token_set is True, timeout=TIMEOUT)
    assert all(secret not in t for t in shown_texts(again))

    with qtbot.waitSignal(page.token_changed, timeout=TIMEOUT):
        qtbot.mouseClick(page.clear_token_button, Qt.MouseButton.LeftButton)
    assert not token_file.exists()
    assert page.token_status_label.text() == "Not set"


def test_a_token_set_in_settings_unlocks_a_gated_download(
    hub_window: MainWindow, qtbot: QtBot
) -> None:
    settings = hub_window.settings_page
    with qtbot.waitSignal(settings.token_changed, timeout=TIMEOUT):
        settings.set_token(TOKEN)
    page = hub_window.discover_page
    with qtbot.waitSignal(page.repo_shown, timeout=TIMEOUT):
        page.open_repo(GATED_REPO)
    assert page.select_option("Q4_K_M")
    with qtbot.waitSignal(page.download_queued, timeout=TIMEOUT) as queued:
        qtbot.mouseClick(page.download_button, Qt.MouseButton.LeftButton)
    downloads = hub_window.downloads_page.table_model
    qtbot.waitUntil(lambda: downloads.state_of(queued.args[0]) == "completed", timeout=TIMEOUT)
