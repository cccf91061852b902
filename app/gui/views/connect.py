"""The Connect page ("connect an app"): ready settings for Continue, Cline, Zed, Open
WebUI, Claude Code, Codex, openai-python and LangChain, from app/core/desktop/connect.py (the same as
``hearth connect TOOL``). It shows the base URL, key, environment and a snippet to copy, warns
when the model's context is too small for the tool and can save a larger one in its preset.

Nothing here writes another app's files: the user pastes the snippet. Everything the page reads
(settings, library, presets, keys) is read on the loop thread through the bridge.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QPalette, QShowEvent
from PySide6.QtWidgets import (
    QAbstractButton,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core.desktop.connect import (
    KEY_PLACEHOLDER,
    TOOLS,
    Connection,
    ContextCheck,
    Target,
    check_context,
    check_fim,
    connection,
    effective_context,
    known_capabilities,
    pick_model,
    with_context,
)
from app.core.gateway.keys import KeyStore
from app.errors import AlreadyExists
from app.gui.bridge import Bridge, log_failure
from app.gui.context import GuiContext
from app.gui.theme import pick, theme_signals
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title
from app.gui.views.copied import copy_text
from app.server.runner import planned_url
from app.settings import Settings, generate_key

log = logging.getLogger(__name__)

TITLE = "Connect"
NO_MODEL = "<model id>"  # in the snippets while the library has no model
NO_MODEL_TEXT = "No model yet: import or download one on the Library page."


@dataclass(frozen=True, slots=True)
class ConnectState:
    """What the page shows, gathered on the loop thread for one tool and model."""

    root: str  # the server's URL without /v1
    running: bool
    key_required: bool
    models: tuple[str, ...]  # the library's models, then the aliases
    model: str | None
    conn: Connection
    check: ContextCheck
    local: bool  # a library model: its preset can take a larger context
    loaded: bool
    preset_context: int | None = None  # the context_length in the model's preset
    fim: ContextCheck = ContextCheck(True)  # autocomplete: the model fills in the middle

    @property
    def needs_reload(self) -> bool:
        """Loaded with too small a context while its preset already holds enough."""
        need = self.conn.context_needed
        return self.loaded and not self.check.ok and (self.preset_context or 0) >= need


def export_lines(env: dict[str, str]) -> str:
    """The environment as shell ``export`` lines (quoted), one per variable."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


