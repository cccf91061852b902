"""Discover with the Hub out of reach: a busy indicator while searching, "You're
offline" / "Can't reach the Hub at HOST" within seconds (never a raw errno), and the featured
models of the last listing that came back, marked as cached."""

from __future__ import annotations

import html
import socket
import time

import pytest
from pytestqt.qtbot import QtBot

from app.compose import hub_client
from app.core.hub.downloads import DownloadManager
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.views.discover import DiscoverPage
from tests.gui.conftest import GATED_REPO, HUB_REPO
from tests.support.fakehub import FakeHub

DEADLINE_MS = 15_000  # generous; before this change the message took ~23 s here


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def discover(qtbot: QtBot, ctx: GuiContext, bridge: Bridge) -> DiscoverPage:
    """A window whose Hub client is the app's own (``compose.hub_client``: HF_ENDPOINT, the
    listing cache under the data folder)."""
    ctx.service.hub = DownloadManager(
        ctx.service.models._library,
        hub_client(ctx.paths, ctx.settings_store.load()),
        ctx.service.events,
    )
    w = MainWindow(ctx, bridge)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.show_page("Discover")
    page = w.discover_page
    # the MLX check imports mlx on a worker thread: let it finish before the test can end
    qtbot.waitUntil(lambda: page.formats_known, timeout=DEADLINE_MS)
    return page


def search_timed(qtbot: QtBot, page: DiscoverPage, query: str = "") -> float:
    t0 = time.monotonic()
    with qtbot.waitSignal(page.searched, timeout=DEADLINE_MS):
        page.search(query)
        # the answer arrives through the Qt event loop, so the indicator is up until then
        assert page.busy.isVisible() and page.busy_label.isVisible()
    assert not page.busy.isVisible()
    return time.monotonic() - t0


OFFLINE = [
    ("closed loopback port", lambda: f"http://127.0.0.1:{closed_port()}", "Can't reach the Hub"),
    ("unresolvable host", lambda: "http://hearth-offline.invalid", "You're offline"),
]


@pytest.mark.parametrize(("case", "endpoint", "said"), OFFLINE, ids=[c[0] for c in OFFLINE])
def test_offline_search_says_so_quickly(
    case: str,
    endpoint: object,
    said: str,
    qtbot: QtBot,
    gui_ctx: GuiContext,
    bridge: Bridge,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint())  # type: ignore[operator]
    page = discover(qtbot, gui_ctx, bridge)
    for query in ("", "qwen"):  # the featured models (nothing kept yet) and a search
        search_timed(qtbot, page, query)
        text = html.unescape(page.banner.text())  # as the rich-text banner shows it
        assert page.banner.kind == "error" and said in text, text
        assert "Errno" not in text and "[" not in text
        assert page.results_model.rowCount() == 0 and not page.showing_cached


def test_featured_models_from_an_earlier_listing_show_offline_marked_cached(
    qtbot: QtBot,
    gui_ctx: GuiContext,
    bridge: Bridge,
    hub: FakeHub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page = discover(qtbot, gui_ctx, bridge)  # HF_ENDPOINT: the fake Hub (online)
    search_timed(qtbot, page)
    assert page.results_model.ids() == [HUB_REPO, GATED_REPO] and not page.showing_cached
    assert page.banner.text() == ""
    qtbot.waitUntil(lambda: page.size_text(HUB_REPO) not in ("", "—"), timeout=DEADLINE_MS)
    size = page.size_text(HUB_REPO)  # read after the listing: kept with it

    # later, offline: a new session of the app (a new client) over the same data folder
    monkeypatch.setenv("HF_ENDPOINT", "http://hearth-offline.invalid")
    gui_ctx.service.hub = DownloadManager(
        gui_ctx.service.models._library,
        hub_client(gui_ctx.paths, gui_ctx.settings_store.load()),
        gui_ctx.service.events,
    )
    page.results_model.set_results([])
    search_timed(qtbot, page)
    assert page.results_model.ids() == [HUB_REPO, GATED_REPO]
    assert page.showing_cached and page.size_text(HUB_REPO) == size
    text = html.unescape(page.banner.text())  # as the rich-text banner shows it
    assert "You're offline" in text and "(cached)" in text and "featured models as of" in text
    assert page.banner.kind == "info"

    # a search for something else is not answered from the featured list
    search_timed(qtbot, page, "tiny")
    assert "You're offline" in html.unescape(page.banner.text()) and page.banner.kind == "error"
