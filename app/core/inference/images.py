"""Images in a conversation: the decoded input a runtime gets, and the one bounded decoder.

Every wire API turns an image part into an :class:`ImageSource` (encoded bytes or a URL, and
the parameter it came from); the server fetches URLs and calls :func:`decode_image`, which
checks the encoded size, a JPEG's scan count and the pixel count (from the header, before any
pixel is decoded), takes the pixels from the request's :class:`PixelBudget`, and hands the
runtime RGB8 pixels only. The message text holds :data:`IMAGE_MARKER` once per
image, in order, where the image goes.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.core.types import ImageInput, ImageSource, LocalModel, supports_vision
from app.errors import InvalidRequest, UnsupportedParameter

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

    from app.core.requests import ChatRequest

IMAGE_MARKER = "<__media__>"  # llama.cpp's mtmd default marker (mtmd_default_marker())
# what a literal marker in user text becomes: looks the same to a reader, is never an image
MARKER_LOOKALIKE = "<\u200b__media__>"

MAX_PIXELS = 16_777_216  # 4096 x 4096
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGES = 64  # images in one request, all messages together
MAX_REQUEST_PIXELS = 4 * MAX_PIXELS  # decoded pixels of one request, all images together
# libjpeg's progressive script has 10 scans (6 for grey), mozjpeg's a few more; each scan is a
# pass over every block, so a file that repeats scans costs decode time far beyond its size
MAX_JPEG_SCANS = 64
MAX_JPEG_SEGMENTS = 1024  # marker segments of any kind: real files have tens

# Pillow format name -> the media types that name it (Anthropic's media_type, data URLs)
FORMATS: dict[str, tuple[str, ...]] = {
    "PNG": ("image/png",),
    "JPEG": ("image/jpeg", "image/jpg"),
    "WEBP": ("image/webp",),
    "GIF": ("image/gif",),
    "BMP": ("image/bmp", "image/x-ms-bmp"),
}
_ALLOWED = "PNG, JPEG, WebP, GIF or BMP"


class InvalidImage(InvalidRequest):
    """An image that cannot be taken: corrupt, truncated, too large, or of another format. The
    message starts with the parameter: Anthropic's and Ollama's error shapes have no ``param``."""

    code = "invalid_image"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(f"{param}: {message}" if param else message, param=param)


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_pixels: int = MAX_PIXELS
    max_bytes: int = MAX_IMAGE_BYTES
    max_request_pixels: int = MAX_REQUEST_PIXELS
    max_jpeg_scans: int = MAX_JPEG_SCANS


class PixelBudget:
    """What a request's images may decode to, all together: each image takes its pixels
    (from its header) before it is decoded, so the image that would go over is never decoded."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, pixels: int, where: str) -> None:
        """Raises: InvalidImage (naming ``where``) when ``pixels`` more would go over."""
        if self.used + pixels > self.total:
            raise InvalidImage(
                f"the request's images would decode to {self.used + pixels} pixels; at most "
                f"{self.total} are taken in one request (vision.max_request_pixels)",
                param=where,
            )
        self.used += pixels


class DecodeStopped(Exception):  # noqa: N818 - not an error: the request ended
    """Decoding was stopped because its request ended (client gone, time limit)."""


class _StoppableBytes(io.BytesIO):
    """The encoded bytes as Pillow reads them: every read asks ``stop`` first, so a decode
    (fed block by block from here) ends within one block once the request is gone."""

    def __init__(self, data: bytes, stop: Callable[[], bool]) -> None:
        super().__init__(data)
        self._stop = stop

    def read(self, size: int | None = -1, /) -> bytes:
        if self._stop():
            raise DecodeStopped
        return super().read(size)


# a marker: 0xFF then a code that is not a stuffed zero, a restart marker or a fill byte
_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_NO_LENGTH = frozenset({0x01, 0xD8})  # TEM, SOI: markers without a length