class ConnectPage(QWidget):
    state_shown = Signal(object)  # ConnectState: the page shows it now
    context_saved = Signal(str, int)  # model id, the context now in its preset
    key_created = Signal(str)  # the new key's name (its secret is in the snippet, this once)

    def __init__(self, ctx: GuiContext, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._ctx = ctx
        self._bridge = bridge
        self._keys = KeyStore(ctx.paths.keys_file)
        self._secret: tuple[str, str] | None = None  # (tool, secret): a key made here, shown once
        self.state: ConnectState | None = None
        self._asked = 0  # refreshes asked for; only the latest one's answer is shown
        self._answered = 0

        self.tool_combo = QComboBox()
        for name, tool in TOOLS.items():
            self.tool_combo.addItem(tool.title, name)
        self.model_combo = QComboBox()
        self.model_combo.setMinimumContentsLength(24)
        self.url_edit = QLineEdit()
        self.url_edit.setReadOnly(True)
        self.server_label = QLabel()
        self.server_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.key_label = QLabel()
        self.key_label.setWordWrap(True)
        self.key_label.setTextFormat(Qt.TextFormat.PlainText)
        self.create_key_button = QPushButton("Create a key for this app")
        self.create_key_button.setToolTip(
            "Adds a named key (Server page › API keys); its secret is shown here once"
        )
        self.context_label = QLabel()
        self.warning_label = QLabel()
        self.warning_label.setWordWrap(True)
        self._style_warning()
        theme_signals().changed.connect(self._style_warning)  # readable red on either theme
        self.set_context_button = QPushButton()
        self.reload_button = QPushButton()
        self.snippet_edit = QPlainTextEdit()
        self.snippet_edit.setReadOnly(True)
        self.snippet_edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.snippet_edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.snippet_edit.setMinimumHeight(120)
        self.copy_button = QPushButton("Copy")
        self.snippet_label = QLabel("Settings to paste")
        self.env_label = QLabel("Environment variables")
        self.env_list = QListWidget()
        self.env_list.setFont(self.snippet_edit.font())
        self.env_list.setMinimumHeight(60)
        self.copy_env_button = QPushButton("Copy line")
        self.copy_exports_button = QPushButton("Copy all as export lines")
        self.notes_label = QLabel()
        self.notes_label.setWordWrap(True)
        # top: with no environment section the notes take the column and stay under its head
        self.notes_label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.banner = MessageBanner()
        self._build_layout()

        self.tool_combo.currentIndexChanged.connect(self._on_tool_combo_changed)
        self.model_combo.activated.connect(self._on_model_combo_activated)
        self.create_key_button.clicked.connect(self._on_create_key_button_clicked)
        self.set_context_button.clicked.connect(self._on_set_context_button_clicked)
        self.reload_button.clicked.connect(self._on_reload_button_clicked)
        self.copy_button.clicked.connect(self.copy_snippet)
        self.copy_env_button.clicked.connect(self._on_copy_env_button_clicked)
        self.copy_exports_button.clicked.connect(self.copy_exports)
        self.env_list.itemDoubleClicked.connect(lambda item: self._copy(item.text(), "line"))
        for sig in (bridge.server_started, bridge.server_stopped, bridge.library_changed):
            sig.connect(self.refresh)
        bridge.model_loaded.connect(self.refresh)
        bridge.model_unloaded.connect(self.refresh)
        self.set_context_button.hide()
        self.reload_button.hide()
        self.refresh()

    def _build_layout(self) -> None:
        key_row = QHBoxLayout()
        key_row.addWidget(self.key_label, 1)
        key_row.addWidget(self.create_key_button)
        url_row = QHBoxLayout()
        url_row.addWidget(self.url_edit, 1)
        url_row.addWidget(self.server_label)
        form = QFormLayout()
        form.addRow("App", self.tool_combo)
        form.addRow("Model", self.model_combo)
        form.addRow("Base URL", url_row)
        form.addRow("API key", key_row)
        form.addRow("Context", self.context_label)
        warn_row = QHBoxLayout()
        warn_row.addWidget(self.warning_label, 1)
        warn_row.addWidget(self.set_context_button)
        warn_row.addWidget(self.reload_button)

        snippet_head = QHBoxLayout()
        snippet_head.addWidget(self.snippet_label)
        snippet_head.addStretch(1)
        snippet_head.addWidget(self.copy_button)
        left = QVBoxLayout()
        left.addLayout(snippet_head)
        left.addWidget(self.snippet_edit, 1)
        env_buttons = QHBoxLayout()
        env_buttons.addWidget(self.copy_env_button)
        env_buttons.addWidget(self.copy_exports_button)
        right = QVBoxLayout()
        right.addWidget(self.env_label)
        right.addWidget(self.env_list, 1)
        right.addLayout(env_buttons)
        right.addWidget(self.notes_label)
        body = QHBoxLayout()
        body.addLayout(left, 3)
        body.addLayout(right, 2)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addWidget(page_title("Connect an app"))
        layout.addWidget(self.banner)
        layout.addLayout(form)
        layout.addLayout(warn_row)
        layout.addLayout(body, 1)

    # -- public --------------------------------------------------------------------------------
    @property
    def tool(self) -> str:
        return str(self.tool_combo.currentData())

    def select_tool(self, tool: str) -> None:
        self.tool_combo.setCurrentIndex(max(0, self.tool_combo.findData(tool)))

    def select_model(self, model_id: str) -> None:
        i = self.model_combo.findData(model_id)
        if i >= 0:
            self.model_combo.setCurrentIndex(i)
            self.refresh()

    def refresh(self, *_: object) -> None:
        """Gather the settings again (on the loop thread) and show them."""
        tool, asked = self.tool, self.model_combo.currentData()
        secret = self._secret[1] if self._secret and self._secret[0] == tool else None
        self._asked += 1
        n = self._asked

        def answered(st: ConnectState) -> None:
            self._answered = max(self._answered, n)
            if n == self._asked:
                self._show(st)

        def failed(exc: BaseException) -> None:
            self._answered = max(self._answered, n)
            self._failed(exc)

        self._bridge.call(self._gather, tool, asked, secret, on_done=answered, on_error=failed)

    @property
    def pending(self) -> bool:
        """A refresh is under way: what the page shows may be about to change."""
        return self._answered < self._asked

    def copy_snippet(self) -> None:
        self._copy(self.snippet_edit.toPlainText(), "settings", self.copy_button)

    def copy_exports(self) -> None:
        if self.state is not None and self.state.conn.env:
            self._copy(export_lines(self.state.conn.env), "export lines", self.copy_exports_button)

    def create_key(self) -> None:
        """Add a named key for this app; its secret goes into the snippet, shown this once."""
        tool, secret = self.tool, generate_key()

        def add() -> str:
            for n in range(1, 100):
                name = tool if n == 1 else f"{tool}-{n}"
                try:
                    self._keys.add(name, secret)
                    return name
                except AlreadyExists:
                    continue
            raise AlreadyExists(f"keys named '{tool}' … '{tool}-99' exist: remove some")

        def added(name: str) -> None:
            self._secret = (tool, secret)
            self.banner.show_message(
                f"Created the key '{name}': it is in the settings below this once. Copy it now; "
                "Hearth keeps only its hash.",
                "notice",
            )
            self.key_created.emit(name)
            self.refresh()

        self._bridge.call(add, on_done=added, on_error=self._failed)

    def raise_context(self) -> None:
        """Save the tool's context in the model's preset (the service's save_preset)."""
        st = self.state
        if st is None or st.model is None or not st.local:
            return
        service, mid, needed = self._ctx.service, st.model, st.conn.context_needed

        def save() -> int:
            service.models.save_preset(mid, with_context(service.models.preset(mid), needed))
            return needed

        def saved(n: int) -> None:
            if st.loaded:
                self.banner.show_message(
                    f"Saved: '{mid}' loads with {n:,} tokens. It is loaded with less now: "
                    "reload it to use them.",
                    "notice",
                )
            else:
                self.banner.show_message(f"Saved: '{mid}' loads with {n:,} tokens of context.")
            self.context_saved.emit(mid, n)
            self.refresh()

        self._bridge.call(save, on_done=saved, on_error=self._failed)

    def reload_model(self) -> None:
        st = self.state
        if st is None or st.model is None:
            return
        mid = st.model
        self.reload_button.setEnabled(False)
        self.banner.show_message(f"Reloading {mid}…", "notice")

        def done(_: object) -> None:
            self.reload_button.setEnabled(True)
            self.banner.show_message(f"Reloaded {mid}.")
            self.refresh()

        def failed(exc: BaseException) -> None:
            self.reload_button.setEnabled(True)
            self._failed(exc)

        # {}: the preset and defaults, resolved afresh: the new context reloads the model
        self._bridge.run(
            self._ctx.service.models.load(mid, {}, wait=True), on_done=done, on_error=failed
        )

    # -- loop thread ---------------------------------------------------------------------------
    def _gather(self, tool: str, asked: object, secret: str | None) -> ConnectState:
        service, server = self._ctx.service, self._ctx.server
        settings = self._ctx.settings_store.load()
        statuses = service.models.all()
        models = [s.model.id for s in statuses] + list(service.routing.aliases())
        model = asked if isinstance(asked, str) and asked in models else None
        capability = "fim" if TOOLS[tool].fim else "chat"
        model = model or pick_model(settings.default_model, (s.model for s in statuses), capability)
        if model and model not in models:
            models.insert(0, model)  # the default model is an alias or a provider's
        root, running = _root(settings, server.base_url if server.running else None)
        key_required = bool(
            settings.server.api_key_hashes or server.extra_key_hashes or self._keys.all()
        )
        conn = connection(tool, Target(root, model or NO_MODEL, secret, key_required))
        status = next((s for s in statuses if s.model.id == model), None)
        loaded = status is not None and status.state == "loaded"
        check, preset = ContextCheck(True), None
        if model:
            raw = service.models.preset(model).get("context_length") if status else None
            preset = int(raw) if raw else None
            current = effective_context(
                loaded=status.context_length if status and loaded else None,
                preset=preset,
                default=settings.load.context_length,
            )
            trained = status.model.context_length if status else None
            cap = settings.load.max_auto_context
            check = check_context(
                conn.context_needed, model, current=current, trained=trained, auto_cap=cap
            )
        caps = known_capabilities(status.model) if status is not None else None
        fim = check_fim(tool, model, caps) if model else ContextCheck(True)
        return ConnectState(
            root, running, key_required, tuple(models), model, conn, check, status is not None,
            loaded, preset, fim,
        )  # fmt: skip

    # -- GUI thread ----------------------------------------------------------------------------
    def _show(self, st: ConnectState) -> None:
        self.state = st
        self._fill_models(st)
        c = st.conn
        self.url_edit.setText(c.base_url)
        self.server_label.setText(
            "the server is running" if st.running else "the server is stopped (start it on the "
            "Server page)"
        )  # fmt: skip
        secret = self._secret[1] if self._secret and self._secret[0] == c.tool else None
        if secret:
            self.key_label.setText("A new key for this app, in the settings below (shown once).")
        elif st.key_required:
            self.key_label.setText(
                "This server requires a key. Hearth keeps only hashes of its keys, so it cannot "
                f"show one: create a key for this app, or put yours where it says {KEY_PLACEHOLDER}."
            )
        else:
            self.key_label.setText('No key needed: the placeholder "hearth" is used.')
        self.create_key_button.setVisible(st.key_required and not secret)
        self.context_label.setText(f"{c.title} needs {c.context_needed:,} tokens of context")
        self._show_check(st)
        self.snippet_edit.setPlainText(c.snippet)
        self.snippet_label.setText(f"Settings to paste ({c.snippet_language})")
        self.env_list.clear()
        self.env_list.addItems([f"{k}={v}" for k, v in c.env.items()])
        has_env = bool(c.env)
        for w in (self.env_label, self.env_list, self.copy_env_button, self.copy_exports_button):
            w.setVisible(has_env)  # Continue and Cline read none: their notes say so
        self.notes_label.setText("\n".join(f"• {n}" for n in c.notes))
        if st.model is None:
            self.banner.show_message(NO_MODEL_TEXT, "notice")
        elif self.banner.text() == NO_MODEL_TEXT:
            self.banner.clear_message()
        self.state_shown.emit(st)

    def _show_check(self, st: ConnectState) -> None:
        check, needed = st.check, st.conn.context_needed
        self.warning_label.setVisible(not check.ok)
        self.warning_label.setText(f"⚠ {check.message}" if not check.ok else "")
        if st.needs_reload:
            self.warning_label.setText(
                f"⚠ {check.message}; its preset says {st.preset_context:,} from the next load"
            )
        can = not check.ok and check.can_raise and st.local and not st.needs_reload
        self.set_context_button.setVisible(can)
        self.set_context_button.setText(f"Use {needed:,} tokens for this model")
        self.reload_button.setVisible(st.needs_reload)
        self.reload_button.setText(f"Reload {st.model} now")
        if not st.fim.ok:  # the wrong kind of model: said before any context advice
            shown = self.warning_label.text()
            self.warning_label.setText(f"⚠ {st.fim.message}" + (f"\n{shown}" if shown else ""))
            self.warning_label.setVisible(True)

    def _fill_models(self, st: ConnectState) -> None:
        combo = self.model_combo
        if [combo.itemData(i) for i in range(combo.count())] != list(st.models):
            combo.blockSignals(True)
            combo.clear()
            for m in st.models:
                combo.addItem(m, m)
            combo.blockSignals(False)
        if st.model is not None:
            combo.setCurrentIndex(max(0, combo.findData(st.model)))

    def _copy(self, text: str, what: str, button: QAbstractButton | None = None) -> None:
        copy_text(text, button)
        self.banner.show_message(f"Copied the {what}.")

    def _style_warning(self) -> None:
        # the light theme's dark red reads at 2:1 on the dark window; a light red there
        self.warning_label.setStyleSheet(f"color: {pick('#b3261e', '#f28b82')}; font-weight: bold;")

    def _failed(self, exc: BaseException) -> None:
        self.banner.show_message(log_failure(log, "the Connect page", exc), "error")

    def showEvent(self, e: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(e)
        self.refresh()  # keys, presets and settings may have changed on other pages

    def _on_tool_combo_changed(self, _i: int) -> None:
        if self._secret and self._secret[0] != self.tool:
            self._secret = None  # shown once: gone when the user moves on
        self.refresh()

    def _on_model_combo_activated(self, _i: int) -> None:
        self.refresh()

    def _on_create_key_button_clicked(self) -> None:
        self.create_key()

    def _on_set_context_button_clicked(self) -> None:
        self.raise_context()

    def _on_reload_button_clicked(self) -> None:
        self.reload_model()

    def _on_copy_env_button_clicked(self) -> None:
        item = self.env_list.currentItem() or self.env_list.item(0)
        if item is not None:
            self._copy(item.text(), "line", self.copy_env_button)


def _root(settings: Settings, running_url: str | None) -> tuple[str, bool]:
    """The server's URL without /v1, and whether it runs: the running one, else where it will
    listen (the settings' host and port), as ``hearth connect`` says."""
    if running_url:
        return running_url.removesuffix("/v1"), True
    return planned_url(settings.server).removesuffix("/v1"), False
