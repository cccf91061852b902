"""The Library page: the models on this machine, their metadata and load state."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from PySide6.QtCore import QEvent, QItemSelectionModel, QMimeData, QObject, QPoint, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QPushButton,
    QStackedWidget,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.core.service import Hearth
from app.core.types import LocalModel, ModelStatus
from app.gui.bridge import Bridge, log_failure
from app.gui.library_watch import LibraryWatch
from app.gui.models.library import LibraryTableModel, matches
from app.gui.units import grouped
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title
from app.gui.views.copied import copy_text
from app.gui.views.library.load_dialog import LoadDialog
from app.gui.views.library.welcome import WelcomeView

log = logging.getLogger(__name__)

LOAD_TIP = "Choose the context length and other options, then load"
RELOAD_TIP = "Reload with options: change the context length or other options of the loaded model"
MODEL_MIN_WIDTH = 220  # px: the Model column's least width (ids elide beyond it)

EMPTY_TEXT = (
    "<h2>No models yet</h2>"
    "<p>Import a <b>.gguf</b> file (button below, or drop it on this window),<br>"
    "or run <code>hearth import PATH</code> in a terminal.</p>"
    "<p style='color:#666'>GGUF files copied into<br><code>{folder}</code><br>show up here too.</p>"
)

IMPORT_HINT = (
    "Or import a <b>.gguf</b> file you have (the button above, or drop it on this window), or run "
    "<code>hearth import PATH</code> in a terminal. GGUF files copied into <code>{folder}</code> "
    "show up here too."
)


def gguf_paths(mime: QMimeData) -> list[str]:
    """The local ``.gguf`` files in a drag-and-drop payload (other files are ignored)."""
    if not mime.hasUrls():
        return []
    out = []
    for url in mime.urls():
        if url.isLocalFile() and url.toLocalFile().lower().endswith(".gguf"):
            out.append(url.toLocalFile())
    return out


class LibraryPage(QWidget):
    """Lists the library; imports, loads, unloads and removes models through the service."""

    refreshed = Signal()  # the table shows a fresh snapshot
    model_imported = Signal(str, bool)  # model id, newly added

    def __init__(self, service: Hearth, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self._select_after_refresh: str | None = None
        self._welcome: WelcomeView | None = None
        self._listed = False  # the library has been read at least once
        self.load_dialog: LoadDialog | None = None  # the open Load dialog, if any
        self.table_model = LibraryTableModel(self)
        # changes made outside this window (CLI imports, copied files) arrive as library_changed
        self.watch = LibraryWatch(service, bridge, self)

        self.import_button = QPushButton("Import GGUF…")
        self.load_button = QPushButton("Load…")
        self.load_button.setToolTip(LOAD_TIP)
        self.unload_button = QPushButton("Unload")
        self.remove_button = QPushButton("Remove")
        self.scan_button = QPushButton("Find other apps' models")
        self.scan_button.setToolTip(
            "Index, in place, the GGUF and MLX models of the Hugging Face cache, LM Studio and Ollama"
        )
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search models")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.setMaximumWidth(320)
        header = QHBoxLayout()
        header.addWidget(page_title("Library"))
        header.addStretch(1)
        for b in (
            self.scan_button,
            self.import_button,
            self.load_button,
            self.unload_button,
            self.remove_button,
        ):
            header.addWidget(b)

        self.banner = MessageBanner()

        self.table = QTableView()
        self.table.setModel(self.table_model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.setShowGrid(False)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # the Model column takes the spare width but never less than MODEL_MIN_WIDTH: in a
        # narrow window Type, Size and State stay in view and the rest scrolls
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        hh.setStretchLastSection(False)
        self.table.installEventFilter(self)
        hh.sectionResized.connect(self._on_header_section_resized)
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._on_table_context_menu_requested)

        self.empty_label = QLabel(EMPTY_TEXT.format(folder=service.models.folder))
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setWordWrap(True)
        self.empty_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.empty_import_button = QPushButton("Import a GGUF file…")
        empty = QWidget()
        self._empty_layout = ev = QVBoxLayout(empty)
        ev.addStretch(1)
        ev.addWidget(self.empty_label)
        ev.addWidget(self.empty_import_button, 0, Qt.AlignmentFlag.AlignHCenter)
        ev.addStretch(2)

        table_box = QWidget()  # the search box over the table: the header row is full
        tl = QVBoxLayout(table_box)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.search_edit)
        tl.addWidget(self.table, 1)
        self.content = QStackedWidget()
        self.content.addWidget(empty)
        self.content.addWidget(table_box)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(header)
        layout.addWidget(self.banner)
        layout.addWidget(self.content, 1)

        self.import_button.clicked.connect(self._on_import_button_clicked)
        self.empty_import_button.clicked.connect(self._on_import_button_clicked)
        self.load_button.clicked.connect(self._on_load_button_clicked)
        self.unload_button.clicked.connect(self._on_unload_button_clicked)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        self.scan_button.clicked.connect(self._on_scan_button_clicked)
        self.table.selectionModel().selectionChanged.connect(self._on_table_selection_changed)
        self.table.doubleClicked.connect(self._on_table_double_clicked)
        self.search_edit.textChanged.connect(self._on_search_edit_text_changed)
        bridge.library_changed.connect(self.refresh)
        bridge.model_loading.connect(self._on_bridge_model_changed)
        bridge.model_loaded.connect(self._on_bridge_model_changed)
        bridge.model_unloaded.connect(self._on_bridge_model_changed)
        bridge.model_load_failed.connect(self._on_bridge_model_load_failed)
        self._update_buttons()
        self.refresh()

    # -- what the user sees ------------------------------------------------------------------------
    @property
    def showing_empty_message(self) -> bool:
        return self.content.currentIndex() == 0

    def use_welcome(self, welcome: WelcomeView) -> None:
        """Show the first-run welcome while the library is empty, with this page's import hint
        and button in it; it looks up its suggestions once the library is known to be empty."""
        layout = self._empty_layout
        while layout.takeAt(0) is not None:  # the plain text, its button and stretches
            pass
        self.empty_label.setText(IMPORT_HINT.format(folder=self._service.models.folder))
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignLeft)
        welcome.place_import(self.empty_label, self.empty_import_button)
        layout.addWidget(welcome)
        self._welcome = welcome
        if self._listed and not self.table_model.rowCount():
            welcome.load_suggestions()

    def selected_id(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self.table_model.status(rows[0].row()).model.id

    def select(self, model_id: str) -> None:
        row = self.table_model.row_of(model_id)
        if row < 0:
            return
        flags = (
            QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows
        )
        self.table.selectionModel().select(self.table_model.index(row, 0), flags)
        self.table.scrollTo(self.table_model.index(row, 0))

    def visible_ids(self) -> list[str]:
        """The ids of the rows the search leaves in view, in order."""
        return [
            mid for row, mid in enumerate(self.table_model.ids()) if not self.table.isRowHidden(row)
        ]

    def apply_search(self) -> None:
        """Hide the rows the search box's words do not all match."""
        text = self.search_edit.text()
        for row in range(self.table_model.rowCount()):
            self.table.setRowHidden(row, not matches(self.table_model.status(row), text))

    def context_menu(self, model_id: str) -> QMenu:
        """The actions on one model, as its right-click menu offers them."""
        state = self.table_model.state_of(model_id)
        menu = QMenu(self)
        actions = (
            ("Load…", state == "not-loaded", partial(self.open_load_dialog, model_id)),
            ("Reload with options…", state == "loaded", partial(self.open_load_dialog, model_id)),
            ("Eject", state == "loaded", partial(self.unload_model, model_id)),
            ("Show in folder", True, partial(self.show_in_folder, model_id)),
            ("Copy model id", True, partial(self.copy_id, model_id)),
            ("Remove…", state != "loading", partial(self._confirm_remove, model_id)),
        )
        for text, enabled, slot in actions:
            action = menu.addAction(text)
            action.setEnabled(enabled)
            action.triggered.connect(slot)
        return menu

    def copy_id(self, model_id: str) -> None:
        copy_text(model_id)
        self.banner.show_message(f"Copied {model_id}.")

    def show_in_folder(self, model_id: str) -> None:
        """Open the folder holding the model's file in the system's file manager."""
        row = self.table_model.row_of(model_id)
        if row < 0:
            return
        path = Path(self.table_model.status(row).model.path)
        folder = path if path.is_dir() else path.parent
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    # -- actions -------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the library and load states (on the loop thread)."""
        self._bridge.call(
            self._service.models.all, on_done=self._on_models_listed, on_error=self._show_error
        )

    def import_files(self, paths: Sequence[str]) -> None:
        """Add GGUF files to the library in place (what the file dialog and a drop call)."""
        for p in paths:
            self._bridge.call(
                self._service.models.import_path,
                p,
                on_done=self._on_import_done,
                on_error=partial(self._on_import_failed, p),
            )

    def load_model(self, model_id: str) -> None:
        """Load with the preset/defaults at once (no dialog)."""
        self.banner.clear_message()
        self._bridge.run(self._service.models.load(model_id), on_error=self._show_error)

    def open_load_dialog(self, model_id: str) -> LoadDialog | None:
        """Show the Load dialog for ``model_id`` (its Load button loads with what it shows)."""
        row = self.table_model.row_of(model_id)
        if row < 0:
            return None
        self.banner.clear_message()
        dialog = LoadDialog(self._service, self._bridge, self.table_model.status(row).model, self)
        dialog.load_finished.connect(self._on_load_dialog_load_finished)
        dialog.finished.connect(self._on_load_dialog_finished)
        self.load_dialog = dialog
        dialog.open()
        return dialog

    def unload_model(self, model_id: str) -> None:
        self.banner.clear_message()
        self._bridge.run(self._service.models.unload(model_id), on_error=self._show_error)

    def remove_model(self, model_id: str, *, delete_file: bool = False) -> None:
        self.banner.clear_message()
        self._bridge.run(
            self._service.models.remove(model_id, delete_file=delete_file),
            on_done=self._on_remove_done,
            on_error=self._show_error,
        )

    def scan_other_apps(self) -> None:
        """Index the Hugging Face cache, LM Studio and Ollama models in place."""
        self.banner.clear_message()
        self._bridge.run(
            self._service.models.scan_foreign(),
            on_done=self._on_scan_done,
            on_error=self._show_error,
        )

    def _on_scan_done(self, added: list[LocalModel]) -> None:
        if added:
            self.banner.show_message(
                f"Found {len(added)} model(s) from other apps (indexed in place, nothing copied)."
            )
        else:
            self.banner.show_message(
                "No new models found in the Hugging Face cache, LM Studio or Ollama."
            )
        self.refresh()

    def _on_scan_button_clicked(self) -> None:
        self.scan_other_apps()

    # -- slots ---------------------------------------------------------------------------------------
    def _on_import_button_clicked(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Import models", str(Path.home()), "GGUF models (*.gguf);;All files (*)"
        )
        if paths:
            self.import_files(paths)

    def _on_load_button_clicked(self) -> None:
        if mid := self.selected_id():
            self.open_load_dialog(mid)

    def _on_table_double_clicked(self, *_: object) -> None:
        mid = self.selected_id()
        if mid and self.table_model.state_of(mid) == "not-loaded":
            self.open_load_dialog(mid)

    def _on_load_dialog_load_finished(self, model_id: str, context_length: int) -> None:
        self.banner.show_message(
            f"Loaded {model_id} with a {grouped(context_length)}-token context."
        )

    def _on_load_dialog_finished(self, _result: int) -> None:
        if self.sender() is self.load_dialog:
            self.load_dialog = None

    def _on_unload_button_clicked(self) -> None:
        if mid := self.selected_id():
            self.unload_model(mid)

    def _on_remove_button_clicked(self) -> None:
        if mid := self.selected_id():
            self._confirm_remove(mid)

    def _confirm_remove(self, mid: str) -> None:
        model = self.table_model.status(self.table_model.row_of(mid)).model
        if model.origin in ("huggingface-cache", "lm-studio", "ollama"):
            # another app's file: forgetting it is the default; deleting needs an explicit yes
            box = QMessageBox(self)
            box.setWindowTitle("Remove model")
            box.setText(f"{mid} belongs to another app ({model.origin}):\n{model.path}")
            forget = box.addButton("Remove from Hearth only", QMessageBox.ButtonRole.AcceptRole)
            delete = box.addButton("Also delete the file", QMessageBox.ButtonRole.DestructiveRole)
            box.addButton(QMessageBox.StandardButton.Cancel)
            box.exec()
            if box.clickedButton() is forget:
                self.remove_model(mid)
            elif box.clickedButton() is delete:
                self.remove_model(mid, delete_file=True)
            return
        detail = (
            "Its file in Hearth's models folder will be deleted."
            if model.owned
            else f"The file stays where it is:\n{model.path}"
        )
        answer = QMessageBox.question(
            self, "Remove model", f"Remove {mid} from the library?\n\n{detail}"
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.remove_model(mid)

    def _on_search_edit_text_changed(self, _text: str) -> None:
        self.apply_search()

    def _on_table_context_menu_requested(self, pos: QPoint) -> None:
        index = self.table.indexAt(pos)
        if not index.isValid():
            return
        mid = self.table_model.status(index.row()).model.id
        self.select(mid)
        self.context_menu(mid).exec(self.table.viewport().mapToGlobal(pos))

    def _on_header_section_resized(self, index: int, _old: int, _new: int) -> None:
        if index != 0:  # another column grew or shrank with its contents: refit the Model one
            self._fit_model_column()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.table and event.type() == QEvent.Type.Resize:
            self._fit_model_column()
        return super().eventFilter(watched, event)

    def _fit_model_column(self) -> None:
        hh = self.table.horizontalHeader()
        others = sum(hh.sectionSize(c) for c in range(1, hh.count()))
        spare = self.table.viewport().width() - others
        hh.resizeSection(0, max(MODEL_MIN_WIDTH, spare))

    def _on_table_selection_changed(self, *_: object) -> None:
        self._update_buttons()

    def _on_bridge_model_changed(self, *_: object) -> None:
        self.refresh()

    def _on_bridge_model_load_failed(self, model_id: str, message: str) -> None:
        self._show_error(f"Could not load {model_id}: {message}")
        self.refresh()

    def _on_models_listed(self, statuses: list[ModelStatus]) -> None:
        keep = self._select_after_refresh or self.selected_id()
        self._select_after_refresh = None
        self.table_model.set_statuses(statuses)
        self.content.setCurrentIndex(1 if statuses else 0)
        self.apply_search()
        self._fit_model_column()
        self._listed = True
        if self._welcome is not None and not statuses:
            self._welcome.load_suggestions()
        if keep:
            self.select(keep)
        self._update_buttons()
        self.refreshed.emit()

    def _on_import_done(self, result: tuple[LocalModel, bool]) -> None:
        model, created = result
        if created:
            self.banner.show_message(f"Imported {model.id}.")
        else:
            self.banner.show_message(f"{model.id} is already in the library.")
        self._select_after_refresh = model.id
        self.refresh()  # an existing model publishes no event; refresh to select it anyway
        self.model_imported.emit(model.id, created)

    def _on_import_failed(self, path: str, exc: BaseException) -> None:
        text = log_failure(log, f"import of {path} failed", exc)
        self._show_error(f"Could not import {Path(path).name}: {text}")

    def _on_remove_done(self, result: tuple[LocalModel, bool]) -> None:
        model, deleted = result
        self.banner.show_message(
            f"Removed {model.id}" + (" and deleted its file." if deleted else ".")
        )

    def _show_error(self, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else log_failure(log, "library action failed", error)
        self.banner.show_message(text, "error")

    def _update_buttons(self) -> None:
        mid = self.selected_id()
        state = self.table_model.state_of(mid) if mid else None
        self.load_button.setEnabled(state in ("not-loaded", "loaded"))
        # a loaded model reloads with the options the dialog shows (its own, prefilled); the
        # short text keeps the header row within the narrowest window
        loaded = state == "loaded"
        self.load_button.setText("Reload…" if loaded else "Load…")
        self.load_button.setToolTip(RELOAD_TIP if loaded else LOAD_TIP)
        self.unload_button.setEnabled(state == "loaded")
        self.remove_button.setEnabled(mid is not None and state != "loading")
