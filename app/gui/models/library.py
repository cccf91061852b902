"""LibraryTableModel: the models in the library, one row each, with their load state.
Tested by tests/gui/views/library/test_page.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor

from app.core.types import ModelStatus
from app.gui.models.base import RowTableModel
from app.gui.units import grouped, human_bytes, human_count

Index = QModelIndex | QPersistentModelIndex

COLUMNS: tuple[str, ...] = (
    "Model",
    "Format",
    "Architecture",
    "Parameters",
    "Quantization",
    "Size",
    "Context",
    "Chat template",
    "Input",  # "Text, vision" for a model paired with a vision projector
    "Origin",
    "State",
)
ORIGIN_TEXT = {
    "imported": "Imported",
    "downloaded": "Hearth",
    "huggingface-cache": "HF cache",
    "lm-studio": "LM Studio",
    "ollama": "Ollama",
}
STATE_COLUMN = COLUMNS.index("State")
_NUMERIC = {COLUMNS.index(c) for c in ("Parameters", "Size", "Context")}
STATE_TEXT = {"loaded": "Loaded", "loading": "Loading…", "not-loaded": "Not loaded"}
ID_ROLE = Qt.ItemDataRole.UserRole


class LibraryTableModel(RowTableModel):
    """Rows are ``ModelStatus`` snapshots; the page replaces them after each core event."""

    columns = COLUMNS

    # -- content -------------------------------------------------------------------------------
    def set_statuses(self, statuses: Sequence[ModelStatus]) -> None:
        self._replace_rows(statuses)

    def status(self, row: int) -> ModelStatus:
        return self._rows[row]

    def row_of(self, model_id: str) -> int:
        """The row showing ``model_id``, or -1."""
        return next((i for i, s in enumerate(self._rows) if s.model.id == model_id), -1)

    def ids(self) -> list[str]:
        return [s.model.id for s in self._rows]

    def state_of(self, model_id: str) -> str | None:
        row = self.row_of(model_id)
        return self._rows[row].state if row >= 0 else None

    # -- QAbstractTableModel --------------------------------------------------------------------
    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        s = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(s, col)
        if role == ID_ROLE:
            return s.model.id
        if role == Qt.ItemDataRole.ToolTipRole:
            m = s.model
            lines = [m.name or m.id, m.path]
            if "vision" in m.capabilities:
                lines.append(f"Vision projector: {m.extra['projector']}")
            elif m.extra.get("projector_refused"):
                lines.append(f"No vision: {m.extra['projector_refused']}")
            if s.state == "loaded" and s.context_length:
                lines.append(f"Loaded with a {s.context_length:,}-token context ({s.runtime})")
            return "\n".join(lines)
        if role == Qt.ItemDataRole.TextAlignmentRole and col in _NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole and col == STATE_COLUMN and s.state == "loaded":
            return QColor("#1a7f37")
        return None

    @staticmethod
    def _display(s: ModelStatus, col: int) -> str:
        m = s.model
        values = (
            m.id,
            m.format.upper(),
            m.architecture or "",
            human_count(m.parameters),
            m.quantization or "",
            human_bytes(m.size_bytes),
            grouped(m.context_length),
            "Yes" if m.has_chat_template else "No",
            "Text, vision" if "vision" in m.capabilities else "Text",
            ORIGIN_TEXT.get(m.origin, m.origin),
            STATE_TEXT.get(s.state, s.state),
        )
        return values[col]
