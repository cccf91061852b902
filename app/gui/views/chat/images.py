"""Images on the Chat page: the chip of an image waiting to be sent, the
thumbnails in a message, the dialog that shows one larger, and a pasted image's bytes.

Every image shown here was checked by Pillow with the server's bounds first
(:mod:`app.core.workspace.chat_images`): the thumbnails are Pillow's small PNGs, and the larger view is
decoded by Pillow (bounded) and scaled down before Qt sees it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, QSize, Qt, Signal
from PySide6.QtGui import QGuiApplication, QIcon, QImage, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.inference.images import InvalidImage, decode_image
from app.core.util.units import human_bytes
from app.core.workspace.chat_images import ChatImage, thumbnail_png

log = logging.getLogger(__name__)

CHIP_THUMB = 40  # px: a chip's thumbnail height
MESSAGE_THUMB = 120  # px: a thumbnail in a message, its longer side at most
LARGE_SIDE = 1600  # px: the larger view's longer side at most


def pixmap(png: bytes, side: int) -> QPixmap:
    """A PNG (Pillow's thumbnail) as a pixmap at most ``side`` pixels a side."""
    pm = QPixmap()
    pm.loadFromData(png, "PNG")
    if pm.isNull():
        return pm
    if pm.width() > side or pm.height() > side:
        pm = pm.scaled(
            side,
            side,
            Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation,
        )
    return pm


def pasted_png(mime: QMimeData) -> bytes | None:
    """The image on the clipboard (a screenshot, an image copied in a browser) as PNG bytes;
    None when the paste holds no image."""
    if not mime.hasImage():
        return None
    data = mime.imageData()
    img = data if isinstance(data, QImage) else QImage(data) if data is not None else QImage()
    if img.isNull():
        return None
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    img.save(buf, "PNG")  # type: ignore[call-overload]  # the stubs say bytes; str works
    return bytes(QByteArray(buf.data()).data())


class Chip(QFrame):
    """Something waiting to be sent with the next message (a file, an image): a label, an
    optional leading widget (a thumbnail) and a × button that emits ``removed(item)``."""

    removed = Signal(object)  # the item

    def __init__(
        self,
        item: object,
        name: str,
        size_bytes: int,
        tooltip: str,
        *,
        leading: QWidget | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.item = item
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setToolTip(tooltip)
        self.label = QLabel(f"{name} · {human_bytes(size_bytes)}")
        self.remove_button = QToolButton()
        self.remove_button.setText("×")
        self.remove_button.setToolTip(f"Remove {name}")
        self.remove_button.setAutoRaise(True)
        row = QHBoxLayout(self)
        if leading is None:
            row.setContentsMargins(6, 0, 0, 0)
            row.setSpacing(2)
        else:  # a thumbnail: a little room around it
            row.setContentsMargins(4, 2, 0, 2)
            row.setSpacing(4)
            row.addWidget(leading)
        row.addWidget(self.label)
        row.addWidget(self.remove_button)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)

    def _on_remove_button_clicked(self) -> None:
        self.removed.emit(self.item)


class ImageChip(Chip):
    """An image waiting to be sent: its thumbnail, name and size, and a remove button."""

    def __init__(self, image: ChatImage, parent: QWidget | None = None) -> None:
        thumb = QLabel()
        thumb.setPixmap(pixmap(image.thumb, CHIP_THUMB))
        super().__init__(
            image,
            image.name,
            len(image.data),
            f"{image.name}: {image.width}×{image.height} pixels",
            leading=thumb,
            parent=parent,
        )
        self.thumb_label = thumb

    @property
    def image(self) -> ChatImage:
        return self.item  # type: ignore[return-value]


class ImageStrip(QWidget):
    """A message's images as thumbnails (at most MESSAGE_THUMB px); a click opens one larger."""

    def __init__(self, images: Sequence[ChatImage], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.images = list(images)
        self.buttons: list[QToolButton] = []
        self.dialog: ImageDialog | None = None
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 2, 0, 2)
        for img in self.images:
            b = QToolButton()
            pm = pixmap(img.thumb, MESSAGE_THUMB)
            b.setIcon(QIcon(pm))
            b.setIconSize(pm.size() if not pm.isNull() else QSize(MESSAGE_THUMB, MESSAGE_THUMB))
            b.setAutoRaise(True)
            b.setToolTip(f"{img.name} ({img.width}×{img.height}): click to open it larger")
            b.setAccessibleName(f"image {img.name}")
            b.clicked.connect(lambda _=False, img=img: self.open(img))
            row.addWidget(b)
            self.buttons.append(b)
        row.addStretch(1)

    def open(self, image: ChatImage) -> ImageDialog:
        """Show ``image`` larger, in a dialog of its own (one at a time)."""
        if self.dialog is not None:
            self.dialog.close()
        self.dialog = ImageDialog(image, self.window())
        self.dialog.show()
        return self.dialog

    def text(self) -> str:
        return "\n".join(f"[image: {i.name}]" for i in self.images)


class ImageDialog(QDialog):
    """One image, at most LARGE_SIDE pixels a side (and the screen), scrollable."""

    def __init__(self, image: ChatImage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"{image.name} · {image.width}×{image.height}")
        self.image_label = QLabel()
        self.image_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        screen = QGuiApplication.primaryScreen()
        side = LARGE_SIDE
        if screen is not None:
            avail = screen.availableGeometry()
            side = max(200, min(side, int(min(avail.width(), avail.height()) * 0.85)))
        try:  # decoded by Pillow with the bounds the image passed when attached
            png = thumbnail_png(decode_image(image.data, where=image.name), side)
            self.image_label.setPixmap(pixmap(png, side))
        except InvalidImage as e:
            self.image_label.setText(e.message)
        scroll = QScrollArea()
        scroll.setWidget(self.image_label)
        scroll.setWidgetResizable(True)
        lay = QVBoxLayout(self)
        lay.addWidget(scroll)
        pm = self.image_label.pixmap()
        if pm is not None and not pm.isNull():
            self.resize(pm.width() + 40, pm.height() + 40)
