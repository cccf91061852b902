"""The Discover page: search the Hugging Face Hub for GGUF (or, where this machine runs MLX,
MLX; or Whisper speech-to-text) repos, each with the size range of what it offers, inspect a repo's quantizations (size and
whether each fits this machine) and its model card, and queue a download. Every Hub call runs on
the service loop through the bridge."""

from __future__ import annotations

import asyncio
import concurrent.futures
import html
import logging
from dataclasses import replace
from typing import cast

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableView,
    QTextBrowser,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.hub import (
    HubClient,
    HubFormat,
    Listing,
    ModelOption,
    ModelSummary,
    RepoInfo,
    Sort,
    parse_ref,
)
from app.core.hub.downloads import DownloadManager, DownloadStatus
from app.core.library.formats import FORMATS as MODEL_FORMATS
from app.core.library.formats import GGUF, format_named
from app.core.service import Hearth
from app.errors import AccessDenied, HearthError
from app.gui.bridge import Bridge, log_failure
from app.gui.models.hub import COLUMNS, SearchResultsTableModel, access_text, fit_text
from app.gui.units import human_bytes
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title

log = logging.getLogger(__name__)

TITLE = "Discover"
SORTS: tuple[tuple[str, Sort], ...] = (
    ("Most downloads", "downloads"),
    ("Most likes", "likes"),
    ("Recently updated", "recent"),
)
FORMATS: tuple[tuple[str, HubFormat], ...] = tuple((f.label, f.name) for f in MODEL_FORMATS)
UNAVAILABLE_TEXT = "The Hugging Face Hub is not available in this session."
OPTION_ROLE = Qt.ItemDataRole.UserRole
SizeRange = tuple[int, int] | None


def mlx_available(service: Hearth) -> bool:
    """Whether this machine can run MLX models (imports mlx: call it off the GUI thread)."""
    runtime = service.runtimes.get("mlx")
    return runtime is not None and runtime.available()


VISION_BADGE = "vision"  # an option that comes with a vision projector (mmproj)
SPEECH_BADGE = "speech to text"  # a Whisper folder: audio in, text out


def option_label(info: RepoInfo, option: ModelOption) -> str:
    """A GGUF option by its quantization; an MLX option as the one folder it downloads as."""
    return format_named(option.format).option_label(info.id, option)


def gated_text(exc: AccessDenied) -> str:
    """Rich text for an access error, with the repo's page as a link where known."""
    text = html.escape(exc.message)
    if exc.url:
        url = html.escape(exc.url, quote=True)
        text += f" <a href='{url}'>Open the model page</a> to request access, then set your token in Settings."
    return text


