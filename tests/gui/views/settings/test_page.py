"""The Settings page writes through the SettingsStore when applied; API keys are not on it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton
from pytestqt.qtbot import QtBot

from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.settings import Settings
from tests.gui.helpers import SLOW, free_port, show_settings


def test_save_writes_the_settings_file(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    store = gui_ctx.settings_store
    store.update(tray_hint_shown=True)  # a field the page does not show must survive a save
    show_settings(window, qtbot)
    page = window.settings_page
    assert page.address_label.text() == "127.0.0.1, port 8421"

    page.start_at_launch_check.setChecked(True)
    page.models_dir_edit.setText("/tmp/my-models")
    page.context_spin.setValue(8192)
    page.threads_spin.setValue(3)
    page.parallel_spin.setValue(4)
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        qtbot.mouseClick(page.apply_button, Qt.MouseButton.LeftButton)

    s = store.load()
    assert (s.server.host, s.server.port, s.server.start_at_launch) == ("127.0.0.1", 8421, True)
    assert (s.models_dir, s.load.context_length, s.load.threads) == ("/tmp/my-models", 8192, 3)
    assert s.tray_hint_shown is True
    assert s.load.parallel == 4
    on_disk = json.loads(Path(store.path).read_text())
    assert on_disk["server"]["start_at_launch"] is True
    assert on_disk["models_dir"] == "/tmp/my-models"
    assert page.banner.text() == "Settings saved."


def test_api_keys_live_on_the_server_page_only(window: MainWindow, qtbot: QtBot) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    buttons = [b.text() for b in page.findChildren(QPushButton)]
    assert not any("key" in t.lower() for t in buttons)  # no Generate / Remove key here
    assert page.keys_label.text() == "API keys are on the Server page."
    assert page.keys_label.isVisible()


def test_server_starts_at_launch_when_configured(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    port = free_port()
    s = Settings()
    gui_ctx.settings_store.save(
        replace(s, server=replace(s.server, port=port, start_at_launch=True))
    )
    w = MainWindow(gui_ctx, bridge)
    qtbot.addWidget(w)
    qtbot.waitUntil(
        lambda: w.server_page.url_edit.text() == f"http://127.0.0.1:{port}/v1", timeout=SLOW
    )
    assert gui_ctx.server.running


def test_server_stays_off_at_launch_by_default(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    w = MainWindow(gui_ctx, bridge)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.settings_page.settings is not None, timeout=10_000)
    qtbot.wait(300)
    assert not gui_ctx.server.running
    assert w.server_page.status_label.text() == "Stopped"


def test_memory_settings_are_saved_and_used(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    assert page.budget_spin.value() == 0
    qtbot.waitUntil(lambda: page.budget_spin.text().startswith("Auto — 80% of RAM, "))
    assert page.jit_ttl_spin.value() == 15 and page.jit_ttl_spin.isEnabled()
    assert not page.jit_forever_check.isChecked()

    page.budget_spin.setValue(2.5)
    page.jit_ttl_spin.setValue(5)
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        qtbot.mouseClick(page.apply_button, Qt.MouseButton.LeftButton)
    load = gui_ctx.settings_store.load().load
    assert (load.memory_budget_bytes, load.jit_ttl_s, load.jit_keep_forever) == (
        int(2.5 * 1024**3),
        300,
        False,
    )
    assert gui_ctx.service.models._scheduler.budget() == int(2.5 * 1024**3)  # the next load uses it

    page.jit_forever_check.setChecked(True)
    assert not page.jit_ttl_spin.isEnabled()
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        page.apply()
    assert gui_ctx.settings_store.load().load.jit_keep_forever is True


def test_untouched_memory_fields_keep_their_exact_values(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    # values the spins cannot show exactly (10 MiB, 90 s) survive a save that does not touch them
    s = Settings()
    gui_ctx.settings_store.save(
        replace(s, load=replace(s.load, memory_budget_bytes=10 * 1024**2, jit_ttl_s=90))
    )
    w = MainWindow(gui_ctx, bridge)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.settings_page.settings is not None, timeout=10_000)
    with qtbot.waitSignal(w.settings_page.settings_saved, timeout=10_000):
        w.settings_page.apply()
    load = gui_ctx.settings_store.load().load
    assert (load.memory_budget_bytes, load.jit_ttl_s) == (10 * 1024**2, 90)


def test_https_files_are_saved_and_the_server_starts_with_them(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, tmp_path: Path
) -> None:
    import threading
    import urllib.request

    from tests.support.tlsfiles import make_pki

    pki = make_pki(tmp_path / "pki")
    show_settings(window, qtbot)
    page = window.settings_page
    assert page.tls_cert_edit.text() == "" and page.tls_key_edit.text() == ""
    page.tls_cert_edit.setText(str(pki.cert_file))
    page.apply()  # a certificate without its key is refused before anything is written
    assert page.banner.kind == "error" and "both" in page.banner.text()
    assert gui_ctx.settings_store.load().server.tls_cert == ""

    page.tls_key_edit.setText(str(pki.key_file))
    port = free_port()
    window.server_page.port_spin.setValue(port)  # the address is set on the Server page
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        qtbot.mouseClick(page.apply_button, Qt.MouseButton.LeftButton)
    s = gui_ctx.settings_store.load().server
    assert (s.tls_cert, s.tls_key) == (str(pki.cert_file), str(pki.key_file))

    window.show_page("Server")
    server_page = window.server_page
    server_page.start_server()
    url = f"https://127.0.0.1:{port}/v1"
    qtbot.waitUntil(lambda: server_page.status_label.text() == f"Running at {url}", timeout=SLOW)
    result: dict[str, object] = {}

    def fetch() -> None:  # off the GUI thread: the GUI keeps running meanwhile
        try:
            ctx = pki.client_context()
            with urllib.request.urlopen(url + "/models", timeout=60, context=ctx) as r:
                result["status"] = r.status
        except Exception as e:  # reported to the test through result
            result["error"] = e

    t = threading.Thread(target=fetch, daemon=True)
    t.start()
    qtbot.waitUntil(lambda: not t.is_alive(), timeout=SLOW)
    assert result.get("status") == 200, result


def test_a_mismatched_https_key_is_reported_inline(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, tmp_path: Path
) -> None:
    from tests.support.tlsfiles import make_pki

    pki = make_pki(tmp_path / "pki")
    gui_ctx.settings_store.update(
        server=replace(
            gui_ctx.settings_store.load().server,
            tls_cert=str(pki.cert_file),
            tls_key=str(pki.other_key_file),
        )
    )
    page = window.server_page
    page.port_spin.setValue(free_port())
    page.start_server()
    qtbot.waitUntil(lambda: page.banner.kind == "error", timeout=SLOW)
    assert "does not match the certificate" in page.banner.text()
    assert page.status_label.text() == "Stopped"


def test_prompt_cache_mode_is_saved_and_becomes_the_load_default(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    """The Settings page's prompt cache choice is saved as `prompt_cache.mode` in
    settings.json."""
    page = window.settings_page
    show_settings(window, qtbot)
    assert page.prompt_cache_combo.currentData() == "reuse"  # the default
    page.prompt_cache_combo.setCurrentIndex(page.prompt_cache_combo.findData("exact"))
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        qtbot.mouseClick(page.apply_button, Qt.MouseButton.LeftButton)
    assert gui_ctx.settings_store.load().prompt_cache.mode == "exact"
    # (tests/test_settings.py shows the app's loads taking it as their default)
