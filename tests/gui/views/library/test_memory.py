"""Loading through the Load dialog (options, live estimate, presets, budget refusal and "Load
anyway"), the Models in memory page (memory bar, unload, pin, keep-alive countdown), the status
bar and the tray's list of loaded models — all on the real SmolLM2 through the real scheduler."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QSpinBox
from pytestqt.qtbot import QtBot

from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.models.library import COLUMNS as LIBRARY_COLUMNS
from app.gui.models.memory import COLUMNS
from app.gui.units import human_bytes
from app.gui.views.library.load_dialog import LoadDialog
from app.gui.views.library.memory import TITLE
from app.gui.window_state import MINIMUM_SIZE
from app.settings import Settings
from tests.gui.helpers import SLOW

pytestmark = pytest.mark.model

MIB = 1024 * 1024


def open_dialog(window: MainWindow, qtbot: QtBot, model_id: str) -> LoadDialog:
    """Select the model and click the Library's Load… button; wait for the filled-in form."""
    page = window.library_page
    qtbot.waitUntil(lambda: page.table_model.state_of(model_id) == "not-loaded", timeout=10_000)
    page.select(model_id)
    assert page.load_button.isEnabled()
    qtbot.mouseClick(page.load_button, Qt.MouseButton.LeftButton)
    dialog = page.load_dialog
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: dialog.load_button.isEnabled(), timeout=10_000)
    qtbot.waitUntil(lambda: dialog.estimate is not None, timeout=10_000)
    return dialog


def wait_estimate(qtbot: QtBot, dialog: LoadDialog, **expected: object) -> dict[str, object]:
    """Wait until the shown estimate has these values (it follows edits after a debounce)."""

    def shown() -> bool:
        est = dialog.estimate
        return est is not None and all(est[k] == v for k, v in expected.items())

    qtbot.waitUntil(shown, timeout=10_000)
    assert dialog.estimate is not None
    return dialog.estimate


def click_load(qtbot: QtBot, dialog: LoadDialog, gui_ctx: GuiContext, model_id: str) -> None:
    with qtbot.waitSignal(dialog.load_finished, timeout=SLOW):
        qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    assert gui_ctx.service.models._scheduler.state(model_id) == "loaded"


def memory_row(window: MainWindow, qtbot: QtBot, model_id: str) -> None:
    page = window.memory_page
    qtbot.waitUntil(lambda: page.table_model.row_of(model_id) >= 0, timeout=10_000)