def jpeg_scans(
    data: bytes, limit: int = MAX_JPEG_SCANS, segment_limit: int = MAX_JPEG_SEGMENTS
) -> tuple[int, int]:
    """The scans (SOS markers) and marker segments of a JPEG up to its first EOI (0, 0 for
    other bytes); counting stops once either passes its bound.

    Segments are skipped by their length; entropy-coded data is searched for the next marker
    (a regex, so a body of stuffed bytes costs no Python loop)."""
    scans = segments = 0
    if not data.startswith(b"\xff\xd8"):
        return 0, 0
    i = 2
    while scans <= limit and segments <= segment_limit:
        m = _JPEG_MARKER.search(data, i)
        if m is None:
            break  # truncated: Pillow says so
        code, i = m.group()[1], m.end()
        if code == 0xD9:  # EOI
            break
        if code in _NO_LENGTH:
            continue
        segments += 1
        scans += code == 0xDA
        if i + 2 > len(data):
            break
        i += max(2, int.from_bytes(data[i : i + 2], "big"))
    return scans, segments


def image_digest(width: int, height: int, rgb: bytes) -> str:
    """sha256 hex of the little-endian u32 width and height, then the RGB bytes."""
    h = hashlib.sha256(struct.pack("<II", width, height))
    h.update(rgb)
    return h.hexdigest()


_MASK = (1 << 62) - 1


def image_tokens(digest: str, n: int) -> list[int]:
    """The pseudo-token ids of an image's ``n`` prompt positions: negative (never a real
    token), and from its digest, so a prompt cache that compares token lists reuses an image's
    positions only for the same image at the same place."""
    base = int(digest[:16], 16)
    return [-1 - ((base ^ (i * 0x9E3779B97F4A7C15)) & _MASK) for i in range(n)]


def neutralise_markers(text: str) -> str:
    """User text with every literal IMAGE_MARKER made a lookalike, so no text is an image."""
    return text.replace(IMAGE_MARKER, MARKER_LOOKALIKE) if IMAGE_MARKER in text else text


def marked_text(text: str, n_images: int) -> str:
    """A message's text with its ``n_images`` images first: one IMAGE_MARKER each, then the
    text with any literal marker neutralised (Ollama's ``images`` shape; the Chat page and
    ``hearth run`` build their messages with it too)."""
    return IMAGE_MARKER * n_images + neutralise_markers(text)


def strip_markers(content: str) -> str:
    """A message's text without its image markers (what a person wrote)."""
    return content.replace(IMAGE_MARKER, "")


