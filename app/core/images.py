"""Images in a conversation: the decoded input a runtime gets, and the one bounded decoder.

Every wire API turns an image part into an :class:`ImageSource` (encoded bytes or a URL, and
the parameter it came from); the server fetches URLs and calls :func:`decode_image`, which
checks the encoded size and the pixel count (from the header, before any pixel is decoded)
and hands the runtime RGB8 pixels only. The message text holds :data:`IMAGE_MARKER` once per
image, in order, where the image goes.
"""

from __future__ import annotations

import hashlib
import io
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.errors import InvalidRequest, UnsupportedParameter

if TYPE_CHECKING:
    from collections.abc import Callable

    from PIL.Image import Image as PILImage

    from app.core.requests import ChatRequest
    from app.core.types import LocalModel

IMAGE_MARKER = "<__media__>"  # llama.cpp's mtmd default marker (mtmd_default_marker())
# what a literal marker in user text becomes: looks the same to a reader, is never an image
MARKER_LOOKALIKE = "<\u200b__media__>"

MAX_PIXELS = 16_777_216  # 4096 x 4096
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGES = 64  # images in one request, all messages together

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
class ImageInput:
    """One decoded image, as a runtime gets it.

    Attributes:
        rgb: decoded pixels, RGB8, row-major, ``width * height * 3`` bytes.
        digest: sha256 hex of (width, height, rgb): the prompt cache keys on it.
        where: the wire parameter it came from (``messages[0].content[1]``), for errors.
    """

    rgb: bytes
    width: int
    height: int
    digest: str
    where: str = ""


@dataclass(frozen=True, slots=True)
class ImageSource:
    """An image as the wire gave it, before fetching and decoding: ``data`` (encoded bytes) or
    ``url`` (http/https), and the media type the client declared, if any."""

    where: str
    data: bytes | None = None
    url: str | None = None
    media_type: str | None = None
    media_param: str | None = None  # the parameter that declared media_type


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_pixels: int = MAX_PIXELS
    max_bytes: int = MAX_IMAGE_BYTES


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


def supports_vision(model: LocalModel) -> bool:
    """A GGUF model with a paired projector (``extra["projector"]``: an mmproj GGUF's path),
    or an MLX folder whose config describes a vision model (``extra["vision"]``, mlx-vlm)."""
    if model.format == "mlx":
        return model.extra.get("vision") is True
    projector = model.extra.get("projector")
    return model.format == "gguf" and isinstance(projector, str) and bool(projector)


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
) -> ImageInput:
    """Decode one encoded image to RGB8, bounded.

    The byte bound is checked first, then the format (an allowlist) and the pixel count from
    the header, before any pixel is decoded. EXIF orientation is applied, transparency is
    composited on white, the first frame of an animation is taken.

    Raises:
        InvalidImage: too many bytes or pixels, an unsupported format, corrupt or truncated
            data, or a media type that does not match the bytes (``param`` names the part).
    """
    # Pillow is imported here: app.core must import on a machine without it
    from PIL import Image, ImageOps, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise InvalidImage(
            f"the image is {len(data)} bytes; at most {limits.max_bytes} are taken", param=where
        )
    if not data:
        raise InvalidImage("the image is empty", param=where)
    try:
        img = Image.open(io.BytesIO(data), formats=list(FORMATS))
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
        try:
            img.seek(0)  # a GIF's (or animated WebP's) first frame
            img.load()
            rgb_img = _to_rgb(ImageOps.exif_transpose(img) or img)
        except Image.DecompressionBombError:
            raise InvalidImage(
                f"the image has more than {limits.max_pixels} pixels", param=where
            ) from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise InvalidImage(f"the image is corrupt or truncated: {e}", param=where) from None
    w, h = rgb_img.size
    rgb = rgb_img.tobytes()
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
