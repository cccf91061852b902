"""The Server page's response cache box: it shows the saved ``cache`` settings,
saves edits to settings.json (where a server reads them), shows the hit/miss counts of the
cache file, and its Clear button empties that file."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.gateway.cache.store import CacheConfig, CachedAnswer, CacheStore
from app.core.types import Delta, Usage
from app.gui.main_window import MainWindow
from app.settings import SettingsStore
from tests.gui.helpers import SLOW


def test_the_cache_box_saves_settings_shows_counts_and_clears(
    window: MainWindow, qtbot: QtBot
) -> None:
    page = window.server_page
    paths = page._server.paths
    store = SettingsStore(paths.settings_file)
    store.update(cache=CacheConfig(mode="exact", ttl_s=120.0, max_entries=50))
    db = CacheStore(paths.response_cache_db)  # what a running server writes
    answer = CachedAnswer("m", ((Delta("hi", 1), Delta(finish_reason="stop", usage=Usage(3, 1))),))
    db.put("k", answer, 1e12, max_entries=50, ttl_s=120.0)
    db.count("hits")
    db.count("misses")
    db.count("misses")
    window.show_page("Server")
    box = page.cache_section
    box.refresh()
    qtbot.waitUntil(lambda: box.mode_combo.currentText() == "exact", timeout=SLOW)
    assert (box.ttl_spin.value(), box.max_spin.value()) == (120, 50)
    assert box.threshold_spin.value() == 0.9
    qtbot.waitUntil(lambda: "1 entries" in box.counts_label.text(), timeout=SLOW)
    assert "1 hits" in box.counts_label.text() and "2 misses" in box.counts_label.text()

    box.mode_combo.setCurrentText("semantic")
    box.threshold_spin.setValue(0.85)
    box.embedding_edit.setText("all-minilm-l6-v2-q8_0")
    qtbot.mouseClick(box.save_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "saved" in box.banner.text(), timeout=SLOW)
    saved = SettingsStore(paths.settings_file).load().cache
    assert saved == CacheConfig("semantic", 50, 120.0, 0.85, "all-minilm-l6-v2-q8_0")

    qtbot.mouseClick(box.clear_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "0 entries" in box.counts_label.text(), timeout=SLOW)
    assert db.stats()["entries"] == 0 and "0 hits" in box.counts_label.text()
    db.close()