def decode_image(
    data: bytes,
    *,
    where: str,
    limits: ImageLimits = ImageLimits(),
    source: ImageSource | None = None,
    budget: PixelBudget | None = None,
    stop: Callable[[], bool] | None = None,
) -> ImageInput:
    """Decode one encoded image to RGB8, bounded.

    The byte bound is checked first, then a JPEG's scan count, the format (an allowlist), the
    pixel count from the header and the request's ``budget``, before any pixel is decoded.
    EXIF orientation is applied, transparency is composited on white, the first frame of an
    animation is taken. ``stop`` is asked between the steps and at every block Pillow reads.

    Raises:
        InvalidImage: too many bytes, scans or pixels, an unsupported format, corrupt or
            truncated data, or a media type that does not match the bytes (``param`` names
            the part).
        DecodeStopped: ``stop`` said so.
    """
    # Pillow is imported here: app.core must import on a machine without it
    from PIL import Image, ImageOps, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise InvalidImage(
            f"the image is {len(data)} bytes; at most {limits.max_bytes} are taken", param=where
        )
    if not data:
        raise InvalidImage("the image is empty", param=where)
    segment_limit = max(MAX_JPEG_SEGMENTS, 4 * limits.max_jpeg_scans)  # tables before scans
    scans, segments = jpeg_scans(data, limits.max_jpeg_scans, segment_limit)
    if scans > limits.max_jpeg_scans:  # each scan is a pass over the whole image
        raise InvalidImage(
            f"the JPEG has more than {limits.max_jpeg_scans} scans; at most "
            f"{limits.max_jpeg_scans} are taken",
            param=where,
        )
    if segments > segment_limit:
        raise InvalidImage(f"the JPEG has more than {segment_limit} marker segments", param=where)
    fp = io.BytesIO(data) if stop is None else _StoppableBytes(data, stop)
    try:
        img = Image.open(fp, formats=list(FORMATS))
    except UnidentifiedImageError:
        raise InvalidImage(f"unsupported image format: send {_ALLOWED}", param=where) from None
    except Image.DecompressionBombError:
        raise InvalidImage(
            f"the image has more than {limits.max_pixels} pixels", param=where
        ) from None
    except (OSError, ValueError, SyntaxError) as e:  # Pillow's header errors
        raise InvalidImage(f"the image is corrupt: {e}", param=where) from None
    with img:
        fmt = img.format or ""
        if source is not None and source.media_type is not None:
            declared = source.media_type.lower()
            if fmt not in FORMATS or declared not in FORMATS[fmt]:
                raise InvalidImage(
                    f"the media type says {source.media_type} but the bytes are {fmt or 'unknown'}",
                    param=source.media_param or where,
                )
        width, height = img.size
        if width <= 0 or height <= 0 or width * height > limits.max_pixels:
            raise InvalidImage(
                f"the image is {width}x{height} pixels; at most {limits.max_pixels} are taken",
                param=where,
            )
        if budget is not None:
            budget.take(width * height, where)
        try:
            img.seek(0)  # a GIF's (or animated WebP's) first frame
            img.load()
            if stop is not None and stop():
                raise DecodeStopped
            upright = ImageOps.exif_transpose(img) or img
            rgb_img = _to_rgb(upright)
            if upright is not img and upright is not rgb_img:
                upright.close()  # each copy goes as soon as the next exists: at most two held
        except Image.DecompressionBombError:
            raise InvalidImage(
                f"the image has more than {limits.max_pixels} pixels", param=where
            ) from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise InvalidImage(f"the image is corrupt or truncated: {e}", param=where) from None
        w, h = rgb_img.size
        rgb = rgb_img.tobytes()
        if rgb_img is not img:
            rgb_img.close()
    return ImageInput(rgb=rgb, width=w, height=h, digest=image_digest(w, h, rgb), where=where)


def _to_rgb(img: PILImage) -> PILImage:
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def png_data_url(img: ImageInput) -> str:
    """The image re-encoded as a PNG data URL (what a remote OpenAI-compatible engine gets)."""
    import base64

    from PIL import Image

    buf = io.BytesIO()
    Image.frombytes("RGB", (img.width, img.height), img.rgb).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def split_content(content: str, images: tuple[ImageInput, ...]) -> list[str | ImageInput]:
    """``content`` cut at its markers: text pieces and images, in order. More markers than
    images (never from the adapters) leave the extra markers as text."""
    out: list[str | ImageInput] = []
    pieces = content.split(IMAGE_MARKER, len(images))
    for i, piece in enumerate(pieces):
        if piece:
            out.append(piece)
        if i < len(pieces) - 1:
            out.append(images[i])
    return out


def first_image(req: ChatRequest) -> str | None:
    """The parameter of the request's first image (decoded or not), or None without images."""
    for m in req.messages:
        if m.images:
            return m.images[0].where
        if m.image_sources:
            return m.image_sources[0].where
    return None


def check_vision(req: ChatRequest, lookup: Callable[[str], LocalModel]) -> None:
    """Refuse images for a model that takes none, naming the first image's parameter
    (``lookup`` finds the library model of ``req.model``; it is called only with images).

    Raises:
        UnsupportedParameter: the request has images and its model no projector.
        ModelNotFound: from ``lookup``.
    """
    where = first_image(req)
    if where is None:
        return
    model = lookup(req.model)
    if not supports_vision(model):
        why = "is not a vision model" if model.format == "mlx" else "has no projector"
        raise UnsupportedParameter(
            f"{where}: an image needs a vision model; '{model.id}' {why}",
            param=where,
        )
