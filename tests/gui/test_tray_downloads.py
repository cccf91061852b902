"""The tray lists unfinished downloads (rebuilt on aboutToShow) with Pause/Resume/Cancel."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.gui.main_window import MainWindow
from tests.gui.conftest import HUB_FILE, HUB_REPO
from tests.gui.views.test_downloads import TIMEOUT, start
from tests.support.fakehub import FakeHub


def tray_texts(window: MainWindow) -> list[str]:
    window.tray.menu.aboutToShow.emit()
    return [a.text() for a in window.tray.menu.actions() if not a.isSeparator()]


def test_the_tray_lists_unfinished_downloads_with_pause_resume_and_cancel(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot
) -> None:
    assert not any(t.startswith("Downloads") for t in tray_texts(hub_window))
    gate = hub.hold(HUB_REPO, HUB_FILE, at=64 * 1024)  # held until paused
    did = start(hub_window, qtbot, f"{HUB_REPO}:Q4_K_M")
    model = hub_window.downloads_page.table_model
    qtbot.waitUntil(gate.reached.is_set, timeout=TIMEOUT)
    qtbot.waitUntil(lambda: model.state_of(did) == "downloading", timeout=TIMEOUT)
    texts = tray_texts(hub_window)
    assert "Downloads (1)" in texts
    entry = next(t for t in texts if t.startswith(HUB_FILE))
    assert entry.endswith("(Downloading)") and "%" in entry
    tray = hub_window.tray
    assert len(tray.download_menus) == 1
    assert [a.text() for a in tray.download_menus[0].actions()] == ["Pause", "Cancel"]
    tray.download_menus[0].actions()[0].trigger()
    qtbot.waitUntil(lambda: model.state_of(did) == "paused", timeout=TIMEOUT)

    texts = tray_texts(hub_window)
    assert any(t.startswith(HUB_FILE) and t.endswith("(Paused)") for t in texts)
    assert [a.text() for a in tray.download_menus[0].actions()] == ["Resume", "Cancel"]
    tray.download_menus[0].actions()[1].trigger()
    qtbot.waitUntil(lambda: model.state_of(did) == "cancelled", timeout=TIMEOUT)
    assert not any(t.startswith(("Downloads", HUB_FILE)) for t in tray_texts(hub_window))

    # the header opens the Downloads page
    hub_window.show_page("Library")
    hub_window.tray.downloads_header_action.trigger()
    assert hub_window.current_page == "Downloads"
