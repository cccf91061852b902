"""Images a person attaches in the chat (the Chat page, ``hearth run``'s ``/image``).

An image is read once, when attached, into a :class:`ChatImage`: its encoded bytes as given,
checked with the server's own decoder and bounds (:func:`app.core.inference.images.decode_image`: format
allowlist, pixel bound from the header, byte bound), its size and a small PNG thumbnail. The
message that carries it is built as the protocol adapters build theirs (:func:`user_message`:
one marker per image, then the text), with the encoded bytes as image sources; they are
decoded again for each send, on the service side (:func:`decode_messages`), so a long
conversation holds encoded bytes, not pixels.

Saved conversations keep the images in an :class:`ImageStore`: one file per image content
(``SHA256.EXT`` plus ``SHA256.thumb.png``) under the data folder's ``chat-images/``, referenced
from the user message's ``extras["images"]`` (see :meth:`ChatImage.ref`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.inference.images import (
    ImageInput,
    ImageLimits,
    ImageSource,
    InvalidImage,
    PixelBudget,
    decode_image,
    marked_text,
)
from app.core.types import ChatMessage

log = logging.getLogger(__name__)

IMAGES_FOLDER = "chat-images"  # under the data folder, beside conversations.sqlite
THUMB_SIZE = 160  # a thumbnail's longer side, pixels
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"})
_EXT = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}
DEFAULT_LIMITS = ImageLimits()  # the server's defaults; callers pass the settings' bounds
_FILE = re.compile(r"^[0-9a-f]{64}\.(png|jpg|webp|gif|bmp)$")


@dataclass(frozen=True, slots=True)
class ChatImage:
    """An attached image, checked. ``data``: the encoded bytes as given; ``sha256``: of
    ``data`` (the file name in the store); ``thumb``: a PNG at most THUMB_SIZE a side."""

    name: str
    data: bytes
    sha256: str
    width: int
    height: int
    ext: str  # png | jpg | webp | gif | bmp
    thumb: bytes

    @property
    def file(self) -> str:
        return f"{self.sha256}.{self.ext}"

    def ref(self) -> dict[str, Any]:
        """The JSON a saved message keeps for it (``extras["images"]`` items): ``file`` (in
        ``chat-images/``), ``sha256``, ``name``, ``width``, ``height``, ``bytes``."""
        return {
            "file": self.file,
            "sha256": self.sha256,
            "name": self.name,
            "width": self.width,
            "height": self.height,
            "bytes": len(self.data),
        }

    def source(self) -> ImageSource:
        """The image as a message's source: errors name the image by its file name."""
        return ImageSource(self.name, data=self.data)


def is_image_name(name: str | Path) -> bool:
    """A file name that says image (the Chat page sends these down the image path)."""
    return Path(name).suffix.lower() in IMAGE_SUFFIXES


def image_from_bytes(name: str, data: bytes, limits: ImageLimits = DEFAULT_LIMITS) -> ChatImage:
    """Check ``data`` as the server does and make its thumbnail (blocking: decodes).

    Raises:
        InvalidImage: over the byte or pixel bound, another format, corrupt or truncated;
            the message starts with ``name``.
    """
    from PIL import Image

    img = decode_image(data, where=name, limits=limits)
    fmt = Image.open(io.BytesIO(data)).format or "PNG"  # decode_image allowed it: header only
    return ChatImage(
        name=name,
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        width=img.width,
        height=img.height,
        ext=_EXT.get(fmt, "png"),
        thumb=thumbnail_png(img),
    )


