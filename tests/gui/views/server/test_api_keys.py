"""The Server page's API keys: add (limits, models, admin), copy the new key once, the real
server accepts it and refuses requests without one, remove."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from app.core.gateway.keys import KeyStore, hash_secret
from app.gui.main_window import MainWindow
from tests.gui.helpers import SLOW


def get_in_thread(url: str, key: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def go() -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=60
            ) as r:
                result["status"] = r.status
        except urllib.error.HTTPError as e:
            result["status"] = e.code
        except Exception as e:  # reported to the test through result
            result["error"] = e

    threading.Thread(target=go, daemon=True).start()
    return result


def test_add_copy_use_and_remove_a_key(window: MainWindow, qtbot: QtBot) -> None:
    window.show_page("Server")
    page = window.server_page
    keys = page.keys_section
    keys.name_edit.setText("alice")
    keys.rpm_spin.setValue(6)
    keys.tpm_spin.setValue(1000)
    keys.models_edit.setText("smol*, org/*")
    keys.admin_check.setChecked(True)
    qtbot.mouseClick(keys.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: keys.table.rowCount() == 1, timeout=SLOW)
    secret = keys.secret_edit.text()
    assert secret.startswith("hearth-")
    path = page._server.paths.keys_file
    raw = path.read_text()
    assert secret not in raw  # only its hash
    [entry] = json.loads(raw)["keys"]
    assert entry["hash"] == hash_secret(secret)
    assert (entry["name"], entry["rpm"], entry["tpm"], entry["admin"]) == ("alice", 6, 1000, True)
    assert entry["models"] == ["smol*", "org/*"]
    cells = [keys.table.item(0, c).text() for c in range(keys.table.columnCount())]
    assert cells == ["alice", "admin", "6", "1000", "smol*, org/*", "never"]

    QGuiApplication.clipboard().clear()
    qtbot.mouseClick(keys.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == secret
    assert keys.secret_edit.text() == "" and not keys.copy_button.isEnabled()  # shown once
    assert keys.copy_button.text() == "Copied"

    keys.name_edit.setText("alice")  # a second key of that name is refused, and said so
    qtbot.mouseClick(keys.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "exists" in keys.banner.text(), timeout=SLOW)
    assert keys.table.rowCount() == 1

    page.port_spin.setValue(0)
    page.start_server()
    qtbot.waitUntil(lambda: page.url_edit.text() != "", timeout=SLOW)
    url = page.url_edit.text() + "/models"
    without, with_key = get_in_thread(url, None), get_in_thread(url, secret)
    qtbot.waitUntil(lambda: "status" in without and "status" in with_key, timeout=SLOW)
    assert (without["status"], with_key["status"]) == (401, 200)

    keys.table.selectRow(0)
    qtbot.mouseClick(keys.remove_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: keys.table.rowCount() == 0, timeout=SLOW)
    assert json.loads(path.read_text())["keys"] == []
    after = get_in_thread(url, None)  # no key left: open again (loopback), at once
    qtbot.waitUntil(lambda: "status" in after, timeout=SLOW)
    assert after["status"] == 200
    KeyStore(path).add("bob", "k-bob-0123456789", tpm=50)  # as `hearth keys add` would
    keys.refresh()
    qtbot.waitUntil(lambda: keys.table.rowCount() == 1, timeout=SLOW)
    assert [keys.table.item(0, c).text() for c in range(4)] == ["bob", "user", "no limit", "50"]
    page.stop_server()
    qtbot.waitUntil(lambda: page.status_label.text() == "Stopped", timeout=SLOW)
