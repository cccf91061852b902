"""The Providers page's replica groups, on the real main window: a group made in its dialog is
saved in groups.json and listed with each member's state as the pool finds it (a scripted
engine on loopback is ready, a closed port unreachable); a bad member shows its error in the
dialog and saves nothing; Remove (after a confirmation) takes the group away."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.core.util.loop import LoopThread
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.views.providers.page import TITLE
from tests.conftest import listen_loopback
from tests.e2e.providers.scripted_engine import Script, engine_app
from tests.gui.helpers import free_port

PROBE_WAIT = 60_000


@pytest.fixture
def live() -> Iterator[str]:
    loop = LoopThread("scripted-engine").start()
    runner, url = loop.call(listen_loopback(engine_app(Script())), 30)
    try:
        yield str(url)
    finally:
        loop.call(runner.cleanup(), 30)
        loop.stop()


def test_a_group_is_made_listed_with_member_states_and_removed(
    window: MainWindow,
    qtbot: QtBot,
    gui_ctx: GuiContext,
    live: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = ProviderStore(gui_ctx.paths.providers_file, gui_ctx.paths.provider_keys_file)
    store.add(ProviderConfig("up", live + "/v1", kind="vllm"), None, lambda p: None)
    down = f"http://127.0.0.1:{free_port()}/v1"
    store.add(ProviderConfig("down", down, kind="vllm"), None, lambda p: None)
    window.show_page(TITLE)
    page = window.providers_page
    box = page.groups_box
    qtbot.waitUntil(lambda: page.snapshot is not None and len(page.snapshot.providers) == 2)

    dialog = box.open_dialog()
    dialog.name_edit.setText("tiny")
    dialog.members_edit.setText("up down/tiny")
    dialog.strategy_combo.setCurrentText("session")
    with qtbot.waitSignal(dialog.group_saved, timeout=10_000):
        dialog.save_button.click()
    assert not dialog.isVisible()
    saved = json.loads((gui_ctx.paths.config / "groups.json").read_text())["groups"]["tiny"]
    assert saved["members"] == ["up", "down/tiny"] and saved["strategy"] == "session"

    def cell(col: int) -> str:
        item = box.table.item(0, col)
        return item.text() if item is not None else ""

    qtbot.waitUntil(
        lambda: "up/tiny (ready)" in cell(2) and "down/tiny (unreachable)" in cell(2),
        timeout=PROBE_WAIT,
    )
    assert (cell(0), cell(1)) == ("tiny", "session")

    dialog = box.open_dialog()
    dialog.name_edit.setText("other")
    dialog.members_edit.setText("up ghost")
    with qtbot.waitSignal(dialog.save_failed, timeout=10_000):
        dialog.save_button.click()
    assert "ghost" in dialog.banner.text() and dialog.isVisible()
    dialog.reject()
    groups = gui_ctx.service.routing.groups
    assert groups is not None and "other" not in groups.names()

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    box.select_group("tiny")
    assert box.remove_button.isEnabled()
    box.remove_button.click()
    qtbot.waitUntil(lambda: box.table.rowCount() == 0, timeout=10_000)
    assert json.loads((gui_ctx.paths.config / "groups.json").read_text())["groups"] == {}
