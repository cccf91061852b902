"""The Connect page: each app's settings from app/core/desktop/connect.py with the page's
server URL and model, copying them, the context warning and its fix, a key made for an app, and
the URL following the server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from app.core.desktop.connect import KEY_PLACEHOLDER, NO_KEY, TOOLS, Target, connection
from app.core.gateway.keys import KeyStore
from app.gui.context import GuiContext
from app.gui.main_window import PAGES, MainWindow
from app.gui.views.connect import (
    NO_MODEL,
    NO_MODEL_TEXT,
    TITLE,
    ConnectPage,
    ConnectState,
    export_lines,
)
from app.server.runner import base_url
from tests.gui.helpers import contrast

SLOW = 120_000  # loads and server starts on a busy machine


def _shown(page: ConnectPage, qtbot: QtBot, **want: Any) -> ConnectState:
    """Wait until the page shows a state with these fields (``tool``: the connection's)."""

    def ok() -> bool:
        st = page.state
        if st is None or page.pending:
            return False
        for k, v in want.items():
            got = st.conn.tool if k == "tool" else getattr(st, k)
            if got != v:
                return False
        return True

    qtbot.waitUntil(ok, timeout=SLOW)
    assert page.state is not None
    return page.state


@pytest.fixture
def page(window: MainWindow, qtbot: QtBot) -> ConnectPage:
    window.show_page(TITLE)
    return window.connect_page


def _settings_root(gui_ctx: GuiContext) -> str:
    srv = gui_ctx.settings_store.load().server
    return base_url(srv.host, srv.port).removesuffix("/v1")


def test_the_page_is_in_the_window_with_a_shortcut(window: MainWindow) -> None:
    assert TITLE in PAGES and PAGES.index(TITLE) == PAGES.index("Server") + 1
    i = PAGES.index(TITLE)
    assert window.pages[i] is window.connect_page
    assert window.page_actions[i].shortcut().toString() == f"Ctrl+{i + 1}"


def test_each_tool_shows_its_snippet_with_the_url_and_model_and_copies_it(
    page: ConnectPage, imported: str, gui_ctx: GuiContext, qtbot: QtBot
) -> None:
    root = _settings_root(gui_ctx)  # the server is stopped: where it will listen
    titles = [page.tool_combo.itemText(i) for i in range(page.tool_combo.count())]
    assert titles == [t.title for t in TOOLS.values()]
    clipboard = QGuiApplication.clipboard()
    _shown(page, qtbot, model=imported)
    assert page.banner.text() != NO_MODEL_TEXT  # shown before the import, gone with it
    for name in TOOLS:
        page.select_tool(name)
        st = _shown(page, qtbot, tool=name, model=imported)
        want = connection(name, Target(root, imported, None, False))
        assert page.snippet_edit.toPlainText() == want.snippet
        assert page.snippet_edit.isReadOnly()
        assert imported in want.snippet and root in want.snippet
        assert page.url_edit.text() == want.base_url and root in want.base_url
        assert page.model_combo.currentData() == imported  # the only chat model: the default
        assert [page.env_list.item(i).text() for i in range(page.env_list.count())] == [
            f"{k}={v}" for k, v in want.env.items()
        ]
        assert f"{want.context_needed:,}" in page.context_label.text()
        if TOOLS[name].fim:  # SmolLM2 has no FIM tokens: autocomplete tools say so
            assert "cannot fill in the middle" in page.warning_label.text()
            assert page.warning_label.isVisible()
        assert not st.key_required and "hearth" in page.key_label.text()
        assert not page.create_key_button.isVisible()
        page.copy_button.click()
        assert clipboard.text() == want.snippet
        assert page.copy_button.text() == "Copied"  # the button says so where the user looks
        qtbot.waitUntil(lambda: page.copy_button.text() == "Copy", timeout=10_000)
        if want.env:
            page.copy_exports_button.click()
            assert clipboard.text() == export_lines(want.env)
            assert clipboard.text().startswith("export ")
            page.env_list.setCurrentRow(0)
            page.copy_env_button.click()
            k, v = next(iter(want.env.items()))
            assert clipboard.text() == f"{k}={v}"
            assert page.copy_env_button.text() == "Copied"
            assert page.copy_exports_button.text() == "Copied"
        else:
            assert not page.env_list.isVisible() and not page.copy_exports_button.isVisible()
            assert "environment variables" in page.notes_label.text()
    page.select_tool("claude-code")
    _shown(page, qtbot, tool="claude-code")
    text = page.snippet_edit.toPlainText()
    assert (
        f"export ANTHROPIC_BASE_URL={root}\n" in text and f"ANTHROPIC_AUTH_TOKEN={NO_KEY}" in text
    )


def test_a_small_loaded_context_warns_and_the_button_saves_the_preset_and_reloads(
    page: ConnectPage, window: MainWindow, imported: str, gui_ctx: GuiContext, qtbot: QtBot
) -> None:
    service, loop = gui_ctx.service, gui_ctx.loop
    loop.call(service.models.load(imported, {"context_length": 1024}), timeout=SLOW / 1000)
    page.select_tool("continue")  # needs 8,192; SmolLM2 was trained for 8,192
    st = _shown(page, qtbot, tool="continue", loaded=True)
    assert not st.check.ok and st.check.can_raise
    assert page.warning_label.isVisible()
    assert st.check.message in page.warning_label.text()
    assert "1,024" in page.warning_label.text() and "8,192" in page.warning_label.text()
    assert page.set_context_button.isVisible()
    assert page.set_context_button.text() == "Use 8,192 tokens for this model"

    saved: list[tuple[str, int]] = []
    page.context_saved.connect(lambda m, n: saved.append((m, n)))
    page.set_context_button.click()
    qtbot.waitUntil(lambda: bool(saved), timeout=SLOW)
    assert saved == [(imported, 8192)]

    async def preset() -> dict[str, Any]:
        return service.models.preset(imported)

    assert loop.call(preset(), timeout=30)["context_length"] == 8192  # read back: the service
    # still loaded with 1,024: the page says so and offers the reload
    assert "reload" in page.banner.text().lower()
    st = _shown(page, qtbot, tool="continue", preset_context=8192)
    assert st.needs_reload and page.reload_button.isVisible()
    assert not page.set_context_button.isVisible()  # saved: what is left is the reload
    assert "8,192 from the next load" in page.warning_label.text()
    window.show_page("Library")
    window.show_page(TITLE)  # the offer stands when the user comes back
    assert _shown(page, qtbot, tool="continue").needs_reload and page.reload_button.isVisible()
    page.reload_button.click()

    def reloaded() -> bool:
        st = page.state
        return st is not None and st.loaded and st.check.ok

    qtbot.waitUntil(reloaded, timeout=SLOW)
    assert [i.context_length for i in service.models.loaded() if i.model_id == imported] == [8192]
    assert not page.warning_label.isVisible() and not page.set_context_button.isVisible()
    assert not page.reload_button.isVisible()

    # Cline needs 32,768: more than SmolLM2 was trained for; the warning says so, no button
    page.select_tool("cline")
    st = _shown(page, qtbot, tool="cline")
    assert not st.check.ok and not st.check.can_raise
    assert "trained for 8,192" in page.warning_label.text()
    assert page.warning_label.isVisible() and not page.set_context_button.isVisible()


def test_a_not_loaded_model_gets_the_context_at_its_next_load(
    page: ConnectPage, imported: str, gui_ctx: GuiContext, qtbot: QtBot
) -> None:
    store = gui_ctx.settings_store
    store.update(load=store.load().load.__class__(context_length=2048))
    page.refresh()
    page.select_tool("zed")  # needs 16,384: more than trained; continue needs 8,192
    page.select_tool("continue")
    st = _shown(page, qtbot, tool="continue", loaded=False)
    assert not st.check.ok and "2,048" in st.check.message
    page.set_context_button.click()
    qtbot.waitUntil(lambda: "loads with 8,192" in page.banner.text(), timeout=SLOW)
    assert not page.reload_button.isVisible()
    qtbot.waitUntil(lambda: page.state is not None and page.state.check.ok, timeout=SLOW)
    assert gui_ctx.loop.call(_preset(gui_ctx, imported), timeout=30)["context_length"] == 8192


async def _preset(gui_ctx: GuiContext, mid: str) -> dict[str, Any]:
    return gui_ctx.service.models.preset(mid)


def _start_server(window: MainWindow, qtbot: QtBot) -> str:
    sp = window.server_page
    sp.port_spin.setValue(0)  # any free port
    sp.start_server()
    qtbot.waitUntil(lambda: sp.url_edit.text() != "", timeout=SLOW)
    return sp.url_edit.text()


def _get(url: str, key: str | None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None


def test_a_required_key_is_created_for_the_app_shown_once_and_works(
    page: ConnectPage, window: MainWindow, imported: str, gui_ctx: GuiContext, qtbot: QtBot
) -> None:
    KeyStore(gui_ctx.paths.keys_file).add("alice", "sk-alice-0123456789abcdef")
    url = _start_server(window, qtbot)
    window.show_page("Library")
    window.show_page(TITLE)  # the keys are read again when the page is shown
    page.select_tool("openai-python")
    st = _shown(page, qtbot, tool="openai-python", key_required=True, running=True)
    assert page.create_key_button.isVisible()
    assert "keeps only hashes" in page.key_label.text()
    assert KEY_PLACEHOLDER in page.snippet_edit.toPlainText()
    assert _get(url + "/models", None)[0] == 401  # the server does want a key

    names: list[str] = []
    page.key_created.connect(names.append)
    page.create_key_button.click()
    qtbot.waitUntil(lambda: bool(names), timeout=SLOW)
    assert names == ["openai-python"]
    qtbot.waitUntil(lambda: KEY_PLACEHOLDER not in page.snippet_edit.toPlainText(), timeout=SLOW)
    st = page.state
    assert st is not None
    secret = st.conn.env["OPENAI_API_KEY"]
    assert secret not in (NO_KEY, KEY_PLACEHOLDER) and secret in page.snippet_edit.toPlainText()
    assert not page.create_key_button.isVisible()
    status, body = _get(st.conn.base_url + "/models", secret)  # one real request, the page's URL
    assert status == 200 and imported in [m["id"] for m in body["data"]]
    assert "openai-python" in KeyStore(gui_ctx.paths.keys_file).all()

    # shown once: another app, then back, and the secret is gone from the page
    page.select_tool("langchain")
    _shown(page, qtbot, tool="langchain")
    page.select_tool("openai-python")
    _shown(page, qtbot, tool="openai-python")
    assert secret not in page.snippet_edit.toPlainText()
    assert KEY_PLACEHOLDER in page.snippet_edit.toPlainText()
    assert page.create_key_button.isVisible()


def test_the_url_follows_the_server_starting_and_stopping(
    page: ConnectPage, window: MainWindow, gui_ctx: GuiContext, qtbot: QtBot
) -> None:
    page.select_tool("langchain")
    st = _shown(page, qtbot, tool="langchain", running=False)
    settings_url = _settings_root(gui_ctx) + "/v1"
    assert page.url_edit.text() == settings_url and st.model is None
    assert page.banner.text() == NO_MODEL_TEXT and NO_MODEL in page.snippet_edit.toPlainText()
    assert "stopped" in page.server_label.text()
    url = _start_server(window, qtbot)
    assert url != settings_url  # port 0 became a real port
    qtbot.waitUntil(lambda: page.url_edit.text() == url, timeout=SLOW)
    assert page.state is not None and page.state.running
    assert url in page.snippet_edit.toPlainText() and "running" in page.server_label.text()
    window.server_page.stop_server()
    qtbot.waitUntil(lambda: page.state is not None and not page.state.running, timeout=SLOW)
    assert page.url_edit.text() == _settings_root(gui_ctx) + "/v1"


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_context_warning_reads_in_either_theme(
    window: MainWindow, qtbot: QtBot, theme: str
) -> None:
    import re

    from PySide6.QtGui import QColor, QPalette

    from app.gui.theme import apply_theme

    apply_theme(theme)
    try:
        label = window.connect_page.warning_label
        found = re.search(r"color:\s*(#[0-9a-fA-F]{6})", label.styleSheet())
        assert found is not None
        background = QGuiApplication.palette().color(QPalette.ColorRole.Window)  # the theme's
        assert contrast(QColor(found.group(1)), background) >= 4.5
    finally:
        apply_theme("light")
