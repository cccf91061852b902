"""The Discover page against the fake Hub: search, each result's size range, a repo's
quantizations with sizes and fit verdicts, its model card, Download into the queue, jumping to a
pasted URL, the GGUF/MLX format choice (MLX only where it runs) with an MLX repo as one folder,
and the inline message (with a link) for a gated repo without a token."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.types import Runtime
from app.gui.main_window import MainWindow
from app.gui.models.hub import COLUMNS
from app.gui.units import human_byte_range, human_bytes
from app.gui.views.discover import DiscoverPage
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.gui.conftest import GATED_REPO, HUB_FILE, HUB_REPO, MLX_REPO
from tests.support.fakehub import FakeHub, gguf_bytes

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


def test_each_result_shows_its_size_range_once_the_repos_files_are_read(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot, tmp_path: Path
) -> None:
    build = tmp_path / "range-build"
    small = gguf_bytes(build, elems=1000)
    shards = [gguf_bytes(build, file_type=7, elems=40_000), b"\0" * 300_000]
    hub.add_repo(
        "acme/range-GGUF",
        {
            "range-Q4_K_M.gguf": small,
            "Q8_0/range-Q8_0-00001-of-00002.gguf": shards[0],
            "Q8_0/range-Q8_0-00002-of-00002.gguf": shards[1],
            "mmproj-range-f16.gguf": b"\0" * 900_000,  # a projector: fetched with each option
        },
        tags=["gguf"],
        downloads=3,
    )
    page = hub_window.discover_page
    assert COLUMNS.index("Size") == COLUMNS.index("Author") + 1
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.search("range")
    assert page.results_model.ids() == ["acme/range-GGUF"]
    proj = 900_000  # shards: their sum; each option with the projector it comes with
    want = human_byte_range(len(small) + proj, len(shards[0]) + len(shards[1]) + proj)
    assert "–" in want
    qtbot.waitUntil(lambda: page.size_text("acme/range-GGUF") == want, timeout=TIMEOUT)
    # the search answer had no sizes (as on the real Hub): each repo's file list gave them
    assert any(s.path == "/api/models/acme/range-GGUF" for s in hub.seen)

    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.search("tiny")
    tiny = hub.repos[HUB_REPO].files
    sizes = sorted(len(tiny[n].data) for n in (HUB_FILE, "tiny-Q8_0.gguf"))
    qtbot.waitUntil(lambda: page.size_text(HUB_REPO) == human_byte_range(*sizes), timeout=TIMEOUT)


def test_a_result_whose_files_could_not_be_read_shows_a_dash_until_selected(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot
) -> None:
    page = hub_window.discover_page
    hub.repos[HUB_REPO].gone = True  # listed, but its file list cannot be read
    with qtbot.waitSignals(
        [page.searched, page.size_shown],
        check_params_cbs=[None, lambda repo_id: repo_id == HUB_REPO],
        timeout=TIMEOUT,
    ):
        page.search("tiny")
    assert page.results_model.ids() == [HUB_REPO]
    assert page.size_text(HUB_REPO) == "—"
    hub.repos[HUB_REPO].gone = False  # back: selecting the row reads its files again
    with qtbot.waitSignal(page.repo_shown, timeout=TIMEOUT):
        page.results.selectRow(0)
    tiny = hub.repos[HUB_REPO].files
    sizes = sorted(len(tiny[n].data) for n in (HUB_FILE, "tiny-Q8_0.gguf"))
    assert page.size_text(HUB_REPO) == human_byte_range(*sizes)


def test_mlx_is_a_format_choice_here_and_an_mlx_repo_downloads_as_one_folder(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot
) -> None:
    page = hub_window.discover_page
    qtbot.waitUntil(lambda: page.formats_known, timeout=TIMEOUT)
    # mlx[cpu] is installed on this machine; the speech runtime is always there
    assert page.formats() == ["gguf", "mlx", "whisper"]
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.search("tiny")
    assert MLX_REPO not in page.results_model.ids()  # GGUF first
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.format_combo.setCurrentIndex(page.format_combo.findData("mlx"))
    assert page.format == "mlx" and "MLX" in page.search_edit.placeholderText()
    assert page.results_model.ids() == [MLX_REPO]
    files = {n: f for n, f in hub.repos[MLX_REPO].files.items() if n != "README.md"}
    total = sum(len(f.data) for f in files.values())
    qtbot.waitUntil(lambda: page.size_text(MLX_REPO) == human_bytes(total), timeout=TIMEOUT)

    with qtbot.waitSignal(page.repo_shown, timeout=TIMEOUT):
        page.results.selectRow(0)
    opts = option_rows(page)
    assert list(opts) == ["tiny-4bit/ (MLX folder, 4bit)"]  # one folder entry
    size, fit, listed = opts["tiny-4bit/ (MLX folder, 4bit)"]
    assert size == human_bytes(total) and fit == "Fits RAM"
    assert sorted(listed) == sorted(files)
    assert page.options.headerItem().text(0) == "Folder"
    assert page.selected_option() is not None and page.download_button.isEnabled()

    with qtbot.waitSignal(page.download_queued, timeout=TIMEOUT) as queued:
        qtbot.mouseClick(page.download_button, Qt.MouseButton.LeftButton)
    did = queued.args[0]
    downloads = hub_window.downloads_page.table_model
    qtbot.waitUntil(lambda: downloads.state_of(did) == "completed", timeout=TIMEOUT)
    lib = hub_window.library_page.table_model
    qtbot.waitUntil(lambda: lib.rowCount() == 1, timeout=TIMEOUT)
    model = lib.status(0).model
    folder = Path(model.path)
    assert model.format == "mlx" and folder.is_dir()
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)


def test_whisper_is_a_format_choice_and_its_repo_shows_one_speech_to_text_folder(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot
) -> None:
    files = {
        "config.json": b'{"lang_ids": [1, 2]}',
        "model.bin": b"\x01" * 50_000,
        "vocabulary.txt": b"a\n",
        "README.md": b"# whisper\n",
    }
    tags = ["ctranslate2", "automatic-speech-recognition"]
    hub.add_repo("Systran/faster-whisper-tiny", files, tags=tags, library_name="ctranslate2")
    page = hub_window.discover_page
    qtbot.waitUntil(lambda: page.formats_known, timeout=TIMEOUT)
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.search("whisper")
    assert page.results_model.ids() == []  # GGUF first
    page.format_combo.setCurrentIndex(page.format_combo.findData("whisper"))
    assert "Whisper" in page.search_edit.placeholderText()
    with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
        page.search("whisper")
    assert page.results_model.ids() == ["Systran/faster-whisper-tiny"]
    with qtbot.waitSignal(page.repo_shown, timeout=TIMEOUT):
        page.results.selectRow(0)
    label = "faster-whisper-tiny/ (Whisper folder, speech to text)"
    opts = option_rows(page)
    assert list(opts) == [label]
    size, fit, listed = opts[label]
    assert sorted(listed) == ["config.json", "model.bin", "vocabulary.txt"]  # no README
    assert fit == "Fits RAM" and page.options.headerItem().text(0) == "Folder"
    assert page.options.topLevelItem(0).text(3) == "speech to text"
    assert page.download_button.isEnabled()


class TestWithoutMlx:
    """A machine whose Hearth has no MLX runtime: GGUF is the only choice."""

    @pytest.fixture
    def gui_runtimes(self, probe_file: Path) -> dict[str, Runtime]:
        return {"gguf": LlamaCppRuntime(probe_file=probe_file)}

    def test_only_gguf_is_offered(self, hub_window: MainWindow, hub: FakeHub, qtbot: QtBot) -> None:
        page = hub_window.discover_page
        qtbot.waitUntil(lambda: page.formats_known, timeout=TIMEOUT)
        assert page.formats() == ["gguf"] and page.format == "gguf"
        with qtbot.waitSignal(page.searched, timeout=TIMEOUT):
            page.search("")
        assert MLX_REPO not in page.results_model.ids()


def test_an_option_with_a_projector_shows_vision_and_its_combined_size_and_fit(
    hub_window: MainWindow, hub: FakeHub, qtbot: QtBot, tmp_path: Path
) -> None:
    from tests.support.vision_gguf import write_projector

    build = tmp_path / "vision-build"
    model = gguf_bytes(build, elems=20_000)  # embedding size 64
    proj = write_projector(build / "p.gguf", projection_dim=64).read_bytes()
    files = {"see-Q4_K_M.gguf": model, "mmproj-see-F16.gguf": proj}
    hub.add_repo("acme/see-GGUF", files, tags=["gguf"])
    hub.add_repo("acme/blind-GGUF", {"see-Q4_K_M.gguf": model}, tags=["gguf"])
    page = hub_window.discover_page
    shown = {}
    for repo in ("acme/blind-GGUF", "acme/see-GGUF"):  # the tree shows one repo at a time
        with qtbot.waitSignal(page.repo_shown, timeout=TIMEOUT):
            page.show_repo(repo)
        item = page.options.topLevelItem(0)
        assert item is not None
        kids = [item.child(j) for j in range(item.childCount())]
        shown[repo] = (
            [item.text(c) for c in range(4)],
            [(k.text(0), k.text(3)) for k in kids],
            page.selected_option(),
        )
    assert page.options.headerItem().text(3) == "Input"
    (name, size, fit, badge), files, opt = shown["acme/see-GGUF"]
    blind_row, blind_files, blind = shown["acme/blind-GGUF"]
    assert badge == "vision" and blind_row[3] == ""
    assert size == human_bytes(len(model) + len(proj))  # the combined size
    assert files == [("see-Q4_K_M.gguf", ""), ("mmproj-see-F16.gguf", "vision projector")]
    assert blind_files == [("see-Q4_K_M.gguf", "")]
    # the fit counts the projector's weights (its header, read remotely) on top of the model's
    assert opt is not None and blind is not None and opt.estimate and blind.estimate
    assert opt.estimate.weights - blind.estimate.weights > len(proj) // 2
    assert fit == "Fits RAM" and name == "Q4_K_M"
