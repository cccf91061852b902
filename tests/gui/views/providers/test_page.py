"""The Providers page: providers added through its dialog (the real providers file under
HEARTH_HOME), a ready one being a real Hearth server on loopback (``served``, once per module),
an unreachable one a closed port; aliases edited in order; remote models in the Chat picker."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.core.gateway.providers.manage import DEFAULT_URLS
from app.core.gateway.providers.store import KINDS
from app.gui.context import GuiContext
from app.gui.main_window import PAGES, MainWindow
from app.gui.views.providers.dialogs import AddProviderDialog
from app.gui.views.providers.page import COLUMNS, TITLE
from tests.conftest import Served
from tests.gui.helpers import SLOW, free_port

PROBE_WAIT = 60_000  # ms: the pool probes in the background, on a possibly busy machine


def _open_page(window: MainWindow, qtbot: QtBot) -> None:
    window.show_page(TITLE)
    page = window.providers_page
    assert page.isVisible() and page.refresh_timer.isActive()
    qtbot.waitUntil(lambda: page.snapshot is not None, timeout=10_000)


def _add(
    window: MainWindow,
    qtbot: QtBot,
    name: str,
    url: str,
    kind: str = "hearth",
    key: str = "",
) -> AddProviderDialog:
    dialog = window.providers_page.open_add_dialog()
    dialog.kind_combo.setCurrentText(kind)
    dialog.name_edit.setText(name)
    dialog.url_edit.setText(url)
    dialog.key_edit.setText(key)
    with qtbot.waitSignal(dialog.provider_added, timeout=10_000):
        dialog.save_button.click()
    assert not dialog.isVisible()
    return dialog


def _cell(window: MainWindow, row: int, column: str) -> str:
    item = window.providers_page.table.item(row, COLUMNS.index(column))
    return item.text() if item is not None else ""


def _providers_file(ctx: GuiContext) -> Path:
    return ctx.paths.providers_file


def test_the_page_is_in_the_navigation(window: MainWindow) -> None:
    assert TITLE == "Providers" and TITLE in PAGES
    window.show_page(TITLE)
    assert window.current_page == "Providers"
    assert window.providers_page.isVisible()
    assert window.providers_page.empty_label.isVisible()  # no providers yet
    window.show_page("Library")
    assert not window.providers_page.refresh_timer.isActive()  # polls only while shown


def test_the_kind_preset_fills_the_usual_port_unless_a_url_was_typed(
    window: MainWindow, qtbot: QtBot
) -> None:
    dialog = window.providers_page.open_add_dialog()
    assert [dialog.kind_combo.itemText(i) for i in range(dialog.kind_combo.count())] == list(KINDS)
    assert dialog.url_edit.text() == DEFAULT_URLS[dialog.kind_combo.currentText()]
    dialog.kind_combo.setCurrentText("vllm")
    assert dialog.url_edit.text() == "http://127.0.0.1:8000/v1"
    dialog.kind_combo.setCurrentText("ollama")
    assert dialog.url_edit.text() == "http://127.0.0.1:11434/v1"
    dialog.kind_combo.setCurrentText("llama.cpp")
    assert dialog.url_edit.text() == "http://127.0.0.1:8080/v1"
    dialog.url_edit.setText("http://10.0.0.5:9000/v1")  # the user's own URL stays
    dialog.kind_combo.setCurrentText("sglang")
    assert dialog.url_edit.text() == "http://10.0.0.5:9000/v1"
    assert dialog.key_edit.echoMode() == dialog.key_edit.EchoMode.Password
    assert dialog.prefix_edit.placeholderText() == "NAME/"
    dialog.name_edit.setText("lan")
    assert dialog.prefix_edit.placeholderText() == "lan/"
    assert (dialog.connect_spin.value(), dialog.first_token_spin.value()) == (10.0, 120.0)
    assert dialog.idle_spin.value() == 60.0
    # an engine's redirects are not followed unless the user ticks it
    assert not dialog.redirects_check.isChecked() and not dialog.config().follow_redirects
    dialog.redirects_check.setChecked(True)
    assert dialog.config().follow_redirects
    dialog.reject()


def test_add_validates_in_the_dialog_and_writes_nothing(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    dialog = window.providers_page.open_add_dialog()
    dialog.name_edit.setText("Bad Name")
    with qtbot.waitSignal(dialog.add_failed, timeout=10_000) as failed:
        dialog.save_button.click()
    assert "not a valid provider name" in str(failed.args[0])
    assert dialog.isVisible() and dialog.banner.isVisible() and dialog.banner.kind == "error"
    assert "not a valid provider name" in dialog.banner.text()
    assert dialog.save_button.isEnabled()  # fix it and try again
    assert not _providers_file(gui_ctx).exists()

    dialog.name_edit.setText("lan")
    dialog.url_edit.setText("not a url")
    with qtbot.waitSignal(dialog.add_failed, timeout=10_000) as failed:
        dialog.save_button.click()
    assert "is not an http(s) URL" in dialog.banner.text()
    assert not _providers_file(gui_ctx).exists()
    dialog.reject()


def test_a_ready_provider_shows_its_state_tests_ok_chats_and_is_removed(
    window: MainWindow,
    qtbot: QtBot,
    gui_ctx: GuiContext,
    served: Served,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page = window.providers_page
    _open_page(window, qtbot)
    secret = "sk-test-never-shown"
    _add(window, qtbot, "eng", served.base_url, key=secret)

    saved = json.loads(_providers_file(gui_ctx).read_text())
    assert [p["name"] for p in saved["providers"]] == ["eng"]
    assert saved["providers"][0]["url"] == served.base_url
    assert secret not in _providers_file(gui_ctx).read_text()
    keys = gui_ctx.paths.provider_keys_file
    assert json.loads(keys.read_text())["keys"] == {"eng": secret}
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600

    remote_id = f"eng/{served.model_id}"

    def ready() -> bool:
        s = page.status("eng")
        return s is not None and s.state == "ready" and remote_id in s.models

    qtbot.waitUntil(ready, timeout=PROBE_WAIT)
    qtbot.waitUntil(lambda: _cell(window, 0, "State") == "ready", timeout=10_000)
    assert not page.empty_label.isVisible()
    assert _cell(window, 0, "Name") == "eng"
    assert _cell(window, 0, "Kind") == "hearth"
    assert _cell(window, 0, "URL") == served.base_url
    assert _cell(window, 0, "Prefix") == "eng/"
    assert _cell(window, 0, "Models") == "1"
    assert _cell(window, 0, "Latency").endswith(" ms")
    state_item = page.table.item(0, 0)
    assert state_item is not None and not state_item.icon().isNull()
    shown = [_cell(window, r, c) for r in range(page.table.rowCount()) for c in COLUMNS] + [
        page.table.item(0, 0).toolTip()
    ]
    assert all(secret not in text for text in shown)

    # Test: health, the model list and a 1-token chat on the real engine
    page.select_provider("eng")
    assert page.test_button.isEnabled()
    with qtbot.waitSignal(page.test_finished, timeout=SLOW) as tested:
        page.test_button.click()
    result = tested.args[0]
    assert result.ok, result.reason
    assert [s.name for s in result.steps] == ["health", "models", "chat"]
    assert page.test_label.text().startswith("Test of eng: ok")
    assert "✓ chat: " in page.test_label.text()

    # Chat: the picker offers the remote model and a chat with it is answered by the engine
    chat = window.chat_page
    qtbot.waitUntil(lambda: chat.model_combo.findData(remote_id) >= 0, timeout=10_000)
    window.show_page("Chat")
    chat.select_model(remote_id)
    assert "remote: eng" in chat.model_combo.currentText()
    chat.max_tokens_spin.setValue(8)
    with qtbot.waitSignal(chat.answer_finished, timeout=SLOW) as finished:
        assert chat.send("Say hello.")
    assert finished.args[0] in ("stop", "length"), chat.stats_label.text()
    assert chat.answer_text
    assert not gui_ctx.service.models.loaded()  # answered remotely: nothing was loaded here

    # Remove (after a confirmation): the row, the file entry, its key and the Chat entry go
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    window.show_page(TITLE)
    page.select_provider("eng")
    page.remove_button.click()
    qtbot.waitUntil(lambda: page.table.rowCount() == 0, timeout=10_000)
    assert page.empty_label.isVisible()
    assert json.loads(_providers_file(gui_ctx).read_text())["providers"] == []
    assert json.loads(keys.read_text())["keys"] == {}
    qtbot.waitUntil(lambda: chat.model_combo.findData(remote_id) < 0, timeout=10_000)


def test_an_unreachable_provider_shows_why_and_its_test_fails(
    window: MainWindow, qtbot: QtBot
) -> None:
    page = window.providers_page
    _open_page(window, qtbot)
    port = free_port()  # nothing listens there
    _add(window, qtbot, "down", f"http://127.0.0.1:{port}/v1", kind="llama.cpp")

    qtbot.waitUntil(lambda: _cell(window, 0, "State") == "unreachable", timeout=PROBE_WAIT)
    assert _cell(window, 0, "Models") == "0"
    status = page.status("down")
    assert status is not None and status.error
    assert page.table.item(0, 0).toolTip() == status.error

    page.select_provider("down")
    with qtbot.waitSignal(page.test_finished, timeout=PROBE_WAIT) as tested:
        page.test_button.click()
    result = tested.args[0]
    assert not result.ok
    assert result.reason is not None and result.reason.startswith("health: unreachable")
    assert page.test_label.text().startswith("Test of down: failed: health: unreachable")
    assert "✗ health: " in page.test_label.text()


def test_an_alias_with_two_targets_is_saved_in_order_and_errors_are_shown(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    page = window.providers_page
    _open_page(window, qtbot)
    # a remote target needs a provider owning its prefix (reachable or not)
    _add(window, qtbot, "lan", f"http://127.0.0.1:{free_port()}/v1", kind="vllm")
    qtbot.waitUntil(lambda: imported in page.alias_candidates(), timeout=10_000)

    dialog = page.open_alias_dialog()
    dialog.name_edit.setText("gpt-4o-mini")
    assert dialog.add_target("lan/big-model")
    dialog.candidate_combo.setCurrentText(imported)
    dialog.add_target_button.click()
    assert dialog.targets() == ("lan/big-model", imported)
    dialog.target_list.setCurrentRow(1)
    dialog.up_button.click()  # the local model first, the remote one as the fallback
    assert dialog.targets() == (imported, "lan/big-model")
    with qtbot.waitSignal(dialog.alias_saved, timeout=10_000):
        dialog.save_button.click()
    assert not dialog.isVisible()

    assert gui_ctx.service.routing.aliases()["gpt-4o-mini"] == (imported, "lan/big-model")
    qtbot.waitUntil(lambda: page.alias_table.rowCount() == 1, timeout=10_000)
    assert page.alias_table.item(0, 0).text() == "gpt-4o-mini"
    assert page.alias_table.item(0, 1).text() == f"{imported} → lan/big-model"

    # an unknown target: the error shows in the dialog, nothing is saved
    dialog = page.open_alias_dialog()
    dialog.name_edit.setText("claude-sonnet-4")
    dialog.add_target("no-such-model")
    with qtbot.waitSignal(dialog.save_failed, timeout=10_000):
        dialog.save_button.click()
    assert "neither a model id nor an alias" in dialog.banner.text()
    assert dialog.isVisible()
    dialog.reject()
    assert "claude-sonnet-4" not in gui_ctx.service.routing.aliases()

    # a cycle: outer -> gpt-4o-mini, then gpt-4o-mini -> ... -> outer is refused
    dialog = page.open_alias_dialog()
    dialog.name_edit.setText("outer")
    dialog.add_target("gpt-4o-mini")
    with qtbot.waitSignal(dialog.alias_saved, timeout=10_000):
        dialog.save_button.click()
    qtbot.waitUntil(lambda: page.alias_table.rowCount() == 2, timeout=10_000)
    page.select_alias("gpt-4o-mini")
    page.edit_alias_button.click()
    dialog = page.alias_dialog
    assert dialog is not None and dialog.name_edit.isReadOnly()
    assert dialog.targets() == (imported, "lan/big-model")
    dialog.add_target("outer")
    with qtbot.waitSignal(dialog.save_failed, timeout=10_000):
        dialog.save_button.click()
    assert "cycle" in dialog.banner.text()
    dialog.reject()
    assert gui_ctx.service.routing.aliases()["gpt-4o-mini"] == (imported, "lan/big-model")


def test_chat_lists_a_remote_model_once_its_provider_is_ready(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, served: Served
) -> None:
    """Added from outside the page (the CLI's file) while Chat is the page shown: the pool's
    change event re-lists Chat's models once the provider's first probe answers."""
    from app.compose import provider_store
    from app.core.gateway.providers.store import ProviderConfig

    window.show_page("Chat")
    chat = window.chat_page
    provider_store(gui_ctx.paths).add(
        ProviderConfig("outside", served.base_url, kind="hearth"), None, lambda p: None
    )
    remote_id = "outside/" + served.model_id
    chat.refresh_models()  # the listing now sees the new provider, still "starting"
    qtbot.waitUntil(lambda: chat.model_combo.findData(remote_id) >= 0, timeout=PROBE_WAIT)
    assert not window.providers_page.isVisible()  # not the page's timer: the pool's event