def read_image_file(path: str | Path, limits: ImageLimits = DEFAULT_LIMITS) -> ChatImage:
    """Read and check an image file (blocking). The size is checked before it is read.

    Raises:
        InvalidImage: not a readable file, or as :func:`image_from_bytes`.
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise InvalidImage("no such file" if not p.exists() else "not a file", param=p.name)
        size = p.stat().st_size
        if size > limits.max_bytes:
            raise InvalidImage(
                f"the image is {size} bytes; at most {limits.max_bytes} are taken", param=p.name
            )
        data = p.read_bytes()
    except OSError as e:
        raise InvalidImage(f"cannot read it: {e.strerror or e}", param=p.name) from e
    return image_from_bytes(p.name, data, limits)


def thumbnail_png(img: ImageInput, size: int = THUMB_SIZE) -> bytes:
    """``img`` scaled down to at most ``size`` pixels a side, as PNG bytes."""
    from PIL import Image

    pil = Image.frombytes("RGB", (img.width, img.height), img.rgb)
    pil.thumbnail((size, size))
    buf = io.BytesIO()
    pil.save(buf, "PNG")
    return buf.getvalue()


def user_message(text: str, images: Sequence[ChatImage] = ()) -> ChatMessage:
    """The user's message with its images, as the protocol adapters build one: a marker per
    image before the text (literal markers in it neutralised), the images as sources."""
    if not images:
        return ChatMessage("user", text)
    return ChatMessage(
        "user",
        marked_text(text, len(images)),
        image_sources=tuple(i.source() for i in images),
    )


def has_sources(messages: Iterable[ChatMessage]) -> bool:
    return any(m.image_sources for m in messages)


def decode_messages(
    messages: Sequence[ChatMessage], limits: ImageLimits = DEFAULT_LIMITS
) -> tuple[ChatMessage, ...]:
    """``messages`` with their image sources (encoded bytes) decoded into ``images``, as the
    server's edge does (blocking: call it off the event loop).

    Raises:
        InvalidImage: an image that cannot be decoded, one given as a URL, or images over
            ``limits.max_request_pixels`` together.
    """
    budget = PixelBudget(limits.max_request_pixels)
    out = []
    for m in messages:
        if not m.image_sources:
            out.append(m)
            continue
        decoded = []
        for s in m.image_sources:
            if s.data is None:
                raise InvalidImage("only image bytes are taken here, not URLs", param=s.where)
            decoded.append(
                decode_image(s.data, where=s.where, limits=limits, source=s, budget=budget)
            )
        out.append(replace(m, images=m.images + tuple(decoded), image_sources=()))
    return tuple(out)


def image_refs(extras: dict[str, Any]) -> list[dict[str, Any]]:
    """A saved message's image references (``extras["images"]``), the well-formed ones."""
    refs = extras.get("images")
    if not isinstance(refs, list):
        return []
    return [r for r in refs if isinstance(r, dict) and isinstance(r.get("file"), str)]


class ImageStore:
    """Attached images on disk, one file per content (``SHA256.EXT``) and its thumbnail
    (``SHA256.thumb.png``): the same image in two conversations is stored once."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def save(self, img: ChatImage) -> dict[str, Any]:
        """Write ``img`` (and its thumbnail) unless already there; returns its reference.

        Raises:
            OSError: the folder cannot be written.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        _write_once(self.root / img.file, img.data)
        _write_once(self.root / f"{img.sha256}.thumb.png", img.thumb)
        return img.ref()

    def path(self, ref: dict[str, Any]) -> Path | None:
        """The file of a reference (None for a name that is not one of the store's)."""
        name = ref.get("file")
        if not isinstance(name, str) or not _FILE.match(name):
            return None
        return self.root / name

    def load(self, ref: dict[str, Any]) -> ChatImage | None:
        """The image a saved message references (None, logged, when its file is gone or does
        not match its hash). The bytes were checked when attached; they are decoded again
        (bounded) when sent."""
        p = self.path(ref)
        if p is None:
            return None
        try:
            data = p.read_bytes()
        except OSError as e:
            log.warning("image %s of a saved message is missing: %s", ref.get("file"), e)
            return None
        sha = hashlib.sha256(data).hexdigest()
        if p.name.split(".", 1)[0] != sha:
            log.warning("image %s does not match its hash; not used", p.name)
            return None
        thumb_file = self.root / f"{sha}.thumb.png"
        try:
            thumb = thumb_file.read_bytes()
        except OSError:
            thumb = b""
        if not thumb:  # made when attached; made again if it went missing
            try:
                img = image_from_bytes(str(ref.get("name") or p.name), data)
            except InvalidImage as e:
                log.warning("image %s cannot be read: %s", p.name, e)
                return None
            return img
        return ChatImage(
            name=str(ref.get("name") or p.name),
            data=data,
            sha256=sha,
            width=int(ref.get("width") or 0),
            height=int(ref.get("height") or 0),
            ext=p.suffix.lstrip("."),
            thumb=thumb,
        )

    def remove_unused(self, used: Iterable[str]) -> int:
        """Delete the image files (and thumbnails) no reference in ``used`` (file names)
        names; returns how many images went."""
        keep = {u.split(".", 1)[0] for u in used}
        removed = 0
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return 0
        for f in entries:
            sha = f.name.split(".", 1)[0]
            if sha in keep or not re.fullmatch(r"[0-9a-f]{64}", sha):
                continue
            try:
                f.unlink()
            except OSError as e:
                log.warning("could not remove unused image %s: %s", f.name, e)
                continue
            removed += f.name.count(".thumb.") == 0
        return removed


def _write_once(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temp file renamed in) unless it exists: the
    name is the content's hash, so an existing file already holds these bytes."""
    if path.exists():
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
