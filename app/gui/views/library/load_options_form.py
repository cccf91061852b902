"""The Load dialog's option editors, built from the load option table (ranges, steps, help).

Every row comes from ``app.core.engine.load_options.specs()``: a spin box takes the option's range and
step, a combo its choices, each editor its help as a tooltip. Only the wording of the choices is
the GUI's own.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QToolButton,
    QWidget,
)

from app.core.engine.load_options import OptionSpec, specs
from app.core.types import LoadOptions
from app.gui.units import grouped

INT_MAX = 2**31 - 1  # a QSpinBox holds a C int
CHOICE_TEXT: dict[str, dict[str, str]] = {
    "flash_attention": {"auto": "Auto", "on": "On", "off": "Off"},
    "kv_type": {"f16": "F16 (full precision)", "q8_0": "Q8_0 (half the memory)", "q4_0": "Q4_0"},
    "rope_scaling": {"none": "Model's own", "linear": "Linear", "yarn": "YaRN"},
}


def editor_for(spec: OptionSpec, *, maximum: float | None = None) -> QWidget:
    """The widget that edits one option; ``maximum`` narrows the table's (a model's own limit)."""
    hi = spec.maximum if maximum is None else min(maximum, spec.maximum or maximum)
    w: QWidget
    if spec.kind == "bool":
        w = QCheckBox(spec.label)
    elif spec.kind == "choice":
        combo = QComboBox()
        texts = CHOICE_TEXT.get(spec.name, {})
        for v in spec.choices:
            combo.addItem(texts.get(v, v), v)
        w = combo
    elif spec.kind == "float":
        d = QDoubleSpinBox()
        d.setRange(spec.minimum or 0.0, hi if hi is not None else 1e12)
        d.setDecimals(3 if spec.step < 1 else 1)
        d.setSingleStep(spec.step)
        if spec.special:
            d.setSpecialValueText(spec.special)
        w = d
    else:
        s = QSpinBox()
        lo = int(spec.minimum) if spec.minimum is not None else 0
        if spec.nullable:
            lo -= 1  # one below the range: None ("Random")
        top = INT_MAX if hi is None else int(min(hi, INT_MAX))
        s.setRange(max(lo, -INT_MAX), top)
        s.setSingleStep(int(spec.step))
        s.setGroupSeparatorShown(True)
        if spec.special:
            s.setSpecialValueText(spec.special)
        s.setMinimumWidth(170)
        w = s
    w.setToolTip(spec.help[:1].upper() + spec.help[1:])
    return w


# faster-whisper (app/runtimes/speech) reads only its CPU threads: no context, GPU or cache
SPEECH_OPTIONS = ("threads",)
NO_GPU_TEXT = "Auto: no GPU (runs on the CPU)"
NO_GPU_TIP = (
    "This llama.cpp build has no GPU backend, so models run on the CPU whatever this says. "
    "Settings › Runtime shows whether this machine has a GPU and how to use it."
)


class LoadOptionsForm(QGroupBox):
    """ "Load options": the main rows, then "Advanced options" (hidden until asked for). For an
    MLX model only the options MLX reads are shown; for a Whisper model only its CPU threads."""

    changed = Signal()

    def __init__(
        self,
        *,
        trained_context: int,
        mlx: bool,
        gpu_offload: bool = True,
        speech: bool = False,
        parent: QWidget | None = None,
    ) -> None:
        """``gpu_offload``: the llama.cpp build can offload to a GPU (else "GPU offload" says
        that it runs on the CPU)."""
        super().__init__("Load options", parent)
        self.mlx = mlx
        self.speech = speech
        self.specs = specs()
        self.form = QFormLayout(self)
        self.advanced_button = QToolButton()
        self.advanced_button.setText("Advanced options")
        self.advanced_button.setCheckable(True)
        self.advanced_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.advanced_button.setArrowType(Qt.ArrowType.RightArrow)
        self.advanced_button.setAutoRaise(True)
        self.advanced_box = QWidget()
        advanced = QFormLayout(self.advanced_box)
        advanced.setContentsMargins(0, 0, 0, 0)
        self.trained_context = trained_context
        self.context_hint = QLabel()
        self.context_hint.setWordWrap(True)
        # option name -> the widget that edits it
        self.editors: dict[str, QWidget] = {}
        for spec in self.specs:
            # the table's range, not the trained length: typing past a cap would be cut short
            # silently (1000000 became 1,000); a length past training gets a warning instead
            w = editor_for(spec)
            self.editors[spec.name] = w
            if spec.name == "gpu_layers" and not gpu_offload and isinstance(w, QSpinBox):
                w.setSpecialValueText(NO_GPU_TEXT)
                w.setToolTip(NO_GPU_TIP)
            target = advanced if spec.advanced else self.form
            label = "" if spec.kind == "bool" else spec.label
            if spec.name == "context_length":
                row = QHBoxLayout()
                row.addWidget(w)
                row.addWidget(self.context_hint, 1)
                target.addRow(label, row)
            else:
                target.addRow(label, w)
            _connect(w, self._on_editor_changed)
        self._show_context_hint()
        self.advanced_box.hide()
        self.form.addRow(self.advanced_button)
        self.form.addRow(self.advanced_box)
        self.advanced_button.toggled.connect(self._on_advanced_button_toggled)
        if mlx or speech:
            for spec in self.specs:
                if not self.reads(spec):
                    layout = advanced if spec.advanced else self.form
                    layout.setRowVisible(self.editors[spec.name], False)
            if not any(self.reads(s) for s in self.specs if s.advanced):
                self.form.setRowVisible(self.advanced_button, False)
                self.form.setRowVisible(self.advanced_box, False)

    def reads(self, spec: OptionSpec) -> bool:
        """Whether this model's runtime reads the option (faster-whisper: its CPU threads)."""
        if self.speech:
            return spec.name in SPEECH_OPTIONS
        return spec.mlx or not self.mlx

    def values(self) -> dict[str, Any]:
        """The options the form shows (only those this model's runtime reads)."""
        return {s.name: _value(s, self.editors[s.name]) for s in self.specs if self.reads(s)}

    def show_options(self, options: LoadOptions) -> None:
        for s in self.specs:
            _set_value(s, self.editors[s.name], getattr(options, s.name))

    def set_editable(self, enabled: bool) -> None:
        for w in (*self.editors.values(), self.advanced_button):
            w.setEnabled(enabled)

    def _on_editor_changed(self, *_: object) -> None:
        self._show_context_hint()
        self.changed.emit()

    def _show_context_hint(self) -> None:
        trained = self.trained_context
        w = self.editors.get("context_length")
        value = w.value() if isinstance(w, QSpinBox) else 0
        if trained and value > trained:
            self.context_hint.setText(
                f"more than the {grouped(trained)} tokens it was trained on: answers may "
                "degrade unless RoPE scaling (Advanced options) stretches it"
            )
            self.context_hint.setStyleSheet("color:#9a5b00")
        else:
            self.context_hint.setText(
                f"trained on {grouped(trained)} tokens" if trained else "trained context unknown"
            )
            self.context_hint.setStyleSheet("color:#6b6b6b")

    def _on_advanced_button_toggled(self, shown: bool) -> None:
        self.advanced_box.setVisible(shown)
        self.advanced_button.setArrowType(
            Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow
        )
        window = self.window()
        if window is not None:
            window.adjustSize()