class DiscoverPage(QWidget):
    """Search results on the left; the selected repo's quantizations and card on the right."""

    searched = Signal()  # results (or an error) are shown
    repo_shown = Signal(str)  # repo id; its options are listed
    card_shown = Signal(str)  # repo id
    download_queued = Signal(str)  # download id
    size_shown = Signal(str)  # repo id; its size range is known (or known to be unknown)
    formats_listed = Signal()  # the format choices match this machine's runtimes

    def __init__(self, service: Hearth, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self._repo_wanted: str | None = None  # drop late answers for repos no longer selected
        self._search_serial = 0
        self._sizes: dict[str, SizeRange] = {}  # repo id -> size range, once its files are read
        self._size_lookups: list[concurrent.futures.Future[SizeRange]] = []
        self.formats_known = False  # True once MLX is known to run here or not
        self.showing_cached = False  # the results are the last featured listing kept on disk
        self.repo: RepoInfo | None = None
        self.results_model = SearchResultsTableModel(self)

        self.search_edit = QLineEdit()
        self.format_combo = QComboBox()
        self.format_combo.addItem(*FORMATS[0])  # MLX joins once this machine is known to run it
        if service.runtimes.get("whisper") is not None:
            self.format_combo.addItem(*FORMATS[2])
        self.format_combo.setToolTip("Model format")
        self._update_placeholder()
        self.sort_combo = QComboBox()
        for label, key in SORTS:
            self.sort_combo.addItem(label, key)
        self.search_button = QPushButton("Search")
        # a search can take seconds on a slow network: say that it is under way
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)  # indeterminate
        self.busy.setMaximumWidth(90)
        self.busy.setTextVisible(False)
        self.busy_label = QLabel("Searching the Hub…")
        self.busy.hide()
        self.busy_label.hide()
        self.open_edit = QLineEdit()
        self.open_edit.setPlaceholderText("owner/name or a huggingface.co URL")
        self.open_button = QPushButton("Open")

        header = QHBoxLayout()
        header.addWidget(page_title(TITLE))
        header.addStretch(1)
        header.addWidget(self.busy_label)
        header.addWidget(self.busy)
        search_row = QHBoxLayout()
        search_row.addWidget(self.search_edit, 1)
        search_row.addWidget(self.format_combo)
        search_row.addWidget(self.sort_combo)
        search_row.addWidget(self.search_button)
        search_row.addSpacing(16)
        search_row.addWidget(QLabel("Go to:"))
        search_row.addWidget(self.open_edit)
        search_row.addWidget(self.open_button)

        self.banner = MessageBanner()
        self.banner.setTextFormat(Qt.TextFormat.RichText)
        self.banner.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse
            | Qt.TextInteractionFlag.LinksAccessibleByMouse
        )
        self.banner.setOpenExternalLinks(True)

        self.results = QTableView()
        self.results.setModel(self.results_model)
        self.results.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.results.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.results.setAlternatingRowColors(True)
        self.results.verticalHeader().hide()
        self.results.setShowGrid(False)
        self.results.setWordWrap(False)
        rh = self.results.horizontalHeader()
        rh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        rh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)

        self.repo_title = QLabel("Select a model to see its files.")
        self.repo_title.setWordWrap(True)
        self.repo_title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.options = QTreeWidget()
        self.options.setHeaderLabels(["Quantization", "Size", "Fit", "Input"])
        self.options.setRootIsDecorated(True)
        self.options.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.download_button = QPushButton("Download")
        self.download_button.setEnabled(False)
        self.card = QTextBrowser()
        self.card.setOpenExternalLinks(True)

        detail = QWidget()
        dl = QVBoxLayout(detail)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addWidget(self.repo_title)
        dl.addWidget(self.options, 2)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.download_button)
        dl.addLayout(row)
        dl.addWidget(self.card, 3)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.results)
        split.addWidget(detail)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(header)
        layout.addLayout(search_row)
        layout.addWidget(self.banner)
        layout.addWidget(split, 1)

        self.search_edit.returnPressed.connect(self._on_search_edit_return_pressed)
        self.search_button.clicked.connect(self._on_search_button_clicked)
        self.sort_combo.currentIndexChanged.connect(self._on_sort_combo_changed)
        self.format_combo.currentIndexChanged.connect(self._on_format_combo_changed)
        self.open_edit.returnPressed.connect(self._on_open_edit_return_pressed)
        self.open_button.clicked.connect(self._on_open_button_clicked)
        self.results.selectionModel().selectionChanged.connect(self._on_results_selection_changed)
        self.options.itemSelectionChanged.connect(self._on_options_selection_changed)
        self.download_button.clicked.connect(self._on_download_button_clicked)

        if self.manager is None:
            self.banner.show_message(UNAVAILABLE_TEXT, "notice")
            for w in (
                self.search_button,
                self.open_button,
                self.search_edit,
                self.open_edit,
                self.format_combo,
            ):
                w.setEnabled(False)
        else:
            self._bridge.run(
                asyncio.to_thread(mlx_available, service),
                self._on_mlx_checked,
                lambda exc: self._on_mlx_checked(False, exc),
            )

    # -- public --------------------------------------------------------------------------------------
    @property
    def manager(self) -> DownloadManager | None:
        return self._service.hub

    @property
    def hub(self) -> HubClient | None:
        dm = self.manager
        return dm.hub if dm is not None else None

    @property
    def sort(self) -> Sort:
        return cast(Sort, self.sort_combo.currentData())

    @property
    def format(self) -> HubFormat:
        return cast(HubFormat, self.format_combo.currentData())

    def formats(self) -> list[HubFormat]:
        """The format choices offered (MLX only where this machine runs it; Whisper where
        Hearth has its speech runtime)."""
        return [
            cast(HubFormat, self.format_combo.itemData(i)) for i in range(self.format_combo.count())
        ]

    def size_text(self, repo_id: str) -> str:
        """What the results list shows as a repo's size range."""
        row = self.results_model.row_of(repo_id)
        return self.results_model.index(row, COLUMNS.index("Size")).data() if row >= 0 else ""

    def search(self, query: str | None = None) -> None:
        hub = self.hub
        if hub is None:
            return
        if query is not None:
            self.search_edit.setText(query)
        self._search_serial += 1
        serial = self._search_serial
        self.banner.clear_message()
        self._set_busy(True)
        query = self.search_edit.text().strip()

        def listed(listing: Listing) -> None:
            if serial != self._search_serial:
                return
            if listing.cached_at is None:
                done(list(listing.results))
                return
            self._set_busy(False)
            self.showing_cached = True
            self.results_model.set_results(list(listing.results))
            when = listing.cached_at.astimezone().strftime("%Y-%m-%d %H:%M")
            self.banner.show_message(
                html.escape(
                    f"{listing.unreachable} Showing the featured models as of {when} (cached)."
                )
            )
            self.searched.emit()  # no size lookups: the Hub cannot be reached

        def done(results: list[ModelSummary]) -> None:
            if serial != self._search_serial:
                return
            self._set_busy(False)
            self.showing_cached = False
            known = [
                replace(r, size_range=self._sizes[r.id]) if r.id in self._sizes else r
                for r in results
            ]
            self.results_model.set_results(known)
            if not results:
                self.banner.show_message("No models match that search.", "notice")
            self.searched.emit()
            self._look_up_sizes([r.id for r in results if r.id not in self._sizes])

        def failed(exc: BaseException) -> None:
            if serial == self._search_serial:
                self._set_busy(False)
                self._show_error("search", exc)
                self.searched.emit()

        self._cancel_size_lookups()
        if query:
            self._bridge.run(hub.search(query, format=self.format, sort=self.sort), done, failed)
        else:  # the featured models: kept, so they can be shown when the Hub cannot be reached
            self._bridge.run(hub.featured(format=self.format, sort=self.sort), listed, failed)

    def open_repo(self, text: str) -> None:
        """Show a repo from an id or a Hub URL (a named quantization is selected when given)."""
        hub = self.hub
        if hub is None:
            return
        try:
            ref = parse_ref(text, endpoint=hub.endpoint)
        except HearthError as e:
            self.banner.show_message(html.escape(e.message), "error")
            return
        self.show_repo(ref.repo_id, select=ref.quant)

    def show_repo(self, repo_id: str, *, select: str | None = None) -> None:
        hub = self.hub
        if hub is None:
            return
        self._repo_wanted = repo_id
        self.repo = None
        self.options.clear()
        self.card.clear()
        self.download_button.setEnabled(False)
        self.repo_title.setText(f"<b>{html.escape(repo_id)}</b> — reading files…")
        self.banner.clear_message()

        def done(info: RepoInfo) -> None:
            if self._repo_wanted != repo_id:
                return
            self._fill_repo(info, select)
            self.repo_shown.emit(repo_id)
            self._load_card(info)

        def failed(exc: BaseException) -> None:
            if self._repo_wanted == repo_id:
                self.repo_title.setText(f"<b>{html.escape(repo_id)}</b>")
                self._show_error(repo_id, exc)
                self.repo_shown.emit(repo_id)

        self._bridge.run(hub.repo(repo_id), done, failed)

    def selected_option(self) -> ModelOption | None:
        items = self.options.selectedItems()
        if not items:
            return None
        item = items[0]
        while (up := item.parent()) is not None:
            item = up
        opt = item.data(0, OPTION_ROLE)
        return opt if isinstance(opt, ModelOption) else None

    def select_option(self, name: str) -> bool:
        for i in range(self.options.topLevelItemCount()):
            item = self.options.topLevelItem(i)
            opt = item.data(0, OPTION_ROLE) if item is not None else None
            if (
                item is not None
                and isinstance(opt, ModelOption)
                and opt.name.lower() == name.lower()
            ):
                self.options.setCurrentItem(item)
                return True
        return False

    def download_selected(self) -> None:
        dm, info, opt = self.manager, self.repo, self.selected_option()
        if dm is None or info is None or opt is None:
            return
        self.banner.clear_message()

        async def queue() -> DownloadStatus:
            plan = await dm.plan_for(info, opt)
            return await dm.start(plan)

        def done(status: DownloadStatus) -> None:
            self.banner.show_message(
                html.escape(f"Downloading {status.name} ({human_bytes(status.total_bytes)}).")
            )
            self.download_queued.emit(status.id)

        self._bridge.run(queue(), done, lambda exc: self._show_error(info.id, exc))

    # -- slots ---------------------------------------------------------------------------------------
    def _on_search_edit_return_pressed(self) -> None:
        self.search()

    def _on_search_button_clicked(self) -> None:
        self.search()

    def _on_sort_combo_changed(self, _index: int) -> None:
        if self.results_model.rowCount():
            self.search()

    def _on_format_combo_changed(self, _index: int) -> None:
        self._update_placeholder()
        if self.results_model.rowCount():
            self.search()

    def _on_mlx_checked(self, available: bool, exc: BaseException | None = None) -> None:
        if exc is not None:
            log.warning("cannot tell whether MLX runs here: %s", exc)
        if available and self.format_combo.findData("mlx") < 0:
            self.format_combo.insertItem(1, *FORMATS[1])
        self.formats_known = True
        self.formats_listed.emit()

    def _on_open_edit_return_pressed(self) -> None:
        self.open_repo(self.open_edit.text())

    def _on_open_button_clicked(self) -> None:
        self.open_repo(self.open_edit.text())

    def _on_results_selection_changed(self, *_: object) -> None:
        rows = self.results.selectionModel().selectedRows()
        if rows:
            self.show_repo(self.results_model.summary(rows[0].row()).id)

    def _on_download_button_clicked(self) -> None:
        self.download_selected()

    def _on_options_selection_changed(self) -> None:
        self.download_button.setEnabled(self.selected_option() is not None)

    # -- helpers -------------------------------------------------------------------------------------
    def _set_busy(self, busy: bool) -> None:
        self.busy.setVisible(busy)
        self.busy_label.setVisible(busy)

    def _update_placeholder(self) -> None:
        self.search_edit.setPlaceholderText(
            f"Search {self.format_combo.currentText()} models on Hugging Face…"
        )

    def _look_up_sizes(self, repo_ids: list[str]) -> None:
        """Read each listed repo's files in the background (the core runs a few at a time) and
        show its size range as it arrives; a new search cancels what is still pending."""
        hub = self.hub
        if hub is None:
            return
        for repo_id in repo_ids:

            def done(size_range: SizeRange, repo_id: str = repo_id) -> None:
                self._show_size(repo_id, size_range)

            def failed(exc: BaseException, repo_id: str = repo_id) -> None:
                log_failure(log, f"{repo_id} size range", exc)
                self.size_shown.emit(repo_id)  # stays "—"; selecting the repo tries again

            self._size_lookups.append(self._bridge.run(hub.repo_size_range(repo_id), done, failed))

    def _cancel_size_lookups(self) -> None:
        for f in self._size_lookups:
            f.cancel()
        self._size_lookups.clear()

    def _show_size(self, repo_id: str, size_range: SizeRange) -> None:
        self._sizes[repo_id] = size_range
        self.results_model.set_size_range(repo_id, size_range)
        self.size_shown.emit(repo_id)

    def _fill_repo(self, info: RepoInfo, select: str | None) -> None:
        self.repo = info
        self._show_size(info.id, info.size_range)
        access = access_text(info.gated, info.private)
        bits = [f"<b>{html.escape(info.id)}</b>"]
        if info.license:
            bits.append(html.escape(info.license))
        if access:
            bits.append(access)
        bits.append(f"<a href='{html.escape(info.url, quote=True)}'>Hub page</a>")
        self.repo_title.setText(" · ".join(bits))
        self.repo_title.setOpenExternalLinks(True)
        self.options.clear()
        heading = format_named(info.format).option_heading if info.format else GGUF.option_heading
        self.options.setHeaderLabels([heading, "Size", "Fit", "Input"])
        for opt in info.options:
            label = option_label(info, opt)
            badge = (
                VISION_BADGE if opt.projector else SPEECH_BADGE if opt.format == "whisper" else ""
            )
            item = QTreeWidgetItem([label, human_bytes(opt.size_bytes), fit_text(opt), badge])
            item.setData(0, OPTION_ROLE, opt)
            if opt.estimate is not None:
                item.setToolTip(2, f"Needs about {human_bytes(opt.estimate.total)}")
            elif opt.fit_error:
                item.setToolTip(2, opt.fit_error)
            for f in opt.files:
                child = QTreeWidgetItem([f.path, human_bytes(f.size), "", ""])
                item.addChild(child)
            if opt.projector is not None:  # fetched with the model: size and fit include it
                p = opt.projector
                item.setToolTip(
                    1,
                    f"{human_bytes(opt.model_bytes)} model + {human_bytes(p.size)} vision "
                    "projector",
                )
                item.setToolTip(3, f"Takes images: the vision projector {p.path} comes with it")
                item.addChild(
                    QTreeWidgetItem([p.path, human_bytes(p.size), "", "vision projector"])
                )
            self.options.addTopLevelItem(item)
        if info.refused:
            self.banner.show_message(
                html.escape(f"Hearth will not download this: {info.refused}"), "error"
            )
        elif not info.options:
            self.banner.show_message(
                "This repo has no GGUF, MLX or Whisper files Hearth can use.", "notice"
            )
        if select:
            self.select_option(select)
        elif (first := self.options.topLevelItem(0)) is not None:
            self.options.setCurrentItem(first)

    def _load_card(self, info: RepoInfo) -> None:
        hub = self.hub
        if hub is None:
            return

        def done(text: str) -> None:
            if self._repo_wanted == info.id:
                self.card.setMarkdown(text or "_This repo has no model card._")
                self.card_shown.emit(info.id)

        def failed(exc: BaseException) -> None:
            if self._repo_wanted == info.id:
                self.card.setPlainText(
                    f"The model card could not be read: {log_failure(log, 'model card', exc)}"
                )
                self.card_shown.emit(info.id)

        self._bridge.run(hub.model_card(info.id, revision=info.revision), done, failed)

    def _show_error(self, what: str, exc: BaseException) -> None:
        text = log_failure(log, what, exc)
        if isinstance(exc, AccessDenied):
            self.banner.show_message(gated_text(exc), "error")
        else:
            self.banner.show_message(html.escape(text), "error")
