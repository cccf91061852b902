"""Settings as a new user finds them: the on-demand loading switch the README promises,
applied to the running server at once; the server address edited in one place (the Server page);
the models folder shown as its real path, with Open; the Auto memory budget's figure."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QLineEdit, QSpinBox
from pytestqt.qtbot import QtBot

from app.compose import build_service
from app.core.library import fit
from app.core.util.loop import LoopThread
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.units import human_bytes
from app.paths import AppPaths
from app.server.runner import ServerController
from app.settings import SettingsStore
from tests.gui.helpers import SLOW, free_port, show_settings


@pytest.fixture
def app_window(qtbot: QtBot, hearth_home: Path, probe_file: Path) -> Iterator[MainWindow]:
    """The window over the service exactly as the desktop app wires it (``build_service``, as
    ``hearth`` with no command does), so settings reach the service the way they do for users."""
    paths = AppPaths.default().ensure()
    if probe_file.exists():  # the llama.cpp probe's verdict for this machine, from other tests
        shutil.copy(probe_file, paths.probe_file)
    store = SettingsStore(paths.settings_file)
    service = build_service(paths, store.load())
    loop = LoopThread("test-app").start()
    server = ServerController(service, store, paths)
    ctx = GuiContext(service=service, loop=loop, settings_store=store, paths=paths, server=server)
    bridge = Bridge(loop, service.events)
    try:
        w = MainWindow(ctx, bridge)
        qtbot.addWidget(w)
        w.show()
        qtbot.waitExposed(w)
        qtbot.waitUntil(lambda: w.settings_page.settings is not None, timeout=10_000)
        yield w
    finally:
        bridge.close()
        try:
            loop.call(server.stop("test"), timeout=30)
            loop.call(service.close(), timeout=60)
        finally:
            loop.stop()


def post_in_thread(url: str, body: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """POST off the GUI thread (the GUI keeps running); the result lands in the dict."""
    result: dict[str, Any] = {}

    def run() -> None:
        req = urllib.request.Request(
            url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                result["status"], result["body"] = r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            result["status"], result["body"] = e.code, json.loads(e.read())
        except Exception as e:  # reported to the test through result
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def test_on_demand_loading_switch_applies_to_the_running_server_at_once(
    app_window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    w = app_window
    w.library_page.import_files([str(smollm2_path)])
    qtbot.waitUntil(lambda: w.library_page.table_model.rowCount() == 1, timeout=10_000)
    model_id = w.library_page.table_model.ids()[0]
    port = free_port()
    w.server_page.port_spin.setValue(port)
    w.server_page.start_server()
    base = f"http://127.0.0.1:{port}/v1"
    qtbot.waitUntil(lambda: w.server_page.status_label.text() == f"Running at {base}", timeout=SLOW)
    chat = {"model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}

    page = w.settings_page
    show_settings(w, qtbot)
    assert page.jit_loading_check.isChecked()  # the default: on
    page.jit_loading_check.setChecked(False)
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        qtbot.mouseClick(page.apply_button, Qt.MouseButton.LeftButton)
    assert w._ctx.settings_store.load().server.jit_loading is False

    # the same server, not restarted: an unloaded model is refused as the README says
    t, result = post_in_thread(base + "/chat/completions", chat)
    qtbot.waitUntil(lambda: not t.is_alive(), timeout=SLOW)
    assert result.get("status") == 404, result
    assert "on-demand loading is off" in result["body"]["error"]["message"]
    assert w._ctx.service.models.loaded() == []

    page.jit_loading_check.setChecked(True)
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        page.apply()
    t, result = post_in_thread(base + "/chat/completions", chat)
    qtbot.waitUntil(lambda: not t.is_alive(), timeout=SLOW)
    assert result.get("status") == 200, result
    assert result["body"]["choices"][0]["message"]["role"] == "assistant"


def test_the_address_is_edited_on_the_server_page_and_shown_in_settings(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    assert page.address_label.text() == "127.0.0.1, port 8421"
    # nothing on the Settings page edits the host or the port any more
    editable = [e.text() for e in page.findChildren(QLineEdit) if not e.isReadOnly()]
    assert "127.0.0.1" not in editable
    assert 8421 not in [s.value() for s in page.findChildren(QSpinBox)]

    qtbot.mouseClick(page.change_address_button, Qt.MouseButton.LeftButton)
    assert window.current_page == "Server"
    server_page = window.server_page
    port = free_port()
    server_page.port_spin.setValue(port)
    server_page.start_server()
    qtbot.waitUntil(
        lambda: server_page.status_label.text() == f"Running at http://127.0.0.1:{port}/v1",
        timeout=SLOW,
    )
    # the address a start used is saved: the next start (at launch, hearth serve) uses it
    qtbot.waitUntil(lambda: gui_ctx.settings_store.load().server.port == port, timeout=10_000)
    qtbot.waitUntil(lambda: page.address_label.text() == f"127.0.0.1, port {port}")
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        page.apply()  # a Settings save keeps it
    assert gui_ctx.settings_store.load().server.port == port


class UrlCatcher(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[QUrl] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.urls.append(url)


def test_models_folder_shows_its_path_and_opens_it(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, tmp_path: Path
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    models = gui_ctx.paths.models
    assert page.models_dir_edit.text() == str(models)  # the real folder, not a placeholder

    catcher = UrlCatcher()
    QDesktopServices.setUrlHandler("file", catcher, "open")
    try:
        qtbot.mouseClick(page.open_models_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: bool(catcher.urls), timeout=10_000)
    finally:
        QDesktopServices.unsetUrlHandler("file")
    assert Path(catcher.urls[0].toLocalFile()) == models and models.is_dir()

    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        page.apply()
    assert gui_ctx.settings_store.load().models_dir == ""  # still "the default folder"
    other = tmp_path / "elsewhere"
    page.models_dir_edit.setText(str(other))  # what Change… fills in
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        page.apply()
    assert gui_ctx.settings_store.load().models_dir == str(other)


def test_auto_memory_budget_says_how_much_it_is_here(window: MainWindow, qtbot: QtBot) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    assert page.budget_spin.value() == 0  # Auto
    mem = fit.probe_memory()  # the real probe: this machine's RAM
    want = f"Auto — 80% of RAM, {human_bytes(int(0.8 * mem.ram_total))}"
    qtbot.waitUntil(lambda: page.budget_spin.text() == want, timeout=10_000)
    assert want in page.budget_spin.toolTip()
