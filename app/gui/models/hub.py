"""Hub search results as a table (SearchResultsTableModel) and the words the Discover page uses
for access markers and fit verdicts.
Tested by tests/gui/views/test_discover.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt

from app.core.hub import ModelOption, ModelSummary
from app.gui.models.base import RowTableModel
from app.gui.units import grouped, human_byte_range

Index = QModelIndex | QPersistentModelIndex

COLUMNS: tuple[str, ...] = (
    "Repository",
    "Author",
    "Size",
    "Downloads",
    "Likes",
    "Updated",
    "License",
    "Access",
)
_NUMERIC = {COLUMNS.index(c) for c in ("Size", "Downloads", "Likes")}
ID_ROLE = Qt.ItemDataRole.UserRole
FIT_TEXT = {"fits-gpu": "Fits GPU", "fits-ram": "Fits RAM", "too-large": "Too large"}
UNKNOWN_SIZE = "—"  # until the repo's files are read


def size_range_text(size_range: tuple[int, int] | None) -> str:
    """``"1.2–7.7 GiB"``: the smallest and largest download a repo offers, or ``"—"``."""
    return human_byte_range(*size_range) if size_range else UNKNOWN_SIZE


def access_text(gated: bool | str, private: bool) -> str:
    """``"Gated"``, ``"Private"`` or empty (open)."""
    if private:
        return "Private"
    if gated:
        return "Gated"
    return ""


def fit_text(option: ModelOption) -> str:
    """The verdict in words, or why there is none."""
    if option.fit is not None:
        return FIT_TEXT.get(option.fit, option.fit)
    if option.fit_error:
        return "Unknown"
    return ""


class SearchResultsTableModel(RowTableModel):
    """Rows are ``ModelSummary`` values from one search."""

    columns = COLUMNS

    def set_results(self, results: Sequence[ModelSummary]) -> None:
        self._replace_rows(results)

    def summary(self, row: int) -> ModelSummary:
        return self._rows[row]

    def ids(self) -> list[str]:
        return [s.id for s in self._rows]

    def row_of(self, repo_id: str) -> int:
        return next((i for i, s in enumerate(self._rows) if s.id == repo_id), -1)

    def set_size_range(self, repo_id: str, size_range: tuple[int, int] | None) -> None:
        """Show a repo's size range once its files are read (its row, if still listed)."""
        row = self.row_of(repo_id)
        if row < 0 or self._rows[row].size_range == size_range:
            return
        self._rows[row] = replace(self._rows[row], size_range=size_range)
        cell = self.index(row, COLUMNS.index("Size"))
        self.dataChanged.emit(cell, cell, [Qt.ItemDataRole.DisplayRole])

    # -- QAbstractTableModel --------------------------------------------------------------------
    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        s = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(s, col)
        if role == ID_ROLE:
            return s.id
        if role == Qt.ItemDataRole.TextAlignmentRole and col in _NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole and s.tags:
            return ", ".join(s.tags[:20])
        return None

    @staticmethod
    def _display(s: ModelSummary, col: int) -> str:
        name = COLUMNS[col]
        if name == "Repository":
            return s.id
        if name == "Author":
            return s.author or ""
        if name == "Size":
            return size_range_text(s.size_range)
        if name == "Downloads":
            return grouped(s.downloads) or "0"
        if name == "Likes":
            return grouped(s.likes) or "0"
        if name == "Updated":
            return s.last_modified.date().isoformat() if s.last_modified else ""
        if name == "License":
            return s.license or ""
        return access_text(s.gated, s.private)