def test_load_dialog_loads_with_the_chosen_context(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    dialog = open_dialog(window, qtbot, imported)
    assert dialog.windowTitle() == f"Load {imported}"
    assert dialog.context_spin.value() == 2048  # the defaults (no preset yet)
    assert dialog.fit_label.text().startswith("✓ Fits")
    assert dialog.options_form.isRowVisible(dialog.kv_combo)  # a GGUF shows llama.cpp options
    dialog.context_spin.setValue(1024)
    wait_estimate(qtbot, dialog, context_length=1024)
    click_load(qtbot, dialog, gui_ctx, imported)
    qtbot.waitUntil(lambda: window.library_page.load_dialog is None, timeout=5_000)  # closed

    info = gui_ctx.service.models.loaded()[0]
    assert (info.context_length, info.ttl, info.pinned) == (1024, None, False)
    window.show_page(TITLE)
    memory_row(window, qtbot, imported)
    page = window.memory_page
    assert page.content.currentWidget() is page.table and page.table.isVisible()
    assert page.cell(imported, "Context") == "1,024"
    assert page.cell(imported, "Runtime") == "llama.cpp"
    assert page.cell(imported, "Memory") == human_bytes(info.memory_bytes)
    assert info.memory_bytes > 10 * MIB
    assert page.cell(imported, "Keep-alive") == "Never"
    assert re.fullmatch(
        r"[\d.]+ [KMG]iB of [\d.]+ GiB budget in use \(\d+%\)", page.memory_label.text()
    )
    assert page.memory_bar.value() > 0
    assert window.library_page.banner.text() == f"Loaded {imported} with a 1,024-token context."
    qtbot.waitUntil(lambda: window.library_page.table_model.state_of(imported) == "loaded")
    assert window.memory_status.text().startswith("<a href='memory'>1 model in memory</a>")


def test_estimate_follows_the_options(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    dialog = open_dialog(window, qtbot, imported)
    small = wait_estimate(qtbot, dialog, context_length=2048)
    small_kv_text = dialog.kv_label.text()
    assert small_kv_text == f"{human_bytes(int(small['kv_cache']))}  (2,048 tokens, f16)"
    assert dialog.weights_label.text() == human_bytes(int(small["weights"]))
    # the default shared "reuse" cache keeps idle conversations' caches in RAM, up to its size
    assert int(small["prompt_ram"]) == int(small["kv_cache"]) > 0
    assert dialog.idle_label.text().startswith(f"up to {human_bytes(int(small['kv_cache']))}")
    assert dialog.total_label.text().startswith(human_bytes(int(small["calibrated_total"])))

    dialog.context_spin.setValue(8192)
    big = wait_estimate(qtbot, dialog, context_length=8192)
    assert int(big["kv_cache"]) > int(small["kv_cache"])
    assert dialog.kv_label.text() != small_kv_text
    assert "(8,192 tokens, f16)" in dialog.kv_label.text()

    dialog.kv_combo.setCurrentIndex(dialog.kv_combo.findData("q8_0"))
    qtbot.waitUntil(lambda: "q8_0)" in dialog.kv_label.text(), timeout=10_000)
    q8 = wait_estimate(qtbot, dialog, context_length=8192)
    assert int(q8["kv_cache"]) < int(big["kv_cache"])  # about half: 8-bit instead of 16
    assert dialog.kv_label.text() == f"{human_bytes(int(q8['kv_cache']))}  (8,192 tokens, q8_0)"

    # with the exact prompt cache, one cache stream per parallel request: four times the KV
    dialog.prompt_cache_combo.setCurrentIndex(dialog.prompt_cache_combo.findData("exact"))
    dialog.parallel_spin.setValue(4)
    qtbot.waitUntil(lambda: "4 × 8,192 tokens" in dialog.kv_label.text(), timeout=10_000)
    par = wait_estimate(qtbot, dialog, context_length=8192)
    assert int(par["kv_cache"]) == 4 * int(q8["kv_cache"])
    assert int(par["prompt_ram"]) == 0 and dialog.idle_label.text() == "none"  # streams of its own
    # the default (reuse) shares one cache among them: one context's KV cache again
    dialog.prompt_cache_combo.setCurrentIndex(dialog.prompt_cache_combo.findData("reuse"))
    qtbot.waitUntil(lambda: "×" not in dialog.kv_label.text(), timeout=10_000)
    assert int(wait_estimate(qtbot, dialog, context_length=8192)["kv_cache"]) == int(q8["kv_cache"])
    # the per-sequence layout gives each request its own cache too, with the reuse cache
    dialog.option_form.editors["kv_layout"].setCurrentIndex(
        dialog.option_form.editors["kv_layout"].findData("per-sequence")
    )
    qtbot.waitUntil(lambda: "4 × 8,192 tokens" in dialog.kv_label.text(), timeout=10_000)
    assert int(wait_estimate(qtbot, dialog, context_length=8192)["kv_cache"]) == int(
        par["kv_cache"]
    )
    assert dialog.options()["kv_layout"] == "per-sequence"
    assert dialog.options()["parallel"] == 4
    dialog.reject()
    assert gui_ctx.service.models.loaded() == []  # Cancel loads nothing


def test_a_load_over_the_budget_is_refused_with_the_numbers_then_loads_anyway(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    s = Settings()
    gui_ctx.settings_store.save(replace(s, load=replace(s.load, memory_budget_bytes=16 * MIB)))
    dialog = open_dialog(window, qtbot, imported)
    qtbot.waitUntil(lambda: dialog.estimate["budget"] == 16 * MIB, timeout=10_000)  # type: ignore[index]
    assert dialog.fit_label.text().startswith("✗ Does not fit")
    assert "16.0 MiB budget" in dialog.fit_label.text()
    assert not dialog.load_anyway_button.isVisible()

    with qtbot.waitSignal(dialog.load_refused, timeout=SLOW) as refused:
        qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    needed, available = refused.args
    assert needed > 16 * MIB and available == 16 * MIB
    text = dialog.banner.text()
    assert f"needs about {human_bytes(needed)}" in text
    assert f"only {human_bytes(available)} of the memory budget" in text
    assert dialog.banner.kind == "error" and dialog.isVisible()
    assert dialog.load_anyway_button.isVisible() and dialog.load_anyway_button.isEnabled()
    assert gui_ctx.service.models.loaded() == []

    with qtbot.waitSignal(dialog.load_finished, timeout=SLOW):
        qtbot.mouseClick(dialog.load_anyway_button, Qt.MouseButton.LeftButton)
    assert [m.model_id for m in gui_ctx.service.models.loaded()] == [imported]
    window.show_page(TITLE)
    memory_row(window, qtbot, imported)
    page = window.memory_page
    assert "of 16.0 MiB budget in use" in page.memory_label.text()
    assert page.memory_bar.value() == page.memory_bar.maximum()  # over the budget: full, red
    assert "#b3261e" in page.memory_label.styleSheet()


def test_unload_and_pin_buttons(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    window.library_page.load_model(imported)  # the quick path: preset/defaults, no dialog
    window.show_page(TITLE)
    memory_row(window, qtbot, imported)
    page = window.memory_page
    assert page.selected_id() == imported  # the only row is selected: the buttons work at once
    assert page.pin_button.text() == "Pin" and page.unload_button.isEnabled()

    qtbot.mouseClick(page.pin_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.cell(imported, "Keep-alive") == "Pinned", timeout=10_000)
    assert gui_ctx.service.models.loaded()[0].pinned is True
    assert page.pin_button.text() == "Unpin"

    qtbot.mouseClick(page.pin_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.cell(imported, "Keep-alive") == "Never", timeout=10_000)
    assert gui_ctx.service.models.loaded()[0].pinned is False
    assert page.pin_button.text() == "Pin"

    qtbot.mouseClick(page.unload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 0, timeout=SLOW)
    assert gui_ctx.service.models.loaded() == []
    assert page.empty_label.isVisible() and not page.table.isVisible()
    assert not page.unload_button.isEnabled() and not page.pin_button.isEnabled()
    assert page.memory_label.text().startswith("0 B of ")
    qtbot.waitUntil(lambda: window.library_page.table_model.state_of(imported) == "not-loaded")


def test_keep_alive_counts_down_and_unloads(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    dialog = open_dialog(window, qtbot, imported)
    assert not dialog.ttl_check.isChecked()  # explicit loads stay by default
    dialog.ttl_check.setChecked(True)
    dialog.ttl_spin.setValue(5)
    click_load(qtbot, dialog, gui_ctx, imported)
    assert gui_ctx.service.models.loaded()[0].ttl == 300

    window.show_page(TITLE)
    memory_row(window, qtbot, imported)
    page = window.memory_page
    first = page.cell(imported, "Keep-alive")
    assert re.fullmatch(r"Unloads in (4:[45]\d|5:00)", first), first
    # the 1 s timer repaints just the countdown column, from the cached snapshot
    ticks: list[tuple[int, int]] = []
    page.table_model.dataChanged.connect(
        lambda tl, br, *_: ticks.append((tl.column(), br.column()))
    )
    column = COLUMNS.index("Keep-alive")
    qtbot.waitUntil(lambda: (column, column) in ticks, timeout=2_500)
    qtbot.waitUntil(lambda: page.cell(imported, "Keep-alive") != first, timeout=5_000)
    assert re.fullmatch(r"Unloads in 4:[45]\d", page.cell(imported, "Keep-alive"))

    # the "Unload after" menu changes it for this load
    never = next(a for a in page.keep_alive_actions if a.data() is None)
    never.trigger()
    qtbot.waitUntil(lambda: page.cell(imported, "Keep-alive") == "Never", timeout=10_000)
    assert gui_ctx.service.models.loaded()[0].ttl is None

    # a short keep-alive really unloads it, and the page follows
    page.set_keep_alive(imported, 1.5)
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 0, timeout=15_000)
    assert gui_ctx.service.models.loaded() == []


def test_pinned_load_and_preset_from_the_dialog(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    presets = gui_ctx.service.models._presets
    assert presets is not None
    dialog = open_dialog(window, qtbot, imported)
    assert dialog.preset_check.text() == "Save as preset for this model"
    dialog.context_spin.setValue(1024)
    dialog.ttl_check.setChecked(True)
    dialog.ttl_spin.setValue(10)
    dialog.preset_check.setChecked(True)
    click_load(qtbot, dialog, gui_ctx, imported)
    # only what the user changed: untouched options keep following the global defaults
    assert presets.get(imported) == {"context_length": 1024, "ttl": 600.0}
    info = gui_ctx.service.models.loaded()[0]
    assert (info.context_length, info.ttl) == (1024, 600.0)

    window.memory_page.unload_model(imported)
    qtbot.waitUntil(lambda: gui_ctx.service.models.loaded() == [], timeout=SLOW)
    dialog = open_dialog(window, qtbot, imported)  # the preset fills the form
    assert dialog.context_spin.value() == 1024
    assert dialog.ttl_check.isChecked() and dialog.ttl_spin.value() == 10
    assert dialog.preset_check.text() == "Update this model's preset"
    dialog.pin_check.setChecked(True)
    assert not dialog.ttl_check.isEnabled()  # pinned: no idle unload to choose
    click_load(qtbot, dialog, gui_ctx, imported)  # preset box unchecked: the preset stays
    assert presets.get(imported) == {"context_length": 1024, "ttl": 600.0}
    assert gui_ctx.service.models.loaded()[0].pinned is True
    window.show_page(TITLE)
    memory_row(window, qtbot, imported)
    qtbot.waitUntil(lambda: window.memory_page.cell(imported, "Keep-alive") == "Pinned")


def test_tray_menu_lists_loaded_models_and_unloads_them(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    def entries() -> list[str]:
        window.tray.menu.aboutToShow.emit()
        return [a.text() for a in window.tray.menu.actions() if not a.isSeparator()]

    def listed() -> list[str]:
        return [a.text() for a in window.tray.menu.actions() if not a.isSeparator()]

    assert "No models loaded" in entries()
    window.tray.menu.popup(QPoint(10, 10))  # an open menu follows a load without reopening
    qtbot.waitUntil(window.tray.menu.isVisible, timeout=5_000)
    window.library_page.load_model(imported)
    qtbot.waitUntil(lambda: "Loaded models" in listed(), timeout=SLOW)
    window.tray.menu.hide()
    qtbot.waitUntil(lambda: window.memory.snapshot.find(imported) is not None, timeout=SLOW)
    info = window.memory.snapshot.find(imported)
    assert info is not None
    shown = entries()
    title = f"{imported}  ({human_bytes(info.memory_bytes)})"
    assert shown[shown.index("Loaded models") + 1] == title
    header = next(a for a in window.tray.menu.actions() if a.text() == "Loaded models")
    assert not header.isEnabled()

    submenu = next(a.menu() for a in window.tray.menu.actions() if a.text() == title)
    unload = next(a for a in submenu.actions() if a.text() == "Unload")
    unload.trigger()
    qtbot.waitUntil(lambda: gui_ctx.service.models.loaded() == [], timeout=SLOW)
    qtbot.waitUntil(lambda: "No models loaded" in entries(), timeout=10_000)
    assert not any(imported in t for t in entries())


def test_mlx_model_dialog_shows_only_what_mlx_reads(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, tmp_path: Path
) -> None:
    pytest.importorskip("mlx_lm", reason="needs mlx-lm (and mlx[cpu] on Linux)")
    from tests.support.mlx_model import build_tiny_mlx_model

    folder = build_tiny_mlx_model(tmp_path / "Tiny-MLX-Llama")
    window.library_page.import_files([str(folder)])
    qtbot.waitUntil(lambda: window.library_page.table_model.rowCount() == 1, timeout=10_000)
    mid = window.library_page.table_model.ids()[0]
    dialog = open_dialog(window, qtbot, mid)
    form = dialog.options_form
    for hidden in (
        dialog.kv_combo,
        dialog.flash_combo,
        dialog.gpu_layers_spin,
        dialog.parallel_spin,
    ):
        assert not form.isRowVisible(hidden)
    assert not form.isRowVisible(dialog.advanced_button)  # threads, batch, mmap, RoPE: llama.cpp
    assert dialog.context_spin.isVisible() and dialog.seed_spin.isVisible()
    assert dialog.prompt_cache_combo.isVisible()  # MLX reuses prompts too
    assert dialog.ttl_check.isVisible() and dialog.pin_check.isVisible()
    assert set(dialog.options()) == {"context_length", "seed", "prompt_cache"}
    dialog.context_spin.setValue(256)
    dialog.seed_spin.setValue(7)
    wait_estimate(qtbot, dialog, context_length=256)
    click_load(qtbot, dialog, gui_ctx, mid)
    window.show_page(TITLE)
    memory_row(window, qtbot, mid)
    assert window.memory_page.cell(mid, "Runtime") == "mlx"
    assert window.memory_page.cell(mid, "Context") == "256"
    assert gui_ctx.service.models.loaded()[0].options.seed == 7


def test_whisper_model_dialog_shows_only_what_speech_reads(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    from tests.support.speech import whisper_or_skip

    window.library_page.import_files([str(whisper_or_skip())])
    lib = window.library_page.table_model
    qtbot.waitUntil(lambda: lib.rowCount() == 1, timeout=10_000)
    mid = lib.ids()[0]
    assert lib.index(0, LIBRARY_COLUMNS.index("Type")).data() == "Speech to text"
    dialog = open_dialog(window, qtbot, mid)
    form = dialog.options_form
    for hidden in (
        dialog.context_spin,
        dialog.gpu_layers_spin,
        dialog.kv_combo,
        dialog.flash_combo,
        dialog.parallel_spin,
        dialog.prompt_cache_combo,
        dialog.seed_spin,
    ):
        assert not form.isRowVisible(hidden)
    assert set(dialog.options()) == {"threads"}  # all faster-whisper reads
    dialog.advanced_button.click()
    assert dialog.threads_spin.isVisible() and not dialog.batch_spin.isVisible()
    assert not dialog.kv_label.isVisible() and not dialog.context_reason_label.isVisible()
    assert dialog.weights_label.isVisible() and dialog.fit_label.text().startswith("✓ Fits")
    assert dialog.ttl_check.isVisible() and dialog.pin_check.isVisible()  # keep-alive applies
    dialog.ttl_check.setChecked(True)
    dialog.ttl_spin.setValue(5)
    click_load(qtbot, dialog, gui_ctx, mid)
    [loaded] = gui_ctx.service.models.loaded()
    assert loaded.ttl == 300
    window.show_page(TITLE)
    memory_row(window, qtbot, mid)
    assert window.memory_page.cell(mid, "Runtime") == "Speech to text (faster-whisper)"
    assert window.memory_page.cell(mid, "Context") == ""


def test_load_dialog_says_why_the_context_is_what_it_is(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    dialog = open_dialog(window, qtbot, imported)
    assert dialog.context_reason_label.text() == "2,048 tokens: set explicitly (2,048)"
    dialog.context_spin.setValue(0)  # auto: SmolLM2's trained length fits this machine's budget
    assert dialog.context_spin.text() == "Auto (fits memory)"
    wait_estimate(qtbot, dialog, context_length=8192)
    assert dialog.context_reason_label.text() == (
        "8,192 tokens: auto: the model's trained length (8,192)"
    )
    assert "(8,192 tokens, f16)" in dialog.kv_label.text()


def test_reload_from_the_models_in_memory_page_changes_the_context(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, imported: str
) -> None:
    window.library_page.load_model(imported)  # the defaults: a 2,048-token context
    window.show_page(TITLE)
    memory_row(window, qtbot, imported)
    page = window.memory_page
    assert [i.context_length for i in gui_ctx.service.models.loaded()] == [2048]
    assert page.reload_button.isEnabled()
    window.resize(MINIMUM_SIZE)  # the header row, with its Reload… button, fits the narrowest
    qtbot.waitUntil(lambda: window.size() == MINIMUM_SIZE, timeout=10_000)

    def right() -> int:
        return page.unload_button.mapTo(window, page.unload_button.rect().topRight()).x()

    # the layouts settle after the resize (posted layout requests): wait for them, not a guess
    qtbot.waitUntil(lambda: right() < window.width(), timeout=10_000)
    qtbot.mouseClick(page.reload_button, Qt.MouseButton.LeftButton)
    dialog = window.library_page.load_dialog
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: dialog.load_button.isEnabled(), timeout=10_000)
    assert dialog.windowTitle() == f"Reload {imported} with options"
    ctx = dialog.option_form.editors["context_length"]
    assert isinstance(ctx, QSpinBox) and ctx.value() == 2048
    ctx.setValue(3072)
    with qtbot.waitSignal(dialog.load_finished, timeout=SLOW):
        qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    assert [i.context_length for i in gui_ctx.service.models.loaded()] == [3072]
    qtbot.waitUntil(lambda: page.cell(imported, "Context") == "3,072", timeout=10_000)
