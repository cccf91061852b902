"""The Discover page against the fake Hub: search, a repo's quantizations with sizes and fit
verdicts, its model card, Download into the queue, jumping to a pasted URL, and the inline
message (with a link) for a gated repo without a token."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.gui.main_window import MainWindow
from app.gui.models.hub import COLUMNS
from app.gui.views.discover import DiscoverPage
from tests.fakehub import FakeHub
from tests.gui.conftest import GATED_REPO, HUB_FILE, HUB_REPO

TIMEOUT = 20_000


def option_rows(page: DiscoverPage) -> dict[str, tuple[str, str, list[str]]]:
    """Quantization -> (size, fit, files) as the tree shows them."""
    out = {}
    for i in range(page.options.topLevelItemCount()):
        item = page.options.topLevelItem(i)
        files = [item.child(j).text(0) for j in range(item.childCount())]
        out[item.text(0)] = (item.text(1), item.text(2), files)
    return out


def test_search_lists_results_and_selecting_one_shows_quantizations_fits_and_card(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot
) -> None:
    page = hub_window.discover_page
    hub_window.show_page("Discover")
    qtbot.keyClicks(page.search_edit, "tiny")
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        qtbot.keyClick(page.search_edit, Qt.Key.Key_Return)
    assert page.results_model.ids() == [HUB_REPO]
    m = page.results_model
    row = {COLUMNS[c]: m.index(0, c).data() for c in range(len(COLUMNS))}
    assert row["Author"] == "acme" and row["Downloads"] == "1,234" and row["Likes"] == "56"
    assert row["License"] == "mit" and row["Access"] == ""

    with qtbot.waitSignal(page.card_shown, timeout=TIMEOUT):
        page.results.selectRow(0)
    opts = option_rows(page)
    assert set(opts) == {"Q4_K_M", "Q8_0"}
    size, fit, files = opts["Q4_K_M"]
    assert files == [HUB_FILE]
    assert size.endswith("KiB") or size.endswith("MiB")
    assert fit == "Fits RAM"  # the fake machine: 32 GiB RAM free, no GPU
    assert "tiny test model card" in page.card.toPlainText()
    assert page.selected_option() is not None and page.download_button.isEnabled()


def test_sorting_by_likes_asks_the_hub_for_likes(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot
) -> None:
    page = hub_window.discover_page
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        qtbot.mouseClick(page.search_button, Qt.MouseButton.LeftButton)
    assert set(page.results_model.ids()) == {HUB_REPO, GATED_REPO}
    assert page.results_model.ids()[0] == HUB_REPO  # most downloads first
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.sort_combo.setCurrentIndex(page.sort_combo.findData("likes"))
    assert page.sort == "likes"
    assert page.results_model.ids() == [GATED_REPO, HUB_REPO]  # 100 likes before 56
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.sort_combo.setCurrentIndex(page.sort_combo.findData("recent"))
    assert page.results_model.ids() == [GATED_REPO, HUB_REPO]  # updated in 2026
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.sort_combo.setCurrentIndex(page.sort_combo.findData("downloads"))
    assert page.results_model.ids() == [HUB_REPO, GATED_REPO]
    gated_row = page.results_model.row_of(GATED_REPO)
    access = page.results_model.index(gated_row, COLUMNS.index("Access")).data()
    assert access == "Gated"


def test_download_button_queues_the_selected_quantization_and_it_completes(
    hub_window: MainWindow, qtbot: QtBot
) -> None:
    page = hub_window.discover_page
    page.open_edit.setText(f"{hub_window.discover_page.hub.endpoint}/{HUB_REPO}")  # type: ignore[union-attr]
    with qtbot.waitSignal(page.repo_shown, timeout=TIMEOUT):
        qtbot.mouseClick(page.open_button, Qt.MouseButton.LeftButton)
    assert page.repo is not None and page.repo.id == HUB_REPO
    assert page.select_option("Q8_0")
    with qtbot.waitSignal(page.download_queued, timeout=TIMEOUT) as queued:
        qtbot.mouseClick(page.download_button, Qt.MouseButton.LeftButton)
    did = queued.args[0]
    downloads = hub_window.downloads_page.table_model
    qtbot.waitUntil(lambda: downloads.state_of(did) == "completed", timeout=TIMEOUT)
    assert downloads.status(downloads.row_of(did)).option == "Q8_0"
    lib = hub_window.library_page.table_model
    qtbot.waitUntil(lambda: lib.rowCount() == 1, timeout=TIMEOUT)
    assert lib.status(0).model.quantization == "Q8_0"


def test_a_pasted_ref_with_a_quantization_selects_it(hub_window: MainWindow, qtbot: QtBot) -> None:
    page = hub_window.discover_page
    with qtbot.waitSignal(page.repo_shown, timeout=TIMEOUT):
        page.open_repo(f"{HUB_REPO}:q8_0")
    opt = page.selected_option()
    assert opt is not None and opt.name == "Q8_0"


def test_a_bad_reference_is_shown_inline(hub_window: MainWindow) -> None:
    page = hub_window.discover_page
    page.open_repo("not a repo")
    assert not page.banner.isHidden() and page.banner.kind == "error"


def test_a_gated_repo_without_a_token_says_so_with_a_link(
    hub_window: MainWindow, qtbot: QtBot
) -> None:
    page = hub_window.discover_page
    with qtbot.waitSignal(page.repo_shown, timeout=TIMEOUT):
        page.open_repo(GATED_REPO)
    assert "Gated" in page.repo_title.text()
    if page.banner.kind != "error":  # the listing worked; the download is what is refused
        assert page.select_option("Q4_K_M")
        qtbot.mouseClick(page.download_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: page.banner.kind == "error", timeout=TIMEOUT)
    text = page.banner.text()
    assert "<a href=" in text and GATED_REPO in text
    assert hub_window.downloads_page.table_model.rowCount() == 0


def test_without_the_hub_the_page_says_so(window: MainWindow) -> None:
    page = window.discover_page
    assert page.hub is None
    assert not page.search_button.isEnabled()
    page.search("anything")  # harmless
    assert page.results_model.rowCount() == 0
