"""The Downloads page against the fake Hub: rows follow the core's Download* events, the buttons
pause, resume, cancel and retry through the DownloadManager, and finished models reach the
Library page."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.hub.downloads import DownloadManager, DownloadStatus
from app.gui.main_window import MainWindow
from app.gui.models.download import COLUMNS, STATE_COLUMN, DownloadsTableModel
from tests.gui.conftest import HUB_FILE, HUB_REPO
from tests.support.fakehub import FakeHub

TIMEOUT = 20_000
LEFT = Qt.MouseButton.LeftButton


def start(window: MainWindow, qtbot: QtBot, ref: str) -> str:
    """Queue ``ref`` through the manager on the service loop; returns the download id."""
    dm = window.downloads_page.manager
    assert isinstance(dm, DownloadManager)
    got: list[DownloadStatus] = []
    window.downloads_page._bridge.run(dm.start(ref), on_done=got.append)
    qtbot.waitUntil(lambda: bool(got), timeout=TIMEOUT)
    return got[0].id


def state_text(model: DownloadsTableModel, download_id: str) -> str:
    return str(model.index(model.row_of(download_id), STATE_COLUMN).data())


def test_a_download_shows_progress_then_done_and_the_model_reaches_the_library(
    hub_window: MainWindow, qtbot: QtBot
) -> None:
    page = hub_window.downloads_page
    hub_window.show_page("Downloads")
    assert page.empty_label.isVisible()
    did = start(hub_window, qtbot, f"{HUB_REPO}:Q4_K_M")
    qtbot.waitUntil(lambda: page.table_model.row_of(did) >= 0, timeout=TIMEOUT)
    model = page.table_model
    row = model.row_of(did)
    assert model.index(row, COLUMNS.index("File")).data() == HUB_FILE
    assert model.index(row, COLUMNS.index("Repository")).data() == HUB_REPO
    qtbot.waitUntil(lambda: model.state_of(did) == "completed", timeout=TIMEOUT)
    assert state_text(model, did) == "Done"
    assert model.index(row, COLUMNS.index("Progress")).data() == "100%"
    assert not page.empty_label.isVisible()
    # the Library page lists it (through LibraryChanged, not a rescan)
    lib = hub_window.library_page.table_model
    qtbot.waitUntil(lambda: lib.rowCount() == 1, timeout=TIMEOUT)
    assert lib.status(0).model.quantization == "Q4_K_M"


def test_pause_and_resume_a_stalled_download_from_the_buttons(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot
) -> None:
    hub.hold(HUB_REPO, HUB_FILE, at=64 * 1024)  # held until paused
    page = hub_window.downloads_page
    hub_window.show_page("Downloads")
    did = start(hub_window, qtbot, f"{HUB_REPO}:Q4_K_M")
    model = page.table_model
    qtbot.waitUntil(
        lambda: model.state_of(did) == "downloading" and model.status(0).bytes_done > 0,
        timeout=TIMEOUT,
    )
    assert not page.resume_button.isEnabled()  # nothing selected yet
    page.select(did)
    assert page.pause_button.isEnabled() and not page.resume_button.isEnabled()
    qtbot.mouseClick(page.pause_button, LEFT)
    qtbot.waitUntil(lambda: model.state_of(did) == "paused", timeout=TIMEOUT)
    assert state_text(model, did) == "Paused"
    assert page.resume_button.isEnabled() and not page.pause_button.isEnabled()
    qtbot.mouseClick(page.resume_button, LEFT)
    qtbot.waitUntil(lambda: model.state_of(did) == "completed", timeout=TIMEOUT)
    # resumed from the bytes on disk: the second request asked for a Range
    assert any(r for r in hub.ranges(HUB_REPO, HUB_FILE)[1:])


def test_cancel_then_retry(hub_window: MainWindow, hub: FakeHub, qtbot: QtBot) -> None:
    gate = hub.hold(HUB_REPO, HUB_FILE, at=64 * 1024)  # held until cancelled
    page = hub_window.downloads_page
    did = start(hub_window, qtbot, f"{HUB_REPO}:Q4_K_M")
    model = page.table_model
    # the request itself must be the held one: cancelled before it, the retry would be held
    qtbot.waitUntil(gate.reached.is_set, timeout=TIMEOUT)
    qtbot.waitUntil(lambda: model.state_of(did) == "downloading", timeout=TIMEOUT)
    page.select(did)
    qtbot.mouseClick(page.cancel_button, LEFT)
    qtbot.waitUntil(lambda: model.state_of(did) == "cancelled", timeout=TIMEOUT)
    assert state_text(model, did) == "Cancelled"
    assert page.retry_button.isEnabled()
    qtbot.mouseClick(page.retry_button, LEFT)
    qtbot.waitUntil(lambda: model.state_of(did) == "completed", timeout=TIMEOUT)


def test_without_a_download_manager_the_page_says_so(window: MainWindow) -> None:
    page = window.downloads_page
    assert page.manager is None
    assert page.banner.isVisible() or page.banner.text()
    assert page.table_model.rowCount() == 0
