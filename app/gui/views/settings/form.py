"""The Settings page's one model: every value widget is a field that shows a setting and is
written back only by Apply. A field counts as changed while its widget differs from what it
showed for the settings last read, so the page knows it has unsaved changes.
Tested by tests/gui/views/settings/test_apply.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (
    QAbstractButton,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QMessageBox,
    QSpinBox,
    QWidget,
)

from app.settings import Settings


@dataclass(frozen=True, slots=True)
class Field:
    """One setting on the page: ``read`` gives the value as the widget shows it, ``write``
    returns the settings with the widget's value in them."""

    name: str
    widget: QWidget
    read: Callable[[Settings], Any]
    write: Callable[[Settings, Any], Settings]


class SettingsForm(QObject):
    """The fields, the settings they were last shown from, and whether any was changed since."""

    dirty_changed = Signal(bool)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.fields: list[Field] = []
        self.shown_from: Settings | None = None  # the settings the widgets were filled from
        # what each widget showed for them: a spin may round (10 MiB shows as 0.0 GiB)
        self._shown: dict[str, Any] = {}
        self._dirty = False

    @property
    def dirty(self) -> bool:
        return self._dirty

    def add(
        self,
        name: str,
        widget: QWidget,
        read: Callable[[Settings], Any],
        write: Callable[[Settings, Any], Settings],
    ) -> None:
        self.fields.append(Field(name, widget, read, write))
        _changed_signal(widget).connect(self._on_widget_changed)

    def show(self, s: Settings) -> None:
        """Fill every widget from ``s`` (what Revert does): nothing is changed afterwards."""
        self._fill(self.fields, s)

    def merge(self, s: Settings) -> None:
        """Show ``s`` (read again: another page or process may have written it) in the fields
        the user has not changed; changed fields keep what the user chose."""
        changed = {f.name for f in self.changed()}
        for f in self.fields:
            if f.name in changed:  # still changed against the new settings' value
                self._shown[f.name] = _shown_value(f.widget, f.read(s))
        self._fill([f for f in self.fields if f.name not in changed], s)

    def changed(self) -> list[Field]:
        """The fields whose widget differs from what it showed for the settings last read."""
        return [
            f
            for f in self.fields
            if f.name in self._shown and _get(f.widget) != self._shown[f.name]
        ]

    def apply_to(self, s: Settings) -> Settings:
        """``s`` (the file as it is now) with the changed fields' values; the rest as in ``s``,
        so what other pages wrote meanwhile, and values a widget cannot show exactly, survive."""
        for f in self.changed():
            s = f.write(s, _get(f.widget))
        return s

    def value(self, name: str) -> Any:
        return next(_get(f.widget) for f in self.fields if f.name == name)

    def _fill(self, fields: list[Field], s: Settings) -> None:
        for f in fields:
            _set(f.widget, f.read(s))
            self._shown[f.name] = _get(f.widget)
        self.shown_from = s
        self._update()

    def _on_widget_changed(self, *_: object) -> None:
        self._update()

    def _update(self) -> None:
        dirty = bool(self.changed())
        if dirty != self._dirty:
            self._dirty = dirty
            self.dirty_changed.emit(dirty)


def unsaved_dialog(parent: QWidget) -> QMessageBox:
    """Apply (AcceptRole) / Discard (DestructiveRole) / Cancel, for unsaved settings."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("Unsaved settings")
    box.setText("Settings has changes that are not applied yet.")
    box.setInformativeText("Apply them, discard them, or go back to Settings?")
    apply = box.addButton("Apply", QMessageBox.ButtonRole.AcceptRole)
    box.addButton("Discard", QMessageBox.ButtonRole.DestructiveRole)
    cancel = box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(apply)
    box.setEscapeButton(cancel)
    return box


def settings_form(box: QGroupBox) -> QFormLayout:
    """A form whose long labels go above their field when the page is narrow (no side scroll)."""
    form = QFormLayout(box)
    form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
    form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    return form


def note_label(text: str) -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setStyleSheet("color:#6b6b6b")
    return label


def _shown_value(w: QWidget, value: Any) -> Any:
    """What ``w`` would show for ``value`` (a spin's rounding), without changing it."""
    if isinstance(w, QDoubleSpinBox):
        return round(float(value), w.decimals())
    if isinstance(w, QLineEdit):
        return str(value).strip()
    return value


def _changed_signal(w: QWidget) -> Any:
    if isinstance(w, QAbstractButton):
        return w.toggled
    if isinstance(w, QComboBox):
        return w.currentIndexChanged
    if isinstance(w, QSpinBox | QDoubleSpinBox):
        return w.valueChanged
    if isinstance(w, QLineEdit):
        return w.textChanged
    raise TypeError(f"no change signal for {type(w).__name__}")


def _get(w: QWidget) -> Any:
    if isinstance(w, QAbstractButton):
        return w.isChecked()
    if isinstance(w, QComboBox):
        return w.currentData()
    if isinstance(w, QSpinBox | QDoubleSpinBox):
        return w.value()
    if isinstance(w, QLineEdit):
        return w.text().strip()
    raise TypeError(f"no value for {type(w).__name__}")


def _set(w: QWidget, value: Any) -> None:
    if isinstance(w, QAbstractButton):
        w.setChecked(bool(value))
    elif isinstance(w, QComboBox):
        w.setCurrentIndex(max(0, w.findData(value)))
    elif isinstance(w, QSpinBox):
        w.setValue(int(value))
    elif isinstance(w, QDoubleSpinBox):
        w.setValue(float(value))
    elif isinstance(w, QLineEdit):
        w.setText(str(value))
