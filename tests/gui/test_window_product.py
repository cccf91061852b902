"""The window as a product: closing and quitting with and without a tray, a minimum
size where no page overlaps itself, the window's place remembered, keyboard use, dark mode,
banners that go away, and the Chat status line."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations

import pytest
from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QKeySequence, QPalette
from PySide6.QtWidgets import QApplication, QLayout, QWidget
from pytestqt.qtbot import QtBot

from app.core.types import ChatMessage
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.instance import SingleInstance
from app.gui.main_window import PAGES, MainWindow
from app.gui.theme import apply_theme
from app.gui.window_state import restored_geometry
from app.settings import Settings, UiSettings, WindowState
from tests.gui.helpers import SLOW, contrast, show_settings


def make_window(qtbot: QtBot, ctx: GuiContext, bridge: Bridge, *, tray: bool) -> MainWindow:
    w = MainWindow(ctx, bridge, tray_available=lambda: tray)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    qtbot.waitUntil(lambda: w.settings_page.settings is not None, timeout=10_000)
    return w


def start_server(w: MainWindow, qtbot: QtBot, ctx: GuiContext) -> None:
    w.server_page.port_spin.setValue(0)
    w.server_page.start_server()
    qtbot.waitUntil(lambda: ctx.server.running and not w.server_page._busy, timeout=30_000)


def activate(w: QWidget, qtbot: QtBot) -> None:
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=5_000)


@pytest.fixture
def no_tray(qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge) -> MainWindow:
    return make_window(qtbot, gui_ctx, bridge, tray=False)


# -- 1. close and quit -----------------------------------------------------------------------------
def test_close_without_a_tray_asks_and_keeps_serving_until_hearth_runs_again(
    no_tray: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    w = no_tray
    start_server(w, qtbot, gui_ctx)
    finished: list[bool] = []
    w.shutdown_finished.connect(lambda: finished.append(True))
    w.close()
    dialog = w.close_dialog
    assert dialog is not None and dialog.isVisible()
    assert w.isVisible()  # nothing happens before the user answers
    labels = {b.text() for b in dialog.buttons()}
    assert {"Keep serving in the background", "Quit"} <= labels
    assert dialog.cancel_button in dialog.buttons()
    assert "run <b>hearth</b> again" in dialog.informativeText()  # how to come back
    assert gui_ctx.server.base_url in dialog.informativeText()

    dialog.remember_check.setChecked(True)
    with qtbot.waitSignal(w.kept_in_background, timeout=5_000):
        dialog.background_button.click()
    assert not w.isVisible() and gui_ctx.server.running and finished == []
    qtbot.waitUntil(lambda: gui_ctx.settings_store.load().ui.close_action == "background")
    assert w.settings_page.close_action_combo.currentData() == "background"  # and shown there

    # a second `hearth` launch (the single-instance socket, wired as in run_gui) brings it back
    first = SingleInstance("hearth-test-window-product")
    assert first.listen()
    first.activation_requested.connect(w.bring_to_front)
    try:
        assert SingleInstance(first.name).activate_running()
        qtbot.waitUntil(w.isVisible, timeout=10_000)
    finally:
        first.close()

    # remembered: the next close does not ask
    w.close()
    assert w.close_dialog is None and not w.isVisible() and gui_ctx.server.running


def test_close_without_a_tray_can_quit_or_be_cancelled(
    no_tray: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    w = no_tray
    start_server(w, qtbot, gui_ctx)
    w.close()
    assert w.close_dialog is not None
    w.close_dialog.cancel_button.click()
    qtbot.waitUntil(lambda: w.close_dialog is None)
    assert w.isVisible() and gui_ctx.server.running
    assert gui_ctx.settings_store.load().ui.close_action == "ask"

    w.close()
    dialog = w.close_dialog
    assert dialog is not None
    dialog.remember_check.setChecked(True)
    with qtbot.waitSignal(w.shutdown_finished, timeout=SLOW):
        dialog.quit_button.click()
    assert not gui_ctx.server.running and not w.isVisible()
    qtbot.waitUntil(lambda: gui_ctx.settings_store.load().ui.close_action == "quit")


def test_close_with_a_remembered_quit_quits_without_asking(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    store = gui_ctx.settings_store
    store.update(ui=UiSettings(close_action="quit"))
    w = make_window(qtbot, gui_ctx, bridge, tray=False)
    start_server(w, qtbot, gui_ctx)
    with qtbot.waitSignal(w.shutdown_finished, timeout=SLOW):
        w.close()
    assert w.close_dialog is None and not gui_ctx.server.running


def test_close_with_a_tray_hides_to_it_without_asking(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    w = make_window(qtbot, gui_ctx, bridge, tray=True)
    start_server(w, qtbot, gui_ctx)
    with qtbot.waitSignal(w.hidden_to_tray, timeout=5_000):
        w.close()
    assert w.close_dialog is None and not w.isVisible() and gui_ctx.server.running


def test_close_set_to_quit_quits_even_with_a_tray(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    """One setting says what closing does: "quit" (the welcome's "Keep running in the tray"
    off) quits with a tray too."""
    gui_ctx.settings_store.update_ui(close_action="quit")
    w = make_window(qtbot, gui_ctx, bridge, tray=True)
    start_server(w, qtbot, gui_ctx)
    with qtbot.waitSignal(w.shutdown_finished, timeout=SLOW):
        w.close()
    assert not gui_ctx.server.running


def test_close_without_a_tray_and_the_server_stopped_quits(
    no_tray: MainWindow, qtbot: QtBot
) -> None:
    with qtbot.waitSignal(no_tray.shutdown_finished, timeout=5_000):
        no_tray.close()
    assert no_tray.close_dialog is None


def test_quit_is_in_the_file_menu_the_tray_and_ctrl_q(
    no_tray: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    w = no_tray
    menu_actions = [a for m in w.menuBar().actions() for a in m.menu().actions()]
    assert w.quit_action in menu_actions
    assert w.quit_action.shortcut() == QKeySequence("Ctrl+Q")  # Cmd+Q on macOS
    assert w.tray.quit_action in w.tray.menu.actions()
    start_server(w, qtbot, gui_ctx)
    w.show_page("Chat")
    activate(w, qtbot)
    w.chat_page.prompt_edit.setFocus()
    with qtbot.waitSignal(w.shutdown_finished, timeout=SLOW):  # from inside the message box
        qtbot.keyClick(w.chat_page.prompt_edit, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    assert not gui_ctx.server.running  # Quit stops the server: no question asked


# -- 2. size and place -----------------------------------------------------------------------------
def _managed(layout: QLayout) -> list[tuple[QWidget, QSize]]:
    """The visible widgets ``layout`` places (through its sub-layouts), each with the least size
    its layout item asks for (the minimum, as the size policy allows)."""
    out: list[tuple[QWidget, QSize]] = []
    for i in range(layout.count()):
        item = layout.itemAt(i)
        if item is None:
            continue
        w = item.widget()
        if w is not None and w.isVisible():
            out.append((w, item.minimumSize()))
        elif item.layout() is not None:
            out += _managed(item.layout())
    return out


def overlaps(root: QWidget) -> list[str]:
    """Pairs of widgets one layout places over each other, widgets placed past their parent's
    edge, and widgets squeezed below their minimum size."""
    problems = []
    for parent in [root, *root.findChildren(QWidget)]:
        if not parent.isVisible() or parent.layout() is None:
            continue
        managed = _managed(parent.layout())
        kids = [k for k, _ in managed]
        for a, b in combinations(kids, 2):
            if a.geometry().intersects(b.geometry()):
                problems.append(f"{_name(a)} over {_name(b)} in {_name(parent)}")
        for k, least in managed:
            if not parent.rect().contains(k.geometry()):
                problems.append(f"{_name(k)} {k.geometry()} past {_name(parent)} {parent.rect()}")
            # squeezed below its minimum: drawn cut off, or (at height 0) not at all. Wrapped
            # text needs the height of its lines at the width it got (its minimum size is
            # for its narrowest width: more lines)
            height = least.height()
            if k.hasHeightForWidth() and k.heightForWidth(k.width()) >= 0:
                height = k.heightForWidth(k.width())
            if k.width() < least.width() or k.height() < height:
                problems.append(f"{_name(k)} squeezed to {k.size()} (needs {least})")
    return problems


def _name(w: QWidget) -> str:
    text = w.text() if hasattr(w, "text") and callable(w.text) else ""
    return f"{type(w).__name__}({text!r})" if text else type(w).__name__


def test_at_the_minimum_size_no_page_draws_widgets_over_each_other(
    window: MainWindow, qtbot: QtBot
) -> None:
    minimum = window.minimumSize()
    # small enough for a 1024x600 netbook or a half-screen tile, big enough to work in
    assert QSize(640, 420).boundedTo(minimum) == QSize(640, 420)
    assert minimum.width() <= 900 and minimum.height() <= 580
    window.resize(minimum)
    qtbot.waitUntil(lambda: window.size() == minimum, timeout=5_000)
    # the window's own parts fit in it: nothing is laid out past its edge and clipped
    assert overlaps(window) == []
    for name, page in zip(PAGES, window.pages, strict=True):
        if name == "Settings":  # its Runtime report, made on first show, grows the page
            show_settings(window, qtbot)
        window.show_page(name)
        # a layout grown by content that just arrived (the Runtime report) settles over a few
        # posted events: wait for it; an overlap that stays still fails here
        try:
            qtbot.waitUntil(lambda page=page: overlaps(page) == [], timeout=5_000)
        except qtbot.TimeoutError:
            pass
        assert overlaps(page) == [], name
    # the Server page's log is still there to read, under the charts
    sp = window.server_page
    window.show_page("Server")
    QApplication.processEvents()
    assert sp.request_table.isVisible() and sp.request_table.height() >= 60


def test_restored_geometry_keeps_a_saved_place_on_a_screen_and_recentres_a_lost_one() -> None:
    screens = [QRect(0, 0, 1920, 1080), QRect(1920, 0, 1280, 1024)]
    minimum = QSize(820, 540)
    assert restored_geometry(WindowState(), screens, minimum) is None  # never saved
    on_second = WindowState(x=2000, y=50, width=1000, height=700)
    assert restored_geometry(on_second, screens, minimum) == QRect(2000, 50, 1000, 700)
    # the second monitor was unplugged: centred on the first, whole
    lost = restored_geometry(on_second, screens[:1], minimum)
    assert lost is not None and screens[0].contains(lost) and lost.size() == QSize(1000, 700)
    # bigger than the screen now: shrunk to it, never below the minimum
    huge = restored_geometry(WindowState(x=0, y=0, width=4000, height=3000), screens, minimum)
    assert huge == QRect(0, 0, 1920, 1080)
    tiny = restored_geometry(WindowState(x=10, y=10, width=100, height=100), screens, minimum)
    assert tiny is not None and tiny.size() == minimum
    # above the top edge (title bar unreachable): brought back
    above = restored_geometry(WindowState(x=100, y=-900, width=800, height=600), screens, minimum)
    assert above is not None and screens[0].contains(above)


def test_size_position_maximized_and_page_are_remembered(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    w = make_window(qtbot, gui_ctx, bridge, tray=False)
    screen = QGuiApplication.primaryScreen().availableGeometry()
    w.resize(860, 560)
    w.move(screen.left() + 13, screen.top() + 17)
    w.show_page("Server")
    qtbot.waitUntil(lambda: w.size() == QSize(860, 560))
    with qtbot.waitSignal(w.shutdown_finished, timeout=5_000):
        w.close()  # server stopped: quits, saving the window's place
    saved = gui_ctx.settings_store.load().ui.window
    assert (saved.width, saved.height, saved.page, saved.maximized) == (860, 560, "Server", False)

    again = MainWindow(gui_ctx, bridge, tray_available=lambda: False)
    qtbot.addWidget(again)
    assert again.current_page == "Server"
    # as saved, but no wider or taller than the screen (the offscreen one is 800x600) and
    # moved only as far as keeps it on the screen
    fit = QSize(min(860, screen.width()), min(560, screen.height())).expandedTo(w.minimumSize())
    assert again.size() == fit
    expected = restored_geometry(saved, [screen], again.minimumSize())
    assert expected is not None and again.pos() == expected.topLeft()
    assert abs(again.pos().x() - saved.x) <= max(0, fit.width() - screen.width())
    assert again.pos().y() == saved.y

    # a place on a monitor that is gone, maximized: back on a screen, maximized
    store = gui_ctx.settings_store
    lost = WindowState(x=9000, y=9000, width=900, height=600, maximized=True, page="Chat")
    store.update(ui=UiSettings(window=lost))
    third = MainWindow(gui_ctx, bridge, tray_available=lambda: False)
    qtbot.addWidget(third)
    assert screen.intersects(QRect(third.pos(), third.size()))
    assert third.windowState() & Qt.WindowState.WindowMaximized
    assert third.current_page == "Chat"

    # maximized, it saves the size it goes back to, and that it was maximized
    third.show()
    qtbot.waitExposed(third)
    normal = third.normalGeometry().size()
    third.quit_app()
    saved = store.load().ui.window
    assert saved.maximized and (saved.width, saved.height) == (normal.width(), normal.height())


def test_bad_ui_settings_are_refused_like_the_others() -> None:
    from app.errors import ConfigError
    from app.settings import settings_from_dict

    s = settings_from_dict(
        {"ui": {"theme": "dark", "close_action": "quit", "window": {"x": -1200, "width": 900}}}
    )
    assert (s.ui.theme, s.ui.close_action, s.ui.window.x, s.ui.window.width) == (
        "dark",
        "quit",
        -1200,
        900,
    )
    assert settings_from_dict(Settings().to_dict()) == Settings()
    for bad in (
        {"theme": "blue"},
        {"close_action": "minimize"},
        {"window": {"x": "left"}},
        {"window": {"width": -5}},
        {"window": []},
    ):
        with pytest.raises(ConfigError):
            settings_from_dict({"ui": bad})


# -- 3. keyboard -----------------------------------------------------------------------------------
def test_tab_leaves_the_message_box_and_enter_still_sends(window: MainWindow, qtbot: QtBot) -> None:
    window.show_page("Chat")
    activate(window, qtbot)
    box = window.chat_page.prompt_edit
    box.setFocus()
    qtbot.keyClicks(box, "Hi")
    qtbot.keyClick(box, Qt.Key.Key_Tab)
    assert box.toPlainText() == "Hi"  # no tab character
    assert not box.hasFocus()
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert box.toPlainText() == "Hi\n"


def test_page_shortcuts_switch_pages_and_are_shown_in_tooltips(
    window: MainWindow, qtbot: QtBot
) -> None:
    activate(window, qtbot)
    for i, name in enumerate(PAGES):
        qtbot.keyClick(window.nav, Qt.Key(Qt.Key.Key_1 + i), Qt.KeyboardModifier.ControlModifier)
        assert window.current_page == name
        assert f"Ctrl+{i + 1}" in window.nav.item(i).toolTip()
    window.show_page("Library")
    window.chat_page.history.append(ChatMessage("user", "hello"))
    window.chat_page.transcript.add_message("old", "user", "an old conversation", header="You")
    qtbot.keyClick(window.nav, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.current_page == "Chat"
    assert window.chat_page.history == [] and window.chat_page.transcript.plain_text() == ""
    qtbot.waitUntil(window.chat_page.prompt_edit.hasFocus, timeout=5_000)


def test_the_sidebar_draws_a_focus_outline(window: MainWindow, qtbot: QtBot) -> None:
    nav = window.nav
    activate(window, qtbot)
    window.show_page("Chat")
    rect = nav.visualItemRect(nav.currentItem())
    edge = (rect.left() + 1, rect.center().y())

    def edge_colour() -> QColor:
        return nav.viewport().grab().toImage().pixelColor(*edge)

    window.chat_page.prompt_edit.setFocus()
    qtbot.waitUntil(lambda: not nav.hasFocus())
    unfocused = edge_colour()
    nav.setFocus()
    qtbot.waitUntil(nav.hasFocus)
    focused = edge_colour()
    text = nav.palette().color(QPalette.ColorRole.Text)
    assert focused != unfocused
    assert abs(focused.lightness() - text.lightness()) < 40  # the outline, in the text colour


# -- 4. dark mode ----------------------------------------------------------------------------------
@pytest.fixture
def dark() -> Iterator[None]:
    apply_theme("dark")
    try:
        yield
    finally:
        apply_theme("system")


def test_dark_theme_banners_memory_bar_and_you_label_follow_the_palette(
    window: MainWindow, qtbot: QtBot, dark: None
) -> None:
    base = QGuiApplication.palette().color(QPalette.ColorRole.Base)
    assert base.lightness() < 80  # the theme took effect app-wide

    banner = window.server_page.banner
    window.show_page("Server")
    banner.show_message("Copied the base URL to the clipboard.")
    QApplication.processEvents()
    img = banner.grab().toImage()
    assert img.pixelColor(img.width() // 2, 3).lightness() < 100  # no light box on dark

    window.show_page("Models in memory")
    window.memory.refresh()
    qtbot.waitUntil(lambda: window.memory.fetched, timeout=10_000)
    window.memory_page._show_memory(window.memory.snapshot)
    bar = window.memory_page.memory_bar
    QApplication.processEvents()
    img = bar.grab().toImage()
    assert img.pixelColor(img.width() - 4, img.height() // 2).lightness() < 100  # the groove

    from app.gui.views.chat.page import role_color

    assert contrast(role_color("user"), base) >= 4.5  # the "You" header is readable
    window.show_page("Server")
    QApplication.processEvents()
    nav = window.nav.viewport()
    assert nav.grab().toImage().pixelColor(4, nav.height() - 4).lightness() < 100  # the sidebar
    apply_theme("light")  # while the banner is on screen
    light_base = QGuiApplication.palette().color(QPalette.ColorRole.Base)
    assert contrast(role_color("user"), light_base) >= 4.5
    QApplication.processEvents()
    img = banner.grab().toImage()
    assert img.pixelColor(img.width() // 2, 3).lightness() > 180  # re-tinted for light
    assert nav.grab().toImage().pixelColor(4, nav.height() - 4).lightness() > 180


def test_the_theme_setting_applies_when_applied_and_is_saved(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    try:
        page.theme_combo.setCurrentIndex(page.theme_combo.findData("dark"))
        with qtbot.waitSignal(page.settings_saved, timeout=10_000):
            page.apply()  # like every setting on the page, it waits for Apply
        assert QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 80
        assert gui_ctx.settings_store.load().ui.theme == "dark"
        page.theme_combo.setCurrentIndex(page.theme_combo.findData("system"))
        combo = page.close_action_combo  # "don't ask again", undone or chosen here
        combo.setCurrentIndex(combo.findData("quit"))
        with qtbot.waitSignal(page.settings_saved, timeout=10_000):
            page.apply()
        assert gui_ctx.settings_store.load().ui.theme == "system"
        assert gui_ctx.settings_store.load().ui.close_action == "quit"
    finally:
        apply_theme("system")
    assert QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() > 128


# -- 5. banners ------------------------------------------------------------------------------------
def test_info_banners_go_away_and_errors_stay_until_closed(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    start_server(window, qtbot, gui_ctx)
    window.show_page("Server")
    info = window.server_page.banner
    error = window.settings_page.banner
    info.auto_hide_ms = error.auto_hide_ms = 50
    error.show_message("Something failed.", "error")
    window.server_page.copy_url()  # "Copied the base URL": started after the error's
    assert info.isVisible() and "Copied" in info.text()
    qtbot.waitUntil(lambda: not info.isVisible(), timeout=10_000)
    assert info.text() == ""
    assert error.text() == "Something failed." and not error.isHidden()  # its timer would be due
    error.close_button.click()
    assert error.isHidden() and error.kind == ""


# -- 3 and 6, on a real model: Esc stops; "Loading…" and "Thinking…" only when true ---------------
@pytest.mark.model
def test_esc_stops_the_answer_and_the_status_says_what_is_happening(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    page = window.chat_page
    window.show_page("Chat")
    qtbot.waitUntil(lambda: page.current_model_id() == imported, timeout=10_000)
    page.max_tokens_spin.setValue(0)
    page.temperature_spin.setValue(0.0)
    statuses: list[str] = []  # the status line at each chunk
    page.chunk_received.connect(lambda _t: statuses.append(page.stats_label.text()))
    activate(window, qtbot)
    page.send("Write a very long story about a dragon who learns to bake bread.")
    sent_status = page.stats_label.text()
    qtbot.waitUntil(lambda: len(statuses) >= 3, timeout=SLOW)
    page.prompt_edit.setFocus()
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.keyClick(page.prompt_edit, Qt.Key.Key_Escape)
    assert done.args[0] == "cancelled"
    assert "Thinking" not in sent_status  # this model does not reason
    assert statuses and all("Loading" not in s and "Thinking" not in s for s in statuses)
    assert "stopped" in page.stats_label.text()
