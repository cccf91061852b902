"""Images a person attaches: checked with the server's decoder and bounds, built into
a message as the protocol adapters build theirs, kept content-addressed beside the
conversations, cleaned up when nothing references them, named in the exports."""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from app.core.inference.images import (
    IMAGE_MARKER,
    ImageLimits,
    InvalidImage,
    image_digest,
    strip_markers,
)
from app.core.workspace.chat_images import (
    THUMB_SIZE,
    ImageStore,
    decode_messages,
    image_from_bytes,
    read_image_file,
    user_message,
)
from app.core.workspace.conversation_export import to_json, to_markdown
from app.core.workspace.conversations import Conversation, ConversationStore
from app.server.protocols.ollama.parse import parse_history


def png(width: int, height: int, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "PNG")
    return buf.getvalue()


def noise_png() -> bytes:
    """A 32x32 PNG of noise (it does not compress: cut short, its pixels are missing)."""
    buf = io.BytesIO()
    Image.frombytes("RGB", (32, 32), random.Random(0).randbytes(32 * 32 * 3)).save(buf, "PNG")
    return buf.getvalue()


def bomb_png(side: int = 100_000) -> bytes:
    """A PNG whose header claims side x side pixels (tiny on disk: never decoded)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_an_image_is_checked_and_thumbnailed_and_its_message_is_the_adapters_shape() -> None:
    img = image_from_bytes("red.png", png(400, 100))
    assert (img.width, img.height, img.ext) == (400, 100, "png")
    thumb = Image.open(io.BytesIO(img.thumb))
    assert max(thumb.size) == THUMB_SIZE and thumb.format == "PNG"
    # the same message the Ollama adapter builds from the same text and image
    text = f"what is it? {IMAGE_MARKER}"  # a literal marker is text, never an image
    msg = user_message(text, [img])
    b64 = base64.b64encode(img.data).decode()
    wire = parse_history([{"role": "user", "content": text, "images": [b64]}])[0]
    assert msg.content == wire.content and msg.content.count(IMAGE_MARKER) == 1
    assert strip_markers(msg.content).startswith("what is it?")
    (decoded,) = decode_messages([msg])
    (rgb,) = decoded.images
    assert rgb.digest == image_digest(400, 100, rgb.rgb) and not decoded.image_sources


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (bomb_png(), "pixels"),
        (noise_png()[:1500], "corrupt or truncated"),
        (b"hello, not an image", "unsupported image format"),
    ],
)
def test_bad_images_are_refused_with_the_reason(data: bytes, said: str, tmp_path: Path) -> None:
    f = tmp_path / "bad.png"
    f.write_bytes(data)
    with pytest.raises(InvalidImage, match=said) as e:
        read_image_file(f)
    assert e.value.message.startswith("bad.png: ")


def test_the_byte_bound_is_checked_before_reading(tmp_path: Path) -> None:
    f = tmp_path / "big.png"
    f.write_bytes(png(64, 64))
    with pytest.raises(InvalidImage, match="at most 100 are taken"):
        read_image_file(f, ImageLimits(max_bytes=100))
    with pytest.raises(InvalidImage, match="no such file"):
        read_image_file(tmp_path / "gone.png")


def test_the_store_keeps_one_file_per_content_and_removes_the_unused(tmp_path: Path) -> None:
    db = ConversationStore(tmp_path / "conversations.sqlite", undo_seconds=0)
    store = ImageStore(tmp_path / "chat-images")
    a, b = image_from_bytes("a.png", png(20, 20)), image_from_bytes("b.png", png(10, 30, (0, 0, 9)))
    ref_a, ref_b = store.save(a), store.save(b)
    assert store.save(a) == ref_a  # the same content: one file
    assert sorted(p.name for p in (tmp_path / "chat-images").iterdir()) == sorted(
        [a.file, f"{a.sha256}.thumb.png", b.file, f"{b.sha256}.thumb.png"]
    )
    back = store.load(ref_a)
    assert back is not None and back.data == a.data and back.thumb == a.thumb
    conv = Conversation()
    conv.add(None, "user", "look", extras={"images": [ref_a, ref_b]})
    db.save(conv)
    other = Conversation()
    other.add(None, "user", "again", extras={"images": [ref_a]})
    db.save(other)
    db.delete(conv.id)
    used = {r["file"] for v in db.extras_values("images") for r in v}
    assert used == {a.file, b.file}  # a deleted conversation counts until it is purged
    db.purge_deleted()
    used = {r["file"] for v in db.extras_values("images") for r in v}
    assert store.remove_unused(used) == 1  # b: no message left uses it; a: `other` does
    assert store.load(ref_b) is None and store.load(ref_a) is not None
    assert store.load({"file": "../conversations.sqlite"}) is None  # never outside the folder
    # the exports name the images: JSON by reference, Markdown under the message
    assert to_json(other)["messages"][0]["extras"]["images"][0]["file"] == a.file
    assert f"*[image: a.png, 20×20 · {a.file}]*" in to_markdown(other)
    db.close()
