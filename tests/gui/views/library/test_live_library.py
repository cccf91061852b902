"""The open Library follows changes made outside the window: a `hearth import` run in a terminal
(another process writing the library index) and a GGUF file copied into the models folder show
up without a click."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.gui.context import GuiContext
from app.gui.main_window import MainWindow

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[4]  # the checkout whose `app` the window runs


def test_a_cli_import_in_another_process_shows_in_the_open_library(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    page = window.library_page
    window.show_page("Library")
    qtbot.waitUntil(lambda: page.showing_empty_message, timeout=10_000)
    done = subprocess.run(
        [sys.executable, "-m", "app", "import", str(smollm2_path)],
        cwd=ROOT,
        env=os.environ.copy(),  # the same HEARTH_HOME as the window's service
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 1, timeout=10_000)
    assert page.table_model.ids() == ["smollm2-135m-instruct.q4_1"]
    assert not page.showing_empty_message


def test_a_gguf_copied_into_the_models_folder_shows_in_the_open_library(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, embedding_gguf: Path
) -> None:
    page = window.library_page
    qtbot.waitUntil(lambda: page.showing_empty_message, timeout=10_000)
    folder = gui_ctx.service.models.folder
    shutil.copy(embedding_gguf, folder / embedding_gguf.name)
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 1, timeout=10_000)
    assert page.table_model.ids() == ["all-minilm-l6-v2-q8_0"]
    assert (
        Path(page.table_model.status(0).model.path).resolve()
        == (folder / embedding_gguf.name).resolve()
    )
