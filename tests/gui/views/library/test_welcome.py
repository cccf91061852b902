"""The first-run welcome on the empty Library page, over a real service and the fake
Hub serving the curated starter repos: suggestions with sizes and verdicts, a Download that lands
in the library and switches the page to the table, offline, and the start-at-login and
keep-in-tray switches (the XDG autostart file under a temporary XDG_CONFIG_HOME)."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.hub import HubClient
from app.core.hub.downloads import DownloadManager
from app.core.hub.starters import MAX_SUGGESTIONS, STARTERS
from app.core.library.fit import DeviceMemory
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.launch import show_at_start
from app.gui.main_window import MainWindow
from app.gui.units import human_bytes
from app.gui.views.discover import TITLE as DISCOVER_PAGE
from app.gui.views.library.welcome import LOOKING_TEXT, NO_HUB_TEXT
from tests.gui.helpers import SLOW, free_port, show_settings
from tests.support.fakehub import FakeHub, add_starters

TIMEOUT = 30_000


@pytest.fixture(autouse=True)
def xdg_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Autostart entries go under tmp_path, never into the real ~/.config."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    return tmp_path / "xdg-config"


@pytest.fixture
def starter_files(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    return add_starters(hub, tmp_path / "starters", large=(STARTERS[2].repo_id,))


def open_window(qtbot: QtBot, ctx: GuiContext, bridge: Bridge) -> MainWindow:
    w = MainWindow(ctx, bridge)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    qtbot.waitUntil(lambda: w.settings_page.settings is not None, timeout=10_000)
    return w


def wait_suggestions(qtbot: QtBot, w: MainWindow) -> None:
    welcome = w.welcome
    qtbot.waitUntil(
        lambda: (
            welcome.loaded
            or welcome.retry_button.isVisibleTo(welcome)
            or welcome.status_text == NO_HUB_TEXT
        ),
        timeout=TIMEOUT,
    )
    # a layout shows the widgets it was given on the next event-loop turn, not at once
    qtbot.waitUntil(
        lambda: all(r.download_button.isVisible() for r in welcome.rows.values()),
        timeout=TIMEOUT,
    )


def test_an_empty_library_opens_on_the_welcome_with_fitting_suggestions(
    qtbot: QtBot, hub_ctx: GuiContext, bridge: Bridge, starter_files: dict[str, str], hub: FakeHub
) -> None:
    # a budget that the large starter's estimate exceeds and the small ones' do not
    hub_ctx.settings_store.update(
        load=hub_ctx.settings_store.load().load.__class__(memory_budget_bytes=60 << 20)
    )
    w = open_window(qtbot, hub_ctx, bridge)
    page, welcome = w.library_page, w.welcome
    qtbot.waitUntil(lambda: page.showing_empty_message, timeout=10_000)
    assert w.current_page == "Library" and welcome.isVisible() and not page.table.isVisible()
    text = welcome.server_label.text()
    for words in ("OpenAI", "Anthropic", "Ollama", "http://127.0.0.1:8421/v1", "editor"):
        assert words in text
    assert "Start the server on the Server page" in text  # it is not running yet

    wait_suggestions(qtbot, w)
    large = STARTERS[2].repo_id
    expected = [s.repo_id for s in STARTERS if s.repo_id != large][:MAX_SUGGESTIONS]
    assert list(welcome.rows) == expected
    for repo_id, row in welcome.rows.items():
        data = hub.repos[repo_id].files[starter_files[repo_id]].data
        assert row.size_label.text() == human_bytes(len(data))
        assert row.fit_label.text() == "Fits RAM"
        assert "Needs about" in row.fit_label.toolTip()
        assert row.download_button.isVisible() and row.download_button.isEnabled()
    assert welcome.more_label.isVisible()
    assert "1 more suggested model needs more memory" in welcome.more_label.text()
    assert welcome.status_text == ""

    # Discover more opens Discover; the import action is the Library page's own
    assert welcome.import_button is page.empty_import_button
    assert welcome.import_button.isVisible()
    assert "hearth import PATH" in page.empty_label.text() and page.empty_label.isVisible()
    qtbot.mouseClick(welcome.discover_button, Qt.MouseButton.LeftButton)
    assert w.current_page == DISCOVER_PAGE


def test_download_from_the_welcome_lands_in_the_library_and_the_table_shows(
    qtbot: QtBot, hub_ctx: GuiContext, bridge: Bridge, starter_files: dict[str, str]
) -> None:
    w = open_window(qtbot, hub_ctx, bridge)
    welcome, page = w.welcome, w.library_page
    wait_suggestions(qtbot, w)
    repo_id = next(iter(welcome.rows))
    button = welcome.rows[repo_id].download_button
    with qtbot.waitSignal(welcome.download_queued, timeout=TIMEOUT):
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert "Downloading" in welcome.banner.text()
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 1, timeout=TIMEOUT)
    model = page.table_model.status(0).model
    assert model.quantization == "Q4_K_M" and Path(model.path).name == starter_files[repo_id]
    assert Path(model.path).is_file()
    assert not page.showing_empty_message
    assert page.table.isVisible() and not welcome.isVisible()


def test_offline_says_so_quickly_and_still_offers_import(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on: the Hub is unreachable
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = HubClient(
        endpoint=f"http://127.0.0.1:{port}",
        memory_probe=lambda: DeviceMemory(ram_total=64 << 30, ram_available=32 << 30),
    )
    gui_ctx.service.hub = DownloadManager(
        gui_ctx.service.models._library, client, gui_ctx.service.events
    )
    t0 = time.monotonic()
    w = open_window(qtbot, gui_ctx, bridge)
    welcome = w.welcome
    qtbot.waitUntil(lambda: "You're offline" in welcome.status_text, timeout=TIMEOUT)
    elapsed = time.monotonic() - t0
    assert f"127.0.0.1:{port}" in welcome.status_text
    assert not welcome.rows
    assert welcome.retry_button.isVisible()
    assert welcome.import_button is not None and welcome.import_button.isVisible()
    assert elapsed < 20, elapsed  # generous; no 40 s wait for a connection that cannot be made
    # Try again asks again (and says it is looking meanwhile)
    qtbot.mouseClick(welcome.retry_button, Qt.MouseButton.LeftButton)
    assert welcome.status_text == LOOKING_TEXT and not welcome.retry_button.isVisible()
    qtbot.waitUntil(lambda: welcome.retry_button.isVisible(), timeout=TIMEOUT)


def test_without_the_hub_the_welcome_says_so(window: MainWindow, qtbot: QtBot) -> None:
    qtbot.waitUntil(lambda: window.welcome.status_text == NO_HUB_TEXT, timeout=10_000)
    assert window.welcome.import_button is not None and window.welcome.import_button.isVisible()


def test_start_at_login_writes_and_removes_the_xdg_entry_and_the_setting(
    window: MainWindow, qtbot: QtBot, xdg_config: Path
) -> None:
    entry = xdg_config / "autostart" / "hearth.desktop"
    store = window._ctx.settings_store
    check = window.welcome.start_at_login_check
    assert not check.isChecked() and not entry.exists()
    with qtbot.waitSignal(check.changed, timeout=10_000):
        check.click()
    assert entry.is_file() and "--background" in entry.read_text()
    assert store.load().start_at_login is True

    # the Settings page shows the same switch, checked, and turning it off there removes it
    show_settings(window, qtbot)
    settings_check = window.settings_page.start_at_login_check
    assert settings_check is not None and settings_check.isVisible()
    assert settings_check.isChecked()
    with qtbot.waitSignal(settings_check.changed, timeout=10_000):
        settings_check.setChecked(False)
    assert not entry.exists() and store.load().start_at_login is False
    window.show_page("Library")
    assert not check.isChecked()  # re-read when shown


def test_keep_running_in_the_tray_is_off_without_a_tray_and_quit_quits_while_serving(
    window: MainWindow, qtbot: QtBot
) -> None:
    store = window._ctx.settings_store
    check = window.welcome.keep_in_tray_check
    # offscreen there is no tray: nothing to keep running in, so it is off and not offered
    qtbot.waitUntil(lambda: not check.isEnabled(), timeout=10_000)
    assert not check.isChecked() and "no tray" in check.toolTip()
    store.update_ui(close_action="quit")  # Settings › Window's "Quit", the same setting
    window.server_page.port_spin.setValue(free_port())
    window.server_page.start_server()
    qtbot.waitUntil(lambda: window._ctx.server.running, timeout=SLOW)
    url = window._ctx.server.base_url
    qtbot.waitUntil(lambda: f"<code>{url}</code>" in window.welcome.server_label.text())
    assert "Start the server" not in window.welcome.server_label.text()
    with qtbot.waitSignal(window.shutdown_finished, timeout=TIMEOUT):
        window.close()  # serving, but the user chose not to keep Hearth in the tray
    assert not window._ctx.server.running


def test_background_start_hides_the_window_only_where_a_tray_exists(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    # the user chose to have the server start with Hearth: a background start serves too
    store = gui_ctx.settings_store
    store.update(server=replace(store.load().server, start_at_launch=True, port=free_port()))
    w = MainWindow(gui_ctx, bridge)
    qtbot.addWidget(w)
    assert show_at_start(w, background=True, tray_available=lambda: True) is False
    qtbot.waitUntil(lambda: gui_ctx.server.running, timeout=SLOW)
    assert not w.isVisible()
    # offscreen has no tray (the real check): the window shows, or it could never be reached
    assert not w.tray.available()
    assert show_at_start(w, background=True) is True and w.isVisible()
    w.hide()
    assert show_at_start(w, background=False, tray_available=lambda: True) is True
    assert w.isVisible()