def _connect(w: QWidget, slot: Any) -> None:
    if isinstance(w, QSpinBox | QDoubleSpinBox):
        w.valueChanged.connect(slot)
    elif isinstance(w, QComboBox):
        w.currentIndexChanged.connect(slot)
    elif isinstance(w, QCheckBox):
        w.toggled.connect(slot)


def _value(spec: OptionSpec, w: QWidget) -> Any:
    if isinstance(w, QCheckBox):
        return w.isChecked()
    if isinstance(w, QComboBox):
        return w.currentData()
    if isinstance(w, QDoubleSpinBox):
        return w.value()
    if isinstance(w, QSpinBox):
        v = w.value()
        return None if spec.nullable and v == w.minimum() else v
    raise TypeError(f"no value for {type(w).__name__}")  # pragma: no cover - editor_for's kinds


def _set_value(spec: OptionSpec, w: QWidget, value: Any) -> None:
    if isinstance(w, QCheckBox):
        w.setChecked(bool(value))
    elif isinstance(w, QComboBox):
        w.setCurrentIndex(max(0, w.findData(value)))
    elif isinstance(w, QDoubleSpinBox):
        w.setValue(float(value))
    elif isinstance(w, QSpinBox):
        w.setValue(w.minimum() if value is None and spec.nullable else int(value))
