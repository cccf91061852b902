"""Files in the chat: the attach button, chips, drag and drop, paste, and the hook
that puts the files into a message (whole, or the retrieved chunks) on the loop thread. Audio
files dropped go to the Dictate button's transcription instead (dictation.py).

The files belong to the conversation: they stay attached (as chips) for the next questions,
until removed or a new chat; each message retrieves what it needs from them.

Images come the same ways (a pasted screenshot too) and go with the next message
only: sent, their chips leave the bar. They are checked with the server's decoder and bounds
(``vision`` settings) off the GUI thread; a model without vision refuses them at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QMimeData, QObject, Signal
from PySide6.QtGui import QDropEvent, QPalette
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTextEdit,
    QWidget,
)

from app.core.inference.images import ImageLimits
from app.core.service import Hearth
from app.core.types import ChatMessage
from app.core.workspace.attachments import Attachment, attachment_from_text, read_attachment
from app.core.workspace.chat_images import (
    ChatImage,
    decode_messages,
    image_from_bytes,
    is_image_name,
    read_image_file,
)
from app.core.workspace.retrieval import Prepared, Retriever, vector_cache_folder
from app.core.workspace.vector_cache import VectorCache
from app.errors import HearthError
from app.gui.bridge import Bridge, log_failure
from app.gui.views.chat.dictation import Dictation, is_audio_name
from app.gui.views.chat.images import Chip, ImageChip, pasted_png
from app.paths import AppPaths
from app.settings import SettingsStore

log = logging.getLogger(__name__)

LONG_PASTE_CHARS = 2000  # a paste longer than this becomes an attachment, not prompt text
FILE_FILTER = (
    "Images, text, code, Markdown and PDF (*.png *.jpg *.jpeg *.webp *.gif *.bmp *.txt *.md "
    "*.markdown *.rst *.pdf *.py *.js *.ts *.json *.yaml *.yml *.toml *.csv *.html *.css *.c "
    "*.h *.cpp *.rs *.go *.java *.sh *.sql *.log);;"
    "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp);;"
    "Text, code, Markdown and PDF (*.txt *.md *.markdown *.rst *.pdf *.py *.js *.ts *.json "
    "*.yaml *.yml *.toml *.csv *.html *.css *.c *.h *.cpp *.rs *.go *.java *.sh *.sql *.log);;"
    "All files (*)"
)

Prepare = Callable[[Sequence[ChatMessage]], Awaitable[Sequence[ChatMessage]]]


def show_files_notice(page: Any, text: str) -> None:
    """Say under the answer, below its stats, which parts of the files it used."""
    view = page._answer_view  # the answer just finished (transcript.MessageView)
    if view is not None:
        view.set_notice(f"{view.notice}\n{text}" if view.notice else text, "meta")


class AttachmentChip(Chip):
    """One attached file: its name and size, and a remove button."""

    def __init__(self, attachment: Attachment, parent: QWidget | None = None) -> None:
        pages = f", {len(attachment.pages)} pages" if attachment.kind == "pdf" else ""
        super().__init__(
            attachment,
            attachment.name,
            attachment.size_bytes,
            f"{attachment.kind}{pages}, {attachment.chars:,} characters",
            parent=parent,
        )

    @property
    def attachment(self) -> Attachment:
        return self.item  # type: ignore[return-value]


class AttachmentBar(QWidget):
    """The row above the prompt: an Attach button, a chip per file, and a refusal's reason."""

    attachments_changed = Signal()
    # the user message's extras (attachments, chunks_used), as soon as the files are placed:
    # before the answer's first token
    extras_recorded = Signal(dict)
    _prepared_streamed = Signal(object)  # Prepared, emitted on the loop thread
    progress_streamed = Signal(str)  # how far embedding the files is (from the loop thread)

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        parent: QWidget | None = None,
        *,
        settings: SettingsStore | None = None,
        cache_root: Path | None = None,
    ) -> None:
        """``settings`` (its ``chat.embedding_model``) and ``cache_root`` (the vectors' folder
        goes under it): the app's, from its composition root; else the default paths'."""
        super().__init__(parent)
        self._bridge = bridge
        self._service = service
        self.dictation: Dictation | None = None  # once install() knows the prompt box
        if settings is None or cache_root is None:
            paths = AppPaths.default()
            settings = settings or SettingsStore(paths.settings_file)
            cache_root = cache_root or paths.cache
        store = settings
        self._settings = settings
        # used on the loop thread only (the store caches the file by mtime: no read per call)
        self.retriever = Retriever(
            service,
            embedding_setting=lambda: store.load().chat.embedding_model,
            cache=VectorCache(vector_cache_folder(cache_root)),
        )
        self.chips: list[AttachmentChip] = []
        self.image_chips: list[ImageChip] = []
        # why the chosen model takes no images (None: it does); set by the page
        self.image_refusal: Callable[[], str | None] = lambda: None
        self._pasted_images = 0
        self.last_prepared: Prepared | None = None
        self._pasted = 0
        self._reading = 0

        self.attach_button = QPushButton("Attach…")
        self.attach_button.setToolTip(
            "Attach images (for a vision model), text, code, Markdown or PDF files (or drop them "
            "on the page, or paste them: a screenshot too). An audio file dropped here is "
            "transcribed into the message box"
        )
        self.error_label = QLabel("")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #b3261e")
        self.error_label.hide()
        self.status_label = QLabel("")  # "Reading report.pdf with MODEL: 16/120 parts"
        self.status_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._row.addWidget(self.attach_button)
        self._row.addStretch(1)
        self._row.addWidget(self.status_label)
        self._row.addWidget(self.error_label, 2)
        self.attach_button.clicked.connect(self._on_attach_button_clicked)
        self._prepared_streamed.connect(self._on_self_prepared_streamed)
        self.progress_streamed.connect(self.status_label.setText)

    # -- state -------------------------------------------------------------------------------
    @property
    def attachments(self) -> list[Attachment]:
        return [c.attachment for c in self.chips]

    @property
    def images(self) -> list[ChatImage]:
        """The images waiting to go with the next message."""
        return [c.image for c in self.image_chips]

    def image_limits(self) -> ImageLimits:
        """The server's image bounds (``vision`` in settings.json)."""
        cfg = self._settings.load().vision
        return cfg.limits()

    @property
    def busy(self) -> bool:
        """Files still being read."""
        return self._reading > 0

    # -- adding and removing -------------------------------------------------------------------
    def add_paths(self, paths: Sequence[str | Path]) -> None:
        """Read each file off the GUI thread and add a chip (or say why it was refused);
        image files become image chips."""
        audio = [p for p in paths if is_audio_name(p)]
        for p in audio:  # speech: its text goes into the prompt box (dictation.py)
            if self.dictation is not None:
                self.dictation.transcribe_file(p)
        paths = [p for p in paths if not is_audio_name(p)]
        images = [p for p in paths if is_image_name(p)]
        if images:
            self.add_images(images)
        for p in (p for p in paths if not is_image_name(p)):
            self._reading += 1
            self._bridge.run(
                asyncio.to_thread(read_attachment, p),
                on_done=self._on_file_read,
                on_error=self._on_file_refused,
            )

    def add_images(self, paths: Sequence[str | Path]) -> None:
        """Check each image off the GUI thread and add a chip with its thumbnail (or say why
        not: the model takes no images, or the image is refused)."""
        if self._refused():
            return
        limits = self.image_limits()
        for p in paths:
            self._reading += 1
            self._bridge.run(
                asyncio.to_thread(read_image_file, p, limits),
                on_done=self._on_image_read,
                on_error=self._on_file_refused,
            )

    def add_image_bytes(self, name: str, data: bytes) -> None:
        """An image's encoded bytes (a pasted screenshot), checked as a file is."""
        if self._refused():
            return
        self._reading += 1
        self._bridge.run(
            asyncio.to_thread(image_from_bytes, name, data, self.image_limits()),
            on_done=self._on_image_read,
            on_error=self._on_file_refused,
        )

    def take_images(self) -> list[ChatImage]:
        """The images waiting, for the message being sent: their chips leave the bar."""
        images = self.images
        for chip in self.image_chips:
            self._row.removeWidget(chip)
            chip.deleteLater()
        self.image_chips.clear()
        if images:
            self.attachments_changed.emit()
        return images

    def say(self, text: str) -> None:
        """Show ``text`` (a refusal and its fix) beside the chips; "" clears it."""
        self._say(text)

    def add_text(self, text: str) -> None:
        """Pasted text as an attachment (``pasted-N.txt``)."""
        self._pasted += 1
        try:
            self._add(attachment_from_text(f"pasted-{self._pasted}.txt", text))
        except HearthError as e:
            self._say(e.message)

    def remove(self, attachment: Attachment) -> None:
        for chip in [c for c in self.chips if c.attachment is attachment]:
            self.chips.remove(chip)
            self._row.removeWidget(chip)
            chip.deleteLater()
        self.attachments_changed.emit()

    def clear(self) -> None:
        for a in self.attachments:
            self.remove(a)
        self.take_images()
        self.last_prepared = None
        self._say("")

    def paste(self, mime: QMimeData) -> bool:
        """Take a paste: local files become attachments, an image (a screenshot) an image
        chip, and text longer than :data:`LONG_PASTE_CHARS` an attachment. Returns False for
        a paste the prompt box should take."""
        files = [u.toLocalFile() for u in mime.urls() if u.isLocalFile()] if mime.hasUrls() else []
        if files:
            self.add_paths(files)
            return True
        png = pasted_png(mime)
        if png is not None:
            self._pasted_images += 1
            self.add_image_bytes(f"pasted-image-{self._pasted_images}.png", png)
            return True
        if mime.hasText() and len(mime.text()) > LONG_PASTE_CHARS:
            self.add_text(mime.text())
            return True
        return False

    def install(self, page: QWidget, prompt: QWidget, *targets: QWidget) -> None:
        """Take file drops on ``page`` and its ``targets`` (text views: pass their viewport),
        and file or long-text pastes in ``prompt``."""
        self._filter = _DropAndPaste(self, prompt)
        if isinstance(prompt, QPlainTextEdit | QTextEdit):  # the microphone writes into it
            self.dictation = Dictation(
                self._service, self._bridge, prompt, self._settings, say=self._say,
                status=self.status_label.setText, parent=self,
            )  # fmt: skip
            self._row.insertWidget(1, self.dictation.button)
        if hasattr(prompt, "take_paste"):  # the page's PromptEdit: every paste comes here first
            prompt.take_paste = self.paste
        for w in (page, prompt, *targets):
            w.setAcceptDrops(True)
            w.installEventFilter(self._filter)
        if hasattr(prompt, "viewport"):
            prompt.viewport().setAcceptDrops(True)
            prompt.viewport().installEventFilter(self._filter)

    # -- the send path (chat.py's hooks) -------------------------------------------------------
    def preparer(
        self, model_id: str, max_tokens: int | None, *, images: bool = False
    ) -> Prepare | None:
        """For the send in progress: a coroutine function the answer runs on the loop thread
        before it starts, decoding the messages' images (``images``: there are some) and
        putting the attached files into the messages (None: neither)."""
        files = tuple(self.attachments)
        self.last_prepared = None
        if not files and not images:
            return None
        retriever = self.retriever
        progress = self.progress_streamed.emit  # queued to the GUI thread
        limits = self.image_limits()

        async def prepare(messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
            if images:  # the encoded bytes, decoded with the server's bounds, off the loop
                messages = await asyncio.to_thread(decode_messages, messages, limits)
            if not files:
                return messages
            p = await retriever.prepare(
                model_id, messages, files, max_tokens=max_tokens, progress=progress
            )
            self._prepared_streamed.emit(p)
            return p.messages

        return prepare

    def answer_done(self, page: Any) -> None:
        """After the answer: say which chunks it used."""
        if self.last_prepared is not None:
            show_files_notice(page, self.last_prepared.notice())

    def turn_failed(self, page: Any, exc: BaseException, text: str) -> None:
        """A send the files stopped (no embedding model, no room): the message was not sent,
        so its text goes back into the prompt box to send again."""
        if isinstance(exc, HearthError) and exc.param == "file" and text:
            if not page.prompt_edit.toPlainText().strip():
                page.prompt_edit.setPlainText(text)
        self.status_label.clear()

    # -- slots ---------------------------------------------------------------------------------
    def _on_attach_button_clicked(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files", "", FILE_FILTER)
        if paths:
            self.add_paths(paths)

    def _on_file_read(self, attachment: Attachment) -> None:
        self._reading -= 1
        self._add(attachment)

    def _on_file_refused(self, exc: BaseException) -> None:
        self._reading -= 1
        self._say(log_failure(log, "attach", exc))

    def _on_image_read(self, image: ChatImage) -> None:
        self._reading -= 1
        if any(c.image.sha256 == image.sha256 for c in self.image_chips):
            return  # the same image twice: once is enough
        chip = ImageChip(image)
        chip.removed.connect(self._on_image_chip_removed)
        self._row.insertWidget(1 + len(self.chips) + len(self.image_chips), chip)
        self.image_chips.append(chip)
        self._say("")
        self.attachments_changed.emit()

    def _on_image_chip_removed(self, image: ChatImage) -> None:
        for chip in [c for c in self.image_chips if c.image is image]:
            self.image_chips.remove(chip)
            self._row.removeWidget(chip)
            chip.deleteLater()
        self.attachments_changed.emit()

    def _on_self_prepared_streamed(self, prepared: Prepared) -> None:
        self.status_label.clear()
        self.last_prepared = prepared
        self.extras_recorded.emit(prepared.extras())

    def _on_chip_removed(self, attachment: Attachment) -> None:
        self.remove(attachment)

    # -- helpers -------------------------------------------------------------------------------
    def _refused(self) -> bool:
        why = self.image_refusal()
        if why:
            self._say(why)
        return bool(why)

    def _add(self, a: Attachment) -> None:
        if any(c.attachment.digest == a.digest and c.attachment.name == a.name for c in self.chips):
            return  # the same file twice: once is enough
        chip = AttachmentChip(a)
        chip.removed.connect(self._on_chip_removed)
        self._row.insertWidget(1 + len(self.chips) + len(self.image_chips), chip)
        self.chips.append(chip)
        self._say("")
        self.attachments_changed.emit()

    def _say(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))


class _DropAndPaste(QObject):
    """Event filter: local files dropped become attachments (pastes: PromptEdit.take_paste)."""

    def __init__(self, bar: AttachmentBar, prompt: QWidget) -> None:
        super().__init__(bar)
        self._bar = bar
        self._prompt = prompt

    def eventFilter(self, obj: QObject, e: QEvent) -> bool:  # noqa: N802 - Qt override
        t = e.type()
        drag = (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop)
        if t in drag and isinstance(e, QDropEvent):  # QDragEnterEvent, QDragMoveEvent too
            files = _local_files(e.mimeData())
            if not files:
                return False  # text dragged in: the prompt box's own business
            if t == QEvent.Type.Drop:
                self._bar.add_paths(files)
            e.acceptProposedAction()
            return True
        return False


def _local_files(mime: QMimeData | None) -> list[str]:
    if mime is None or not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile()]
