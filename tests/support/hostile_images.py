"""Hostile images made with Pillow for the tests and the request fuzz: a progressive JPEG whose
last scan is repeated (decode work far beyond its size), large one-colour PNGs (a few KB that
decode to 48 MB each), and a PNG whose header is fine but whose pixel data is missing."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def progressive_jpeg(size: tuple[int, int] = (256, 256), *, noisy: bool = False) -> bytes:
    """A real progressive JPEG (Pillow's libjpeg: about 10 scans). One colour by default: its
    refinement scans are a few bytes each, so repeating one costs little space and a full pass
    over the image to decode."""
    img = (
        Image.effect_noise(size, 80).convert("RGB")
        if noisy
        else Image.new("RGB", size, (90, 120, 200))
    )
    buf = io.BytesIO()
    img.save(buf, "JPEG", progressive=True, quality=90)
    return buf.getvalue()


def repeated_scans(data: bytes, times: int) -> bytes:
    """``data`` (a JPEG) with its last scan (SOS to EOI) spliced in ``times`` more times."""
    eoi = data.rindex(b"\xff\xd9")
    last = data.rindex(b"\xff\xda", 0, eoi)
    return data[:eoi] + data[last:eoi] * times + data[eoi:]


def one_colour_png(side: int = 4096) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (7, 7, 7)).save(buf, "PNG", optimize=False, compress_level=9)
    return buf.getvalue()


def header_only_png(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` RGB pixels, with no pixel data: corrupt
    the moment anything tries to decode it."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def data_url(data: bytes) -> str:
    kind = "jpeg" if data.startswith(b"\xff\xd8") else "png"
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()
