"""The Chat page's side panel: the conversation's settings (system prompt, sampling, stop
strings, token limit, a JSON schema the answer must follow) and per-model presets.

The values are what a conversation saves (``params()``, restored with ``set_params``) and what
each request carries (``sampling()``, ``stop()``, ``constraint()``). A model's preset is kept
under ``chat`` in the model's load preset (``presets.json``, app/core/engine/presets.py), so one
file holds everything remembered about a model.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtWidgets import (
    QAbstractButton,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.engine.presets import CHAT_KEY
from app.core.service import Hearth
from app.core.types import Constraint, SamplingParams
from app.gui.bridge import Bridge, log_failure

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
SEED_RANDOM = -1  # the seed box's "Random" value


def _spin(lo: float, hi: float, step: float, value: float, decimals: int = 2) -> QDoubleSpinBox:
    s = QDoubleSpinBox()
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setDecimals(decimals)
    s.setValue(value)
    return s


def _int_spin(lo: int, hi: int, value: int, special: str = "") -> QSpinBox:
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setValue(value)
    if special:
        s.setSpecialValueText(special)  # shown for the minimum
    return s


class ChatOptionsPanel(QScrollArea):
    """The collapsible panel beside the transcript with the conversation's settings."""

    preset_saved = Signal(str)  # model id
    preset_loaded = Signal(str)  # model id (its preset, or none: the panel is unchanged)

    def __init__(self, service: Hearth, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self.model_id: str | None = None  # the model whose preset the buttons save and load
        self.setWidgetResizable(True)
        self.setMinimumWidth(260)

        self.system_edit = QPlainTextEdit(DEFAULT_SYSTEM_PROMPT)
        self.system_edit.setFixedHeight(90)
        self.temperature_spin = _spin(0.0, 2.0, 0.1, 0.7)
        self.top_p_spin = _spin(0.0, 1.0, 0.05, 1.0)
        self.top_k_spin = _int_spin(0, 1000, 0, "Off")
        self.min_p_spin = _spin(0.0, 1.0, 0.01, 0.0)
        self.repeat_penalty_spin = _spin(0.0, 3.0, 0.05, 1.0)
        self.seed_spin = _int_spin(SEED_RANDOM, 2**31 - 1, SEED_RANDOM, "Random")
        self.stop_edit = QPlainTextEdit()
        self.stop_edit.setPlaceholderText("One per line: the answer ends before it")
        self.stop_edit.setFixedHeight(56)
        self.max_tokens_spin = _int_spin(0, 131072, 1024, "No limit")
        self.max_tokens_spin.setSingleStep(128)
        self.schema_edit = QPlainTextEdit()
        self.schema_edit.setPlaceholderText('A JSON schema, e.g. {"type": "object", ...}')
        self.schema_edit.setFixedHeight(90)
        self.schema_error = QLabel("")
        self.schema_error.setWordWrap(True)
        self.schema_error.hide()

        self.save_preset_button = QPushButton("Save as preset")
        self.save_preset_button.setToolTip("Keep these settings for the chosen model")
        self.load_preset_button = QPushButton("Load preset")
        self.load_preset_button.setToolTip("Use the settings saved for the chosen model")
        self.preset_label = QLabel("")
        self.preset_label.setWordWrap(True)

        form = QFormLayout()
        form.addRow(QLabel("System prompt"))
        form.addRow(self.system_edit)
        for label, w in (
            ("Temperature", self.temperature_spin),
            ("Top P", self.top_p_spin),
            ("Top K", self.top_k_spin),
            ("Min P", self.min_p_spin),
            ("Repeat penalty", self.repeat_penalty_spin),
            ("Seed", self.seed_spin),
            ("Max tokens", self.max_tokens_spin),
        ):
            form.addRow(label, w)
        form.addRow(QLabel("Stop strings"))
        form.addRow(self.stop_edit)
        schema_label = QLabel("Structured output (JSON schema; empty: off)")
        schema_label.setWordWrap(True)  # two lines in a narrow panel, never cut off
        form.addRow(schema_label)
        form.addRow(self.schema_edit)
        form.addRow(self.schema_error)
        presets = QHBoxLayout()
        presets.addWidget(self.save_preset_button)
        presets.addWidget(self.load_preset_button)
        inner = QWidget()
        lay = QVBoxLayout(inner)
        lay.addLayout(form)
        lay.addLayout(presets)
        lay.addWidget(self.preset_label)
        lay.addStretch(1)
        self.setWidget(inner)

        self.save_preset_button.clicked.connect(self._on_save_preset_button_clicked)
        self.load_preset_button.clicked.connect(self._on_load_preset_button_clicked)
        self.schema_edit.textChanged.connect(self._on_schema_edit_text_changed)

    # -- values ------------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        return self.system_edit.toPlainText()

    def sampling(self) -> SamplingParams:
        seed = self.seed_spin.value()
        return SamplingParams(
            temperature=self.temperature_spin.value(),
            top_p=self.top_p_spin.value(),
            top_k=self.top_k_spin.value(),
            min_p=self.min_p_spin.value(),
            repeat_penalty=self.repeat_penalty_spin.value(),
            seed=None if seed == SEED_RANDOM else seed,
        )

    def max_tokens(self) -> int | None:
        return self.max_tokens_spin.value() or None

    def stop(self) -> tuple[str, ...]:
        return tuple(s for s in self.stop_edit.toPlainText().split("\n") if s)

    def schema_problem(self) -> str | None:
        """Why the JSON schema cannot be used (None: it can, or there is none)."""
        text = self.schema_edit.toPlainText().strip()
        if not text:
            return None
        try:
            schema = json.loads(text)
        except ValueError as e:
            return f"The JSON schema is not valid JSON: {e}"
        if not isinstance(schema, dict):
            return "The JSON schema must be a JSON object."
        return None

    def constraint(self) -> Constraint | None:
        """The answer's required shape: the JSON schema, when one is set (and valid)."""
        text = self.schema_edit.toPlainText().strip()
        if not text or self.schema_problem() is not None:
            return None
        return Constraint("json_schema", json.dumps(json.loads(text)))

    def params(self) -> dict[str, Any]:
        """The panel's values as a conversation (or a preset) keeps them (JSON)."""
        s = self.sampling()
        return {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "repeat_penalty": s.repeat_penalty,
            "seed": s.seed,
            "stop": list(self.stop()),
            "max_tokens": self.max_tokens_spin.value(),
            "json_schema": self.schema_edit.toPlainText().strip(),
        }

    def set_params(self, params: dict[str, Any]) -> None:
        """Show saved values; keys missing (an older conversation) keep the panel's."""
        floats = (
            ("temperature", self.temperature_spin),
            ("top_p", self.top_p_spin),
            ("min_p", self.min_p_spin),
            ("repeat_penalty", self.repeat_penalty_spin),
        )
        for key, spin in floats:
            v = params.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                spin.setValue(float(v))
        for key, ispin in (("top_k", self.top_k_spin), ("max_tokens", self.max_tokens_spin)):
            v = params.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                ispin.setValue(v)
        if "seed" in params:
            seed = params["seed"]
            self.seed_spin.setValue(seed if isinstance(seed, int) else SEED_RANDOM)
        if isinstance(params.get("stop"), list):
            self.stop_edit.setPlainText("\n".join(str(s) for s in params["stop"]))
        if isinstance(params.get("json_schema"), str):
            self.schema_edit.setPlainText(params["json_schema"])

    # -- presets -------------------------------------------------------------------------------------
    def save_preset(self) -> None:
        """Keep the panel's values (and system prompt) for the chosen model."""
        mid = self.model_id
        if mid is None:
            return
        chat = {**self.params(), "system_prompt": self.system_prompt()}
        models = self._service.models

        def save() -> None:  # loop thread: the other keys of the model's preset stay
            models.save_preset(mid, {**models.preset(mid), CHAT_KEY: chat})

        self._bridge.call(save, on_done=lambda _: self._said_saved(mid), on_error=self._failed)

    def load_preset(self) -> None:
        """Show the chosen model's saved values (nothing saved: a line says so)."""
        mid = self.model_id
        if mid is None:
            return
        models = self._service.models
        self._bridge.call(
            lambda: models.preset(mid).get(CHAT_KEY),
            on_done=lambda chat: self._apply_preset(mid, chat),
            on_error=self._failed,
        )

    def _apply_preset(self, mid: str, chat: object) -> None:
        if isinstance(chat, dict):
            self.set_params(chat)
            if isinstance(chat.get("system_prompt"), str):
                self.system_edit.setPlainText(chat["system_prompt"])
            self.preset_label.setText(f"Loaded the preset of {mid}.")
        else:
            self.preset_label.setText(f"{mid} has no saved preset.")
        self.preset_loaded.emit(mid)

    def _said_saved(self, mid: str) -> None:
        self.preset_label.setText(f"Saved as the preset of {mid}.")
        self.preset_saved.emit(mid)

    def _failed(self, exc: BaseException) -> None:
        self.preset_label.setText(log_failure(log, "chat preset", exc))

    # -- slots ---------------------------------------------------------------------------------------
    def _on_save_preset_button_clicked(self) -> None:
        self.save_preset()

    def _on_load_preset_button_clicked(self) -> None:
        self.load_preset()

    def _on_schema_edit_text_changed(self) -> None:
        problem = self.schema_problem()
        self.schema_error.setText(problem or "")
        self.schema_error.setVisible(problem is not None)


NARROW_PAGE_PX = 1000  # a Chat page narrower than this gives the transcript the panel's room


class StepAside(QObject):
    """The settings panel steps aside when the page becomes narrow and comes back when it is
    wide again (through its toggle ``button``, so the button always says what is shown).
    Only crossing the width flips it: the user's own click holds until the next crossing."""

    def __init__(self, page: QWidget, button: QAbstractButton) -> None:
        super().__init__(page)
        self._button = button
        self._narrow: bool | None = None
        page.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Resize and isinstance(watched, QWidget):
            narrow = watched.width() < NARROW_PAGE_PX
            if narrow != self._narrow:
                self._narrow = narrow
                self._button.setChecked(not narrow)
        return False
