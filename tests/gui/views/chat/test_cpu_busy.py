"""The Chat page says when an answer is slow because the CPU is busy: once per answer, above it,
and "CPU busy" in the stats line. Driven through the real service and worker, with a scripted
engine in place of llama.cpp (whose thread tuner decides "busy" from the machine's load)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from pytestqt.qtbot import QtBot

from app.core.types import Runtime
from app.gui.main_window import MainWindow
from app.gui.views.chat.page import CPU_BUSY_NOTICE
from app.runtimes.worker import Sequence
from tests.gui.helpers import SLOW
from tests.support.fakes import FakeRuntime, ScriptEngine
from tests.support.gguf_files import write_model

PIECES = ("The", " kettle", " is", " warm", ".")


class BusyEngine(ScriptEngine):
    """Decodes piece ``busy_from`` onwards as llama.cpp does when the tuner moved to fewer
    threads (``None``: never busy)."""

    busy_from: int | None = 2

    def step(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            i = s.engine_state if isinstance(s.engine_state, int) else 0
            s.cpu_busy = self.busy_from is not None and i >= self.busy_from
        super().step(seqs)


class BusyRuntime(FakeRuntime):
    engine_type = BusyEngine


@pytest.fixture
def runtime() -> BusyRuntime:
    return BusyRuntime(delay=0.0, pieces=PIECES)


@pytest.fixture
def gui_runtimes(runtime: BusyRuntime) -> dict[str, Runtime]:
    return {"gguf": cast(Runtime, runtime)}  # the fake model is typed loosely


def ask(window: MainWindow, qtbot: QtBot, text: str) -> None:
    page = window.chat_page
    page.prompt_edit.setPlainText(text)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.mouseClick(page.send_button, Qt.MouseButton.LeftButton)
    assert done.args[0] == "stop"


def busy_engine(runtime: BusyRuntime) -> BusyEngine:
    engine = runtime.models[-1].engine
    assert isinstance(engine, BusyEngine)
    return engine


def test_a_busy_cpu_is_said_once_per_answer_and_in_the_stats(
    window: MainWindow, qtbot: QtBot, runtime: BusyRuntime, tmp_path: Path
) -> None:
    window.library_page.import_files([str(write_model(tmp_path / "Tiny-Q8_0.gguf"))])
    qtbot.waitUntil(lambda: window.library_page.table_model.rowCount() == 1, timeout=10_000)
    window.show_page("Chat")
    page = window.chat_page
    page.refresh_models()
    qtbot.waitUntil(lambda: page.current_model_id() is not None, timeout=10_000)
    answer = "".join(PIECES)

    ask(window, qtbot, "Is the kettle warm?")
    text = page.transcript.plain_text()
    assert text.count(CPU_BUSY_NOTICE) == 1  # three busy pieces, one notice
    assert page.answer_text == answer and answer in text  # the answer is whole, not split
    # the notice sits under the answer's header, above the answer, dimmed like the stats line
    assert text.index("Assistant ·") < text.index(CPU_BUSY_NOTICE) < text.index(answer)
    view = page.transcript.messages()[-1]
    assert view.caption_label.text() == CPU_BUSY_NOTICE and view.caption_label.font().italic()
    assert view.body.plain_text() == answer
    cursor = QTextCursor(view.body.documents()[-1])
    cursor.setPosition(1)
    assert not cursor.charFormat().fontItalic()
    assert page.stats_label.text().endswith(" · CPU busy")

    # a second busy answer says it again, once
    ask(window, qtbot, "And the tea?")
    assert page.transcript.plain_text().count(CPU_BUSY_NOTICE) == 2

    # an answer decoded with all the threads says nothing of the kind
    busy_engine(runtime).busy_from = None
    ask(window, qtbot, "And the cat?")
    text = page.transcript.plain_text()
    assert text.count(CPU_BUSY_NOTICE) == 2
    assert "CPU busy" not in page.stats_label.text()
    assert text.rstrip().endswith(page.stats_label.text())
