"""LibraryTableModel: the models in the library, one row each, with their load state.
Tested by tests/gui/views/library/test_page.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor

from app.core.types import LocalModel, ModelStatus
from app.gui.models.base import RowTableModel
from app.gui.units import grouped, human_bytes, human_count

Index = QModelIndex | QPersistentModelIndex

# what a narrow window must show comes first (the rest scrolls into view)
COLUMNS: tuple[str, ...] = (
    "Model",
    # Chat, Chat + vision (a vision projector is paired), Embedding, Reranker, Speech to text
    "Type",
    "Size",
    "State",
    "Format",
    "Architecture",
    "Parameters",
    "Quantization",
    "Context",
    "Chat template",
    "Origin",
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


def type_text(m: LocalModel) -> str:
    """What the model is for, in the words of the Type column."""
    caps = m.capabilities
    if "transcription" in caps:
        return "Speech to text"
    if "embeddings" in caps:
        return "Embedding"
    if "chat" not in caps:
        return "Reranker"
    return "Chat + vision" if "vision" in caps else "Chat"


def matches(s: ModelStatus, text: str) -> bool:
    """Whether a search for ``text`` keeps this row: every word appears in its id, name,
    type, architecture, quantization, format or origin (case-insensitive)."""
    m = s.model
    hay = " ".join(
        str(v or "")
        for v in (
            m.id,
            m.name,
            type_text(m),
            m.architecture,
            m.quantization,
            m.format,
            ORIGIN_TEXT.get(m.origin, m.origin),
        )
    ).lower()
    return all(word in hay for word in text.lower().split())


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
            type_text(m),
            human_bytes(m.size_bytes),
            STATE_TEXT.get(s.state, s.state),
            m.format.upper(),
            m.architecture or "",
            human_count(m.parameters),
            m.quantization or "",
            grouped(m.context_length),
            "Yes" if m.has_chat_template else "No",
            ORIGIN_TEXT.get(m.origin, m.origin),
        )
        return values[col]
