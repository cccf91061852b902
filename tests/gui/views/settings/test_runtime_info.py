"""Settings › Runtime shows the doctor's report; the Load dialog's "GPU offload"
says when this llama.cpp build has no GPU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import llama_cpp
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from app.gui.main_window import MainWindow
from app.gui.views.library.load_options_form import NO_GPU_TEXT
from tests.gui.views.library.test_memory import open_dialog


def _box(window: MainWindow, qtbot: QtBot):  # type: ignore[no-untyped-def]
    window.show_page("Settings")
    box = window.settings_page.runtime_box
    assert box is not None
    qtbot.waitUntil(lambda: box.report is not None, timeout=30_000)
    return box


def test_the_report_waits_until_settings_is_shown(window: MainWindow, qtbot: QtBot) -> None:
    """The report runs nvidia-smi and imports mlx: not while the window opens on another page."""
    box = window.settings_page.runtime_box
    assert box is not None and window.current_page != "Settings"
    qtbot.wait(50)  # the window's start-up work (queued calls) has run
    assert box.report is None and not box.checking
    _box(window, qtbot)
    assert box.report is not None


def test_runtime_section_shows_this_build(window: MainWindow, qtbot: QtBot) -> None:
    box = _box(window, qtbot)
    text = box.details_label.text()
    assert f"llama.cpp: llama-cpp-python {llama_cpp.__version__}, backends: " in text
    assert "CPU" in box.report["llama_cpp"]["backends"]
    assert "Models folder: " in text and "Server: http" in text
    if shutil.which("nvidia-smi") is None and not box.report["gpus"]:
        assert "GPU: none found (models run on the CPU)" in text
        # no GPU warning; the label shows only the warnings there are (here, on an AMX Xeon:
        # the probe turned llama.cpp's extra buffer types off)
        assert not [w for w in box.report["warnings"] if "cannot use it" in w]
        assert box.warnings_label.isHidden() is not bool(box.report["warnings"])
    qtbot.mouseClick(box.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text().startswith("Hearth ")


def test_runtime_section_warns_about_an_unused_gpu(
    window: MainWindow, qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama.cpp build drives GPUs: the unused-GPU warning cannot show")
    box = _box(window, qtbot)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA GeForce RTX 4090, 24564'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    box.report = None
    qtbot.mouseClick(box.refresh_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: box.report is not None, timeout=30_000)
    assert box.warnings_label.isVisible() or not box.isVisible()
    assert "RTX 4090" in box.warnings_label.text()
    assert "-DGGML_CUDA=on" in box.warnings_label.text()
    assert "GPU: NVIDIA GeForce RTX 4090, 24.0 GiB (NOT USED)" in box.details_label.text()


def test_gpu_offload_says_when_the_build_has_no_gpu(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    dialog = open_dialog(window, qtbot, imported)
    spin = dialog.gpu_layers_spin
    if llama_cpp.llama_supports_gpu_offload():
        assert spin.specialValueText() == "Auto (all that fit)"
    else:
        assert spin.specialValueText() == NO_GPU_TEXT
        assert "no GPU backend" in spin.toolTip()
