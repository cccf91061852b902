"""Speech into the chat's prompt box with the real Whisper test model and espeak-ng speech: a
WAV file dropped on the page becomes text in the box (not an attachment, not sent), added after
what was typed; without a speech model the drop and the Dictate button say how to get one; the
Dictate button without a microphone (or without the multimedia add-ons) says so and stays off.
Recording from a real microphone is not tested: these machines have no audio input."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QPushButton
from pytestqt.qtbot import QtBot

from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.views.chat.dictation import NO_MICROPHONE, NO_MODEL, NO_RECORDER
from app.gui.views.chat.page import ChatPage
from tests.gui.helpers import SLOW
from tests.gui.views.chat.test_attachments import drop
from tests.support.speech import FOX_WORDS, speak, whisper_or_skip


@pytest.fixture
def page(qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge) -> ChatPage:
    p = ChatPage(gui_ctx.service, bridge)
    qtbot.addWidget(p)
    p.show()
    return p


def import_whisper(ctx: GuiContext) -> str:
    folder = whisper_or_skip()

    async def add() -> str:
        return ctx.service.models.import_path(folder)[0].id

    return ctx.loop.call(add(), timeout=60)


def test_a_dropped_recording_becomes_prompt_text_after_what_was_typed(
    page: ChatPage, gui_ctx: GuiContext, qtbot: QtBot, tmp_path: Path
) -> None:
    import_whisper(gui_ctx)
    wav = speak(tmp_path / "fox.wav")
    page.prompt_edit.setPlainText("Summarise:")
    page.prompt_edit.moveCursor(page.prompt_edit.textCursor().MoveOperation.End)
    dictation = page.attachments.dictation
    assert dictation is not None
    with qtbot.waitSignal(dictation.transcribed, timeout=SLOW) as got:
        drop(page, wav)
    text = got.args[0]
    assert any(w in text.lower() for w in FOX_WORDS), text
    box = page.prompt_edit.toPlainText()
    assert box == f"Summarise: {text}"  # after the typed text, a space between
    assert page.attachments.attachments == [] and page.history == []  # not attached, not sent


def test_without_a_speech_model_the_drop_and_the_button_say_how_to_get_one(
    page: ChatPage, tmp_path: Path
) -> None:
    wav = tmp_path / "fox.wav"
    wav.write_bytes(b"RIFF")  # never read: no model to read it
    drop(page, wav)
    assert page.attachments.error_label.text() == NO_MODEL
    assert page.prompt_edit.toPlainText() == ""
    button = page.attachments.dictation.button  # type: ignore[union-attr]
    page.attachments.say("")
    button.click()
    assert not button.isChecked()
    assert page.attachments.error_label.text() == NO_MODEL


def test_the_dictate_button_without_a_microphone_says_so_and_stays_off(
    page: ChatPage, gui_ctx: GuiContext
) -> None:
    import_whisper(gui_ctx)
    button = page.attachments.dictation.button  # type: ignore[union-attr]
    assert isinstance(button, QPushButton) and button.isVisible()
    button.click()
    assert not button.isChecked()
    assert page.attachments.error_label.text() in (NO_MICROPHONE, NO_RECORDER)
