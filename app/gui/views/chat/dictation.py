"""Speech into the prompt box. The microphone button records (QtMultimedia, from PySide6's
add-ons: the speech extra installs them) and an audio file dropped on the chat is read the same
way: a Whisper model of the library turns either into text, which goes into the prompt box at
the cursor for the user to edit and send. Nothing is sent by itself.

The model is the library's first speech model by id (``speech_model``); without one, or
without the recording add-ons or a microphone, the button says what is missing instead of
failing. Tested by tests/gui/views/chat/test_dictation.py.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtWidgets import QPlainTextEdit, QPushButton, QTextEdit

from app.core.engine.models import speech_models
from app.core.requests import TranscriptionRequest
from app.core.service import Hearth
from app.core.types import AudioInput, SpeechJob
from app.errors import HearthError
from app.gui.bridge import Bridge
from app.settings import SettingsStore

log = logging.getLogger(__name__)

# what a dropped file must end with to be transcribed rather than attached
AUDIO_SUFFIXES = (".wav", ".mp3", ".m4a", ".ogg", ".oga", ".opus", ".flac", ".webm", ".aac")
NO_MODEL = (
    "No speech model: import a Whisper model in CTranslate2 format (hearth import FOLDER) or "
    "download one from Discover (faster-whisper repositories)"
)
NO_RECORDER = "Recording needs PySide6's multimedia add-ons: pip install 'hearth[speech]'"
NO_MICROPHONE = "No microphone found"
IDLE_TIP = "Dictate: record speech and put its text into the message box (click again to stop)"


def can_record() -> tuple[bool, str]:
    """Whether the Dictate button can record here: PySide6's QtMultimedia imports (its add-on
    wheel comes with the speech extra); (False, why) when it does not (``hearth doctor``)."""
    try:
        importlib.import_module("PySide6.QtMultimedia")
    except (ImportError, OSError) as e:  # OSError: the module is there, a Qt library is not
        return (
            False,
            f"PySide6's QtMultimedia cannot be imported ({e}): pip install 'hearth[speech]'",
        )
    return True, ""


def is_audio_name(path: str | Path) -> bool:
    return str(path).lower().endswith(AUDIO_SUFFIXES)


class _Recorder:
    """One recording into a WAV file through QtMultimedia (imported here: the add-ons are
    optional). ``stopped(path)`` is called once the file is complete."""

    def __init__(self, stopped: Callable[[Path], None], failed: Callable[[str], None]) -> None:
        from PySide6.QtMultimedia import (
            QAudioInput,
            QMediaCaptureSession,
            QMediaDevices,
            QMediaFormat,
            QMediaRecorder,
        )

        device = QMediaDevices.defaultAudioInput()
        if device.isNull():
            raise HearthError(NO_MICROPHONE)
        self._dir = tempfile.TemporaryDirectory(prefix="hearth-dictation-")
        self.path = Path(self._dir.name) / "dictation.wav"
        self._input = QAudioInput(device)
        self._session = QMediaCaptureSession()
        self._session.setAudioInput(self._input)
        self._recorder = QMediaRecorder()
        self._session.setRecorder(self._recorder)
        fmt = QMediaFormat(QMediaFormat.FileFormat.Wave)
        fmt.setAudioCodec(QMediaFormat.AudioCodec.Wave)
        self._recorder.setMediaFormat(fmt)
        self._recorder.setOutputLocation(QUrl.fromLocalFile(str(self.path)))
        self._stopped, self._failed = stopped, failed
        self._recorder.recorderStateChanged.connect(self._on_recorder_state_changed)
        self._recorder.errorOccurred.connect(self._on_recorder_error_occurred)
        self._recorder.record()

    def stop(self) -> None:
        self._recorder.stop()

    def close(self) -> None:
        self._dir.cleanup()

    def _on_recorder_state_changed(self, state: Any) -> None:
        from PySide6.QtMultimedia import QMediaRecorder

        if state == QMediaRecorder.RecorderState.StoppedState:
            where = Path(self._recorder.actualLocation().toLocalFile() or self.path)
            self._stopped(where)

    def _on_recorder_error_occurred(self, _error: Any, text: str) -> None:
        self._failed(f"Recording failed: {text}")


class Dictation(QObject):
    """The microphone button, and audio files turned into prompt text."""

    transcribed = Signal(str)  # the text put into the prompt box
    _finished = Signal(str)  # queued from the loop thread
    _failed = Signal(str)

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        prompt: QPlainTextEdit | QTextEdit,
        settings: SettingsStore,
        *,
        say: Callable[[str], None],
        status: Callable[[str], None],
        parent: QObject | None = None,
    ) -> None:
        """``say``: a refusal or failure, shown to the user; ``status``: progress ("" clears)."""
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self._prompt = prompt
        self._settings = settings
        self._say, self._status = say, status
        self._recorder: _Recorder | None = None
        self.button = QPushButton("Dictate")
        self.button.setCheckable(True)
        self.button.setToolTip(IDLE_TIP)
        self.button.toggled.connect(self._on_button_toggled)
        self._finished.connect(self._on_self_finished)
        self._failed.connect(self._on_self_failed)

    def speech_model(self) -> str | None:
        """The library's first speech model by id (None: it has none)."""
        ids = speech_models(self._service.models.all())
        return ids[0] if ids else None

    # -- audio in ------------------------------------------------------------------------------
    def transcribe_file(self, path: str | Path) -> bool:
        """Turn an audio file into prompt text (False: refused at once, and said why)."""
        model = self.speech_model()
        if model is None:
            self._say(NO_MODEL)
            return False
        p = Path(path)
        cfg = self._settings.load().audio
        try:
            size = p.stat().st_size
        except OSError as e:
            self._say(f"Cannot read {p.name}: {e.strerror or e}")
            return False
        if size > cfg.max_bytes:  # the server's bound on an upload holds here too
            self._say(f"{p.name} is over {cfg.max_bytes // (1024 * 1024)} MB (audio.max_bytes)")
            return False
        self._status(f"Transcribing {p.name} with {model}…")
        self._bridge.run(
            self._transcribe(model, p, cfg.max_seconds),
            on_done=self._finished.emit,
            on_error=lambda e: self._failed.emit(str(e) if isinstance(e, HearthError) else repr(e)),
        )
        return True

    async def _transcribe(self, model: str, path: Path, max_seconds: float) -> str:
        data = await asyncio.to_thread(path.read_bytes)
        job = SpeechJob(AudioInput(data, path.name, max_seconds))
        result = await self._service.transcribe(TranscriptionRequest(model, job))
        return "".join([s.text async for s in result.transcript]).strip()

    # -- recording -----------------------------------------------------------------------------
    def start_recording(self) -> bool:
        """Record from the default microphone until :meth:`stop_recording` (False: cannot,
        and said why)."""
        if self.speech_model() is None:
            self._say(NO_MODEL)
            return False
        try:
            self._recorder = _Recorder(self._on_recording_stopped, self._failed.emit)
        except ImportError:
            self._say(NO_RECORDER)
            return False
        except HearthError as e:
            self._say(str(e))
            return False
        self._status("Recording… click Dictate again to stop")
        return True

    def stop_recording(self) -> None:
        if self._recorder is not None:
            self._recorder.stop()

    def _on_recording_stopped(self, path: Path) -> None:
        self._status("")
        if path.is_file() and path.stat().st_size > 0:
            self.transcribe_file(path)
        else:
            self._say("Nothing was recorded")
            self._close_recorder()

    def _close_recorder(self) -> None:
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None

    # -- slots -----------------------------------------------------------------------------------
    def _on_button_toggled(self, on: bool) -> None:
        if on and not self.start_recording():
            self.button.blockSignals(True)
            self.button.setChecked(False)
            self.button.blockSignals(False)
        elif not on:
            self.stop_recording()

    def _on_self_finished(self, text: str) -> None:
        self._status("")
        self._close_recorder()
        if not text:
            self._say("No speech was heard")
            return
        cursor = self._prompt.textCursor()
        before = self._prompt.toPlainText()[: cursor.position()]
        cursor.insertText(text if not before or before.endswith((" ", "\n")) else " " + text)
        self._prompt.setFocus()
        self.transcribed.emit(text)

    def _on_self_failed(self, message: str) -> None:
        self._status("")
        self._close_recorder()
        self.button.setChecked(False)
        self._say(f"Transcription failed: {message}")
