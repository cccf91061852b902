"""app/core/inference/images.py: the bounded decoder (allowlist, pixel bound on the header before any
decoding, byte bound, corrupt and truncated data, EXIF, alpha on white), the digest,
supports_vision and marker neutralising, on real encoded images made with Pillow."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zlib

import pytest
from PIL import Image

from app.core.inference.images import (
    IMAGE_MARKER,
    MARKER_LOOKALIKE,
    ImageLimits,
    ImageSource,
    InvalidImage,
    decode_image,
    image_digest,
    neutralise_markers,
    supports_vision,
)
from app.core.types import LocalModel


def encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` RGB pixels, with no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


RED = Image.new("RGB", (4, 3), (255, 0, 0))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_each_allowed_format_decodes_to_rgb8(fmt: str) -> None:
    img = decode_image(encode(RED, fmt), where="p")
    assert (img.width, img.height, len(img.rgb)) == (4, 3, 4 * 3 * 3)
    r, g, b = img.rgb[:3]
    assert r > 200 and g < 60 and b < 60  # lossy formats stay close to red
    assert img.digest == image_digest(4, 3, img.rgb) and img.where == "p"


def test_alpha_is_composited_on_white_and_palette_transparency_too() -> None:
    clear = Image.new("RGBA", (2, 2), (0, 0, 0, 0))
    half = Image.new("RGBA", (1, 1), (0, 0, 0, 128))
    assert decode_image(encode(clear, "PNG"), where="p").rgb == b"\xff" * 12
    assert decode_image(encode(half, "PNG"), where="p").rgb[0] in (127, 128)
    pal = Image.new("P", (2, 1), 0)
    pal.putpalette([0, 0, 0, 10, 20, 30])
    pal.putpixel((1, 0), 1)
    img = decode_image(encode(pal, "PNG", transparency=0), where="p")
    assert img.rgb == b"\xff\xff\xff" + bytes([10, 20, 30])


def test_exif_orientation_is_applied() -> None:
    wide = Image.new("RGB", (6, 2), (0, 0, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    img = decode_image(encode(wide, "JPEG", exif=exif), where="p")
    assert (img.width, img.height) == (2, 6)


def test_gif_first_frame_only() -> None:
    frames = [Image.new("RGB", (2, 2), c) for c in ((0, 255, 0), (255, 0, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    img = decode_image(buf.getvalue(), where="p")
    assert img.rgb[1] > 200 and img.rgb[0] < 60


def test_the_digest_keys_on_content_and_size() -> None:
    a = decode_image(encode(RED, "PNG"), where="a")
    b = decode_image(encode(RED, "BMP"), where="b")
    c = decode_image(encode(Image.new("RGB", (4, 3), (255, 0, 1)), "PNG"), where="c")
    assert a.digest == b.digest != c.digest
    assert image_digest(2, 6, a.rgb[:36]) != image_digest(6, 2, a.rgb[:36])


def test_a_decompression_bomb_is_refused_from_its_header_without_allocating() -> None:
    bomb = png_header(100_000, 100_000)
    tracemalloc.start()
    with pytest.raises(InvalidImage) as e:
        decode_image(bomb, where="messages[0].content[1].image_url.url")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert e.value.status == 400 and e.value.param == "messages[0].content[1].image_url.url"
    assert "pixels" in e.value.message
    assert peak < 4 * 1024 * 1024  # 30 GB of pixels were claimed; nothing like it was allocated


def test_the_pixel_bound_is_the_setting() -> None:
    data = encode(Image.new("RGB", (20, 20)), "PNG")
    decode_image(data, where="p", limits=ImageLimits(max_pixels=400))
    with pytest.raises(InvalidImage, match="20x20"):
        decode_image(data, where="p", limits=ImageLimits(max_pixels=399))


def test_oversize_bytes_are_refused_before_decoding() -> None:
    data = encode(RED, "PNG")
    with pytest.raises(InvalidImage, match="bytes") as e:
        decode_image(data, where="images[0]", limits=ImageLimits(max_bytes=len(data) - 1))
    assert e.value.param == "images[0]"


@pytest.mark.parametrize(
    "data",
    [
        encode(RED, "TIFF"),
        b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
        encode(RED, "ICO"),
        b"not an image at all",
    ],
    ids=["tiff", "svg", "ico", "text"],
)
def test_other_formats_are_unsupported(data: bytes) -> None:
    with pytest.raises(InvalidImage, match="unsupported image format") as e:
        decode_image(data, where="p")
    assert e.value.param == "p"


def test_truncated_and_corrupt_images_are_refused() -> None:
    big = Image.effect_noise((64, 64), 50).convert("RGB")
    for fmt in ("PNG", "JPEG", "WEBP"):
        data = encode(big, fmt)
        with pytest.raises(InvalidImage, match="corrupt|truncated|unsupported"):
            decode_image(data[: len(data) // 2], where="p")
    png = bytearray(encode(big, "PNG"))
    png[60:80] = b"\x00" * 20  # inside the pixel data: a bad checksum / bad deflate stream
    with pytest.raises(InvalidImage):
        decode_image(bytes(png), where="p")
    with pytest.raises(InvalidImage, match="empty"):
        decode_image(b"", where="p")


def test_a_declared_media_type_must_match_the_bytes() -> None:
    src = ImageSource("m.data", media_type="image/png", media_param="m.media_type")
    with pytest.raises(InvalidImage, match="image/png") as e:
        decode_image(encode(RED, "JPEG"), where="m.data", source=src)
    assert e.value.param == "m.media_type"
    ok = ImageSource("m.data", media_type="image/jpeg", media_param="m.media_type")
    assert decode_image(encode(RED, "JPEG"), where="m.data", source=ok).width == 4


def test_supports_vision_needs_a_gguf_with_a_projector() -> None:
    m = LocalModel("m", "/m.gguf", "gguf", 1, True)
    assert not supports_vision(m) and "vision" not in m.capabilities
    seer = LocalModel("s", "/s.gguf", "gguf", 1, True, extra={"projector": "/mmproj.gguf"})
    assert supports_vision(seer) and seer.capabilities == ("completion", "chat", "vision")
    assert not supports_vision(LocalModel("e", "/e.gguf", "gguf", 1, True, extra={"projector": ""}))


def test_literal_markers_are_neutralised() -> None:
    text = f"a {IMAGE_MARKER} b {IMAGE_MARKER}"
    out = neutralise_markers(text)
    assert IMAGE_MARKER not in out and out.count(MARKER_LOOKALIKE) == 2
    assert neutralise_markers("plain") == "plain"
